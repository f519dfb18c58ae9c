//! Validation of a `TrainingJobSpec` into a [`ValidatedJob`], the only input
//! the estimator and planner accept. Every problem is collected, each naming
//! the field path, the value and the reason. Pure: no I/O.

use std::fmt;

use super::training_job::*;
use model::resolve_model;
pub use peft::{
    LORA_TARGET_ALIASES, LORA_TARGETS, SAVED_MODULE_ALIASES, block_projections, lora_target_names,
    saved_module_name,
};
use peft::{lora_of, validate_peft};
pub use quantization::quantization_name;
use quantization::resolved_quantization;

mod float8;
mod model;
mod peft;
mod quantization;
mod settings;
use crate::api::arch::{Act, Arch, Kind, Mlp, Norm};
use crate::api::framework::{FrameworkAllocator, allocator_of};
use crate::api::params;
use crate::api::presets;
pub use settings::{ALL_FIELDS, Settings, yaml_name};
use settings::{
    cache_holds, checkpoint_every, context_parallel_divides, micro_batch, offload,
    offload_gradients, position_table, resolved_sequence_length, sequence_length_range,
    weights_load, zero_stage,
};

/// Largest parameter count we accept (a quadrillion: 2 500 × Llama-3.1-405B).
pub const MAX_PARAMETERS: f64 = 1e15;
/// Largest byte count a user may give for per-sample activations or data.
pub const MAX_BYTES: f64 = 1e18;
/// Longest sequence we accept (tokens per sample).
pub const MAX_SEQUENCE_LENGTH: u64 = 1 << 26;
/// Largest micro-batch we accept.
pub const MAX_MICRO_BATCH: u64 = 1 << 24;
/// Largest LoRA alpha we accept: fp16's largest finite value.
pub const MAX_LORA_ALPHA: f64 = 65_504.0;
/// Largest GPU count we accept.
pub const MAX_GPUS: u64 = 1 << 20;

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, e.g. `spec.training.microBatchSize`.
    pub path: String,
    /// Why the value is wrong and, where possible, what would be valid.
    pub reason: String,
}

/// Longest line one field error prints: a hostile document can put megabytes
/// into a value the error would otherwise echo.
pub const MAX_ERROR_LINE: usize = 512;
/// Errors printed for one document; the rest are counted.
pub const MAX_ERRORS_SHOWN: usize = 20;

/// `line` cut to at most [`MAX_ERROR_LINE`] bytes, ending in `...` when cut.
pub fn clip(mut line: String) -> String {
    if line.len() > MAX_ERROR_LINE {
        let mut end = MAX_ERROR_LINE - 3;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push_str("...");
    }
    line
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&clip(format!("{}: {}", self.path, self.reason)))
    }
}

/// `errs` one per line, at most [`MAX_ERRORS_SHOWN`] of them.
pub fn errors_to_string(errs: &[FieldError]) -> String {
    let mut lines: Vec<String> = errs
        .iter()
        .take(MAX_ERRORS_SHOWN)
        .map(ToString::to_string)
        .collect();
    if errs.len() > MAX_ERRORS_SHOWN {
        lines.push(format!(
            "... and {} more problems",
            errs.len() - MAX_ERRORS_SHOWN
        ));
    }
    lines.join("\n")
}

/// All problems found in one spec.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&errors_to_string(&self.0))
    }
}

/// What the model is, once resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum ResolvedModel {
    Transformer(Arch),
    /// An MLP/CNN from `layers` or a vision preset, shapes propagated.
    Layers(Box<crate::api::layers::LayerStack>),
    /// Known by size only.
    Custom {
        parameters: u64,
        activation_bytes_per_sample: u64,
    },
}

