//! Shrink: the cheapest change a job's fit policy allows that makes it fit one
//! GPU, and when none does, what would (`advice.rs`: more allowed, or a bigger
//! GPU). Pure: it calls the estimator on modified copies of the job, never I/O.
//!
//! The search walks every combination of the discrete knobs (checkpointing,
//! precision, optimizer, ZeRO stage, loss) in increasing order of their cost
//! (`cost.rs`) and, per combination, binary-searches the largest micro-batch
//! that fits, taking estimated memory not to decrease as the micro-batch grows.
//! The written micro-batch is tried on its own first: with accumulation 1 it
//! holds no accumulated gradients, so it can fit where a smaller one does not.
//! Every plan returned was estimated and fits; where the estimate is not
//! monotone the search can miss a larger micro-batch, never return one that
//! does not fit. It stops once a combination's knob cost alone is no better
//! than the best plan found, since a smaller micro-batch only adds to it. The
//! effective batch is kept exactly: a new micro-batch divides micro ×
//! accumulation as written (never above the written micro-batch) and the
//! accumulation steps make up the rest.

use super::settings::{ALL_FIELDS, Plan, Settings, effective_batch};
use super::{GpuView, Verdict, cost, fit_estimate};
use crate::api::{
    AdjustableField, Checkpointing, EstimateStatus, FitMode, FitPolicy, Head, Loss, Optimizer,
    Precision, Strategy, TrainingMode, ValidatedJob,
};
use crate::estimate::gpus::Architecture;
use crate::estimate::{EstimateError, GpuProduct};

/// Largest micro-batch up to which candidate micro-batches are found by
/// trying every divisor; above it only the divisors of the written micro-batch.
const DIVISOR_SCAN_LIMIT: u64 = 4096;

/// What a search may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowance {
    fields: u8,
    /// Smallest micro-batch a plan may use.
    pub min_micro_batch_size: u64,
}

fn field_bit(f: AdjustableField) -> u8 {
    match f {
        AdjustableField::MicroBatchSize => 1,
        AdjustableField::Precision => 2,
        AdjustableField::GradientCheckpointing => 4,
        AdjustableField::Optimizer => 8,
        AdjustableField::ZeroStage => 16,
        AdjustableField::Loss => 32,
    }
}

impl Allowance {
    /// Nothing may change.
    pub fn none() -> Allowance {
        Allowance {
            fields: 0,
            min_micro_batch_size: 1,
        }
    }

    /// Every field, down to a micro-batch of 1.
    pub fn all() -> Allowance {
        ALL_FIELDS.iter().fold(Allowance::none(), |a, f| a.with(*f))
    }

    /// What a fit policy allows: nothing under Reject, its `allow` list under Adjust.
    pub fn from_policy(policy: &FitPolicy) -> Allowance {
        let mut a = Allowance {
            fields: 0,
            min_micro_batch_size: policy.min_micro_batch_size.max(1),
        };
        if policy.mode == FitMode::Adjust {
            for f in &policy.allow {
                a = a.with(*f);
            }
        }
        a
    }

    /// This allowance plus `field`.
    pub fn with(mut self, field: AdjustableField) -> Allowance {
        self.fields |= field_bit(field);
        self
    }

    pub fn allows(&self, field: AdjustableField) -> bool {
        self.fields & field_bit(field) != 0
    }

    /// True when nothing may change.
    pub fn is_empty(&self) -> bool {
        self.fields == 0
    }
}

/// One combination of the discrete knobs and its cost.
#[derive(Clone, Copy, Debug)]
struct Combo {
    precision: Precision,
    checkpointing: Checkpointing,
    optimizer: Optimizer,
    zero_stage: u8,
    loss: Loss,
    cost: f64,
    changes: u32,
}

/// The values each knob may take (the written one first).
pub(super) struct Options {
    pub(super) precision: Vec<Precision>,
    pub(super) checkpointing: Vec<Checkpointing>,
    pub(super) optimizer: Vec<Optimizer>,
    pub(super) zero_stage: Vec<u8>,
    pub(super) loss: Vec<Loss>,
}

