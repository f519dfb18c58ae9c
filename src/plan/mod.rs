//! Fit decisions: need vs one GPU's view (`fit`), the cheapest change that
//! fits (`shrink`, priced by `cost`), and placement over the cluster's GPUs
//! (`place`). Pure functions, no I/O.

mod advice;
pub mod cost;
pub mod max;
pub mod memo;
pub mod place;
pub mod settings;
pub mod shrink;

pub use advice::Advice;
pub use place::{
    Assignment, DeviceAssignment, Need, NodeAssignment, PlaceOutcome, Request, Reservation,
    ReservationIndex, architecture_of, held_in, place, place_scaled, place_scaled_in, place_with,
    reservations_of, scale_bytes,
};
pub use settings::{ALL_FIELDS, Plan, Settings, effective_batch};
pub use shrink::{Allowance, cheapest_plan, search, search_below};

use crate::api::ValidatedJob;
use crate::estimate::framework::AllocatorLimit;
use crate::estimate::{Estimate, EstimateError, GpuProduct};
use advice::advise;
use serde::Serialize;

/// What one GPU offers a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuView {
    /// Memory the device has in all.
    pub total_bytes: u64,
    /// Memory free for this job now (as probed, minus reservations).
    pub free_bytes: u64,
    /// Largest single block the job could allocate.
    pub largest_block_bytes: u64,
}

impl GpuView {
    /// An empty GPU: everything but the driver's reserve is free in one block.
    pub fn empty(total_bytes: u64) -> GpuView {
        GpuView {
            total_bytes,
            free_bytes: total_bytes,
            largest_block_bytes: total_bytes,
        }
    }
}

/// Which constraint decides the verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Binding {
    /// Total free memory.
    FreeMemory,
    /// The largest tensor against the largest free block.
    LargestBlock,
    /// Reserved bytes against the framework allocator's own limit.
    AllocatorLimit,
    /// The GPU cannot run the job as written whatever its memory (bf16 before Ampere).
    Unsupported,
}

/// The framework allocator's own limit, checked against the reserved bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorCheck {
    /// The limit on this GPU.
    pub limit_bytes: u64,
    /// Peak reserved bytes with the safety margin.
    pub need_bytes: u64,
    /// Why the limit exists.
    pub reason: String,
    /// The setting that would lift it enough, when one exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl AllocatorCheck {
    /// For people: the shortfall, the limit, what the job needs under it,
    /// and the setting that would let it through.
    pub fn explain(&self, short_by_bytes: u64) -> String {
        let gib = |b: u64| b as f64 / crate::estimate::GIB;
        let mut s = format!(
            "short by {:.1} GiB: {}: {:.1} GiB here, and it needs {:.1} GiB reserved with the safety margin",
            gib(short_by_bytes),
            self.reason,
            gib(self.limit_bytes),
            gib(self.need_bytes)
        );
        if let Some(fix) = &self.fix {
            s.push_str(&format!("; {fix} to let it through"));
        }
        s
    }
}

/// The outcome of a fit check, with its numbers.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub fits: bool,
    /// Per-GPU bytes including the safety margin.
    pub need_bytes: u64,
    pub have_bytes: u64,
    /// have − need when it fits, else 0.
    pub headroom_bytes: u64,
    /// need − have when it does not fit, else 0.
    pub short_by_bytes: u64,
    pub largest_tensor_bytes: u64,
    pub largest_block_bytes: u64,
    /// The constraint that binds (the failing one, or the tighter one).
    pub binding: Binding,
    /// The framework allocator's limit, when it has one (JAX, TensorFlow).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_limit: Option<AllocatorCheck>,
    /// Why the GPU cannot run the job as written whatever its memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

/// Need with the safety margin, saturating (margin is validated to [0, 1)).
pub fn with_margin(per_gpu_bytes: u64, safety_margin: f64) -> u64 {
    let margin = (per_gpu_bytes as f64 * safety_margin.clamp(0.0, 1.0)).ceil();
    per_gpu_bytes.saturating_add(margin as u64)
}

/// Does a job needing `per_gpu_bytes` (largest tensor `largest_tensor_bytes`) fit `gpu`?
pub fn fit(
    per_gpu_bytes: u64,
    largest_tensor_bytes: u64,
    safety_margin: f64,
    gpu: GpuView,
) -> Verdict {
    fit_limited(
        per_gpu_bytes,
        largest_tensor_bytes,
        safety_margin,
        gpu,
        None,
    )
}

/// Does the job of `est` fit `gpu`, its framework allocator's limit included?
pub fn fit_estimate(est: &Estimate, safety_margin: f64, gpu: GpuView) -> Verdict {
    let mut v = fit_limited(
        est.status.fit_per_gpu_bytes(),
        est.status.largest_tensor_bytes,
        safety_margin,
        gpu,
        est.allocator_limit
            .map(|l| (est.status.fit_reserved_bytes(), l)),
    );
    if let Some(why) = &est.unsupported {
        v.fits = false;
        v.headroom_bytes = 0;
        v.binding = Binding::Unsupported;
        v.unsupported = Some(why.clone());
    }
    v
}