/// A spec that passed validation, with every default resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedJob {
    /// The spec as written, defaults filled in by serde; read through [`Self::spec`],
    /// changed only through the `with_` methods, which validate again.
    spec: TrainingJobSpec,
    pub model: ResolvedModel,
    /// Short human name of the model (`llama-3.1-8b`, `transformer 32×4096`).
    pub model_name: String,
    pub head: Head,
    pub num_labels: u64,
    pub quantization: Quantization,
    /// Bits per base weight of a gptq or awq checkpoint (4 otherwise).
    pub quantization_bits: u8,
    /// Input rows per scale of a gptq or awq checkpoint; `None`: the whole row.
    pub quantization_group: Option<u64>,
    pub lora: Option<LoraSpec>,
    /// Total parameters of the model.
    pub total_parameters: u64,
    /// Data-parallel ranks: gpus / (tensor × pipeline × context parallel).
    pub data_parallel: u64,
    pub gpus_per_node: u64,
    /// Gradient accumulation steps as written (1 without globalBatchSize).
    pub gradient_accumulation_steps: u64,
    /// The limit the framework's allocator puts on itself (from `framework`
    /// and the trainer's environment).
    pub allocator: FrameworkAllocator,
    /// The releases the job runs with, as far as known (spec, then image tag).
    pub runtime: crate::api::RuntimeFacts,
    /// The caching allocator's settings from the trainer's environment.
    pub allocator_conf: crate::api::AllocatorConf,
}

impl ValidatedJob {
    /// The spec as validated (defaults filled in, the ZeRO stage written down).
    pub fn spec(&self) -> &TrainingJobSpec {
        &self.spec
    }
}

/// The most positions a generation may add or a KV cache may hold (16 Mi).
pub const MAX_GENERATED_TOKENS: u64 = 1 << 24;

struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: &str, reason: impl Into<String>) {
        self.0.push(FieldError {
            path: path.to_string(),
            reason: reason.into(),
        });
    }

    fn at_least(&mut self, path: &str, value: u64, min: u64) {
        if value < min {
            self.push(path, format!("{value} is not allowed; minimum is {min}"));
        }
    }

    fn at_most(&mut self, path: &str, value: u64, max: u64) {
        if value > max {
            self.push(path, format!("{value} is too large; maximum is {max}"));
        }
    }
}

/// A float that must be a whole count in `0..=max`.
fn count_from_f64(errs: &mut Errors, path: &str, v: f64, min: f64, max: f64) -> Option<u64> {
    if !v.is_finite() {
        errs.push(path, format!("{v} is not a finite number"));
        return None;
    }
    if v < min {
        errs.push(path, format!("{v} is not allowed; minimum is {min}"));
        return None;
    }
    if v > max {
        errs.push(path, format!("{v:e} is too large; maximum is {max:e}"));
        return None;
    }
    // In range and finite: the conversion is exact up to 2^53 and saturating above.
    Some(v.round() as u64)
}

/// Annotation naming the catalog model a spelled-out `transformer` is: the
/// facts its dims cannot say (block layout, norms, soft-capping) come from
/// that preset unless the spec sets them.
pub const PRESET_HINT_ANNOTATION: &str = "vramguard.io/preset-hint";

/// Validate a spec; all problems at once.
pub fn validate(spec: &TrainingJobSpec) -> Result<ValidatedJob, ValidationErrors> {
    validate_hinted(spec, None)
}

/// Validate a TrainingJob: its spec, read with the `vramguard.io/preset-hint`
/// annotation when there is one.
pub fn validate_job(tj: &TrainingJob) -> Result<ValidatedJob, ValidationErrors> {
    let hint = tj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PRESET_HINT_ANNOTATION))
        .map(String::as_str);
    validate_hinted(&tj.spec, hint)
}