pub(super) fn options(job: &ValidatedJob, gpu: &GpuProduct, allow: Allowance) -> Options {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let inference = t.mode == TrainingMode::Inference;
    let mut o = Options {
        precision: vec![t.precision],
        checkpointing: vec![t.gradient_checkpointing],
        optimizer: vec![t.optimizer],
        zero_stage: vec![p.zero()],
        loss: vec![t.loss],
    };
    if allow.allows(AdjustableField::Precision)
        && matches!(t.precision, Precision::Fp32 | Precision::Tf32)
    {
        // Volta and Turing have no bf16 tensor cores.
        o.precision.push(match gpu.architecture {
            Architecture::Volta | Architecture::Turing => Precision::Fp16Mixed,
            _ => Precision::Bf16Mixed,
        });
    }
    if inference {
        // Nothing else changes the memory of a forward pass.
        return o;
    }
    if allow.allows(AdjustableField::GradientCheckpointing) {
        match t.gradient_checkpointing {
            Checkpointing::None => o
                .checkpointing
                .extend([Checkpointing::Selective, Checkpointing::Full]),
            Checkpointing::Selective | Checkpointing::OpSelective => {
                o.checkpointing.push(Checkpointing::Full)
            }
            Checkpointing::Full => {}
        }
    }
    if allow.allows(AdjustableField::Optimizer) {
        match t.optimizer {
            Optimizer::Adam | Optimizer::Adamw => o.optimizer.push(Optimizer::Adamw8bit),
            Optimizer::PagedAdamw => o.optimizer.push(Optimizer::PagedAdamw8bit),
            _ => {}
        }
    }
    if allow.allows(AdjustableField::ZeroStage) && job.data_parallel > 1 {
        // Megatron's distributed optimizer and pipeline schedules shard optimizer states only
        // (DeepSpeed refuses ZeRO-2/3 with pipeline parallelism).
        let max = if p.strategy == Strategy::Megatron || p.pipeline_parallel > 1 {
            1
        } else {
            3
        };
        o.zero_stage.extend((p.zero() + 1)..=max);
    }
    if allow.allows(AdjustableField::Loss) && t.loss == Loss::Standard && job.head == Head::Lm {
        o.loss.push(Loss::Chunked);
    }
    o
}

fn combos(job: &ValidatedJob, o: &Options) -> Vec<Combo> {
    let t = &job.spec().training;
    let written_zero = job.spec().parallelism.zero();
    let mut out = Vec::with_capacity(
        o.precision.len()
            * o.checkpointing.len()
            * o.optimizer.len()
            * o.zero_stage.len()
            * o.loss.len(),
    );
    for &checkpointing in &o.checkpointing {
        for &precision in &o.precision {
            for &optimizer in &o.optimizer {
                for &zero_stage in &o.zero_stage {
                    for &loss in &o.loss {
                        let cost = cost::checkpointing(checkpointing)
                            / cost::checkpointing(t.gradient_checkpointing)
                            * cost::precision(precision)
                            / cost::precision(t.precision)
                            * cost::optimizer(optimizer)
                            / cost::optimizer(t.optimizer)
                            * cost::zero_stage(zero_stage)
                            / cost::zero_stage(written_zero)
                            * cost::loss(loss)
                            / cost::loss(t.loss);
                        let changes = u32::from(checkpointing != t.gradient_checkpointing)
                            + u32::from(precision != t.precision)
                            + u32::from(optimizer != t.optimizer)
                            + u32::from(zero_stage != written_zero)
                            + u32::from(loss != t.loss);
                        out.push(Combo {
                            precision,
                            checkpointing,
                            optimizer,
                            zero_stage,
                            loss,
                            cost,
                            changes,
                        });
                    }
                }
            }
        }
    }
    // Stable: equal costs keep the enumeration order (fewer changes first).
    out.sort_by(|a, b| a.cost.total_cmp(&b.cost).then(a.changes.cmp(&b.changes)));
    out
}

