//! Fit decisions: need vs one GPU's view (`fit`), the cheapest change that
//! fits (`shrink`, priced by `cost`), and placement over the cluster's GPUs
//! (`place`). Pure functions, no I/O.

mod advice;
pub mod cost;
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
pub use shrink::{Allowance, Shrink, search, shrink};

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
    let need = with_margin(per_gpu_bytes, safety_margin);
    let have = gpu.free_bytes;
    let memory_ok = need <= have;
    let block_ok = largest_tensor_bytes <= gpu.largest_block_bytes;
    let binding = if !memory_ok {
        Binding::FreeMemory
    } else if !block_ok {
        Binding::LargestBlock
    } else if have - need <= gpu.largest_block_bytes - largest_tensor_bytes {
        Binding::FreeMemory
    } else {
        Binding::LargestBlock
    };
    Verdict {
        fits: memory_ok && block_ok,
        need_bytes: need,
        have_bytes: have,
        headroom_bytes: have.saturating_sub(need),
        short_by_bytes: need.saturating_sub(have),
        largest_tensor_bytes,
        largest_block_bytes: gpu.largest_block_bytes,
        binding,
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