fn validate_hinted(
    spec: &TrainingJobSpec,
    hint: Option<&str>,
) -> Result<ValidatedJob, ValidationErrors> {
    let mut errs = Errors(Vec::new());
    let errs = &mut errs;
    let t = &spec.training;

    let (model, model_name) = resolve_model(errs, &spec.model, hint);
    let (head, num_labels) = head_and_labels(errs, spec, model.as_ref());

    // Training.
    micro_batch(errs, t.micro_batch_size);
    sequence_length_range(errs, resolved_sequence_length(t, model.as_ref()));
    if let Some(m) = model.as_ref() {
        position_table(errs, m, &model_name, t);
    }
    if t.data_on_gpu_bytes as f64 > MAX_BYTES {
        errs.push(
            "spec.training.dataOnGpuBytes",
            format!(
                "{} is too large; maximum is {MAX_BYTES:e}",
                t.data_on_gpu_bytes
            ),
        );
    }

    weights_load(errs, t);

    let (quantization, quantization_bits, quantization_group) = resolved_quantization(errs, spec);
    float8::float8(errs, t, &spec.parallelism, quantization);
    let lora = lora_of(errs, t, model.as_ref());
    validate_peft(
        errs,
        t,
        matches!(model, Some(ResolvedModel::Transformer(_))),
    );

    let total_parameters = total_parameters(errs, model.as_ref(), head, num_labels);
    trainable_and_generation(errs, t, total_parameters);
    let (model_parallel, data_parallel, gpus_per_node) = parallel_sizes(errs, &spec.parallelism);
    parallel_fits_model(errs, spec, model.as_ref(), model_parallel);
    let gradient_accumulation_steps = accumulation_steps(errs, spec, data_parallel);
    micro_batches_fit_schedule(errs, spec, gradient_accumulation_steps);
    fit_policy(errs, spec);
    let (allocator, runtime, allocator_conf) = framework_of(errs, spec);

    if !errs.0.is_empty() {
        return Err(ValidationErrors(std::mem::take(&mut errs.0)));
    }
    let model = model.expect("a model error would have returned above");
    // The stage the job runs at, written down: FSDP without zeroStage shards fully;
    // and the length, shortened to a learned position table when not written.
    let mut spec = spec.clone();
    spec.parallelism.zero_stage = Some(spec.parallelism.zero());
    spec.training.sequence_length = Some(resolved_sequence_length(&spec.training, Some(&model)));
    Ok(ValidatedJob {
        spec,
        model,
        model_name,
        head,
        num_labels,
        quantization,
        quantization_bits,
        quantization_group,
        lora,
        total_parameters,
        data_parallel,
        gpus_per_node,
        gradient_accumulation_steps,
        allocator,
        runtime,
        allocator_conf,
    })
}

/// The head and the label count. Layer lists and vision presets carry their own classifier;
/// a shape given beside a model that does not read it is still checked.
fn head_and_labels(
    errs: &mut Errors,
    spec: &TrainingJobSpec,
    model: Option<&ResolvedModel>,
) -> (Head, u64) {
    let t = &spec.training;
    let is_layers = matches!(model, Some(ResolvedModel::Layers(_)));
    let head = spec.model.head.unwrap_or(if is_layers {
        Head::Classification
    } else {
        Head::Lm
    });
    if is_layers
        && matches!(
            t.mode,
            TrainingMode::Lora | TrainingMode::Qlora | TrainingMode::Adapter
        )
        && t.trainable_parameters.is_none()
    {
        errs.push(
            "spec.training.trainableParameters",
            "required with an adapter mode on a layers model (which layers get adapters is not known)",
        );
    }
    let num_labels = spec.model.num_labels.unwrap_or(2);
    if spec.model.num_labels.is_some() && head != Head::Classification {
        errs.push(
            "spec.model.numLabels",
            "only used with head: classification",
        );
    }
    errs.at_least("spec.model.numLabels", num_labels, 1);
    errs.at_most("spec.model.numLabels", num_labels, 1 << 24);
    let analysed_shape =
        matches!(model, Some(ResolvedModel::Layers(_))) || spec.model.layers.is_some();
    if let Some(shape) = spec.model.input_shape.as_ref().filter(|_| !analysed_shape) {
        if shape.is_empty() {
            errs.push("spec.model.inputShape", "must not be empty");
        }
        for (i, d) in shape.iter().enumerate() {
            errs.at_least(&format!("spec.model.inputShape[{i}]"), *d, 1);
        }
    }
    (head, num_labels)
}

