//! Recognising a GPU out-of-memory death from what a failed container left
//! behind: its termination message or the tail of its log. Pure: text in,
//! typed facts out, no I/O, and no panic on any input.
//!
//! Kubelet reports a CUDA OOM only as exit code 1 with reason `Error`; the
//! framework's message is the only evidence of how much memory was missing.
//! Recognised:
//!
//! - PyTorch, today's format (2.1+): `torch.OutOfMemoryError: CUDA out of
//!   memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15
//!   GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process
//!   has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is
//!   allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but
//!   unallocated.`
//! - PyTorch, the older format: `RuntimeError: CUDA out of memory. Tried to
//!   allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.61 GiB already
//!   allocated; 8.69 MiB free; 9.67 GiB reserved in total by PyTorch)`
//!   (before 1.4: `... cached)`), and `CUDA error: out of memory` from CUDA
//!   calls outside the caching allocator;
//! - either under torchrun's per-line prefixes `[rank3]:` (global rank) or
//!   `[default0]:` (`--tee`, local rank of the role), with a traceback after;
//! - TensorFlow: `ResourceExhaustedError: OOM when allocating tensor with
//!   shape[32,1024,1024] and type float on ... by allocator GPU_0_bfc`, and
//!   the BFC allocator's `Allocator (GPU_0_bfc) ran out of memory trying to
//!   allocate 4.00GiB (rounded to 4294967296)` with its `Limit:` / `InUse:`
//!   statistics. The allocator's non-fatal warning (`... The caller indicates
//!   that this is not a failure ...`) is not an OOM;
//! - JAX/XLA: `RESOURCE_EXHAUSTED: Out of memory while trying to allocate N
//!   bytes` and `Failed to allocate request for 1.00GiB (1073741824B)`;
//! - NCCL: `NCCL WARN Cuda failure 'out of memory'` (also `Cuda failure 2
//!   'out of memory'`), and `ncclUnhandledCudaError` when the same text says
//!   the CUDA failure was `out of memory` (alone it is any CUDA failure);
//! - cuBLAS `CUBLAS_STATUS_ALLOC_FAILED`, cuDNN `CUDNN_STATUS_ALLOC_FAILED`,
//!   the driver's `CUDA_ERROR_OUT_OF_MEMORY` and the runtime's
//!   `cudaErrorMemoryAllocation`.
//!
//! Sizes: `B`/`bytes`, binary `KiB MiB GiB TiB`, and decimal `KB MB GB TB`
//! taken at their SI value (1000-based) as written. Numbers are parsed as
//! integers with up to nine fractional digits; all arithmetic is checked and
//! a number that does not fit `u64` is left out, not wrapped.

use std::fmt;

mod parse;
#[cfg(test)]
mod tests;

pub use parse::{parse, size};

/// Which software reported the failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    PyTorch,
    TensorFlow,
    Jax,
    Nccl,
    Cublas,
    Cudnn,
    /// A bare CUDA allocation error, from no framework in particular.
    Cuda,
}

impl fmt::Display for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Framework::PyTorch => "PyTorch",
            Framework::TensorFlow => "TensorFlow",
            Framework::Jax => "JAX",
            Framework::Nccl => "NCCL",
            Framework::Cublas => "cuBLAS",
            Framework::Cudnn => "cuDNN",
            Framework::Cuda => "CUDA",
        })
    }
}

/// What one GPU out-of-memory message says. Every number is what the message
/// states (or, for TensorFlow's tensor shapes, shape × element size); absent
/// when the message does not give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuOom {
    pub framework: Framework,
    /// The rank that died: the global rank from torchrun's `[rankN]:` prefix,
    /// else the local rank from a `[defaultN]:` (role) prefix.
    pub rank: Option<u32>,
    /// The CUDA device index the message names (`GPU 0`, `GPU_0_bfc`).
    pub gpu: Option<u32>,
    /// The allocation that failed.
    pub tried_bytes: Option<u64>,
    /// The device's total capacity (TensorFlow: the allocator's limit).
    pub total_bytes: Option<u64>,
    /// Free on the device when the allocation failed.
    pub free_bytes: Option<u64>,
    /// Allocated by the framework's allocator (PyTorch "allocated by
    /// PyTorch" / "already allocated"; TensorFlow `InUse`).
    pub allocated_by_framework_bytes: Option<u64>,
    /// Reserved (allocated plus cached) by the framework's allocator. Today's
    /// PyTorch message gives the unallocated part; this is allocated plus it.
    pub reserved_by_framework_bytes: Option<u64>,
    /// This process's whole footprint on the device, non-framework memory
    /// (CUDA context, cuBLAS workspaces, NCCL buffers) included.
    pub process_in_use_bytes: Option<u64>,
}

impl GpuOom {
    fn new(framework: Framework) -> GpuOom {
        GpuOom {
            framework,
            rank: None,
            gpu: None,
            tried_bytes: None,
            total_bytes: None,
            free_bytes: None,
            allocated_by_framework_bytes: None,
            reserved_by_framework_bytes: None,
            process_in_use_bytes: None,
        }
    }

