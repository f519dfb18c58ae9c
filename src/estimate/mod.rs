//! Spec → per-rank GPU memory. Pure functions over a [`ValidatedJob`] and a
//! GPU product: no I/O, no clock. The step is modelled phase by phase (end of
//! forward, backward, optimizer step) and the peak is the largest phase, not a
//! sum of per-component maxima.

pub mod bounds;
// The catalogs and the model types the validator resolves a spec into live in `api`
// (below `estimate`); their old paths stay.
pub use crate::api::{arch, framework, gpus, hf, layers, params, presets, vision};
pub mod peft;
pub mod stacks;

mod activations;
pub mod caching;
mod first_step;
pub mod pipeline;
mod step;
mod zero3;

use crate::api::{Breakdown, EstimateBounds, EstimateStatus, RangeSpread, ValidatedJob};
use bounds::{End, Ends, Mechanism};
pub use gpus::GpuProduct;
pub use step::{Component, StepPhase};

/// Bytes in a GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Largest per-GPU figure we report (1 EiB); beyond it the spec is nonsense.
pub const MAX_REPORTED_BYTES: f64 = (1u64 << 60) as f64;

/// Why an estimate could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EstimateError {
    /// The numbers are valid one by one but their product is absurd.
    #[error(
        "the estimate exceeds 1 EiB per GPU ({what}); check spec.training.microBatchSize, spec.training.sequenceLength and the model dimensions"
    )]
    TooLarge { what: &'static str },
}

/// Bytes of one phase of the step, by component.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseBytes {
    pub phase: StepPhase,
    /// Tensor bytes per component (f64: exact below 2^53 bytes).
    pub components: [f64; Component::COUNT],
    /// Churned bytes of an earlier moment whose stranded cache this phase
    /// still holds in place of its own churn's (0: its own). The end of
    /// backward's embedding moment carries the first block's backward: the
    /// cache its activations left is not returned, and the embedding's one
    /// gradient-sized transient is a new block beside it, not churn.
    pub carried_churn: f64,
}

impl PhaseBytes {
    /// Bytes of tensors live in this phase (what the caching allocator has handed out).
    pub fn allocated(&self) -> f64 {
        Component::ALL
            .iter()
            .filter(|c| c.is_allocated())
            .map(|c| self.components[*c as usize])
            .sum()
    }

    pub fn get(&self, c: Component) -> f64 {
        self.components[c as usize]
    }
}

/// A full estimate: the status object plus what explains it.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// `status.estimate`, byte counts as integers.
    pub status: EstimateStatus,
    /// Every phase modelled, in step order.
    pub phases: Vec<PhaseBytes>,
    /// The phase whose allocated bytes set the peak.
    pub peak_phase: StepPhase,
    /// GPU the estimate was made for.
    pub gpu: &'static GpuProduct,
    /// The limit the framework's allocator puts on itself on this GPU, if any.
    pub allocator_limit: Option<framework::AllocatorLimit>,
    /// Why the job as written cannot run on this GPU whatever its memory (bf16 on a
    /// GPU without bf16), with what to write instead.
    pub unsupported: Option<String>,
}

impl Estimate {
    /// The largest contributors at the peak, largest first: (name, bytes).
    pub fn top_contributors(&self, n: usize) -> Vec<(&'static str, u64)> {
        let b = &self.status.breakdown;
        let mut all = breakdown_entries(b);
        all.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(y.0)));
        all.truncate(n);
        all
    }
}

/// The breakdown as (name, bytes) pairs in contract order.
pub fn breakdown_entries(b: &Breakdown) -> Vec<(&'static str, u64)> {
    vec![
        ("weights", b.weights),
        ("gradients", b.gradients),
        ("optimizerStates", b.optimizer_states),
        ("activations", b.activations),
        ("logits", b.logits),
        ("inputs", b.inputs),
        ("temporaries", b.temporaries),
        ("allocatorOverhead", b.allocator_overhead),
        ("cudaContext", b.cuda_context),
        ("workspaces", b.workspaces),
        ("communication", b.communication),
    ]
}

fn to_bytes(v: f64, what: &'static str) -> Result<u64, EstimateError> {
    if !v.is_finite() || v > MAX_REPORTED_BYTES {
        return Err(EstimateError::TooLarge { what });
    }
    // Finite, non-negative by construction and below 2^60: the conversion is exact enough.
    Ok(v.max(0.0).ceil() as u64)
}

