//! The knobs a plan sets ([`Settings`]) and the one way to change them on a
//! [`ValidatedJob`]: [`ValidatedJob::with_settings`], which re-runs the checks
//! of validation that read those knobs, so a changed job is as valid as one
//! written that way. The checks live here and `validate` calls the same ones.

use serde::Serialize;

use super::{Errors, MAX_MICRO_BATCH, MAX_SEQUENCE_LENGTH, ValidatedJob, ValidationErrors};
use crate::api::training_job::DEFAULT_SEQUENCE_LENGTH;
use crate::api::{
    AdjustableField, Checkpointing, FitMode, Loss, Offload, Optimizer, ParallelismSpec, PlanStatus,
    Precision, ResolvedModel, Strategy, TrainingSpec, WeightsLoad,
};

/// Every field a fit policy can allow, in the order changes are listed.
pub const ALL_FIELDS: [AdjustableField; 6] = [
    AdjustableField::MicroBatchSize,
    AdjustableField::GradientCheckpointing,
    AdjustableField::Precision,
    AdjustableField::Optimizer,
    AdjustableField::ZeroStage,
    AdjustableField::Loss,
];

/// The knobs a plan sets (the `status.plan` fields, plus the loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub micro_batch_size: u64,
    pub gradient_accumulation_steps: u64,
    pub precision: Precision,
    pub gradient_checkpointing: Checkpointing,
    pub optimizer: Optimizer,
    pub zero_stage: u8,
    pub loss: Loss,
}

impl Settings {
    /// The job's settings as written.
    pub fn of(job: &ValidatedJob) -> Settings {
        let t = &job.spec.training;
        Settings {
            micro_batch_size: t.micro_batch_size,
            gradient_accumulation_steps: job.gradient_accumulation_steps,
            precision: t.precision,
            gradient_checkpointing: t.gradient_checkpointing,
            optimizer: t.optimizer,
            zero_stage: job.spec.parallelism.zero(),
            loss: t.loss,
        }
    }

    /// `status.plan` for these settings, with the changes that led to them.
    pub fn to_status(&self, changes: Vec<String>) -> PlanStatus {
        PlanStatus {
            micro_batch_size: self.micro_batch_size,
            gradient_accumulation_steps: self.gradient_accumulation_steps,
            precision: self.precision,
            gradient_checkpointing: self.gradient_checkpointing,
            optimizer: self.optimizer,
            zero_stage: self.zero_stage,
            loss: self.loss,
            expandable_segments: false,
            changes,
        }
    }

    /// Fields whose value differs from `other`.
    pub fn changed_fields(&self, other: &Settings) -> Vec<AdjustableField> {
        ALL_FIELDS
            .iter()
            .copied()
            .filter(|f| match f {
                AdjustableField::MicroBatchSize => {
                    self.micro_batch_size != other.micro_batch_size
                        || self.gradient_accumulation_steps != other.gradient_accumulation_steps
                }
                AdjustableField::GradientCheckpointing => {
                    self.gradient_checkpointing != other.gradient_checkpointing
                }
                AdjustableField::Precision => self.precision != other.precision,
                AdjustableField::Optimizer => self.optimizer != other.optimizer,
                AdjustableField::ZeroStage => self.zero_stage != other.zero_stage,
                AdjustableField::Loss => self.loss != other.loss,
            })
            .collect()
    }

    /// `field: from → to` for every change from `from`, in [`ALL_FIELDS`] order.
    pub fn changes_from(&self, from: &Settings) -> Vec<String> {
        let mut out = Vec::new();
        let mut push = |field: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{field}: {a} → {b}"));
            }
        };
        push(
            "microBatchSize",
            from.micro_batch_size.to_string(),
            self.micro_batch_size.to_string(),
        );
        push(
            "gradientAccumulationSteps",
            from.gradient_accumulation_steps.to_string(),
            self.gradient_accumulation_steps.to_string(),
        );
        push(
            "gradientCheckpointing",
            yaml_name(&from.gradient_checkpointing),
            yaml_name(&self.gradient_checkpointing),
        );
        push(
            "precision",
            yaml_name(&from.precision),
            yaml_name(&self.precision),
        );
        push(
            "optimizer",
            yaml_name(&from.optimizer),
            yaml_name(&self.optimizer),
        );
        push(
            "zeroStage",
            from.zero_stage.to_string(),
            self.zero_stage.to_string(),
        );
        push("loss", yaml_name(&from.loss), yaml_name(&self.loss));
        out
    }
}

