//! The `Gpu` trait: what the node agent asks of a GPU backend (NVML + CUDA on
//! a real node, a YAML file in simulation), the plain values the backends
//! answer with, and the bounded largest-block search they share. No I/O here:
//! the backends do it.

use std::time::{Duration, Instant};

/// Why a backend could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// A shared library could not be loaded at all.
    #[error("could not load {library}: {reason}")]
    LibraryMissing { library: String, reason: String },
    /// The library loaded but lacks a function this call needs (an older driver).
    #[error("{library} has no function {symbol}: the driver is older than this call needs")]
    MissingSymbol { library: String, symbol: String },
    /// A library call returned an error.
    #[error("{call}{}: {message}", device_suffix(.device))]
    Call {
        call: String,
        device: Option<u32>,
        message: String,
    },
    /// The index is past the last device.
    #[error("GPU {index} does not exist: this node has {count} GPU(s)")]
    NoSuchDevice { index: u32, count: u32 },
    /// The backend cannot answer this question (e.g. NVML alone cannot allocate).
    #[error("{what} is not supported by the {backend} backend")]
    Unsupported {
        backend: &'static str,
        what: &'static str,
    },
}

fn device_suffix(device: &Option<u32>) -> String {
    device.map(|d| format!(" (GPU {d})")).unwrap_or_default()
}

impl GpuError {
    /// A failed call, with the device it was about.
    pub fn call(call: impl Into<String>, device: Option<u32>, message: impl ToString) -> GpuError {
        GpuError::Call {
            call: call.into(),
            device,
            message: message.to_string(),
        }
    }
}

/// Memory as the driver counts it. With NVML's v2 query `total = free + used
/// + reserved`; with the v1 query the reserve is inside `used` and
/// `reserved_bytes` is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub reserved_bytes: Option<u64>,
}

/// A process with a compute context on the device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// `None` where the driver does not say (Windows WDDM, some containers).
    pub used_bytes: Option<u64>,
}

/// MIG state of a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MigMode {
    /// The device cannot be split, or the driver does not say.
    #[default]
    Unsupported,
    Disabled,
    Enabled,
}

/// One MIG device (GPU instance) of a split GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigInfo {
    pub index: u32,
    pub uuid: Option<String>,
    /// Profile, e.g. `3g.40gb`.
    pub profile: String,
    pub memory: MemoryInfo,
}

/// What the driver says about the device's health. `None`: not available.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Pages waiting to be retired (needs a GPU reset).
    pub retired_pages_pending: Option<bool>,
    /// XID errors seen since the agent started, oldest first.
    pub xids: Vec<u64>,
}

/// XIDs that mean the hardware or its memory is not to be trusted
/// (NVIDIA's XID catalog: 48 double-bit ECC, 62/64 remap failures, 74 NVLink,
/// 79 fell off the bus, 92 high single-bit rate, 94/95 contained/uncontained
/// ECC, 119/120 GSP errors). XIDs such as 13, 31 or 43 are application faults.
pub const CRITICAL_XIDS: &[u64] = &[48, 62, 64, 74, 79, 92, 94, 95, 119, 120];

impl Health {
    /// Reasons to distrust the device, empty when none.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(n) = self.ecc_uncorrected_volatile
            && n > 0
        {
            out.push(format!(
                "{n} uncorrected ECC error(s) since the driver loaded"
            ));
        }
        if self.retired_pages_pending == Some(true) {
            out.push("pages are pending retirement: the GPU needs a reset".to_string());
        }
        for x in &self.xids {
            if CRITICAL_XIDS.contains(x) {
                out.push(format!("XID {x}"));
            }
        }
        out
    }
}

/// Everything the agent reads about one device in one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: u32,
    pub uuid: Option<String>,
    /// Product name as the driver reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub product: Option<String>,
    /// Lowercase architecture, e.g. `hopper` (`estimate::gpus::Architecture::as_str`).
    pub architecture: Option<String>,
    pub memory: MemoryInfo,
    /// `None`: the driver could not list them.
    pub processes: Option<Vec<ProcessInfo>>,
    pub mig_mode: MigMode,
    pub mig_devices: Vec<MigInfo>,
    pub health: Health,
    /// Optional data the backend could not read, with why (`uuid: ...`).
    pub missing: Vec<String>,
}

/// The outcome of a largest-block search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockProbe {
    /// Largest size that was allocated (a multiple of the granularity).
    pub bytes: u64,
    /// The upper bound searched: the smaller of what was asked and what was free.
    pub limit_bytes: u64,
    /// True when the true largest block is below `bytes + granularity`; false
    /// when the step or time budget ran out first (`bytes` is then a lower bound).
    pub exact: bool,
    /// Allocation attempts made.
    pub steps: u32,
    pub elapsed: Duration,
}