/// Estimate one rank's memory for `job` on `gpu`: the most loaded rank (with
/// pipeline parallelism, the heavier of the first and last stage by per-GPU bytes).
///
/// The status is the point estimate under the most likely stack profile with
/// every mechanism at its point ([`bounds`]); `upper` is the largest estimate
/// over every profile the spec leaves possible with every mechanism at its
/// high end, `lower` the smallest with every mechanism at its low end, and
/// `spread` says how far each mechanism alone moves the per-GPU figure.
pub fn estimate(job: &ValidatedJob, gpu: &'static GpuProduct) -> Result<Estimate, EstimateError> {
    let profiles = stacks::profiles(job);
    let point_ends = Ends::all(End::Point);
    let mut point = estimate_profile(job, gpu, &profiles[0], &point_ends)?;
    let totals = |e: &Estimate| EstimateBounds {
        peak_allocated_bytes: e.status.peak_allocated_bytes,
        peak_reserved_bytes: e.status.peak_reserved_bytes,
        per_gpu_bytes: e.status.per_gpu_bytes,
    };
    let mut upper = totals(&point);
    let mut lower = upper;
    // The stacks' behaviours at the point, each mechanism's ends with the
    // point's profile, and every profile at either end.
    let mut stack_above = 0u64;
    for profile in &profiles {
        let at_point = totals(&estimate_profile(job, gpu, profile, &point_ends)?);
        stack_above = stack_above.max(
            at_point
                .per_gpu_bytes
                .saturating_sub(point.status.per_gpu_bytes),
        );
        let high = totals(&estimate_profile(job, gpu, profile, &Ends::all(End::High))?);
        let low = totals(&estimate_profile(job, gpu, profile, &Ends::all(End::Low))?);
        for t in [at_point, high] {
            upper.peak_allocated_bytes = upper.peak_allocated_bytes.max(t.peak_allocated_bytes);
            upper.peak_reserved_bytes = upper.peak_reserved_bytes.max(t.peak_reserved_bytes);
            upper.per_gpu_bytes = upper.per_gpu_bytes.max(t.per_gpu_bytes);
        }
        for t in [at_point, low] {
            lower.peak_allocated_bytes = lower.peak_allocated_bytes.min(t.peak_allocated_bytes);
            lower.peak_reserved_bytes = lower.peak_reserved_bytes.min(t.peak_reserved_bytes);
            lower.per_gpu_bytes = lower.per_gpu_bytes.min(t.per_gpu_bytes);
        }
    }
    let mut spread = Vec::new();
    if stack_above > 0 {
        spread.push(RangeSpread {
            mechanism: "stackBehaviour".to_string(),
            below_bytes: 0,
            above_bytes: stack_above,
        });
    }
    let base = point.status.per_gpu_bytes;
    for m in Mechanism::ALL {
        let high = estimate_profile(job, gpu, &profiles[0], &Ends::point_but(m, End::High))?;
        let low = estimate_profile(job, gpu, &profiles[0], &Ends::point_but(m, End::Low))?;
        let above = high.status.per_gpu_bytes.saturating_sub(base);
        let below = base.saturating_sub(low.status.per_gpu_bytes);
        if above > 0 || below > 0 {
            spread.push(RangeSpread {
                mechanism: m.name().to_string(),
                below_bytes: below,
                above_bytes: above,
            });
        }
    }
    spread.sort_by(|a, b| {
        (b.above_bytes + b.below_bytes)
            .cmp(&(a.above_bytes + a.below_bytes))
            .then(a.mechanism.cmp(&b.mechanism))
    });
    point.status.upper = Some(upper);
    point.status.lower = Some(lower);
    point.status.spread = spread;
    Ok(point)
}

