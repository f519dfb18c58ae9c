//! Shrink: the cheapest change a job's fit policy allows that makes it fit one
//! GPU, and when none does, what would (more allowed, or a bigger GPU). Pure:
//! it calls the estimator on modified copies of the job, never I/O.
//!
//! The search walks every combination of the discrete knobs (checkpointing,
//! precision, optimizer, ZeRO stage, loss) in increasing order of their cost
//! (`cost.rs`) and, per combination, binary-searches the largest micro-batch
//! that fits: estimated memory does not decrease with the micro-batch. It stops
//! once a combination's knob cost alone is no better than the best plan found,
//! since a smaller micro-batch only adds to it. The effective batch is kept
//! exactly: a new micro-batch divides micro × accumulation as written and the
//! accumulation steps make up the rest.

use serde::Serialize;

use super::{GpuView, Verdict, cost, fit};
use crate::api::{
    AdjustableField, Checkpointing, EstimateStatus, FitMode, FitPolicy, Head, Loss, Optimizer,
    PlanStatus, Precision, Strategy, TrainingMode, ValidatedJob,
};
use crate::estimate::gpus::{self, Architecture};
use crate::estimate::{self, EstimateError, GIB, GpuProduct};

/// Every field a fit policy can allow, in the order changes are listed.
pub const ALL_FIELDS: [AdjustableField; 6] = [
    AdjustableField::MicroBatchSize,
    AdjustableField::GradientCheckpointing,
    AdjustableField::Precision,
    AdjustableField::Optimizer,
    AdjustableField::ZeroStage,
    AdjustableField::Loss,
];

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
            zero_stage: job.spec.parallelism.zero_stage,
            loss: t.loss,
        }
    }

    /// Write these settings into `job` (what the estimator reads).
    pub fn apply_to(&self, job: &mut ValidatedJob) {
        let t = &mut job.spec.training;
        t.micro_batch_size = self.micro_batch_size;
        t.precision = self.precision;
        t.gradient_checkpointing = self.gradient_checkpointing;
        t.optimizer = self.optimizer;
        t.loss = self.loss;
        job.spec.parallelism.zero_stage = self.zero_stage;
        job.gradient_accumulation_steps = self.gradient_accumulation_steps;
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
fn yaml_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A way to run the job on one GPU, with its estimate there.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    #[serde(flatten)]
    pub settings: Settings,
    /// The settings as written (what `changes` start from).
    #[serde(skip)]
    pub original: Settings,
    /// Every change as `field: from → to`; empty when the job fits as written.
    pub changes: Vec<String>,
    /// Estimated step time over the step time as written (1.0: unchanged).
    pub slowdown: f64,
    /// Micro-batch × accumulation × data-parallel ranks, the same as written.
    pub effective_batch_size: u64,
    /// The estimate of the changed job (`status.estimate` of the plan).
    pub estimate: EstimateStatus,
    pub verdict: Verdict,
}

impl Plan {
    /// Fields this plan changes.
    pub fn changed_fields(&self) -> Vec<AdjustableField> {
        self.settings.changed_fields(&self.original)
    }

    /// The job with this plan applied (what the estimator and the trainer see).
    pub fn apply(&self, job: &ValidatedJob) -> ValidatedJob {
        let mut out = job.clone();
        self.settings.apply_to(&mut out);
        out
    }

    /// `status.plan`.
    pub fn to_status(&self) -> PlanStatus {
        let s = &self.settings;
        PlanStatus {
            micro_batch_size: s.micro_batch_size,
            gradient_accumulation_steps: s.gradient_accumulation_steps,
            precision: s.precision,
            gradient_checkpointing: s.gradient_checkpointing,
            optimizer: s.optimizer,
            zero_stage: s.zero_stage,
            changes: self.changes.clone(),
        }
    }