/// The model's parameter count (0 when it is unknown or refused).
fn total_parameters(
    errs: &mut Errors,
    model: Option<&ResolvedModel>,
    head: Head,
    num_labels: u64,
) -> u64 {
    match model {
        Some(ResolvedModel::Transformer(arch)) => {
            match params::count(arch, head, num_labels).map(|c| c.total) {
                Some(n) if (n as f64) <= MAX_PARAMETERS => n,
                Some(n) => {
                    errs.push(
                        "spec.model",
                        format!("the model has {n} parameters; maximum is {MAX_PARAMETERS:e}"),
                    );
                    0
                }
                None => {
                    errs.push(
                        "spec.model",
                        "the parameter count overflows 64 bits; check the dimensions",
                    );
                    0
                }
            }
        }
        Some(ResolvedModel::Custom { parameters, .. }) => *parameters,
        Some(ResolvedModel::Layers(stack)) => stack.parameters,
        None => 0,
    }
}

/// `trainableParameters` against the model, and what inference alone may set.
fn trainable_and_generation(errs: &mut Errors, t: &TrainingSpec, total_parameters: u64) {
    if let Some(tp) = t.trainable_parameters
        && let Some(n) = count_from_f64(
            errs,
            "spec.training.trainableParameters",
            tp,
            0.0,
            MAX_PARAMETERS,
        )
        && total_parameters > 0
        && n > total_parameters
    {
        errs.push(
            "spec.training.trainableParameters",
            format!("{n} exceeds the model's {total_parameters} parameters"),
        );
    }
    if let Some(g) = &t.generation {
        if t.mode != TrainingMode::Inference {
            errs.push(
                "spec.training.generation",
                "only used with mode: inference (training steps generate nothing)",
            );
        }
        errs.at_most(
            "spec.training.generation.newTokens",
            g.new_tokens,
            MAX_GENERATED_TOKENS,
        );
        if let Some(len) = g.cache_length {
            cache_holds(errs, t.seq_len(), g.new_tokens, len);
            errs.at_most(
                "spec.training.generation.cacheLength",
                len,
                MAX_GENERATED_TOKENS,
            );
        }
    }
    if t.mode == TrainingMode::Inference && t.trainable_parameters.is_some_and(|v| v > 0.0) {
        errs.push(
            "spec.training.trainableParameters",
            "must be 0 or absent in mode: inference",
        );
    }
}

/// The parallel sizes: (tensor × pipeline × context, data-parallel ranks, GPUs per node).
fn parallel_sizes(errs: &mut Errors, p: &ParallelismSpec) -> (Option<u64>, u64, u64) {
    errs.at_least("spec.parallelism.gpus", p.gpus, 1);
    errs.at_most("spec.parallelism.gpus", p.gpus, MAX_GPUS);
    errs.at_least("spec.parallelism.tensorParallel", p.tensor_parallel, 1);
    errs.at_least("spec.parallelism.pipelineParallel", p.pipeline_parallel, 1);
    errs.at_least("spec.parallelism.contextParallel", p.context_parallel, 1);
    errs.at_least("spec.parallelism.virtualStages", p.virtual_stages, 1);
    zero_stage(errs, p);
    if let Some(sharding) = p.sharding {
        if p.strategy != Strategy::Fsdp {
            errs.push(
                "spec.parallelism.sharding",
                "is FSDP's sharding strategy and strategy is not fsdp; set strategy: fsdp, or say the ZeRO stage with zeroStage",
            );
        }
        if let Some(z) = p.zero_stage
            && z != sharding.zero_stage()
        {
            errs.push(
                "spec.parallelism.zeroStage",
                format!(
                    "{z} contradicts sharding, which means ZeRO {}; write one of the two, or make them agree (full-shard is 3, shard-grad-op 2, no-shard 0)",
                    sharding.zero_stage()
                ),
            );
        }
    }
    let model_parallel = p
        .tensor_parallel
        .checked_mul(p.pipeline_parallel)
        .and_then(|x| x.checked_mul(p.context_parallel));
    let data_parallel = match model_parallel {
        None => {
            errs.push(
                "spec.parallelism",
                "tensorParallel × pipelineParallel × contextParallel overflows",
            );
            1
        }
        Some(0) => 1,
        Some(mp) if !p.gpus.is_multiple_of(mp) => {
            errs.push(
                "spec.parallelism.gpus",
                format!(
                    "{} is not a multiple of tensorParallel × pipelineParallel × contextParallel = {mp}",
                    p.gpus
                ),
            );
            1
        }
        Some(mp) => (p.gpus / mp).max(1),
    };
    let gpus_per_node = p.gpus_per_node.unwrap_or(p.gpus.min(8));
    if let Some(g) = p.gpus_per_node {
        errs.at_least("spec.parallelism.gpusPerNode", g, 1);
        errs.at_most("spec.parallelism.gpusPerNode", g, 64);
        if g > 0 && p.gpus > g && !p.gpus.is_multiple_of(g) {
            errs.push(
                "spec.parallelism.gpusPerNode",
                format!(
                    "{} GPUs do not split into whole nodes of {g}; use a multiple of {g}",
                    p.gpus
                ),
            );
        }
    }
    (model_parallel, data_parallel, gpus_per_node)
}