/// [`estimate`] under one stack profile, every mechanism at `ends`.
fn estimate_profile(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    profile: &stacks::Profile,
    ends: &Ends,
) -> Result<Estimate, EstimateError> {
    let mut best: Option<Estimate> = None;
    for model in step::StepModel::candidates(job, gpu, profile, ends) {
        let e = estimate_stage(job, &model, gpu)?;
        let heavier = match &best {
            None => true,
            Some(b) => {
                (e.status.per_gpu_bytes, e.status.peak_allocated_bytes)
                    > (b.status.per_gpu_bytes, b.status.peak_allocated_bytes)
            }
        };
        if heavier {
            best = Some(e);
        }
    }
    let mut best = best.expect("there is always at least one stage");
    best.allocator_limit = job.allocator.limit(gpu);
    best.unsupported = unsupported(job, gpu);
    Ok(best)
}

fn estimate_stage(
    job: &ValidatedJob,
    model: &step::StepModel,
    gpu: &'static GpuProduct,
) -> Result<Estimate, EstimateError> {
    let phases = model.phases();
    let (peak_idx, _) = phases
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.allocated()))
        .fold(
            (0, f64::MIN),
            |best, cur| if cur.1 > best.1 { cur } else { best },
        );
    let peak = &phases[peak_idx];
    // A tensor of the largest size exists at some point, so the peak holds it.
    let largest = model.largest_tensor();
    let allocated = peak.allocated().max(largest);
    // The caching allocator keeps what it reserved: the reserved peak is the
    // largest over phases of allocated + rounding and fragmentation.
    // The first step's optimizer step may find no cached block for its new
    // states (`first_step`).
    let reserved = phases
        .iter()
        .map(|p| p.allocated() + model.allocator_overhead(p))
        .fold(allocated, f64::max)
        .max(first_step::reserved(job, model, &phases))
        + model.fp32_build();
    let allocator = reserved - allocated;
    let fixed = model.fixed_overheads();
    let unallocated = phases
        .iter()
        .map(|p| model.unallocated(p))
        .fold(0.0, f64::max);
    let per_gpu = reserved + fixed.context + fixed.nccl + unallocated;
    let c = |comp: Component| to_bytes(peak.get(comp), comp.name());
    let breakdown = Breakdown {
        weights: c(Component::Weights)?,
        gradients: c(Component::Gradients)?,
        optimizer_states: to_bytes(
            peak.get(Component::OptimizerStates) + peak.get(Component::PagedOptimizerStates),
            "optimizerStates",
        )?,
        activations: c(Component::Activations)?,
        logits: c(Component::Logits)?,
        inputs: c(Component::Inputs)?,
        temporaries: c(Component::Temporaries)?,
        allocator_overhead: to_bytes(allocator, "allocatorOverhead")?,
        cuda_context: to_bytes(fixed.context, "cudaContext")?,
        workspaces: c(Component::Workspaces)?,
        communication: to_bytes(
            peak.get(Component::CommBuffers) + fixed.nccl,
            "communication",
        )?,
    };
    let status = EstimateStatus {
        peak_allocated_bytes: to_bytes(allocated, "peakAllocatedBytes")?,
        peak_reserved_bytes: to_bytes(reserved, "peakReservedBytes")?,
        per_gpu_bytes: to_bytes(per_gpu, "perGpuBytes")?,
        breakdown,
        largest_tensor_bytes: to_bytes(largest, "largestTensorBytes")?,
        peak_phase: peak.phase.name().to_string(),
        gpu: Some(gpu.name.to_string()),
        upper: None,
        lower: None,
        spread: Vec::new(),
    };
    Ok(Estimate {
        status,
        peak_phase: peak.phase,
        phases,
        gpu,
        allocator_limit: None,
        unsupported: None,
    })
}

/// bf16 needs compute capability 8.0 (Ampere) or newer: Volta and Turing have no bf16
/// units, and Transformers' Trainer refuses `--bf16` there ("Your setup doesn't support
/// bf16/gpu", `TrainingArguments.__post_init__`).
pub fn unsupported(job: &ValidatedJob, gpu: &GpuProduct) -> Option<String> {
    use crate::api::Precision;
    use gpus::Architecture;
    let bf16 = matches!(
        job.spec().training.precision,
        Precision::Bf16 | Precision::Bf16Mixed
    );
    let old = matches!(gpu.architecture, Architecture::Volta | Architecture::Turing);
    (bf16 && old).then(|| {
        format!(
            "{} has no bf16 (it needs an Ampere or newer GPU, compute capability 8.0); write precision: fp16-mixed",
            gpu.name
        )
    })
}

/// Format bytes as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / GIB)
}