/// The YAML spelling of an enum value.
pub fn yaml_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl ValidatedJob {
    /// This job with `settings` in place of its own, checked again by every rule of
    /// validation that reads them; a change that would make the job invalid is refused
    /// with the problems it causes, each at the field it breaks.
    ///
    /// The plan's `zeroStage` is what the job runs at (`zeroStage` is read before FSDP's
    /// `sharding`), so it is not held to agree with `sharding` as a written one is; nor is
    /// `fitPolicy.minMicroBatchSize` or `globalBatchSize`, which bound the planner's search
    /// (advice and `vramguard max` look past them on purpose), not what the job is.
    pub fn with_settings(&self, settings: &Settings) -> Result<ValidatedJob, ValidationErrors> {
        let mut job = self.clone();
        let t = &mut job.spec.training;
        t.micro_batch_size = settings.micro_batch_size;
        t.precision = settings.precision;
        t.gradient_checkpointing = settings.gradient_checkpointing;
        t.optimizer = settings.optimizer;
        t.loss = settings.loss;
        job.spec.parallelism.zero_stage = Some(settings.zero_stage);
        job.gradient_accumulation_steps = settings.gradient_accumulation_steps;

        let mut errs = Errors(Vec::new());
        let (t, p) = (&job.spec.training, &job.spec.parallelism);
        micro_batch(&mut errs, t.micro_batch_size);
        zero_stage(&mut errs, p);
        offload(&mut errs, p);
        if settings.gradient_accumulation_steps == 0 {
            errs.push(
                "gradientAccumulationSteps",
                "0 is not allowed; minimum is 1",
            );
        }
        offload_gradients(&mut errs, p, settings.gradient_accumulation_steps);
        checkpoint_every(&mut errs, t);
        weights_load(&mut errs, t);
        super::float8::float8(&mut errs, t, p, job.quantization);
        errs.into_result(job)
    }

    /// This job at `sequence_length` tokens per sample, checked again by every rule of
    /// validation that reads the length.
    pub fn with_sequence_length(
        &self,
        sequence_length: u64,
    ) -> Result<ValidatedJob, ValidationErrors> {
        let mut job = self.clone();
        job.spec.training.sequence_length = Some(sequence_length);
        let mut errs = Errors(Vec::new());
        let t = &job.spec.training;
        sequence_length_range(&mut errs, t.seq_len());
        position_table(&mut errs, &job.model, &job.model_name, t);
        if matches!(job.model, ResolvedModel::Transformer(_)) {
            context_parallel_divides(&mut errs, &job.spec.parallelism, t.seq_len());
        }
        generation_cache(&mut errs, t);
        errs.into_result(job)
    }

    /// This job under fit policy `mode` (nothing else reads the mode).
    pub fn with_fit_mode(&self, mode: FitMode) -> ValidatedJob {
        let mut job = self.clone();
        job.spec.fit_policy.mode = mode;
        job
    }
}

impl Errors {
    fn into_result(self, job: ValidatedJob) -> Result<ValidatedJob, ValidationErrors> {
        if self.0.is_empty() {
            Ok(job)
        } else {
            Err(ValidationErrors(self.0))
        }
    }
}

// ---- The checks validation and the `with_` methods share ----

pub(super) fn micro_batch(errs: &mut Errors, micro: u64) {
    errs.at_least("spec.training.microBatchSize", micro, 1);
    errs.at_most("spec.training.microBatchSize", micro, MAX_MICRO_BATCH);
}

pub(super) fn sequence_length_range(errs: &mut Errors, len: u64) {
    errs.at_least("spec.training.sequenceLength", len, 1);
    errs.at_most("spec.training.sequenceLength", len, MAX_SEQUENCE_LENGTH);
}

/// Positions the model can embed: a learned table (GPT-2's `wpe` of
/// `n_positions`, BERT's `position_embeddings` of `max_position_embeddings`)
/// has one row per position, and a position past it is an index error on the
/// GPU (`IndexError`/device-side assert), not a longer step. `None`: the
/// positions are computed (RoPE, ALiBi, T5's relative buckets), any length runs.
pub(super) fn learned_positions(model: &ResolvedModel) -> Option<u64> {
    match model {
        ResolvedModel::Transformer(a) if a.max_positions > 0 => Some(a.max_positions),
        _ => None,
    }
}