/// [`fit`], plus a limit the allocator puts on its reserved bytes.
pub fn fit_limited(
    per_gpu_bytes: u64,
    largest_tensor_bytes: u64,
    safety_margin: f64,
    gpu: GpuView,
    limit: Option<(u64, AllocatorLimit)>,
) -> Verdict {
    let need = with_margin(per_gpu_bytes, safety_margin);
    let have = gpu.free_bytes;
    let memory_ok = need <= have;
    let block_ok = largest_tensor_bytes <= gpu.largest_block_bytes;
    let check = limit.map(|(reserved, l)| {
        let need = with_margin(reserved, safety_margin);
        let limit_bytes = l.bytes(gpu.total_bytes, gpu.free_bytes);
        AllocatorCheck {
            limit_bytes,
            need_bytes: need,
            reason: l.reason(),
            fix: (need > limit_bytes)
                .then(|| l.fix(need, gpu.total_bytes, gpu.free_bytes))
                .flatten(),
        }
    });
    let (limit_ok, limit_room, limit_short) = match &check {
        Some(c) => (
            c.need_bytes <= c.limit_bytes,
            c.limit_bytes.saturating_sub(c.need_bytes),
            c.need_bytes.saturating_sub(c.limit_bytes),
        ),
        None => (true, u64::MAX, 0),
    };
    let memory_room = have.saturating_sub(need);
    let block_room = gpu.largest_block_bytes.saturating_sub(largest_tensor_bytes);
    let memory_short = need.saturating_sub(have);
    let binding = if !limit_ok && limit_short >= memory_short {
        Binding::AllocatorLimit
    } else if !memory_ok {
        Binding::FreeMemory
    } else if !block_ok {
        Binding::LargestBlock
    } else if limit_room < memory_room.min(block_room) {
        Binding::AllocatorLimit
    } else if memory_room <= block_room {
        Binding::FreeMemory
    } else {
        Binding::LargestBlock
    };
    Verdict {
        fits: memory_ok && block_ok && limit_ok,
        need_bytes: need,
        have_bytes: have,
        headroom_bytes: if limit_ok {
            memory_room.min(limit_room)
        } else {
            0
        },
        short_by_bytes: memory_short.max(limit_short),
        largest_tensor_bytes,
        largest_block_bytes: gpu.largest_block_bytes,
        binding,
        allocator_limit: check,
        unsupported: None,
    }
}

/// A GPU of `usable` bytes, empty, as a job whose estimates are `scale`
/// times too small sees it: need × scale ≤ free ⟺ need ≤ free / scale.
pub fn scaled_view(usable: u64, scale: f64) -> GpuView {
    let bytes = if scale > 1.0 {
        (usable as f64 / scale).floor() as u64
    } else {
        usable
    };
    GpuView::empty(bytes)
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

/// Fit the job to `view` of `gpu` under its own fit policy: as written if it
/// fits, else the cheapest allowed plan, else advice. Errors only when the job
/// as written cannot be estimated.
pub fn shrink(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
) -> Result<Shrink, EstimateError> {
    let (as_written, plan) = shrink::as_written_and_plan(job, gpu, view)?;
    if plan.is_some() {
        return Ok(Shrink {
            gpu: gpu.name,
            as_written,
            plan,
            advice: None,
        });
    }
    let allowed = Allowance::from_policy(&job.spec().fit_policy);
    let advice = advise(job, gpu, view, allowed, &as_written);
    Ok(Shrink {
        gpu: gpu.name,
        as_written,
        plan: None,
        advice: Some(advice),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn fits_with_headroom() {
        let v = fit(10 * GIB, GIB, 0.0, GpuView::empty(16 * GIB));
        assert!(v.fits);
        assert_eq!(v.headroom_bytes, 6 * GIB);
        assert_eq!(v.short_by_bytes, 0);
    }

    #[test]
    fn an_allocator_limit_binds_below_free_memory() {
        let jax = AllocatorLimit::Fraction {
            fraction: 0.75,
            variable: None,
        };
        let limit = (79 * GIB) / 4 * 3;
        // On an empty 79 GiB GPU, per-GPU and reserved GiB.
        let check = |per_gpu: u64, reserved: u64| {
            fit_limited(
                per_gpu * GIB,
                GIB,
                0.0,
                GpuView::empty(79 * GIB),
                Some((reserved * GIB, jax)),
            )
        };
        // 70 GiB reserved fits 79 GiB free but not 75 % of it.
        let v = check(71, 70);
        assert!(!v.fits);
        assert_eq!(v.binding, Binding::AllocatorLimit);
        let c = v.allocator_limit.as_ref().unwrap();
        assert_eq!(c.limit_bytes, limit);
        assert_eq!(v.short_by_bytes, 70 * GIB - limit);
        assert!(c.fix.as_deref().unwrap().contains("=0.89"), "{c:?}");
        // Under the limit, the tighter of the two sets the headroom.
        let v = check(51, 50);
        assert!(v.fits);
        assert_eq!(v.binding, Binding::AllocatorLimit);
        assert_eq!(v.headroom_bytes, limit - 50 * GIB);
        // Short of free memory by more than of the limit: free memory binds.
        let v = check(90, 60);
        assert_eq!(v.binding, Binding::FreeMemory);
        assert_eq!(v.short_by_bytes, 11 * GIB);
    }

    #[test]
    fn margin_can_tip_the_verdict() {
        let v = fit(10 * GIB, GIB, 0.1, GpuView::empty(10 * GIB + GIB / 2));
        assert!(!v.fits);
        assert_eq!(v.need_bytes, 11 * GIB);
        assert_eq!(v.short_by_bytes, GIB / 2);
        assert_eq!(v.binding, Binding::FreeMemory);
    }

    #[test]
    fn fragmented_gpu_binds_on_the_largest_block() {
        let gpu = GpuView {
            total_bytes: 80 * GIB,
            free_bytes: 40 * GIB,
            largest_block_bytes: 2 * GIB,
        };
        let v = fit(20 * GIB, 4 * GIB, 0.05, gpu);
        assert!(!v.fits);
        assert_eq!(v.binding, Binding::LargestBlock);
    }

    #[test]
    fn margin_saturates() {
        assert_eq!(with_margin(u64::MAX, 0.5), u64::MAX);
    }
}