/// The parallel settings against each other and against the model they split.
fn parallel_fits_model(
    errs: &mut Errors,
    spec: &TrainingJobSpec,
    model: Option<&ResolvedModel>,
    model_parallel: Option<u64>,
) {
    let (t, p) = (&spec.training, &spec.parallelism);
    if p.sequence_parallel && p.tensor_parallel < 2 {
        errs.push(
            "spec.parallelism.sequenceParallel",
            "needs tensorParallel ≥ 2 (it splits the tensor-parallel group's activations)",
        );
    }
    pipeline_schedule(errs, p);
    offload(errs, p);
    if let Some(target) = t.target_length {
        let encoder_decoder = matches!(
            model,
            Some(ResolvedModel::Transformer(arch))
                if arch.kind == Kind::EncoderDecoder
        );
        if model.is_some() && !encoder_decoder {
            errs.push(
                "spec.training.targetLength",
                "is the decoder's length of an encoder-decoder model (T5, BART); this model has one stack, so sequenceLength says it all",
            );
        }
        errs.at_least("spec.training.targetLength", target, 1);
        errs.at_most("spec.training.targetLength", target, MAX_SEQUENCE_LENGTH);
    }
    if let Some(ResolvedModel::Transformer(arch)) = &model {
        model::sizes_the_model_takes(errs, arch, p.tensor_parallel);
        let stages = p.pipeline_parallel.saturating_mul(p.virtual_stages);
        let blocks = arch.layers.saturating_add(arch.decoder_layers);
        if stages > blocks {
            errs.push(
                "spec.parallelism.pipelineParallel",
                format!(
                    "{} stages × {} virtual stages exceed the model's {blocks} layers",
                    p.pipeline_parallel, p.virtual_stages
                ),
            );
        }
        context_parallel_divides(errs, p, resolved_sequence_length(t, model));
    } else if model.is_some() && model_parallel.is_some_and(|m| m > 1) {
        errs.push(
            "spec.parallelism",
            "tensor, pipeline and context parallelism need a transformer model",
        );
    }
}

/// Virtual stages the schedule places on a rank.
fn pipeline_schedule(errs: &mut Errors, p: &ParallelismSpec) {
    let s = p.pipeline_schedule;
    if p.virtual_stages > 1 && !s.multi_stage() {
        errs.push(
            "spec.parallelism.virtualStages",
            "more than 1 needs a multi-stage pipelineSchedule: interleaved-1f1b, looped-bfs, interleaved-zero-bubble, zbv-zero-bubble or dualpipev",
        );
    }
    if s.v_shape() && p.pipeline_parallel > 1 && p.virtual_stages != 2 {
        errs.push(
            "spec.parallelism.virtualStages",
            format!(
                "is {}; pipelineSchedule {} places exactly 2 virtual stages per rank (in a V), so it must be 2",
                p.virtual_stages,
                s.name()
            ),
        );
    }
}