/// Micro-batches a plan may use, ascending: divisors of micro × accumulation
/// between the allowed minimum and the written micro-batch (never larger).
fn micro_candidates(job: &ValidatedJob, allow: Allowance) -> Vec<u64> {
    let micro = job.spec().training.micro_batch_size.max(1);
    if !allow.allows(AdjustableField::MicroBatchSize) {
        return vec![micro];
    }
    let samples = u128::from(micro) * u128::from(job.gradient_accumulation_steps.max(1));
    let min = allow.min_micro_batch_size.clamp(1, micro);
    let mut out: Vec<u64> = (min..=micro.min(DIVISOR_SCAN_LIMIT))
        .filter(|d| samples % u128::from(*d) == 0)
        .collect();
    if micro > DIVISOR_SCAN_LIMIT {
        // Divisors of the micro-batch itself above the scan limit.
        let mut big = Vec::new();
        let mut k = 1u64;
        while k.saturating_mul(k) <= micro {
            if micro.is_multiple_of(k) {
                for d in [k, micro / k] {
                    if d > DIVISOR_SCAN_LIMIT && d >= min {
                        big.push(d);
                    }
                }
            }
            k += 1;
        }
        big.sort_unstable();
        big.dedup();
        out.extend(big);
    }
    if out.last() != Some(&micro) {
        out.push(micro);
    }
    out
}

/// The cheapest plan that fits `view` of `gpu` changing only what `allow`
/// allows; `None` when none does. Candidates the estimator refuses (absurd
/// sizes) count as not fitting.
pub fn search(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
    allow: Allowance,
) -> Option<Plan> {
    search_below(job, gpu, view, allow, f64::INFINITY)
}

/// [`search`] for a plan whose slowdown is below `limit` only: the cheapest
/// such plan, or `None`. A caller comparing GPUs passes the best slowdown it
/// already has, and the walk stops at the first combination that cannot beat
/// it instead of pricing every one.
pub fn search_below(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
    allow: Allowance,
    limit: f64,
) -> Option<Plan> {
    let original = Settings::of(job);
    let margin = job.spec().fit_policy.safety_margin;
    let micros = micro_candidates(job, allow);
    let combos = combos(job, &options(job, gpu, allow));
    let samples = original.micro_batch_size * original.gradient_accumulation_steps.max(1);
    let seq = job.spec().training.seq_len();
    let slowdown = |micro: u64| cost::micro_batch_slowdown(original.micro_batch_size, micro, seq);

    let eval = |combo: &Combo, micro: u64| -> Option<(Settings, EstimateStatus, Verdict)> {
        let settings = Settings {
            micro_batch_size: micro,
            gradient_accumulation_steps: samples / micro,
            precision: combo.precision,
            gradient_checkpointing: combo.checkpointing,
            optimizer: combo.optimizer,
            zero_stage: combo.zero_stage,
            loss: combo.loss,
        };
        // Settings the job does not take are no plan.
        let work = job.with_settings(&settings).ok()?;
        let est = super::memo::estimate(&work, gpu).ok()?;
        let v = fit_estimate(&est, margin, view);
        v.fits.then_some((settings, est.status, v))
    };

    let mut best: Option<(f64, (Settings, EstimateStatus, Verdict))> = None;
    let top = micros.len() - 1;
    for combo in &combos {
        let bound = best.as_ref().map_or(limit, |b| b.0);
        // A smaller micro-batch only adds to the knob cost: nothing later can win.
        if combo.cost >= bound {
            break;
        }
        // Micro-batches that could still beat the best plan: the smallest one first.
        let lo = micros.partition_point(|&m| combo.cost * slowdown(m) >= bound);
        if lo > top {
            continue;
        }
        // The written micro-batch is checked on its own: with accumulation 1 it keeps no
        // accumulated gradients, so it can fit where a smaller one does not.
        let found = if let Some(hit) = eval(combo, micros[top]) {
            Some((top, hit))
        } else if lo == top {
            None
        } else if let Some(hit) = eval(combo, micros[lo]) {
            // Largest fitting index in [lo, top): `ok` fits, `bad` does not.
            let (mut ok, mut bad, mut hit) = (lo, top, hit);
            while bad - ok > 1 {
                let mid = ok + (bad - ok) / 2;
                match eval(combo, micros[mid]) {
                    Some(h) => {
                        ok = mid;
                        hit = h;
                    }
                    None => bad = mid,
                }
            }
            Some((ok, hit))
        } else {
            None
        };
        if let Some((i, hit)) = found {
            let total = combo.cost * slowdown(micros[i]);
            if total < bound {
                best = Some((total, hit));
            }
        }
    }
    let (slowdown, (settings, estimate, verdict)) = best?;
    Some(Plan {
        changes: settings.changes_from(&original),
        settings,
        original,
        slowdown,
        effective_batch_size: u64::try_from(effective_batch(job)).unwrap_or(u64::MAX),
        estimate,
        verdict,
    })
}