    /// One line for people: what changes, that the batch is kept, the room left, the cost.
    pub fn summary(&self) -> String {
        let fits = format!(
            "fits with {:.1} GiB to spare",
            self.verdict.headroom_bytes as f64 / GIB
        );
        if self.changes.is_empty() {
            return format!("as written: {fits}");
        }
        let mut s = self.changes.join(", ");
        if self.settings.micro_batch_size != self.original.micro_batch_size {
            s.push_str(&format!(
                " keeps the effective batch of {} and",
                self.effective_batch_size
            ));
        }
        format!(
            "{s} {fits} (≈{:.0} % slower)",
            (self.slowdown - 1.0).max(0.0) * 100.0
        )
    }
}

/// Micro-batch × accumulation × data-parallel ranks (= `globalBatchSize` when given).
pub fn effective_batch(job: &ValidatedJob) -> u128 {
    u128::from(job.spec.training.micro_batch_size)
        * u128::from(job.gradient_accumulation_steps.max(1))
        * u128::from(job.data_parallel.max(1))
}

/// What the planner says about a job on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shrink {
    /// The `--gpu` name of the product.
    pub gpu: &'static str,
    /// The job as written against this GPU's view.
    pub as_written: Verdict,
    /// The cheapest plan the fit policy allows that fits (no changes when the
    /// job fits as written); `None` when none does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// Why nothing allowed fits and what would; set exactly when `plan` is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<Advice>,
}

/// What would fit when nothing the policy allows does.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    /// For people, with the numbers.
    pub message: String,
    /// The cheapest plan on this GPU with every field allowed (micro-batch down to 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_if_allowed: Option<Plan>,
    /// Policy edits that plan needs (`fitPolicy.mode: Adjust`, `allow zeroStage`, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policy_changes: Vec<String>,
    /// When no plan fits this GPU: catalog GPUs (whole cards, smallest first) that would
    /// hold the job as written, or else its cheapest all-allowed plan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<&'static str>,
    /// Per-GPU need (with margin) on the smallest of `gpus`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_gpu_bytes: Option<u64>,
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
struct Options {
    precision: Vec<Precision>,
    checkpointing: Vec<Checkpointing>,
    optimizer: Vec<Optimizer>,
    zero_stage: Vec<u8>,
    loss: Vec<Loss>,
}

fn options(job: &ValidatedJob, gpu: &GpuProduct, allow: Allowance) -> Options {
    let t = &job.spec.training;
    let p = &job.spec.parallelism;
    let inference = t.mode == TrainingMode::Inference;
    let mut o = Options {
        precision: vec![t.precision],
        checkpointing: vec![t.gradient_checkpointing],
        optimizer: vec![t.optimizer],
        zero_stage: vec![p.zero_stage],
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
            Checkpointing::Selective => o.checkpointing.push(Checkpointing::Full),
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
        o.zero_stage.extend((p.zero_stage + 1)..=max);
    }
    if allow.allows(AdjustableField::Loss) && t.loss == Loss::Standard && job.head == Head::Lm {
        o.loss.push(Loss::Chunked);
    }
    o
}

