//! Validation of a `TrainingJobSpec` into a [`ValidatedJob`], the only input
//! the estimator and planner accept. Every problem is collected, each naming
//! the field path, the value and the reason. Pure: no I/O.

use std::fmt;

use super::training_job::*;
use crate::api::arch::{Act, Arch, Kind, Mlp, Norm};
use crate::api::framework::{FrameworkAllocator, allocator_of};
use crate::api::params;
use crate::api::presets;

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
    /// The spec as written, defaults filled in by serde.
    pub spec: TrainingJobSpec,
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

/// The most positions a generation may add or a KV cache may hold (16 Mi).
pub const MAX_GENERATED_TOKENS: u64 = 1 << 24;

/// LoRA projections we know how to size.
pub const LORA_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
];

/// The module names models give their projections, as users copy them into
/// PEFT's `target_modules`, with the projections they stand for. A fused
/// projection (GPT-2's `c_attn`, GPT-NeoX's and Falcon's `query_key_value`,
/// Baichuan's `W_pack`, Phi-3's `qkv_proj` and `gate_up_proj`) gets one
/// adapter pair over the fused output; it is counted as one pair per
/// projection it fuses, which adds `rank × hidden` per extra projection
/// (one more `lora_A`) and keeps the adapter's input once per projection:
/// the safe side, a fraction of a percent of the adapter.
pub const LORA_TARGET_ALIASES: &[(&str, &[&str])] = &[
    ("c_attn", &["q_proj", "k_proj", "v_proj"]),
    ("query_key_value", &["q_proj", "k_proj", "v_proj"]),
    ("W_pack", &["q_proj", "k_proj", "v_proj"]),
    ("qkv_proj", &["q_proj", "k_proj", "v_proj"]),
    ("Wqkv", &["q_proj", "k_proj", "v_proj"]),
    ("query", &["q_proj"]),
    ("key", &["k_proj"]),
    ("value", &["v_proj"]),
    ("q", &["q_proj"]),
    ("k", &["k_proj"]),
    ("v", &["v_proj"]),
    ("o", &["o_proj"]),
    ("out_proj", &["o_proj"]),
    ("dense", &["o_proj"]),
    // GPT-2 names its attention output and its second MLP linear `c_proj`:
    // PEFT matches both.
    ("c_proj", &["o_proj", "down_proj"]),
    ("c_fc", &["up_proj"]),
    ("fc1", &["up_proj"]),
    ("fc2", &["down_proj"]),
    ("dense_h_to_4h", &["up_proj"]),
    ("dense_4h_to_h", &["down_proj"]),
    ("gate_up_proj", &["gate_proj", "up_proj"]),
    ("wi", &["up_proj"]),
    ("wi_0", &["gate_proj"]),
    ("wi_1", &["up_proj"]),
    ("wo", &["down_proj"]),
    ("w1", &["gate_proj"]),
    ("w3", &["up_proj"]),
    ("w2", &["down_proj"]),
];

/// The projections a LoRA target name stands for in `arch`: one of
/// `LORA_TARGETS`, or a model's own name (`LORA_TARGET_ALIASES`). BERT's
/// `dense` matches its attention output and both MLP linears
/// (`attention.output.dense`, `intermediate.dense`, `output.dense`).
pub fn lora_target_names(name: &str, arch: Option<&Arch>) -> Option<&'static [&'static str]> {
    if let Some(known) = LORA_TARGETS.iter().position(|t| *t == name) {
        return Some(&LORA_TARGETS[known..known + 1]);
    }
    if name == "dense" && arch.is_some_and(|a| a.kind == Kind::Encoder) {
        return Some(&["o_proj", "up_proj", "down_proj"]);
    }
    LORA_TARGET_ALIASES
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(_, names)| *names)
}

/// Names of the embedding and the LM head in models' own code, for PEFT's
/// `modules_to_save`.
pub const SAVED_MODULE_ALIASES: &[(&str, &str)] = &[
    ("wte", "embed_tokens"),
    ("word_embeddings", "embed_tokens"),
    ("embed_in", "embed_tokens"),
    ("tok_embeddings", "embed_tokens"),
    ("embed_out", "lm_head"),
    ("output", "lm_head"),
];

/// `embed_tokens` or `lm_head` for a `modulesToSave` entry, by either name.
pub fn saved_module_name(name: &str) -> Option<&'static str> {
    match name {
        "embed_tokens" => Some("embed_tokens"),
        "lm_head" => Some("lm_head"),
        _ => SAVED_MODULE_ALIASES
            .iter()
            .find(|(a, _)| *a == name)
            .map(|(_, n)| *n),
    }
}