/// The job as written against `view` of `gpu`, and the plan [`shrink`] would
/// choose (no changes when it fits as written), without the advice.
pub(super) fn as_written_and_plan(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
) -> Result<(Verdict, Option<Plan>), EstimateError> {
    let policy = &job.spec().fit_policy;
    let est = super::memo::estimate(job, gpu)?;
    let as_written = fit_estimate(&est, policy.safety_margin, view);
    if as_written.fits {
        let original = Settings::of(job);
        let plan = Plan {
            settings: original,
            original,
            changes: Vec::new(),
            slowdown: 1.0,
            effective_batch_size: u64::try_from(effective_batch(job)).unwrap_or(u64::MAX),
            estimate: est.status,
            verdict: as_written.clone(),
        };
        return Ok((as_written, Some(plan)));
    }
    let allowed = Allowance::from_policy(policy);
    let plan = if allowed.is_empty() {
        None
    } else {
        search(job, gpu, view, allowed)
    };
    Ok((as_written, plan))
}

/// The plan of [`shrink`] alone: as written if it fits, else the cheapest
/// allowed plan, else `None`; no advice is built (it costs more searches
/// than the plan, and a caller placing the job has no use for it).
pub fn cheapest_plan(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
) -> Result<Option<Plan>, EstimateError> {
    as_written_and_plan(job, gpu, view).map(|(_, plan)| plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::gpus;
    use crate::plan::fit;
    use crate::plan::shrink;

    use crate::api::test_job as job;

    fn gpu(name: &str) -> &'static GpuProduct {
        gpus::find(name).expect("catalog GPU")
    }

    fn empty(g: &GpuProduct) -> GpuView {
        GpuView::empty(g.usable_bytes())
    }

    const FULL_8B: &str = "
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 8, globalBatchSize: 64, sequenceLength: 4096,
           precision: bf16-mixed, optimizer: adamw, attention: flash}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing, optimizer, precision, zeroStage, loss]}