    /// Reserved by the framework but not allocated: memory the caching
    /// allocator held in blocks too small or split for the request. Much of
    /// it means fragmentation (PyTorch: try `expandable_segments:True`).
    pub fn reserved_unallocated_bytes(&self) -> Option<u64> {
        self.reserved_by_framework_bytes?
            .checked_sub(self.allocated_by_framework_bytes?)
    }

    /// How many of the numbers the message gave.
    pub fn known(&self) -> usize {
        [
            self.tried_bytes,
            self.total_bytes,
            self.free_bytes,
            self.allocated_by_framework_bytes,
            self.reserved_by_framework_bytes,
            self.process_in_use_bytes,
        ]
        .iter()
        .filter(|n| n.is_some())
        .count()
    }
}

impl fmt::Display for GpuOom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} GPU out of memory", self.framework)?;
        if let Some(r) = self.rank {
            write!(f, " on rank {r}")?;
        }
        if let Some(g) = self.gpu {
            write!(f, " (GPU {g})")?;
        }
        let parts: Vec<String> = [
            ("tried to allocate", self.tried_bytes),
            ("total", self.total_bytes),
            ("free", self.free_bytes),
            ("allocated", self.allocated_by_framework_bytes),
            ("reserved", self.reserved_by_framework_bytes),
            ("process in use", self.process_in_use_bytes),
        ]
        .iter()
        .filter_map(|(what, n)| n.map(|n| format!("{what} {}", human(n))))
        .collect();
        if !parts.is_empty() {
            write!(f, ": {}", parts.join(", "))?;
        }
        Ok(())
    }
}

/// `1.50 GiB`, for messages.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scale: u64 = 1;
    while unit + 1 < UNITS.len() && bytes / scale >= 1024 {
        scale = scale.saturating_mul(1024);
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let hundredths = (u128::from(bytes) * 100 + u128::from(scale) / 2) / u128::from(scale);
    format!(
        "{}.{:02} {}",
        hundredths / 100,
        hundredths % 100,
        UNITS[unit]
    )
}

/// Why a container ended, as far as vramguard cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The kernel's OOM killer ended it for the container's memory limit
    /// (host RAM): reason `OOMKilled`, or exit code 137 (SIGKILL) with no GPU
    /// OOM in its message. More GPU memory would not have helped.
    HostOom { exit_code: Option<i32> },
    /// A GPU ran out of memory.
    GpuOom(GpuOom),
    /// Anything else.
    Other {
        reason: Option<String>,
        exit_code: Option<i32>,
    },
}

impl Failure {
    /// A one-line explanation for conditions and events.
    pub fn message(&self) -> String {
        match self {
            Failure::HostOom { exit_code } => format!(
                "the container was killed for exceeding its memory limit (host RAM, not GPU memory{}); raise the container's memory limit or lower dataloader workers/prefetching",
                exit_code
                    .map(|c| format!(", exit code {c}"))
                    .unwrap_or_default()
            ),
            Failure::GpuOom(o) => o.to_string(),
            Failure::Other { reason, exit_code } => format!(
                "the container failed ({}{})",
                reason.as_deref().unwrap_or("no reason"),
                exit_code
                    .map(|c| format!(", exit code {c}"))
                    .unwrap_or_default()
            ),
        }
    }
}

/// Classify a terminated container from its state's `reason`, `exitCode` and
/// termination message (or log tail). `OOMKilled` wins over any text: the
/// kernel killed the process whatever it printed. Then a GPU OOM in the text;
/// then exit code 137 counts as a host OOM (a SIGKILL is how the OOM killer
/// ends a process whose cgroup the kubelet did not mark, e.g. a child process).
pub fn classify(reason: Option<&str>, exit_code: Option<i32>, message: &str) -> Failure {
    if reason == Some("OOMKilled") {
        return Failure::HostOom { exit_code };
    }
    if let Some(oom) = parse(message) {
        return Failure::GpuOom(oom);
    }
    if exit_code == Some(137) {
        return Failure::HostOom { exit_code };
    }
    Failure::Other {
        reason: reason.map(str::to_string),
        exit_code,
    }
}

/// What the message proves was missing on the device when the allocation
/// failed: the failed allocation minus what was free (`tried - free`, `0`
/// when the bytes were free but not in one usable block: fragmentation).
/// When the message does not say what was free, the whole failed allocation
/// (the allocator found none of it). None without the failed allocation's size.
pub fn missing_bytes(oom: &GpuOom) -> Option<u64> {
    let tried = oom.tried_bytes?;
    Some(match oom.free_bytes {
        Some(free) => tried.saturating_sub(free),
        None => tried,
    })
}

/// The new floor for the job's per-GPU estimate: what the process held when
/// it failed plus the allocation it could not get. "Held" is the process's
/// whole footprint when the message gives it (today's PyTorch), else what the
/// framework reserved, else what it allocated. None without the failed
/// allocation's size or anything held; None on overflow.
pub fn need_floor_bytes(oom: &GpuOom) -> Option<u64> {
    let held = oom
        .process_in_use_bytes
        .or(oom.reserved_by_framework_bytes)
        .or(oom.allocated_by_framework_bytes)?;
    held.checked_add(oom.tried_bytes?)
}