fn combos(job: &ValidatedJob, o: &Options) -> Vec<Combo> {
    let t = &job.spec.training;
    let written_zero = job.spec.parallelism.zero_stage;
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
    let micro = job.spec.training.micro_batch_size.max(1);
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
            if micro % k == 0 {
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
    let original = Settings::of(job);
    let margin = job.spec.fit_policy.safety_margin;
    let micros = micro_candidates(job, allow);
    let combos = combos(job, &options(job, gpu, allow));
    let samples = original.micro_batch_size * original.gradient_accumulation_steps.max(1);
    let seq = job.spec.training.sequence_length;
    let slowdown = |micro: u64| cost::micro_batch_slowdown(original.micro_batch_size, micro, seq);

    let mut work = job.clone();
    let mut eval = |combo: &Combo, micro: u64| -> Option<(Settings, EstimateStatus, Verdict)> {
        let settings = Settings {
            micro_batch_size: micro,
            gradient_accumulation_steps: samples / micro,
            precision: combo.precision,
            gradient_checkpointing: combo.checkpointing,
            optimizer: combo.optimizer,
            zero_stage: combo.zero_stage,
            loss: combo.loss,
        };
        settings.apply_to(&mut work);
        let est = estimate::estimate(&work, gpu).ok()?;
        let v = fit(
            est.status.per_gpu_bytes,
            est.status.largest_tensor_bytes,
            margin,
            view,
        );
        v.fits.then_some((settings, est.status, v))
    };

    let mut best: Option<(f64, (Settings, EstimateStatus, Verdict))> = None;
    let top = micros.len() - 1;
    for combo in &combos {
        let bound = best.as_ref().map_or(f64::INFINITY, |b| b.0);
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

fn gib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 30)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

/// Fit the job to `view` of `gpu` under its own fit policy: as written if it
/// fits, else the cheapest allowed plan, else advice. Errors only when the job
/// as written cannot be estimated.
pub fn shrink(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
) -> Result<Shrink, EstimateError> {
    let policy = &job.spec.fit_policy;
    let est = estimate::estimate(job, gpu)?;
    let as_written = fit(
        est.status.per_gpu_bytes,
        est.status.largest_tensor_bytes,
        policy.safety_margin,
        view,
    );
    let original = Settings::of(job);
    if as_written.fits {
        let plan = Plan {
            settings: original,
            original,
            changes: Vec::new(),
            slowdown: 1.0,
            effective_batch_size: u64::try_from(effective_batch(job)).unwrap_or(u64::MAX),
            estimate: est.status,
            verdict: as_written.clone(),
        };
        return Ok(Shrink {
            gpu: gpu.name,
            as_written,
            plan: Some(plan),
            advice: None,
        });
    }
    let allowed = Allowance::from_policy(policy);
    if !allowed.is_empty()
        && let Some(plan) = search(job, gpu, view, allowed)
    {
        return Ok(Shrink {
            gpu: gpu.name,
            as_written,
            plan: Some(plan),
            advice: None,
        });
    }
    let advice = advise(job, gpu, view, allowed, &as_written);
    Ok(Shrink {
        gpu: gpu.name,
        as_written,
        plan: None,
        advice: Some(advice),
    })
}

fn field_name(f: AdjustableField) -> String {
    yaml_name(&f)
}

fn advise(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
    allowed: Allowance,
    as_written: &Verdict,
) -> Advice {
    let policy = &job.spec.fit_policy;
    let short = if as_written.short_by_bytes > 0 {
        format!(
            "needs {} per GPU with the {:.0} % margin, {} free: short by {}",
            gib(as_written.need_bytes),
            policy.safety_margin * 100.0,
            gib(as_written.have_bytes),
            gib(as_written.short_by_bytes)
        )
    } else {
        format!(
            "its largest tensor ({}) exceeds the largest free block ({})",
            gib(as_written.largest_tensor_bytes),
            gib(as_written.largest_block_bytes)
        )
    };
    let why = match policy.mode {
        FitMode::Reject => format!("does not fit {} as written ({short})", gpu.name),
        FitMode::Adjust => {
            let allow: Vec<String> = ALL_FIELDS
                .iter()
                .filter(|f| allowed.allows(**f))
                .map(|f| field_name(*f))
                .collect();
            format!(
                "does not fit {} ({short}), and no change in allow [{}] with minMicroBatchSize {} fits",
                gpu.name,
                allow.join(", "),
                allowed.min_micro_batch_size
            )
        }
    };
    if let Some(plan) = search(job, gpu, view, Allowance::all()) {
        let mut policy_changes = Vec::new();
        if policy.mode == FitMode::Reject {
            policy_changes.push("fitPolicy.mode: Reject → Adjust".to_string());
        }
        for f in plan.changed_fields() {
            if policy.mode == FitMode::Reject || !allowed.allows(f) {
                let mut s = format!("allow {}", field_name(f));
                if f == AdjustableField::ZeroStage {
                    s.push_str(&format!(
                        " ({} over {} data-parallel ranks)",
                        plan.settings.zero_stage, job.data_parallel
                    ));
                }
                policy_changes.push(s);
            }
        }
        if plan.settings.micro_batch_size < allowed.min_micro_batch_size {
            policy_changes.push(format!(
                "fitPolicy.minMicroBatchSize: {} → {}",
                allowed.min_micro_batch_size, plan.settings.micro_batch_size
            ));
        }
        let message = format!(
            "{why}; with {} it would: {}",
            policy_changes.join(", "),
            plan.summary()
        );
        return Advice {
            message,
            plan_if_allowed: Some(plan),
            policy_changes,
            gpus: Vec::new(),
            min_gpu_bytes: None,
        };
    }
    let (gpus, min_gpu_bytes, how) = bigger_gpus(job);
    let message = if gpus.is_empty() {
        format!(
            "{why}; no change fits it on {}, and no GPU in the catalog holds it even with every change allowed: spread it over more GPUs (tensorParallel, pipelineParallel, or zeroStage 3 over more ranks)",
            gpu.name
        )
    } else {
        format!(
            "{why}; no change fits it on {}; needs a GPU with ≥ {} GiB{how}: {}",
            gpu.name,
            gib_ceil(min_gpu_bytes.unwrap_or(0)),
            gpus.join(", ")
        )
    };
    Advice {
        message,
        plan_if_allowed: None,
        policy_changes: Vec::new(),
        gpus,
        min_gpu_bytes,
    }
}

/// Whole-card catalog GPUs (smallest first) that hold the job as written on an
/// empty card, else with the cheapest all-allowed plan; the smallest need; how.
fn bigger_gpus(job: &ValidatedJob) -> (Vec<&'static str>, Option<u64>, &'static str) {
    let margin = job.spec.fit_policy.safety_margin;
    let mut cards: Vec<&'static GpuProduct> = gpus::GPUS.iter().filter(|g| !g.mig).collect();
    cards.sort_by(|a, b| {
        a.usable_bytes()
            .cmp(&b.usable_bytes())
            .then(a.name.cmp(b.name))
    });
    // The estimate depends on the GPU only through its architecture.
    let mut by_arch: Vec<(Architecture, Option<(u64, u64)>)> = Vec::new();
    let mut fitting = Vec::new();
    let mut min_need: Option<u64> = None;
    for card in &cards {
        let need = match by_arch.iter().find(|(a, _)| *a == card.architecture) {
            Some((_, n)) => *n,
            None => {
                let n = estimate::estimate(job, card)
                    .ok()
                    .map(|e| (e.status.per_gpu_bytes, e.status.largest_tensor_bytes));
                by_arch.push((card.architecture, n));
                n
            }
        };
        let Some((per_gpu, largest)) = need else {
            continue;
        };
        let v = fit(
            per_gpu,
            largest,
            margin,
            GpuView::empty(card.usable_bytes()),
        );
        if v.fits {
            fitting.push(card.name);
            min_need = Some(min_need.map_or(v.need_bytes, |m| m.min(v.need_bytes)));
        }
    }
    if !fitting.is_empty() {
        return (fitting, min_need, " as written");
    }
    // Largest card of each architecture first: if it fails, the smaller ones do too.
    let mut planned: Vec<(u64, &'static str)> = Vec::new();
    for arch in Architecture::ALL {
        for card in cards.iter().rev().filter(|c| c.architecture == arch) {
            match search(
                job,
                card,
                GpuView::empty(card.usable_bytes()),
                Allowance::all(),
            ) {
                Some(plan) => {
                    planned.push((card.usable_bytes(), card.name));
                    let need = plan.verdict.need_bytes;
                    min_need = Some(min_need.map_or(need, |m| m.min(need)));
                }
                None => break,
            }
        }
    }
    planned.sort_unstable();
    (
        planned.into_iter().map(|(_, n)| n).collect(),
        min_need,
        " with every change allowed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{self, TrainingJobSpec};

    fn job(yaml: &str) -> ValidatedJob {
        let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).expect("test YAML parses");
        api::validate(&spec).expect("test spec is valid")
    }

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
        let a = Allowance::from_policy(&j.spec.fit_policy);
        assert!(a.allows(AdjustableField::ZeroStage));
        let mut reject = j.spec.fit_policy.clone();
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
        let applied = p.apply(&j);
        assert_eq!(effective_batch(&applied), effective_batch(&j));
        let e = estimate::estimate(&applied, g).expect("estimates");
        assert_eq!(e.status, p.estimate);
        assert!(
            fit(
                e.status.per_gpu_bytes,
                e.status.largest_tensor_bytes,
                0.05,
                empty(g)
            )
            .fits
        );
        assert!(p.slowdown >= 1.0);
        assert!(!p.changes.is_empty());
        let allowed = Allowance::from_policy(&j.spec.fit_policy);
        assert!(p.changed_fields().iter().all(|f| allowed.allows(*f)));
    }

    #[test]
    fn reject_mode_gives_advice_not_a_plan() {
        let mut j = job(LORA_8B);
        j.spec.fit_policy.mode = FitMode::Reject;
        let g = gpu("a100-40gb");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        assert!(s.plan.is_none());
        let a = s.advice.expect("advice");
        assert_eq!(a.policy_changes[0], "fitPolicy.mode: Reject → Adjust");
        assert!(a.plan_if_allowed.is_some());
        assert!(a.message.contains("as written"), "{}", a.message);
    }

    #[test]
    fn too_big_for_one_gpu_names_bigger_gpus() {
        // 70B full fine-tune on one GPU: nothing fits anywhere.
        let j = job("
model: {preset: llama-3-70b}
training: {mode: full, microBatchSize: 1, sequenceLength: 4096}
fitPolicy: {mode: Adjust}
");
        let g = gpu("a100-80gb");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        let a = s.advice.expect("advice");
        assert!(a.plan_if_allowed.is_none());
        assert!(a.gpus.is_empty(), "{:?}", a.gpus);
        assert!(a.message.contains("more GPUs"), "{}", a.message);

        // A 13B LoRA at a long sequence on a T4: a bigger card holds it.
        let j = job("
model: {preset: llama-2-13b}
training: {mode: lora, microBatchSize: 1, sequenceLength: 2048, precision: fp16-mixed}
fitPolicy: {mode: Adjust}
");
        let g = gpu("t4");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        let a = s.advice.expect("advice");
        assert!(!a.gpus.is_empty());
        assert!(!a.gpus.contains(&"t4"));
        assert!(a.message.contains("needs a GPU with ≥"), "{}", a.message);
        let min = a.min_gpu_bytes.expect("a need");
        for name in &a.gpus {
            assert!(gpu(name).usable_bytes() >= min, "{name}");
        }
    }

    #[test]
    fn fp32_on_volta_goes_to_fp16_mixed() {
        let j = job("
model: {preset: llama-3.2-1b}
training: {mode: full, microBatchSize: 1, sequenceLength: 2048, precision: fp32}
fitPolicy: {mode: Adjust, allow: [precision]}
");
        let o = options(&j, gpu("v100"), Allowance::from_policy(&j.spec.fit_policy));
        assert_eq!(o.precision, vec![Precision::Fp32, Precision::Fp16Mixed]);
        let o = options(&j, gpu("h100"), Allowance::from_policy(&j.spec.fit_policy));
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
    fn changes_read_field_from_to() {
        let j = job(FULL_8B);
        let from = Settings::of(&j);
        let to = Settings {
            micro_batch_size: 2,
            gradient_accumulation_steps: 4,
            gradient_checkpointing: Checkpointing::Selective,
            ..from
        };
        assert_eq!(
            to.changes_from(&from),
            vec![
                "microBatchSize: 8 → 2",
                "gradientAccumulationSteps: 8 → 4",
                "gradientCheckpointing: none → selective"
            ]
        );
        assert_eq!(
            to.changed_fields(&from),
            vec![
                AdjustableField::MicroBatchSize,
                AdjustableField::GradientCheckpointing
            ]
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