";

    #[test]
    fn allowance_from_policy() {
        let j = job(FULL_8B);
        let a = Allowance::from_policy(&j.spec().fit_policy);
        assert!(a.allows(AdjustableField::ZeroStage));
        let mut reject = j.spec().fit_policy.clone();
        reject.mode = FitMode::Reject;
        assert!(Allowance::from_policy(&reject).is_empty());
        assert_eq!(Allowance::all().min_micro_batch_size, 1);
    }

    #[test]
    fn micro_candidates_divide_the_samples() {
        let j = job(FULL_8B);
        assert_eq!(micro_candidates(&j, Allowance::all()), vec![1, 2, 4, 8]);
        let mut a = Allowance::all();
        a.min_micro_batch_size = 3;
        assert_eq!(micro_candidates(&j, a), vec![4, 8]);
        assert_eq!(micro_candidates(&j, Allowance::none()), vec![8]);
        // micro 6 × accumulation 4: 4 divides 24 though not 6.
        let j = job("
model: {preset: gpt2}
training: {microBatchSize: 6, globalBatchSize: 24}
");
        assert_eq!(micro_candidates(&j, Allowance::all()), vec![1, 2, 3, 4, 6]);
    }

    #[test]
    fn fits_as_written_changes_nothing() {
        let j = job("
model: {preset: gpt2}
training: {microBatchSize: 4, sequenceLength: 1024}
fitPolicy: {mode: Adjust}
");
        let s = shrink(&j, gpu("h100"), empty(gpu("h100"))).expect("estimates");
        let p = s.plan.expect("fits");
        assert!(p.changes.is_empty());
        assert_eq!(p.slowdown, 1.0);
        assert!(s.advice.is_none());
        assert_eq!(p.to_status().micro_batch_size, 4);
    }

    const LORA_8B: &str = "
model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 8, globalBatchSize: 32, sequenceLength: 4096,
           precision: bf16, attention: flash}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}
";

    #[test]
    fn plan_fits_keeps_the_batch_and_changes_only_allowed_fields() {
        let j = job(LORA_8B);
        let g = gpu("a100-40gb");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        assert!(!s.as_written.fits);
        let p = s.plan.expect("some allowed change fits");
        let applied = p.apply(&j).expect("the job takes its plan");
        assert_eq!(effective_batch(&applied), effective_batch(&j));
        let e = crate::estimate::estimate(&applied, g).expect("estimates");
        assert_eq!(e.status, p.estimate);
        assert!(
            fit(
                e.status.fit_per_gpu_bytes(),
                e.status.largest_tensor_bytes,
                0.05,
                empty(g)
            )
            .fits
        );
        assert!(p.slowdown >= 1.0);
        assert!(!p.changes.is_empty());
        let allowed = Allowance::from_policy(&j.spec().fit_policy);
        assert!(p.changed_fields().iter().all(|f| allowed.allows(*f)));
    }

    #[test]
    fn reject_mode_gives_advice_not_a_plan() {
        let j = job(LORA_8B).with_fit_mode(FitMode::Reject);
        let g = gpu("a100-40gb");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        assert!(s.plan.is_none());
        let a = s.advice.expect("advice");
        assert_eq!(a.policy_changes[0], "fitPolicy.mode: Reject → Adjust");
        assert!(a.plan_if_allowed.is_some());
        assert!(a.message.contains("as written"), "{}", a.message);
    }

    #[test]
    fn fp32_on_volta_goes_to_fp16_mixed() {
        let j = job("
model: {preset: llama-3.2-1b}
training: {mode: full, microBatchSize: 1, sequenceLength: 2048, precision: fp32}
fitPolicy: {mode: Adjust, allow: [precision]}
");
        let o = options(
            &j,
            gpu("v100"),
            Allowance::from_policy(&j.spec().fit_policy),
        );
        assert_eq!(o.precision, vec![Precision::Fp32, Precision::Fp16Mixed]);
        let o = options(
            &j,
            gpu("h100"),
            Allowance::from_policy(&j.spec().fit_policy),
        );
        assert_eq!(o.precision, vec![Precision::Fp32, Precision::Bf16Mixed]);
    }

    #[test]
    fn zero_needs_data_parallel_ranks() {
        let j = job(FULL_8B);
        assert_eq!(
            options(&j, gpu("h100"), Allowance::all()).zero_stage,
            vec![0]
        );
        let j = job("
model: {preset: llama-3.1-8b}
parallelism: {gpus: 8}
");
        assert_eq!(
            options(&j, gpu("h100"), Allowance::all()).zero_stage,
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn knob_combinations_are_cheapest_first() {
        let j = job(FULL_8B);
        let c = combos(&j, &options(&j, gpu("h100"), Allowance::all()));
        assert_eq!(c[0].changes, 0);
        assert!(c.windows(2).all(|w| w[0].cost <= w[1].cost));
    }
}