/// A touch-and-verify pass over one block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryCheck {
    pub bytes: u64,
    /// Words that did not read back what was written.
    pub mismatched_words: u64,
    /// Index of the first bad 8-byte word, when any.
    pub first_bad_word: Option<u64>,
    pub write_gb_per_s: Option<f64>,
    pub read_gb_per_s: Option<f64>,
}

/// Bounds on a largest-block search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchLimits {
    /// Sizes tried are multiples of this (cuMemAlloc maps 2 MiB pages).
    pub granularity_bytes: u64,
    /// At most this many allocation attempts.
    pub max_steps: u32,
    /// Stop at this instant, keeping the best size found.
    pub deadline: Instant,
}

/// Tries below the maximum before the largest-block search bisects.
pub const GALLOP_STEPS: u32 = 8;

/// The allocation granularity the search uses by default.
pub const DEFAULT_GRANULARITY_BYTES: u64 = 2 << 20;

impl SearchLimits {
    /// 2 MiB granularity, 40 steps (enough to resolve 2 TiB), `budget` from now.
    pub fn within(budget: Duration) -> SearchLimits {
        SearchLimits {
            granularity_bytes: DEFAULT_GRANULARITY_BYTES,
            max_steps: 40,
            deadline: Instant::now() + budget,
        }
    }
}

/// A GPU backend. Object-safe and synchronous: calls may block (driver calls,
/// allocations), so async callers run them on a blocking thread.
pub trait Gpu: Send + Sync {
    /// Short name for messages: `nvml`, `nvml+cuda`, `simulated`.
    fn backend(&self) -> &'static str;
    fn device_count(&self) -> Result<u32, GpuError>;
    /// Everything about one device; an error means the device could not be
    /// read at all (its memory could not be queried).
    fn device(&self, index: u32) -> Result<DeviceInfo, GpuError>;
    fn driver_version(&self) -> Result<Option<String>, GpuError>;
    /// CUDA version the driver supports, e.g. `12.8`.
    fn cuda_version(&self) -> Result<Option<String>, GpuError>;
    /// Memory one new CUDA context takes on the device.
    fn context_overhead_bytes(&self, index: u32) -> Result<u64, GpuError>;
    /// Largest block a new process could allocate on the device now, at most
    /// `max_bytes` and never more than is free, within `limits`.
    fn largest_allocatable_block(
        &self,
        index: u32,
        max_bytes: u64,
        limits: SearchLimits,
    ) -> Result<BlockProbe, GpuError>;
    /// Write a pattern into a block of `bytes`, read it back, time both.
    fn verify_block(&self, index: u32, bytes: u64) -> Result<MemoryCheck, GpuError> {
        let _ = (index, bytes);
        Err(GpuError::Unsupported {
            backend: self.backend(),
            what: "memory verification",
        })
    }
}