/// The projections inside a transformer block (the LoRA targets but the head).
pub fn block_projections() -> &'static [&'static str] {
    &LORA_TARGETS[..LORA_TARGETS.len() - 1]
}

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
    let t = &spec.training;
    let p = &spec.parallelism;

    let (model, model_name) = resolve_model(&mut errs, &spec.model, hint);

    // Head.
    // Layer lists and vision presets carry their own classifier.
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

    // Training.
    errs.at_least("spec.training.microBatchSize", t.micro_batch_size, 1);
    errs.at_most(
        "spec.training.microBatchSize",
        t.micro_batch_size,
        MAX_MICRO_BATCH,
    );
    errs.at_least("spec.training.sequenceLength", t.sequence_length, 1);
    errs.at_most(
        "spec.training.sequenceLength",
        t.sequence_length,
        MAX_SEQUENCE_LENGTH,
    );
    if t.data_on_gpu_bytes as f64 > MAX_BYTES {
        errs.push(
            "spec.training.dataOnGpuBytes",
            format!(
                "{} is too large; maximum is {MAX_BYTES:e}",
                t.data_on_gpu_bytes
            ),
        );
    }

    // A pre-quantized checkpoint says so in its config.
    let from_config = spec
        .model
        .hf_config
        .as_ref()
        .and_then(|c| hf_quantization(c, &mut errs));
    if let (TrainingMode::Full, None, Some((q, _, _))) = (t.mode, t.quantization, from_config) {
        errs.push(
            "spec.training.mode",
            format!(
                "full fine-tuning cannot train the {} checkpoint model.hfConfig describes (its quantization_config); use mode: lora, qlora or adapter, or the config of the unquantized model",
                quantization_name(q)
            ),
        );
    }
    // (Reported above for full fine-tuning; not again at `quantization`.)
    let written = t.quantization.or(from_config
        .map(|(q, _, _)| q)
        .filter(|_| t.mode != TrainingMode::Full));
    let quantization = match (t.mode, written) {
        (TrainingMode::Qlora, None) => Quantization::Nf4,
        (TrainingMode::Qlora, Some(Quantization::None)) => {
            errs.push(
                "spec.training.quantization",
                "none contradicts mode: qlora (quantized base weights); use nf4, nf4-double, gptq or awq, or mode: lora",
            );
            Quantization::None
        }
        (TrainingMode::Full, Some(q)) if q != Quantization::None => {
            errs.push(
                "spec.training.quantization",
                format!(
                    "{} base weights cannot be trained in mode: full; use mode: lora, qlora or adapter",
                    quantization_name(q)
                ),
            );
            q
        }
        (_, q) => q.unwrap_or(Quantization::None),
    };
    let (quantization_bits, quantization_group) =
        quantization_format(t, quantization, from_config, &mut errs);

    let lora = match t.mode {
        TrainingMode::Lora | TrainingMode::Qlora => {
            let l = t.lora.clone().unwrap_or_default();
            errs.at_least("spec.training.lora.rank", l.rank, 1);
            errs.at_most("spec.training.lora.rank", l.rank, 1 << 16);
            if !l.alpha.is_finite() || l.alpha <= 0.0 {
                errs.push(
                    "spec.training.lora.alpha",
                    format!("{} is not allowed; must be a positive number", l.alpha),
                );
            } else if l.alpha > MAX_LORA_ALPHA {
                errs.push(
                    "spec.training.lora.alpha",
                    format!(
                        "{} is too large; maximum is {MAX_LORA_ALPHA} (fp16's largest value: the adapter's output scaled by alpha/rank past it is infinite); usual values are 8 to 512, often twice the rank",
                        l.alpha
                    ),
                );
            }
            if !l.dropout.is_finite() || !(0.0..1.0).contains(&l.dropout) {
                errs.push(
                    "spec.training.lora.dropout",
                    format!("{} is not allowed; use a probability in [0, 1)", l.dropout),
                );
            }
            if l.target_modules.is_empty() {
                errs.push(
                    "spec.training.lora.targetModules",
                    format!("must name at least one of {}", LORA_TARGETS.join(", ")),
                );
            }
            let arch = match &model {
                Some(ResolvedModel::Transformer(a)) => Some(a),
                _ => None,
            };
            let mut canonical: Vec<String> = Vec::new();
            let mut unknown = 0usize;
            for (i, m) in l.target_modules.iter().enumerate() {
                match lora_target_names(m, arch) {
                    Some(names) => {
                        for n in names {
                            if !canonical.iter().any(|c| c == n) {
                                canonical.push((*n).to_string());
                            }
                        }
                    }
                    // The first few unknown names, each with the known ones; a
                    // list of thousands gets one line for the rest.
                    None if unknown < 8 => {
                        unknown += 1;
                        errs.push(
                            &format!("spec.training.lora.targetModules[{i}]"),
                            format!(
                                "unknown module {m:?}; known: {}, or a model's own name for them (c_attn, query_key_value, W_pack, c_proj, fc1, fc2, dense, ...: the field's description lists them)",
                                LORA_TARGETS.join(", "),
                            ),
                        )
                    }
                    None => unknown += 1,
                }
            }
            if unknown > 8 {
                errs.push(
                    "spec.training.lora.targetModules",
                    format!("{} more unknown modules", unknown - 8),
                );
            }
            let mut saved: Vec<String> = Vec::new();
            for (i, m) in l.modules_to_save.iter().enumerate() {
                match saved_module_name(m) {
                    Some(n) => {
                        if !saved.iter().any(|c| c == n) {
                            saved.push(n.to_string());
                        }
                    }
                    None => errs.push(
                        &format!("spec.training.lora.modulesToSave[{i}]"),
                        format!(
                            "unknown module {m:?}; known: embed_tokens, lm_head, or a model's own name for them ({})",
                            SAVED_MODULE_ALIASES
                                .iter()
                                .map(|(a, _)| *a)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                }
            }
            Some(LoraSpec {
                target_modules: canonical,
                modules_to_save: saved,
                ..l
            })
        }
        _ => {
            if t.lora.is_some() {
                errs.push("spec.training.lora", "only used with mode: lora or qlora");
            }
            None
        }
    };

    validate_peft(
        &mut errs,
        t,
        matches!(model, Some(ResolvedModel::Transformer(_))),
    );

    let total_parameters = match &model {
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
    };

    if let Some(tp) = t.trainable_parameters
        && let Some(n) = count_from_f64(
            &mut errs,
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
            let needed = t.sequence_length.saturating_add(g.new_tokens);
            if len < needed {
                errs.push(
                    "spec.training.generation.cacheLength",
                    format!(
                        "{len} cannot hold the prompt and the generated tokens; use at least sequenceLength + newTokens = {needed}, or leave it out for a cache that grows"
                    ),
                );
            }
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

    // Parallelism.
    errs.at_least("spec.parallelism.gpus", p.gpus, 1);
    errs.at_most("spec.parallelism.gpus", p.gpus, MAX_GPUS);
    errs.at_least("spec.parallelism.tensorParallel", p.tensor_parallel, 1);
    errs.at_least("spec.parallelism.pipelineParallel", p.pipeline_parallel, 1);
    errs.at_least("spec.parallelism.contextParallel", p.context_parallel, 1);
    errs.at_least("spec.parallelism.virtualStages", p.virtual_stages, 1);
    if let Some(z) = p.zero_stage
        && z > 3
    {
        errs.push(
            "spec.parallelism.zeroStage",
            format!("{z} is not a ZeRO stage; allowed: 0, 1, 2, 3"),
        );
    }
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
    if p.sequence_parallel && p.tensor_parallel < 2 {
        errs.push(
            "spec.parallelism.sequenceParallel",
            "needs tensorParallel ≥ 2 (it splits the tensor-parallel group's activations)",
        );
    }
    if p.virtual_stages > 1 && p.pipeline_schedule != PipelineSchedule::Interleaved1f1b {
        errs.push(
            "spec.parallelism.virtualStages",
            "more than 1 needs pipelineSchedule: interleaved-1f1b",
        );
    }
    match p.offload {
        Offload::Optimizer if p.zero() == 0 && p.strategy != Strategy::Ddp => errs.push(
            "spec.parallelism.offload",
            "optimizer offload needs zeroStage ≥ 1, or strategy: ddp (torchao's CPUOffloadOptimizer)",
        ),
        Offload::OptimizerAndParameters if p.zero() != 3 => errs.push(
            "spec.parallelism.offload",
            "parameter offload needs zeroStage: 3",
        ),
        _ => {}
    }
    if let Some(target) = t.target_length {
        let encoder_decoder = matches!(
            &model,
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
        if arch.heads % p.tensor_parallel.max(1) != 0 {
            errs.push(
                "spec.parallelism.tensorParallel",
                format!(
                    "{} does not divide the model's {} attention heads",
                    p.tensor_parallel, arch.heads
                ),
            );
        }
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
        if p.context_parallel > 1 && !t.sequence_length.is_multiple_of(p.context_parallel) {
            errs.push(
                "spec.parallelism.contextParallel",
                format!(
                    "{} does not divide sequenceLength {}",
                    p.context_parallel, t.sequence_length
                ),
            );
        }
    } else if model.is_some() && model_parallel.is_some_and(|m| m > 1) {
        errs.push(
            "spec.parallelism",
            "tensor, pipeline and context parallelism need a transformer model",
        );
    }

    // Batch.
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
    if p.offload_gradients {
        if p.offload != Offload::Optimizer || p.strategy != Strategy::Ddp {
            errs.push(
                "spec.parallelism.offloadGradients",
                "is torchao's CPUOffloadOptimizer option; it needs offload: optimizer and strategy: ddp",
            );
        } else if gradient_accumulation_steps > 1 {
            errs.push(
                "spec.parallelism.offloadGradients",
                format!(
                    "frees each gradient once it is on the host, which gradient accumulation ({gradient_accumulation_steps} steps) cannot do; set it false or globalBatchSize to microBatchSize × data-parallel ranks"
                ),
            );
        }
    }

    // Fit policy.
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

    if !errs.0.is_empty() {
        return Err(ValidationErrors(errs.0));
    }
    let model = model.expect("a model error would have returned above");
    // The stage the job runs at, written down: FSDP without zeroStage shards fully.
    let mut spec = spec.clone();
    spec.parallelism.zero_stage = Some(spec.parallelism.zero());
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

/// `peft` names a method that goes with the mode, on a model whose blocks
/// we know, with parameters in range; `checkpointEvery` is at least 1.
fn validate_peft(errs: &mut Errors, t: &crate::api::TrainingSpec, transformer: bool) {
    use crate::api::PeftMethod;
    if let Some(n) = t.checkpoint_every {
        errs.at_least("spec.training.checkpointEvery", n, 1);
        errs.at_most("spec.training.checkpointEvery", n, 1 << 16);
        if t.gradient_checkpointing == crate::api::Checkpointing::None {
            errs.push(
                "spec.training.checkpointEvery",
                "only used with gradientCheckpointing selective, op-selective or full",
            );
        }
    }
    let Some(p) = &t.peft else {
        return;
    };
    let path = "spec.training.peft";
    let method_ok = match p.method {
        PeftMethod::Galore => t.mode == TrainingMode::Full,
        _ => t.mode == TrainingMode::Adapter,
    };
    if !method_ok {
        let need = if p.method == PeftMethod::Galore {
            "mode: full"
        } else {
            "mode: adapter"
        };
        errs.push(
            &format!("{path}.method"),
            format!("{:?} needs {need}", p.method).to_lowercase(),
        );
    }
    if !transformer {
        errs.push(
            path,
            "needs a transformer model (preset, transformer or hfConfig); set trainableParameters with mode adapter instead",
        );
    }
    for (name, v, max) in [
        ("virtualTokens", p.virtual_tokens, 1u64 << 20),
        ("rank", p.rank, 1 << 16),
        ("layers", p.layers, 1 << 24),
    ] {
        if let Some(v) = v {
            errs.at_least(&format!("{path}.{name}"), v, 1);
            errs.at_most(&format!("{path}.{name}"), v, max);
        }
    }
    let uses = |field: bool, name: &str, methods: &[PeftMethod]| {
        (field && !methods.contains(&p.method)).then(|| {
            (
                format!("{path}.{name}"),
                format!(
                    "not used by method {:?}; it applies to {}",
                    p.method,
                    methods
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
                .to_lowercase(),
            )
        })
    };
    let misplaced = [
        uses(
            p.virtual_tokens.is_some(),
            "virtualTokens",
            &[PeftMethod::PromptTuning, PeftMethod::PrefixTuning],
        ),
        uses(
            p.rank.is_some(),
            "rank",
            &[PeftMethod::Vera, PeftMethod::Galore],
        ),
        uses(
            p.target_modules.is_some(),
            "targetModules",
            &[PeftMethod::Ia3, PeftMethod::Vera],
        ),
        uses(p.layers.is_some(), "layers", &[PeftMethod::LlamaAdapter]),
    ];
    for (field, reason) in misplaced.into_iter().flatten() {
        errs.push(&field, reason);
    }
    if let Some(targets) = &p.target_modules {
        if targets.is_empty() {
            errs.push(
                &format!("{path}.targetModules"),
                format!(
                    "must name at least one of {}",
                    block_projections().join(", ")
                ),
            );
        }
        for (i, m) in targets.iter().enumerate() {
            if !block_projections().contains(&m.as_str()) {
                errs.push(
                    &format!("{path}.targetModules[{i}]"),
                    format!(
                        "unknown module {m:?}; known: {}",
                        block_projections().join(", ")
                    ),
                );
            }
        }
    }
}

fn resolve_model(
    errs: &mut Errors,
    m: &ModelSpec,
    hint: Option<&str>,
) -> (Option<ResolvedModel>, String) {
    let given: Vec<&str> = [
        ("preset", m.preset.is_some()),
        ("transformer", m.transformer.is_some()),
        ("hfConfig", m.hf_config.is_some()),
        ("layers", m.layers.is_some()),
        ("custom", m.custom.is_some()),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| name)
    .collect();
    match given.len() {
        0 => {
            errs.push(
                "spec.model",
                "no model given; set exactly one of preset, transformer, hfConfig, layers, custom",
            );
            return (None, String::new());
        }
        1 => {}
        _ => {
            errs.push(
                "spec.model",
                format!(
                    "several model sources given ({}); set exactly one",
                    given.join(", ")
                ),
            );
            return (None, String::new());
        }
    }
    let hinted = match hint {
        None => None,
        Some(h) => match presets::find(h) {
            Some(p) => Some(p),
            // A vision preset's hint names what a layer list (or the same
            // preset) is; its dims are the layers themselves, nothing to add.
            None if crate::api::vision::find(h).is_some() => {
                let v = crate::api::vision::find(h).map(|v| v.name);
                let same = m
                    .preset
                    .as_deref()
                    .and_then(crate::api::vision::find)
                    .map(|p| p.name)
                    == v;
                if !(same || m.layers.is_some()) {
                    errs.push(
                        HINT_PATH,
                        format!(
                            "names the vision preset {} but is read only with spec.model.layers (or the same spec.model.preset)",
                            v.unwrap_or(h)
                        ),
                    );
                    return (None, String::new());
                }
                None
            }
            None => {
                errs.push(
                    HINT_PATH,
                    format!(
                        "unknown preset {h:?}; known: {}",
                        presets::names()
                            .chain(crate::api::vision::names())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                return (None, String::new());
            }
        },
    };
    if let Some(h) = hinted
        && m.transformer.is_none()
        && m.preset.as_deref().and_then(presets::find).map(|p| p.name) != Some(h.name)
    {
        errs.push(
            HINT_PATH,
            format!(
                "names {} but is read only with spec.model.transformer (or the same spec.model.preset)",
                h.name
            ),
        );
        return (None, String::new());
    }
    if let Some(name) = &m.preset {
        if let Some(p) = presets::find(name) {
            return (Some(ResolvedModel::Transformer(p.arch)), p.name.to_string());
        }
        return match crate::api::vision::find(name) {
            Some(v) => match v.analyze(m.input_shape.as_deref(), m.num_labels) {
                Ok(stack) => (
                    Some(ResolvedModel::Layers(Box::new(stack))),
                    v.name.to_string(),
                ),
                Err(problems) => {
                    for (path, reason) in problems {
                        errs.push(&path, reason);
                    }
                    (None, String::new())
                }
            },
            None => {
                errs.push(
                    "spec.model.preset",
                    format!(
                        "unknown preset {name:?}; known: {}",
                        presets::names()
                            .chain(crate::api::vision::names())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                (None, String::new())
            }
        };
    }
    if let Some(t) = &m.transformer {
        let arch = transformer_arch(errs, t, hinted);
        let name = format!("transformer {}×{}", t.layers, t.hidden_size);
        return (arch.map(ResolvedModel::Transformer), name);
    }
    if let Some(config) = &m.hf_config {
        return match crate::api::hf::arch_from_config(config) {
            Ok(arch) => {
                let name = config
                    .get("_name_or_path")
                    .and_then(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .unwrap_or_else(|| {
                        let t = config
                            .get("model_type")
                            .and_then(|v| v.as_str())
                            .unwrap_or("");
                        format!("{t} {}×{}", arch.layers, arch.hidden)
                    });
                (Some(ResolvedModel::Transformer(arch)), name)
            }
            Err(problems) => {
                for (path, reason) in problems {
                    errs.push(&path, reason);
                }
                (None, String::new())
            }
        };
    }
    if let Some(layers) = &m.layers {
        let Some(shape) = &m.input_shape else {
            errs.push(
                "spec.model.inputShape",
                "required with spec.model.layers (the per-sample input, e.g. [3, 224, 224])",
            );
            return (None, String::new());
        };
        return match crate::api::layers::analyze(layers, shape) {
            Ok(stack) => {
                let name = format!("layers ({} layers)", stack.layer_count);
                (Some(ResolvedModel::Layers(Box::new(stack))), name)
            }
            Err(problems) => {
                for (path, reason) in problems {
                    errs.push(&path, reason);
                }
                (None, String::new())
            }
        };
    }
    if let Some(c) = &m.custom {
        let before = errs.0.len();
        let parameters = count_from_f64(
            errs,
            "spec.model.custom.parameters",
            c.parameters,
            1.0,
            MAX_PARAMETERS,
        );
        let act = count_from_f64(
            errs,
            "spec.model.custom.activationBytesPerSample",
            c.activation_bytes_per_sample,
            0.0,
            MAX_BYTES,
        );
        if errs.0.len() != before {
            return (None, String::new());
        }
        let (Some(parameters), Some(activation_bytes_per_sample)) = (parameters, act) else {
            return (None, String::new());
        };
        let name = format!("custom {:.2}B", parameters as f64 / 1e9);
        return (
            Some(ResolvedModel::Custom {
                parameters,
                activation_bytes_per_sample,
            }),
            name,
        );
    }
    (None, String::new())
}

const HINT_PATH: &str = "metadata.annotations[vramguard.io/preset-hint]";

/// The dims a spelled-out transformer shares with `preset`, or what differs.
fn hint_mismatches(a: &Arch, p: &presets::Preset) -> Vec<String> {
    let b = &p.arch;
    let dims = [
        ("layers", a.layers, b.layers),
        ("hiddenSize", a.hidden, b.hidden),
        ("attentionHeads", a.heads, b.heads),
        ("kvHeads", a.kv_heads, b.kv_heads),
        ("headDim", a.head_dim, b.head_dim),
        ("intermediateSize", a.intermediate, b.intermediate),
        ("vocabSize", a.vocab, b.vocab),
        ("experts", a.experts, b.experts),
        (
            "sharedIntermediateSize",
            a.shared_intermediate,
            b.shared_intermediate,
        ),
        ("denseLayers", a.dense_layers, b.dense_layers),
        (
            "denseIntermediateSize",
            a.dense_intermediate,
            b.dense_intermediate,
        ),
    ];
    let mut out: Vec<String> = dims
        .iter()
        .filter(|(_, ours, theirs)| ours != theirs)
        .map(|(name, ours, theirs)| format!("{name} {ours} (the preset: {theirs})"))
        .collect();
    if a.mlp != b.mlp {
        out.push(format!("mlp {:?} (the preset: {:?})", a.mlp, b.mlp).to_lowercase());
    }
    if a.kind != b.kind {
        out.push(format!("kind {:?} (the preset: {:?})", a.kind, b.kind).to_lowercase());
    }
    out
}

fn transformer_arch(
    errs: &mut Errors,
    t: &TransformerSpec,
    hint: Option<&presets::Preset>,
) -> Option<Arch> {
    let before = errs.0.len();
    let path = "spec.model.transformer";
    const MAX_DIM: u64 = 1 << 24;
    let dims = [
        ("layers", t.layers),
        ("hiddenSize", t.hidden_size),
        ("attentionHeads", t.attention_heads),
        ("vocabSize", t.vocab_size),
    ];
    for (name, v) in dims {
        errs.at_least(&format!("{path}.{name}"), v, 1);
        errs.at_most(&format!("{path}.{name}"), v, MAX_DIM);
    }
    let heads = t.attention_heads;
    let kv_heads = t.kv_heads.unwrap_or(heads);
    errs.at_least(&format!("{path}.kvHeads"), kv_heads, 1);
    if kv_heads > 0 && !heads.is_multiple_of(kv_heads) {
        errs.push(
            &format!("{path}.kvHeads"),
            format!("{kv_heads} does not divide attentionHeads {heads}"),
        );
    }
    let head_dim = match t.head_dim {
        Some(d) => {
            errs.at_least(&format!("{path}.headDim"), d, 1);
            errs.at_most(&format!("{path}.headDim"), d, MAX_DIM);
            d
        }
        None => {
            if heads > 0 && !t.hidden_size.is_multiple_of(heads) {
                errs.push(
                    &format!("{path}.attentionHeads"),
                    format!(
                        "{heads} does not divide hiddenSize {}; set headDim if the model's heads are not hiddenSize / heads wide",
                        t.hidden_size
                    ),
                );
            }
            t.hidden_size.checked_div(heads).unwrap_or(0)
        }
    };
    let intermediate = match t.intermediate_size {
        Some(i) => {
            errs.at_least(&format!("{path}.intermediateSize"), i, 1);
            errs.at_most(&format!("{path}.intermediateSize"), i, MAX_DIM);
            i
        }
        None => t.hidden_size.saturating_mul(4),
    };
    if t.experts == 0 && t.experts_per_token != 0 {
        errs.push(
            &format!("{path}.expertsPerToken"),
            format!("{} needs experts > 0", t.experts_per_token),
        );
    }
    if t.experts > 0 && (t.experts_per_token == 0 || t.experts_per_token > t.experts) {
        errs.push(
            &format!("{path}.expertsPerToken"),
            format!(
                "{} is not allowed; must be between 1 and experts ({})",
                t.experts_per_token, t.experts
            ),
        );
    }
    errs.at_most(&format!("{path}.experts"), t.experts, 1 << 16);
    if t.experts == 0 {
        for (name, v) in [
            ("sharedIntermediateSize", t.shared_intermediate_size),
            ("denseLayers", t.dense_layers),
        ] {
            if v != 0 {
                errs.push(
                    &format!("{path}.{name}"),
                    format!("{v} needs experts > 0 (it describes an MoE model); leave it out for a dense model"),
                );
            }
        }
    }
    errs.at_most(
        &format!("{path}.sharedIntermediateSize"),
        t.shared_intermediate_size,
        MAX_DIM,
    );
    let dense_intermediate = match (t.dense_layers, t.dense_intermediate_size) {
        (0, None) => 0,
        (0, Some(_)) => {
            errs.push(
                &format!("{path}.denseIntermediateSize"),
                "only used with denseLayers > 0",
            );
            0
        }
        (n, d) => {
            if n >= t.layers {
                errs.push(
                    &format!("{path}.denseLayers"),
                    format!(
                        "{n} is not allowed; must be fewer than layers ({}): an MoE model with no routed block is a dense model",
                        t.layers
                    ),
                );
            }
            match d {
                Some(d) => {
                    errs.at_least(&format!("{path}.denseIntermediateSize"), d, 1);
                    errs.at_most(&format!("{path}.denseIntermediateSize"), d, MAX_DIM);
                    d
                }
                None => {
                    errs.push(
                        &format!("{path}.denseIntermediateSize"),
                        format!("missing; {n} dense blocks need their MLP width (DeepSeek's intermediate_size)"),
                    );
                    0
                }
            }
        }
    };
    errs.at_most(&format!("{path}.maxPositions"), t.max_positions, MAX_DIM);
    let decoder_layers = match (t.kind, t.decoder_layers) {
        (TransformerKind::EncoderDecoder, d) => {
            let d = d.unwrap_or(t.layers);
            errs.at_least(&format!("{path}.decoderLayers"), d, 1);
            errs.at_most(&format!("{path}.decoderLayers"), d, MAX_DIM);
            d
        }
        (_, Some(_)) => {
            errs.push(
                &format!("{path}.decoderLayers"),
                "only used with kind: encoder-decoder",
            );
            0
        }
        (_, None) => 0,
    };
    if errs.0.len() != before {
        return None;
    }
    let mlp = match t.mlp {
        MlpKind::Gated => Mlp::Gated,
        MlpKind::Standard => Mlp::Standard,
    };
    let norm = match t.norm {
        Some(NormKind::Layernorm) => Norm::LayerNorm,
        Some(NormKind::Rmsnorm) => Norm::RmsNorm,
        None if mlp == Mlp::Gated => Norm::RmsNorm,
        None => Norm::LayerNorm,
    };
    let mut arch = Arch {
        kind: match t.kind {
            TransformerKind::Decoder => Kind::Decoder,
            TransformerKind::Encoder => Kind::Encoder,
            TransformerKind::EncoderDecoder => Kind::EncoderDecoder,
        },
        layers: t.layers,
        decoder_layers,
        hidden: t.hidden_size,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab: t.vocab_size,
        mlp,
        // The contract does not say the activation function: one op.
        act: Act::Fused,
        tied: t.tied_embeddings,
        experts: t.experts,
        experts_per_token: t.experts_per_token,
        norm,
        qkv_bias: t.bias,
        linear_bias: t.bias,
        max_positions: t.max_positions,
        type_vocab: 0,
        parallel_block: t.parallel_block.unwrap_or(false),
        post_norms: t.post_norms.unwrap_or(false),
        attention_softcap: t.attention_softcap.unwrap_or(false),
        final_softcap: t.final_logit_softcap.unwrap_or(false),
        shared_intermediate: t.shared_intermediate_size,
        dense_layers: t.dense_layers,
        dense_intermediate,
    };
    if let Some(p) = hint {
        let differ = hint_mismatches(&arch, p);
        if !differ.is_empty() {
            errs.push(
                HINT_PATH,
                format!(
                    "names {} but spec.model.transformer differs: {}",
                    p.name,
                    differ.join(", ")
                ),
            );
            return None;
        }
        // What the dims cannot say comes from the preset unless spelled out.
        let b = &p.arch;
        if t.norm.is_none() {
            arch.norm = b.norm;
        }
        arch.parallel_block = t.parallel_block.unwrap_or(b.parallel_block);
        arch.post_norms = t.post_norms.unwrap_or(b.post_norms);
        arch.attention_softcap = t.attention_softcap.unwrap_or(b.attention_softcap);
        arch.final_softcap = t.final_logit_softcap.unwrap_or(b.final_softcap);
    }
    Some(arch)
}

/// The YAML spelling of a quantization.
pub fn quantization_name(q: Quantization) -> &'static str {
    match q {
        Quantization::None => "none",
        Quantization::Int8 => "int8",
        Quantization::Nf4 => "nf4",
        Quantization::Nf4Double => "nf4-double",
        Quantization::Gptq => "gptq",
        Quantization::Awq => "awq",
    }
}

/// What a model config's `quantization_config` says: the method when it is
/// one the estimator knows (gptq, awq), with its `bits` and `group_size`.
/// bitsandbytes configs are left to `training.quantization`, which says the
/// same thing.
type ConfigQuantization = (Quantization, Option<u64>, Option<i64>);

fn hf_quantization(
    config: &serde_json::Map<String, serde_json::Value>,
    errs: &mut Errors,
) -> Option<ConfigQuantization> {
    const PATH: &str = "spec.model.hfConfig.quantization_config";
    let qc = config.get("quantization_config")?;
    let Some(qc) = qc.as_object() else {
        errs.push(
            PATH,
            "must be an object (the checkpoint's quantization_config)",
        );
        return None;
    };
    let method = match qc.get("quant_method").and_then(|m| m.as_str()) {
        Some("gptq") => Quantization::Gptq,
        Some("awq") => Quantization::Awq,
        _ => return None,
    };
    let bits = match qc.get("bits") {
        None => None,
        Some(b) => match b.as_u64() {
            Some(b) => Some(b),
            None => {
                errs.push(
                    &format!("{PATH}.bits"),
                    format!("{b} is not a whole number of bits; use 2, 3, 4 or 8"),
                );
                None
            }
        },
    };
    let group = match qc.get("group_size") {
        None => None,
        Some(g) => match g.as_i64() {
            Some(g) => Some(g),
            None => {
                errs.push(
                    &format!("{PATH}.group_size"),
                    format!(
                        "{g} is not a whole number; use -1 or a group of input rows such as 128"
                    ),
                );
                None
            }
        },
    };
    Some((method, bits, group))
}

/// The bits and group size of a gptq or awq checkpoint: the spec's fields,
/// else its config's, else 4 bits in groups of 128 (the GPTQ and AWQ
/// defaults: optimum's `GPTQConfig`, AutoAWQ's `quant_config`).
fn quantization_format(
    t: &crate::api::TrainingSpec,
    q: Quantization,
    config: Option<ConfigQuantization>,
    errs: &mut Errors,
) -> (u8, Option<u64>) {
    let config = config.filter(|(m, _, _)| *m == q);
    if !q.is_prequantized() {
        for (field, set) in [
            (
                "spec.training.quantizationBits",
                t.quantization_bits.is_some(),
            ),
            (
                "spec.training.quantizationGroupSize",
                t.quantization_group_size.is_some(),
            ),
        ] {
            if set {
                errs.push(
                    field,
                    format!(
                        "describes a gptq or awq checkpoint, but quantization is {}; remove it or set quantization: gptq or awq",
                        quantization_name(q)
                    ),
                );
            }
        }
        return (4, None);
    }
    let bits = t
        .quantization_bits
        .map(u64::from)
        .or(config.and_then(|(_, b, _)| b))
        .unwrap_or(4);
    let allowed: &[u64] = if q == Quantization::Awq {
        &[4]
    } else {
        &[2, 3, 4, 8]
    };
    if !allowed.contains(&bits) {
        errs.push(
            "spec.training.quantizationBits",
            format!(
                "{bits} bits is not a {} format; use {}",
                quantization_name(q),
                allowed
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    let group = t
        .quantization_group_size
        .or(config.and_then(|(_, _, g)| g))
        .unwrap_or(128);
    let group = match group {
        -1 => None,
        g if (1..=MAX_QUANTIZATION_GROUP).contains(&g) => Some(g as u64),
        g => {
            errs.push(
                "spec.training.quantizationGroupSize",
                format!(
                    "{g} is not a group size; use -1 (one group per row) or 1 to {MAX_QUANTIZATION_GROUP} input rows (128 is usual)"
                ),
            );
            Some(128)
        }
    };
    (bits.min(8) as u8, group)
}

/// The largest quantization group a checkpoint is checked against.
const MAX_QUANTIZATION_GROUP: i64 = 1 << 20;