/// The length a job runs at: as written, else 2048 or the model's learned
/// position table where that is shorter.
pub(super) fn resolved_sequence_length(t: &TrainingSpec, model: Option<&ResolvedModel>) -> u64 {
    match (t.sequence_length, model.and_then(learned_positions)) {
        (Some(len), _) => len,
        (None, Some(table)) => table.min(DEFAULT_SEQUENCE_LENGTH),
        (None, None) => DEFAULT_SEQUENCE_LENGTH,
    }
}

/// A sample (with what generation adds to it) must fit the model's learned
/// position table.
pub(super) fn position_table(
    errs: &mut Errors,
    model: &ResolvedModel,
    model_name: &str,
    t: &TrainingSpec,
) {
    let Some(table) = learned_positions(model) else {
        return;
    };
    let len = resolved_sequence_length(t, Some(model));
    // Only inference generates (generation under training is refused on its own).
    let new_tokens = match (&t.generation, t.mode) {
        (Some(g), crate::api::TrainingMode::Inference) => g.new_tokens,
        _ => 0,
    };
    if len > table {
        errs.push(
            "spec.training.sequenceLength",
            format!(
                "{len} is past {model_name}'s learned position table of {table} positions (a position past it cannot be embedded); use at most {table}"
            ),
        );
    } else if len.saturating_add(new_tokens) > table {
        errs.push(
            "spec.training.generation.newTokens",
            format!(
                "{new_tokens} new tokens after a {len}-token prompt pass {model_name}'s learned position table of {table} positions; use at most {} new tokens, or a prompt of at most {} tokens",
                table - len,
                table.saturating_sub(new_tokens)
            ),
        );
    }
}

pub(super) fn zero_stage(errs: &mut Errors, p: &ParallelismSpec) {
    if let Some(z) = p.zero_stage
        && z > 3
    {
        errs.push(
            "spec.parallelism.zeroStage",
            format!("{z} is not a ZeRO stage; allowed: 0, 1, 2, 3"),
        );
    }
}

pub(super) fn offload(errs: &mut Errors, p: &ParallelismSpec) {
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
}

pub(super) fn offload_gradients(errs: &mut Errors, p: &ParallelismSpec, accumulation: u64) {
    if !p.offload_gradients {
        return;
    }
    if p.offload != Offload::Optimizer || p.strategy != Strategy::Ddp {
        errs.push(
            "spec.parallelism.offloadGradients",
            "is torchao's CPUOffloadOptimizer option; it needs offload: optimizer and strategy: ddp",
        );
    } else if accumulation > 1 {
        errs.push(
            "spec.parallelism.offloadGradients",
            format!(
                "frees each gradient once it is on the host, which gradient accumulation ({accumulation} steps) cannot do; set it false or globalBatchSize to microBatchSize × data-parallel ranks"
            ),
        );
    }
}

pub(super) fn checkpoint_every(errs: &mut Errors, t: &TrainingSpec) {
    if let Some(n) = t.checkpoint_every {
        errs.at_least("spec.training.checkpointEvery", n, 1);
        errs.at_most("spec.training.checkpointEvery", n, 1 << 16);
        if t.gradient_checkpointing == Checkpointing::None {
            errs.push(
                "spec.training.checkpointEvery",
                "only used with gradientCheckpointing selective, op-selective or full",
            );
        }
    }
}

/// `weightsLoad: fp32-cast` says 16-bit weights were cast from an fp32 build;
/// a mixed or fp32 precision trains the fp32 weights themselves, so nothing is
/// cast and the field would say nothing: refused, as a setting the job does
/// not use is elsewhere.
pub(super) fn weights_load(errs: &mut Errors, t: &TrainingSpec) {
    let pure16 = matches!(t.precision, Precision::Bf16 | Precision::Fp16);
    if t.weights_load == Some(WeightsLoad::Fp32Cast) && !pure16 {
        errs.push(
            "spec.training.weightsLoad",
            format!(
                "fp32-cast is only used with precision bf16 or fp16 (16-bit weights cast from an fp32 build); precision {} trains fp32 weights, nothing is cast: set weightsLoad dtype or leave it out, or precision bf16 or fp16",
                yaml_name(&t.precision)
            ),
        );
    }
}