/// What `torch.distributed.pipelining`'s schedules refuse of the number of
/// micro-batches, where `globalBatchSize` gives it (the accumulation steps):
/// DualPipeV needs at least one per stage (2 × pipelineParallel), the
/// interleaved zero-bubble schedule a multiple of its rounds
/// (max(1, m // pipelineParallel)); `ScheduleDualPipeV.__init__` and
/// `ScheduleInterleavedZeroBubble.__init__` raise otherwise.
fn micro_batches_fit_schedule(errs: &mut Errors, spec: &TrainingJobSpec, m: u64) {
    let p = &spec.parallelism;
    if spec.training.global_batch_size.is_none() || p.pipeline_parallel <= 1 {
        return;
    }
    let pp = p.pipeline_parallel;
    match p.pipeline_schedule {
        PipelineSchedule::DualPipeV if m < 2 * pp => errs.push(
            "spec.training.globalBatchSize",
            format!(
                "gives {m} micro-batches per step; pipelineSchedule dualpipev needs at least one per stage, 2 × pipelineParallel = {}",
                2 * pp
            ),
        ),
        PipelineSchedule::InterleavedZeroBubble if !m.is_multiple_of((m / pp).max(1)) => {
            let rounds = (m / pp).max(1);
            errs.push(
                "spec.training.globalBatchSize",
                format!(
                    "gives {m} micro-batches per step; pipelineSchedule interleaved-zero-bubble runs them in {rounds} rounds and needs a multiple of that (e.g. a multiple of pipelineParallel = {pp})"
                ),
            )
        }
        _ => {}
    }
}

/// Gradient accumulation steps from `globalBatchSize` (1 without it).
fn accumulation_steps(errs: &mut Errors, spec: &TrainingJobSpec, data_parallel: u64) -> u64 {
    let t = &spec.training;
    let mut gradient_accumulation_steps = 1;
    if let Some(g) = t.global_batch_size {
        match t.micro_batch_size.checked_mul(data_parallel) {
            None => errs.push(
                "spec.training.globalBatchSize",
                "microBatchSize × data-parallel ranks overflows",
            ),
            Some(0) => {}
            Some(per_step) if g < per_step || g % per_step != 0 => errs.push(
                "spec.training.globalBatchSize",
                format!(
                    "{g} is not divisible by microBatchSize × data-parallel ranks = {} × {data_parallel} = {per_step}",
                    t.micro_batch_size
                ),
            ),
            Some(per_step) => gradient_accumulation_steps = g / per_step,
        }
    }
    let p = &spec.parallelism;
    offload_gradients(errs, p, gradient_accumulation_steps);
    gradient_accumulation_steps
}

fn fit_policy(errs: &mut Errors, spec: &TrainingJobSpec) {
    let t = &spec.training;
    let fp = &spec.fit_policy;
    if !fp.safety_margin.is_finite() || !(0.0..1.0).contains(&fp.safety_margin) {
        errs.push(
            "spec.fitPolicy.safetyMargin",
            format!(
                "{} is not allowed; use a fraction in [0, 1), e.g. 0.05",
                fp.safety_margin
            ),
        );
    }
    errs.at_least(
        "spec.fitPolicy.minMicroBatchSize",
        fp.min_micro_batch_size,
        1,
    );
    // A microBatchSize of 0 is already reported; comparing against it would blame this field too.
    if t.micro_batch_size >= 1 && fp.min_micro_batch_size > t.micro_batch_size {
        errs.push(
            "spec.fitPolicy.minMicroBatchSize",
            format!(
                "{} is above spec.training.microBatchSize {}",
                fp.min_micro_batch_size, t.micro_batch_size
            ),
        );
    }
    errs.at_most(
        "spec.fitPolicy.maxOomRetries",
        u64::from(fp.max_oom_retries),
        100,
    );
}

/// The framework's allocator limit and the runtime facts, as the spec and image say.
fn framework_of(
    errs: &mut Errors,
    spec: &TrainingJobSpec,
) -> (
    FrameworkAllocator,
    crate::api::RuntimeFacts,
    crate::api::AllocatorConf,
) {
    let allocator = match allocator_of(spec) {
        Ok(a) => a,
        Err(found) => {
            for (path, reason) in found {
                errs.push(&path, reason);
            }
            FrameworkAllocator::Unbounded
        }
    };

    let (runtime, allocator_conf) = match crate::api::runtime::runtime_of(spec) {
        Ok(found) => found,
        Err(found) => {
            for (path, reason) in found {
                errs.push(&path, reason);
            }
            Default::default()
        }
    };
    (allocator, runtime, allocator_conf)
}
