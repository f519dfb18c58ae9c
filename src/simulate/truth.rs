//! What a simulated trainer really allocates, and what it prints when it
//! cannot: the scenario's hidden truth, which vramguard never sees.
//!
//! A job's true need per GPU is the estimate of the plan it runs (as its
//! `VRAMGUARD_*` variables say) times a hidden factor: the job's own, a
//! measured figure for the spec as written, or one drawn from the
//! scenario's spread per job *shape* (the MemoryProfile fingerprint), so the
//! same model and recipe always need the same share more or less than the
//! estimate, as in a real cluster.

use crate::api::ValidatedJob;
use crate::estimate::{self, gpus::GpuProduct};
use crate::operator::fingerprint;

use super::scenario::{Residuals, TrueNeed};

/// The hidden factor of a job shape, drawn from `spread` by a hash of the
/// shape and the seed.
pub fn drawn_factor(job: &ValidatedJob, seed: u64, spread: (f64, f64)) -> f64 {
    let fp = fingerprint::fingerprint(job.spec());
    let h = fingerprint::fnv1a(format!("{seed}/{fp}").as_bytes());
    // 53 random bits → [0, 1).
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    spread.0 + (spread.1 - spread.0) * u
}

/// The hidden factor of a job shape, drawn from the measured / estimated
/// ratios of its recipe: the job's mode (`sharded-<mode>` first when it runs
/// on several GPUs and the table has it), else every ratio of the table. The
/// same shape always draws the same ratio.
pub fn drawn_residual(job: &ValidatedJob, seed: u64, table: &Residuals) -> f64 {
    let mode = serde_json::to_value(job.spec().training.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let sharded = format!("sharded-{mode}");
    let all: Vec<f64>;
    let ratios: &[f64] = match (job.spec().parallelism.gpus > 1)
        .then(|| table.get(&sharded))
        .flatten()
        .or_else(|| table.get(&mode))
    {
        Some(r) => r,
        None => {
            all = table.values().flatten().copied().collect();
            &all
        }
    };
    if ratios.is_empty() {
        return 1.0;
    }
    let fp = fingerprint::fingerprint(job.spec());
    let h = fingerprint::fnv1a(format!("{seed}/residual/{fp}").as_bytes());
    ratios[(h % ratios.len() as u64) as usize]
}

/// What one rank allocates: the persistent state first (CUDA context,
/// weights, gradients, optimizer states), then, when the step reaches its
/// peak, the rest in one allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankNeed {
    pub persistent_bytes: u64,
    pub peak_bytes: u64,
    /// What vramguard's estimate of this plan says per GPU (unscaled).
    pub estimated_bytes: u64,
}

impl RankNeed {
    pub fn total(&self) -> u64 {
        self.persistent_bytes.saturating_add(self.peak_bytes)
    }
}

fn times(bytes: u64, f: f64) -> u64 {
    let v = (bytes as f64 * f).round();
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v.max(0.0) as u64
    }
}

/// The true need of `job` (its plan applied) on `product`. `as_written` is
/// the job before any plan, for a measured figure.
pub fn rank_need(
    job: &ValidatedJob,
    as_written: &ValidatedJob,
    product: &'static GpuProduct,
    truth: TrueNeed,
) -> Result<RankNeed, String> {
    let est = estimate::estimate(job, product).map_err(|e| e.to_string())?;
    let factor = match truth {
        TrueNeed::Factor(f) => f,
        TrueNeed::BytesPerGpu(b) => {
            let written = estimate::estimate(as_written, product)
                .map_err(|e| e.to_string())?
                .status
                .per_gpu_bytes;
            b as f64 / written.max(1) as f64
        }
    };
    let s = &est.status;
    let b = &s.breakdown;
    let total = times(s.per_gpu_bytes, factor);
    let persistent = times(
        b.cuda_context
            .saturating_add(b.weights)
            .saturating_add(b.gradients)
            .saturating_add(b.optimizer_states),
        factor,
    )
    .min(total);
    Ok(RankNeed {
        persistent_bytes: persistent,
        peak_bytes: total - persistent,
        estimated_bytes: s.per_gpu_bytes,
    })
}

/// Bytes as PyTorch prints them: `2.00 GiB`, `512.00 MiB`.
fn torch_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b >= KIB * KIB * KIB {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    } else if b >= KIB * KIB {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else if b >= KIB {
        format!("{:.2} KiB", b / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// What PyTorch (2.1 and later) prints when the caching allocator cannot get
/// `tried` bytes from the driver on local GPU `gpu`.
pub fn torch_oom(
    gpu: u32,
    tried: u64,
    capacity: u64,
    free: u64,
    in_use: u64,
    allocated: u64,
) -> String {
    format!(
        "Traceback (most recent call last):\n  File \"/workspace/train.py\", line 212, in <module>\n    loss.backward()\n\
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {}. GPU {gpu} has a total capacity of {} of which {} is free. \
Including non-PyTorch memory, this process has {} memory in use. Of the allocated memory {} is allocated by PyTorch, \
and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  \
(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n",
        torch_size(tried),
        torch_size(capacity),
        torch_size(free),
        torch_size(in_use),
        torch_size(allocated),
        torch_size(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::oom::{self, Failure};

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_operator_reads_what_the_trainer_prints() {
        let text = torch_oom(3, 20 * GIB, 79 * GIB, 7 * GIB, 60 * GIB, 59 * GIB);
        let Failure::GpuOom(o) = oom::classify(Some("Error"), Some(1), &text) else {
            panic!("not recognised as a GPU OOM: {text}");
        };
        assert_eq!(o.gpu, Some(3));
        assert_eq!(o.tried_bytes, Some(20 * GIB));
        assert_eq!(o.process_in_use_bytes, Some(60 * GIB));
        assert_eq!(oom::need_floor_bytes(&o), Some(80 * GIB));
        assert!(!crate::operator::learn::fragmented(&o));
    }

    #[test]
    fn the_factor_is_a_property_of_the_shape() {
        let tj = crate::api::parse::training_job(serde_json::json!({
            "apiVersion": "vramguard.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "a"},
            "spec": {"model": {"preset": "gpt2"}, "template": {}}
        }))
        .unwrap();
        let job = crate::api::validate_job(&tj).unwrap();
        let mut other = tj.clone();
        other.metadata.name = Some("b".into());
        let other = crate::api::validate_job(&other).unwrap();
        let f = drawn_factor(&job, 7, (0.9, 1.3));
        assert!((0.9..1.3).contains(&f), "{f}");
        assert_eq!(f, drawn_factor(&other, 7, (0.9, 1.3)));
        assert_ne!(f, drawn_factor(&job, 8, (0.9, 1.3)));
    }
}