pub(super) fn context_parallel_divides(errs: &mut Errors, p: &ParallelismSpec, len: u64) {
    if p.context_parallel > 1 && !len.is_multiple_of(p.context_parallel) {
        errs.push(
            "spec.parallelism.contextParallel",
            format!(
                "{} does not divide sequenceLength {len}",
                p.context_parallel
            ),
        );
    }
}

pub(super) fn generation_cache(errs: &mut Errors, t: &TrainingSpec) {
    if let Some(g) = &t.generation
        && let Some(len) = g.cache_length
    {
        cache_holds(errs, t.seq_len(), g.new_tokens, len);
    }
}

pub(super) fn cache_holds(errs: &mut Errors, sequence_length: u64, new_tokens: u64, len: u64) {
    let needed = sequence_length.saturating_add(new_tokens);
    if len < needed {
        errs.push(
            "spec.training.generation.cacheLength",
            format!(
                "{len} cannot hold the prompt and the generated tokens; use at least sequenceLength + newTokens = {needed}, or leave it out for a cache that grows"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::test_job as job;

    fn problems(r: Result<ValidatedJob, ValidationErrors>) -> Vec<(String, String)> {
        match r {
            Ok(_) => panic!("a change that makes the job invalid was taken"),
            Err(e) => e.0.into_iter().map(|f| (f.path, f.reason)).collect(),
        }
    }

    #[test]
    fn settings_the_job_takes_are_applied_and_read_back() {
        let j = job("
model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 8, globalBatchSize: 64, precision: fp32}
");
        let written = Settings::of(&j);
        assert_eq!(j.with_settings(&written).as_ref(), Ok(&j));
        let s = Settings {
            micro_batch_size: 2,
            gradient_accumulation_steps: 32,
            precision: Precision::Bf16Mixed,
            gradient_checkpointing: Checkpointing::Full,
            optimizer: Optimizer::Adamw8bit,
            zero_stage: 1,
            loss: Loss::Chunked,
        };
        let k = j.with_settings(&s).expect("the job takes these settings");
        assert_eq!(Settings::of(&k), s);
        assert_eq!(k.spec().training.micro_batch_size, 2);
        assert_eq!(k.spec().parallelism.zero_stage, Some(1));
        // What the settings do not name is kept.
        assert_eq!(
            k.spec().training.sequence_length,
            j.spec().training.sequence_length
        );
        assert_eq!(k.total_parameters, j.total_parameters);
    }

    #[test]
    fn settings_that_make_the_job_invalid_are_refused_at_the_field_they_break() {
        let j = job("
model: {preset: llama-3.1-8b}
training: {microBatchSize: 4, gradientCheckpointing: full, checkpointEvery: 2}
parallelism: {gpus: 8, strategy: deepspeed, zeroStage: 3, offload: optimizer-and-parameters}
");
        let written = Settings::of(&j);
        assert_eq!(
            problems(j.with_settings(&Settings {
                zero_stage: 2,
                ..written
            })),
            vec![(
                "spec.parallelism.offload".to_string(),
                "parameter offload needs zeroStage: 3".to_string()
            )]
        );
        assert_eq!(
            problems(j.with_settings(&Settings {
                micro_batch_size: 0,
                gradient_accumulation_steps: 0,
                zero_stage: 4,
                gradient_checkpointing: Checkpointing::None,
                ..written
            })),
            vec![
                (
                    "spec.training.microBatchSize".to_string(),
                    "0 is not allowed; minimum is 1".to_string()
                ),
                (
                    "spec.parallelism.zeroStage".to_string(),
                    "4 is not a ZeRO stage; allowed: 0, 1, 2, 3".to_string()
                ),
                (
                    "spec.parallelism.offload".to_string(),
                    "parameter offload needs zeroStage: 3".to_string()
                ),
                (
                    "gradientAccumulationSteps".to_string(),
                    "0 is not allowed; minimum is 1".to_string()
                ),
                (
                    "spec.training.checkpointEvery".to_string(),
                    "only used with gradientCheckpointing selective, op-selective or full"
                        .to_string()
                ),
            ]
        );

        let offloading = job("
model: {preset: llama-3.1-8b}
parallelism: {gpus: 2, offload: optimizer, offloadGradients: true}
");
        let accumulating = Settings {
            gradient_accumulation_steps: 2,
            ..Settings::of(&offloading)
        };
        let p = problems(offloading.with_settings(&accumulating));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "spec.parallelism.offloadGradients");
        assert!(p[0].1.contains("gradient accumulation (2 steps)"), "{p:?}");
    }

    #[test]
    fn a_precision_that_casts_nothing_is_refused_beside_an_fp32_cast() {
        let j = job("
model: {preset: llama-3.1-8b}
training: {mode: lora, precision: bf16, weightsLoad: fp32-cast}
");
        let written = Settings::of(&j);
        let fp16 = Settings {
            precision: Precision::Fp16,
            ..written
        };
        assert!(j.with_settings(&fp16).is_ok());
        for precision in [Precision::Bf16Mixed, Precision::Fp32] {
            let p = problems(j.with_settings(&Settings {
                precision,
                ..written
            }));
            assert_eq!(p.len(), 1, "{p:?}");
            assert_eq!(p[0].0, "spec.training.weightsLoad");
            let named = format!("precision {} trains fp32 weights", yaml_name(&precision));
            assert!(p[0].1.contains(&named), "{p:?}");
        }
        // Without the declaration any precision is taken.
        let plain = job("
model: {preset: llama-3.1-8b}
training: {mode: lora, precision: bf16}
");
        let mixed = Settings {
            precision: Precision::Bf16Mixed,
            ..Settings::of(&plain)
        };
        assert!(plain.with_settings(&mixed).is_ok());
    }

    #[test]
    fn a_sequence_length_the_job_does_not_take_is_refused() {
        let j = job("
model: {preset: llama-3.1-8b}
training: {sequenceLength: 4096}
parallelism: {gpus: 2, contextParallel: 2}
");
        assert_eq!(
            j.with_sequence_length(8192)
                .map(|k| k.spec().training.seq_len()),
            Ok(8192)
        );
        assert_eq!(
            problems(j.with_sequence_length(4097)),
            vec![(
                "spec.parallelism.contextParallel".to_string(),
                "2 does not divide sequenceLength 4097".to_string()
            )]
        );
        assert_eq!(
            problems(j.with_sequence_length(0))[0].0,
            "spec.training.sequenceLength"
        );
        let generating = job("
model: {preset: llama-3.1-8b}
training: {mode: inference, sequenceLength: 1024, generation: {newTokens: 256, cacheLength: 2048}}
");
        assert!(generating.with_sequence_length(1792).is_ok());
        assert_eq!(
            problems(generating.with_sequence_length(1793))[0].0,
            "spec.training.generation.cacheLength"
        );
    }

    fn refused(yaml: &str) -> Vec<(String, String)> {
        let spec: crate::api::TrainingJobSpec = serde_saphyr::from_str(yaml).expect("YAML parses");
        problems(crate::api::validate(&spec))
    }

    #[test]
    fn a_learned_position_table_bounds_the_length_and_its_default() {
        // Unwritten, the length is 2048, or the table where it is shorter.
        let gpt2 = job("model: {preset: gpt2}");
        assert_eq!(gpt2.spec().training.sequence_length, Some(1024));
        let bert = job("model: {preset: bert-base}");
        assert_eq!(bert.spec().training.sequence_length, Some(512));
        let llama = job("model: {preset: llama-3.1-8b}");
        assert_eq!(llama.spec().training.sequence_length, Some(2048));
        // Computed positions (RoPE) take any length; a table does not.
        assert!(llama.with_sequence_length(65_536).is_ok());
        assert!(gpt2.with_sequence_length(1024).is_ok());
        assert_eq!(
            problems(gpt2.with_sequence_length(1025)),
            vec![(
                "spec.training.sequenceLength".to_string(),
                "1025 is past gpt2's learned position table of 1024 positions (a position past it cannot be embedded); use at most 1024".to_string()
            )]
        );
        assert_eq!(
            refused("model: {preset: gpt2}\ntraining: {sequenceLength: 2048}")[0].0,
            "spec.training.sequenceLength"
        );
        // Generation counts: the prompt and every new token take a position.
        let long = refused(
            "model: {preset: gpt2}\ntraining: {mode: inference, sequenceLength: 1000, generation: {newTokens: 100}}",
        );
        assert_eq!(long[0].0, "spec.training.generation.newTokens");
        assert!(
            long[0]
                .1
                .contains("use at most 24 new tokens, or a prompt of at most 924 tokens"),
            "{long:?}"
        );
    }
}