/// Find the largest size `try_alloc` accepts, up to `max_bytes`, by bisection
/// over multiples of the granularity. `try_alloc(n)` allocates `n` bytes and
/// frees them again, answering `Ok(false)` when out of memory.
///
/// The maximum is tried first, so an unfragmented device costs one attempt.
/// Then the search gallops down from it (1, 2, 4, … granules below, at most
/// [`GALLOP_STEPS`] tries): on an idle device the largest block is a few
/// granules under what is free (measured on an H200: 4 MiB under 139 GiB), so
/// a handful of attempts brackets it, each of which maps most of the device
/// (about 0.4 s there). What the gallop leaves open is bisected. At most
/// `log2(max / granularity) + 1 + GALLOP_STEPS` attempts, fewer when `limits`
/// stop it (the result is then a lower bound, `exact: false`, and after the
/// gallop's first success a close one).
pub fn search_largest_block(
    max_bytes: u64,
    limits: SearchLimits,
    mut try_alloc: impl FnMut(u64) -> Result<bool, GpuError>,
) -> Result<BlockProbe, GpuError> {
    let started = Instant::now();
    let gran = limits.granularity_bytes.max(1);
    let top = max_bytes / gran;
    let mut probe = BlockProbe {
        bytes: 0,
        limit_bytes: max_bytes,
        exact: true,
        steps: 0,
        elapsed: Duration::ZERO,
    };
    if top == 0 {
        return Ok(probe);
    }
    let out_of_budget = |steps: u32| steps >= limits.max_steps || Instant::now() >= limits.deadline;
    if out_of_budget(0) {
        probe.exact = false;
        probe.elapsed = started.elapsed();
        return Ok(probe);
    }
    probe.steps = 1;
    if try_alloc(top * gran)? {
        probe.bytes = top * gran;
        probe.elapsed = started.elapsed();
        return Ok(probe);
    }
    // `lo` units are known to fit (0 trivially), `hi` units are known not to.
    let (mut lo, mut hi) = (0u64, top);
    let mut below = 1u64;
    for _ in 0..GALLOP_STEPS {
        if below >= hi || out_of_budget(probe.steps) {
            break;
        }
        probe.steps += 1;
        if try_alloc((top - below) * gran)? {
            lo = top - below;
            break;
        }
        hi = top - below;
        below *= 2;
    }
    while hi - lo > 1 {
        if out_of_budget(probe.steps) {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        probe.steps += 1;
        if try_alloc(mid * gran)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    probe.bytes = lo * gran;
    probe.exact = hi - lo <= 1;
    probe.elapsed = started.elapsed();
    Ok(probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn limits(steps: u32) -> SearchLimits {
        SearchLimits {
            granularity_bytes: 2 * MIB,
            max_steps: steps,
            deadline: Instant::now() + Duration::from_secs(60),
        }
    }

    #[test]
    fn unfragmented_costs_one_attempt() {
        let p = search_largest_block(80 << 30, limits(40), |_| Ok(true)).unwrap();
        assert_eq!(p.bytes, 80 << 30);
        assert_eq!(p.steps, 1);
        assert!(p.exact);
    }

    #[test]
    fn finds_the_largest_within_one_granule() {
        for truth in [
            0,
            1,
            2 * MIB - 1,
            2 * MIB,
            3 * MIB,
            4_321 * MIB + 17,
            80_000 * MIB,
        ] {
            let p = search_largest_block(81_000 * MIB, limits(40), |n| Ok(n <= truth)).unwrap();
            assert!(p.exact, "{truth}");
            assert!(
                p.bytes <= truth && truth < p.bytes + 2 * MIB,
                "{truth}: {p:?}"
            );
            // log2(81000 MiB / 2 MiB) ≈ 15.3: one try of the maximum, the
            // gallop and 16 halvings.
            assert!(p.steps <= 17 + GALLOP_STEPS, "{p:?}");
        }
    }

    /// An idle device's largest block lies a few granules under what is free:
    /// the gallop finds it in a handful of attempts, and a budget that stops
    /// the search early still leaves a lower bound within a few granules.
    #[test]
    fn a_block_just_under_the_maximum_costs_a_few_attempts() {
        let top = 142_630 * MIB;
        for under in [1, 2, 3, 7, 100] {
            let truth = top - under * 2 * MIB;
            let p = search_largest_block(top, limits(40), |n| Ok(n <= truth)).unwrap();
            assert!(p.exact && p.bytes == truth, "{under}: {p:?}");
            let bits = 64 - under.leading_zeros();
            assert!(p.steps <= 1 + 2 * bits + 1, "{under}: {p:?}");
        }
        let truth = top - 3 * 2 * MIB;
        let p = search_largest_block(top, limits(4), |n| Ok(n <= truth)).unwrap();
        assert!(!p.exact || p.bytes == truth, "{p:?}");
        assert!(p.bytes <= truth && truth - p.bytes <= 2 * 2 * MIB, "{p:?}");
    }

    #[test]
    fn step_budget_gives_a_lower_bound() {
        let truth = 1_234 * MIB;
        let p = search_largest_block(80_000 * MIB, limits(4), |n| Ok(n <= truth)).unwrap();
        assert!(!p.exact);
        assert_eq!(p.steps, 4);
        assert!(p.bytes <= truth);
    }

    #[test]
    fn a_passed_deadline_tries_nothing() {
        let l = SearchLimits {
            deadline: Instant::now() - Duration::from_millis(1),
            ..limits(40)
        };
        let p = search_largest_block(1 << 30, l, |_| panic!("no attempt expected")).unwrap();
        assert_eq!((p.bytes, p.steps, p.exact), (0, 0, false));
    }

    #[test]
    fn errors_stop_the_search() {
        let e = search_largest_block(1 << 30, limits(40), |_| {
            Err(GpuError::call("cuMemAlloc", Some(0), "launch failed"))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "cuMemAlloc (GPU 0): launch failed");
    }

    #[test]
    fn health_problems() {
        let h = Health {
            ecc_uncorrected_volatile: Some(2),
            retired_pages_pending: Some(true),
            xids: vec![13, 79],
        };
        let p = h.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[2].contains("XID 79"));
        assert!(Health::default().problems().is_empty());
    }
}
