//! What a GPU out-of-memory death teaches: pure.
//!
//! The message proves a lower bound of what the attempt needed per GPU: what
//! the process held plus the allocation it could not get
//! ([`oom::need_floor_bytes`]); without those numbers, more than the GPU's
//! whole capacity (the message's, else the placed product's). The ratio of
//! that bound to the attempt's estimate (its point, not its upper end: the
//! scale multiplies the upper end of later estimates, whose spread over the
//! point differs by plan and GPU) becomes the scale on every later
//! estimate of the job (and of jobs with the same fingerprint), and each
//! retry assumes at least [`MIN_STEP`] more than the last: the failed
//! allocation is rarely the last one the step would have made.
//!
//! Fragmentation first: when PyTorch reports more memory reserved but
//! unallocated than the failed allocation asked for (and at least 5 % of
//! what it reserved), the memory was there but in pieces; the first such retry turns on `expandable_segments` and
//! changes nothing else.

use super::oom::{self, Framework as OomFramework, GpuOom};
use crate::api::Learned;

/// The least a retry raises the scale by.
pub const MIN_STEP: f64 = 1.10;

/// The lesson of one OOM.
#[derive(Clone, Debug, PartialEq)]
pub struct Lesson {
    pub learned: Learned,
    /// What the message proves the attempt needed per GPU, at least.
    pub observed_bytes: Option<u64>,
    /// The ratio of that to the attempt's estimate.
    pub ratio: Option<f64>,
    /// The memory was there but fragmented: the retry changes the
    /// allocator, not the estimate, and the bound above counts the
    /// fragments (it is no evidence about the job's real need).
    pub fragmentation: bool,
}

/// True when the message shows the memory was there but fragmented: PyTorch
/// held more reserved-but-unallocated memory than the failed allocation
/// asked for, and that is a noticeable share (≥ 5 %) of what it reserved.
pub fn fragmented(o: &GpuOom) -> bool {
    match (
        o.reserved_unallocated_bytes(),
        o.tried_bytes,
        o.reserved_by_framework_bytes,
    ) {
        (Some(unallocated), Some(tried), Some(reserved)) => {
            o.framework == OomFramework::PyTorch
                && unallocated >= tried
                && unallocated >= reserved / 20
        }
        _ => false,
    }
}

/// Learn from `o`, an OOM of an attempt estimated at `estimated_bytes` per GPU
/// on a GPU offering `gpu_usable_bytes`.
pub fn learn(
    o: &GpuOom,
    previous: Option<&Learned>,
    estimated_bytes: u64,
    gpu_usable_bytes: Option<u64>,
) -> Lesson {
    let prev_scale = previous
        .map(|l| l.scale)
        .filter(|s| s.is_finite() && *s >= 1.0)
        .unwrap_or(1.0);
    let prev_expandable = previous.is_some_and(|l| l.expandable_segments);
    let profile = previous.and_then(|l| l.profile.clone());
    let observed = oom::need_floor_bytes(o)
        .or_else(|| o.total_bytes.and_then(|t| t.checked_add(1)))
        .or_else(|| gpu_usable_bytes.and_then(|t| t.checked_add(1)));
    let ratio = observed
        .filter(|_| estimated_bytes > 0)
        .map(|b| b as f64 / estimated_bytes as f64);
    if fragmented(o) && !prev_expandable {
        return Lesson {
            learned: Learned {
                scale: prev_scale,
                expandable_segments: true,
                profile,
            },
            observed_bytes: observed,
            ratio,
            fragmentation: true,
        };
    }
    let scale = (prev_scale * MIN_STEP).max(ratio.unwrap_or(0.0));
    Lesson {
        learned: Learned {
            scale,
            expandable_segments: prev_expandable,
            profile,
        },
        observed_bytes: observed,
        ratio,
        fragmentation: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn torch(text: &str) -> GpuOom {
        oom::parse(text).expect("a PyTorch OOM")
    }

    #[test]
    fn the_message_sets_the_scale() {
        // 78.12 GiB in use + 2 GiB tried = 80.12 GiB proven; estimated 60 GiB.
        let o = torch(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.",
        );
        let l = learn(&o, None, 60 * GIB, Some(79 * GIB));
        let proven = l.observed_bytes.unwrap();
        assert!(proven > 80 * GIB && proven < 81 * GIB, "{proven}");
        assert!((l.learned.scale - proven as f64 / (60 * GIB) as f64).abs() < 1e-9);
        assert!(!l.learned.expandable_segments);
    }

    #[test]
    fn every_retry_steps_up_at_least_ten_percent() {
        let o = torch(
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.61 GiB already allocated; 8.69 MiB free; 9.67 GiB reserved in total by PyTorch)",
        );
        // The estimate was already above what the message proves; 61 MiB
        // reserved but unallocated is not fragmentation worth a retry.
        assert!(!fragmented(&o));
        let l = learn(&o, None, 20 * GIB, None);
        assert!((l.learned.scale - MIN_STEP).abs() < 1e-9);
        let again = learn(&o, Some(&l.learned), 20 * GIB, None);
        assert!((again.learned.scale - MIN_STEP * MIN_STEP).abs() < 1e-9);
    }

    #[test]
    fn fragmentation_turns_on_expandable_segments_once() {
        // 6 GiB reserved but unallocated, 2 GiB asked for.
        let o = torch(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.80 GiB memory in use. Of the allocated memory 71.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved by PyTorch but unallocated.",
        );
        assert!(fragmented(&o));
        let first = learn(&o, None, 70 * GIB, None);
        assert!(first.learned.expandable_segments);
        assert!(first.fragmentation);
        assert_eq!(first.learned.scale, 1.0);
        let second = learn(&o, Some(&first.learned), 70 * GIB, None);
        assert!(second.learned.expandable_segments);
        assert!(second.learned.scale >= MIN_STEP);
    }

    #[test]
    fn without_numbers_the_capacity_is_the_bound() {
        let o = oom::parse("NCCL WARN Cuda failure 'out of memory'").expect("an NCCL OOM");
        let l = learn(&o, None, 40 * GIB, Some(79 * GIB));
        assert_eq!(l.observed_bytes, Some(79 * GIB + 1));
        assert!(l.learned.scale > 1.97);
        let unknown = learn(&o, None, 0, None);
        assert_eq!(unknown.ratio, None);
        assert!((unknown.learned.scale - MIN_STEP).abs() < 1e-9);
    }
}
