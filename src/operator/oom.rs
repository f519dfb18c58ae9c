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

/// The GPU OOM in a termination message or log tail, if there is one. When
/// several ranks report one, the report with the most numbers wins (the
/// earliest among equals).
pub fn parse(text: &str) -> Option<GpuOom> {
    let lines: Vec<(Option<u32>, &str)> = text.lines().map(strip_prefix).collect();
    let mut best: Option<GpuOom> = None;
    for (i, (rank, line)) in lines.iter().enumerate() {
        let Some(framework) = trigger(line, text) else {
            continue;
        };
        // The message and the lines that continue it (same prefix, no new trigger).
        let mut window = String::from(*line);
        for (r, next) in lines.iter().skip(i + 1).take(12) {
            if r != rank || trigger(next, text).is_some() {
                break;
            }
            window.push('\n');
            window.push_str(next);
        }
        let mut oom = GpuOom::new(framework);
        oom.rank = *rank;
        numbers(&mut oom, &window);
        if best.as_ref().is_none_or(|b| oom.known() > b.known()) {
            best = Some(oom);
        }
    }
    best
}

/// A line that reports a GPU OOM, and whose.
fn trigger(line: &str, whole: &str) -> Option<Framework> {
    let lower = line.to_ascii_lowercase();
    if line.contains("CUDA out of memory") {
        return Some(Framework::PyTorch);
    }
    if line.contains("OOM when allocating tensor") {
        return Some(Framework::TensorFlow);
    }
    if line.contains("_bfc) ran out of memory trying to allocate")
        && !line.contains("not a failure")
        && !line.contains("caller indicates")
    {
        // TensorFlow and XLA share the BFC allocator.
        return Some(
            if line.contains("external/xla") || line.contains("xla/tsl") {
                Framework::Jax
            } else {
                Framework::TensorFlow
            },
        );
    }
    if line.contains("RESOURCE_EXHAUSTED")
        && (lower.contains("out of memory") || line.contains("Failed to allocate request"))
    {
        return Some(Framework::Jax);
    }
    if line.contains("NCCL WARN")
        && lower.contains("cuda failure")
        && lower.contains("out of memory")
    {
        return Some(Framework::Nccl);
    }
    if line.contains("ncclUnhandledCudaError") && whole.contains("out of memory") {
        return Some(Framework::Nccl);
    }
    if line.contains("CUBLAS_STATUS_ALLOC_FAILED") {
        return Some(Framework::Cublas);
    }
    if line.contains("CUDNN_STATUS_ALLOC_FAILED") {
        return Some(Framework::Cudnn);
    }
    if line.contains("CUDA error: out of memory") {
        return Some(Framework::PyTorch);
    }
    if line.contains("CUDA_ERROR_OUT_OF_MEMORY") || line.contains("cudaErrorMemoryAllocation") {
        return Some(Framework::Cuda);
    }
    None
}

/// Strip a Kubernetes log timestamp and torchrun's `[rankN]:` /
/// `[defaultN]:` prefix; the rank, if the prefix named one.
fn strip_prefix(line: &str) -> (Option<u32>, &str) {
    let mut rest = line.trim_start();
    // `2024-05-01T12:00:00.123456789Z ` (kubectl logs --timestamps).
    if let Some((first, after)) = rest.split_once(' ')
        && first.len() >= 20
        && first.as_bytes().first().is_some_and(u8::is_ascii_digit)
        && first.contains('T')
        && first.ends_with('Z')
    {
        rest = after.trim_start();
    }
    let Some(inner_end) = rest.strip_prefix('[').and_then(|r| r.find("]:")) else {
        return (None, rest);
    };
    let inner = rest.get(1..1 + inner_end).unwrap_or("");
    let digits_at = inner
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(inner.len());
    let (name, digits) = inner.split_at(digits_at);
    let name_ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic() || c == '_');
    let digits_ok = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit());
    if !(name_ok && digits_ok) {
        return (None, rest);
    }
    let rank = digits.parse::<u32>().ok();
    let after = rest.get(inner_end + 3..).unwrap_or("");
    (rank, after)
}

/// Fill in the numbers a message gives.
fn numbers(oom: &mut GpuOom, w: &str) {
    let size_after = |needle: &str| after(w, needle).and_then(|s| size(s).map(|(n, _)| n));
    match oom.framework {
        Framework::PyTorch => {
            oom.tried_bytes = size_after("Tried to allocate ");
            oom.gpu = after(w, "GPU ").and_then(leading_u32);
            // Today's format.
            if let Some(cap) = after(w, "has a total capacity of ") {
                oom.total_bytes = size(cap).map(|(n, _)| n);
                oom.free_bytes = after(cap, "of which ").and_then(|s| size(s).map(|(n, _)| n));
                oom.process_in_use_bytes = size_after("this process has ");
                oom.allocated_by_framework_bytes = size_after("Of the allocated memory ");
                let unallocated =
                    after(w, "allocated by PyTorch, and ").and_then(|s| size(s).map(|(n, _)| n));
                oom.reserved_by_framework_bytes =
                    match (oom.allocated_by_framework_bytes, unallocated) {
                        (Some(a), Some(u)) => a.checked_add(u),
                        _ => None,
                    };
            } else if let Some(paren) = after(w, "(GPU ") {
                // The older format: "(GPU 0; 10.76 GiB total capacity; ...)".
                let paren = paren.split(')').next().unwrap_or("");
                for part in paren.split(';').map(str::trim) {
                    let Some((n, rest)) = size(part) else {
                        continue;
                    };
                    let rest = rest.trim();
                    if rest.starts_with("total capacity") {
                        oom.total_bytes = Some(n);
                    } else if rest.starts_with("already allocated") {
                        oom.allocated_by_framework_bytes = Some(n);
                    } else if rest.starts_with("free") {
                        oom.free_bytes = Some(n);
                    } else if rest.starts_with("reserved in total") || rest.starts_with("cached") {
                        oom.reserved_by_framework_bytes = Some(n);
                    }
                }
            }
        }
        Framework::TensorFlow | Framework::Jax => {
            oom.gpu = after(w, "GPU_")
                .and_then(leading_u32)
                .or_else(|| after(w, "device:GPU:").and_then(leading_u32))
                .or_else(|| after(w, "device ordinal ").and_then(leading_u32));
            // Exact bytes first, then the human-readable size.
            oom.tried_bytes = after(w, "(rounded to ")
                .and_then(leading_u64)
                .or_else(|| size_after("ran out of memory trying to allocate "))
                .or_else(|| size_after("Out of memory while trying to allocate "))
                .or_else(|| size_after("Out of memory allocating "))
                .or_else(|| {
                    after(w, "Failed to allocate request for ").and_then(|s| {
                        // "1.00GiB (1073741824B)": the exact figure in parentheses.
                        let (n, rest) = size(s)?;
                        Some(
                            after(rest, "(")
                                .and_then(|p| size(p).map(|(b, _)| b))
                                .unwrap_or(n),
                        )
                    })
                })
                .or_else(|| tensor_bytes(w));
            oom.total_bytes = after(w, "Limit:").and_then(leading_u64);
            oom.allocated_by_framework_bytes = after(w, "InUse:").and_then(leading_u64);
        }
        Framework::Nccl | Framework::Cublas | Framework::Cudnn | Framework::Cuda => {}
    }
}

/// The text after the first occurrence of `needle`.
fn after<'a>(hay: &'a str, needle: &str) -> Option<&'a str> {
    let i = hay.find(needle)?;
    hay.get(i + needle.len()..)
}

fn leading_digits(s: &str) -> &str {
    let s = s.trim_start();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.get(..end).unwrap_or("")
}

fn leading_u64(s: &str) -> Option<u64> {
    leading_digits(s).parse().ok()
}

fn leading_u32(s: &str) -> Option<u32> {
    leading_digits(s).parse().ok()
}

/// A size at the start of `s` ("2.00 GiB", "4.00GiB", "17179869184 bytes",
/// "1073741824B"), and the text after it.
pub fn size(s: &str) -> Option<(u64, &str)> {
    let s = s.trim_start();
    let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let int = s.get(..int_end)?;
    if int.is_empty() {
        return None;
    }
    let mut rest = s.get(int_end..)?;
    let mut frac = "";
    if let Some(r) = rest.strip_prefix('.') {
        let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
        frac = r.get(..end)?;
        rest = r.get(end..)?;
    }
    let r = rest.trim_start();
    let word_end = r
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(r.len());
    let word = r.get(..word_end)?;
    let unit: u64 = match word {
        "B" | "bytes" | "byte" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return None,
    };
    let rest = r.get(word_end..)?;
    let int: u128 = int.parse().ok()?;
    let mut bytes = int.checked_mul(u128::from(unit))?;
    // At most nine fractional digits count; more are below a byte anyway.
    let frac = frac.get(..frac.len().min(9))?;
    if !frac.is_empty() {
        let f: u128 = frac.parse().ok()?;
        let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
        bytes = bytes.checked_add(f.checked_mul(u128::from(unit))? / scale)?;
    }
    Some((u64::try_from(bytes).ok()?, rest))
}

/// TensorFlow's `shape[32,1024,1024] and type float`: elements × element size.
fn tensor_bytes(w: &str) -> Option<u64> {
    let dims = after(w, "shape[")?.split(']').next()?;
    let mut elements: u64 = 1;
    for d in dims.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        elements = elements.checked_mul(d.parse().ok()?)?;
    }
    let ty = after(w, "and type ")?
        .split(|c: char| c.is_whitespace())
        .next()?;
    let width: u64 = match ty {
        "bool" | "int8" | "uint8" | "qint8" | "quint8" => 1,
        "half" | "bfloat16" | "int16" | "uint16" | "float16" => 2,
        "float" | "int32" | "uint32" | "float32" | "qint32" => 4,
        "double" | "int64" | "uint64" | "complex64" | "float64" => 8,
        "complex128" => 16,
        _ => return None,
    };
    elements.checked_mul(width)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// `2.00 GiB` etc. as the messages print them, to the byte.
    fn gib(hundredths: u64) -> u64 {
        hundredths * GIB / 100
    }
    fn mib(hundredths: u64) -> u64 {
        hundredths * MIB / 100
    }

    const TORCH_NEW: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

    const TORCH_OLD: &str = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.61 GiB already allocated; 8.69 MiB free; 9.67 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";

    #[test]
    fn pytorch_todays_format() {
        let o = parse(TORCH_NEW).unwrap();
        assert_eq!(o.framework, Framework::PyTorch);
        assert_eq!(o.rank, None);
        assert_eq!(o.gpu, Some(0));
        assert_eq!(o.tried_bytes, Some(2 * GIB));
        assert_eq!(o.total_bytes, Some(gib(7915)));
        assert_eq!(o.free_bytes, Some(gib(102)));
        assert_eq!(o.process_in_use_bytes, Some(gib(7812)));
        assert_eq!(o.allocated_by_framework_bytes, Some(gib(7550)));
        assert_eq!(o.reserved_by_framework_bytes, Some(gib(7550) + gib(110)));
        assert_eq!(o.reserved_unallocated_bytes(), Some(gib(110)));
        assert_eq!(missing_bytes(&o), Some(2 * GIB - gib(102)));
        assert_eq!(need_floor_bytes(&o), Some(gib(7812) + 2 * GIB));
    }

    #[test]
    fn pytorch_older_format() {
        let o = parse(TORCH_OLD).unwrap();
        assert_eq!(o.framework, Framework::PyTorch);
        assert_eq!(o.gpu, Some(0));
        assert_eq!(o.tried_bytes, Some(20 * MIB));
        assert_eq!(o.total_bytes, Some(gib(1076)));
        assert_eq!(o.allocated_by_framework_bytes, Some(gib(961)));
        assert_eq!(o.free_bytes, Some(mib(869)));
        assert_eq!(o.reserved_by_framework_bytes, Some(gib(967)));
        assert_eq!(o.process_in_use_bytes, None);
        assert_eq!(missing_bytes(&o), Some(20 * MIB - mib(869)));
        // No whole-process figure: the floor is what PyTorch reserved plus the request.
        assert_eq!(need_floor_bytes(&o), Some(gib(967) + 20 * MIB));
    }

    #[test]
    fn pytorch_1_x_cached_and_2_0_module_name() {
        let o = parse("RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 1; 11.17 GiB total capacity; 10.62 GiB already allocated; 832.00 KiB free; 10.66 GiB cached)").unwrap();
        assert_eq!(o.gpu, Some(1));
        assert_eq!(o.free_bytes, Some(832 * 1024));
        assert_eq!(o.reserved_by_framework_bytes, Some(gib(1066)));
        let o = parse("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB (GPU 3; 79.15 GiB total capacity; 75.04 GiB already allocated; 1.01 GiB free; 77.22 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.").unwrap();
        assert_eq!(o.gpu, Some(3));
        assert_eq!(o.tried_bytes, Some(gib(153)));
        assert_eq!(o.reserved_by_framework_bytes, Some(gib(7722)));
    }

    #[test]
    fn torchrun_rank_prefixes_and_a_traceback_after() {
        let log = "\
[rank3]: Traceback (most recent call last):
[rank3]:   File \"/workspace/train.py\", line 212, in <module>
[rank3]:     loss.backward()
[rank3]:   File \"/usr/local/lib/python3.11/site-packages/torch/_tensor.py\", line 626, in backward
[rank3]:     torch.autograd.backward(
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
W0501 12:00:03.123000 140 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 141 closing signal SIGTERM
E0501 12:00:04.456000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 144) of binary: /usr/bin/python
Traceback (most recent call last):
  File \"/usr/local/bin/torchrun\", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
";
        let o = parse(log).unwrap();
        assert_eq!(o.rank, Some(3));
        assert_eq!(o.gpu, Some(3));
        assert_eq!(o.tried_bytes, Some(2 * GIB));
        assert_eq!(o.process_in_use_bytes, Some(gib(7812)));

        let tee = "\
[default0]:Traceback (most recent call last):
[default0]:  File \"train.py\", line 80, in <module>
[default0]:RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.61 GiB already allocated; 8.69 MiB free; 9.67 GiB reserved in total by PyTorch)
[default1]:RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 10.76 GiB total capacity; 9.50 GiB already allocated; 100.00 MiB free; 9.60 GiB reserved in total by PyTorch)
";
        let o = parse(tee).unwrap();
        assert_eq!(o.rank, Some(0), "the earliest of equally detailed reports");
        assert_eq!(o.gpu, Some(0));
        assert_eq!(o.allocated_by_framework_bytes, Some(gib(961)));
    }

    #[test]
    fn kubectl_timestamps_are_stripped() {
        let line = format!("2025-05-01T12:00:00.123456789Z [rank12]: {TORCH_NEW}");
        let o = parse(&line).unwrap();
        assert_eq!(o.rank, Some(12));
        assert_eq!(o.tried_bytes, Some(2 * GIB));
    }

    #[test]
    fn the_most_detailed_rank_report_wins() {
        let log = "\
[rank1]: RuntimeError: CUDA error: out of memory
[rank1]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 39.39 GiB of which 100.00 MiB is free.
";
        let o = parse(log).unwrap();
        assert_eq!(o.rank, Some(0));
        assert_eq!(o.tried_bytes, Some(512 * MIB));
        assert_eq!(o.total_bytes, Some(gib(3939)));
        assert_eq!(o.free_bytes, Some(100 * MIB));
        assert_eq!(o.process_in_use_bytes, None);
        // Nothing held is known: no floor, but the missing part is.
        assert_eq!(need_floor_bytes(&o), None);
        assert_eq!(missing_bytes(&o), Some(412 * MIB));
        // Alone, the bare CUDA error is still a PyTorch GPU OOM without numbers.
        let bare = parse("[rank1]: RuntimeError: CUDA error: out of memory").unwrap();
        assert_eq!(bare.framework, Framework::PyTorch);
        assert_eq!(bare.rank, Some(1));
        assert_eq!(missing_bytes(&bare), None);
    }

    #[test]
    fn tensorflow_oom_when_allocating_tensor() {
        let log = "\
2025-05-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator (GPU_0_bfc) ran out of memory trying to allocate 4.00GiB (rounded to 4294967296)requested by op MatMul
If the cause is memory fragmentation maybe the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' will improve the situation.
2025-05-01 12:00:00.000100: I tensorflow/core/common_runtime/bfc_allocator.cc:1101] Stats:
Limit:                     14328594432
InUse:                     12884901888
MaxInUse:                  13958643712
NumAllocs:                        1234
2025-05-01 12:00:00.000200: W tensorflow/core/framework/op_kernel.cc:1828] OP_REQUIRES failed at matmul_op_impl.h:728 : RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[32768,32768] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
Traceback (most recent call last):
tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__MatMul_device_/job:localhost/replica:0/task:0/device:GPU:0}} OOM when allocating tensor with shape[32768,32768] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:MatMul]
";
        let o = parse(log).unwrap();
        assert_eq!(o.framework, Framework::TensorFlow);
        assert_eq!(o.gpu, Some(0));
        assert_eq!(o.tried_bytes, Some(4 * GIB));
        assert_eq!(o.total_bytes, Some(14_328_594_432));
        assert_eq!(o.allocated_by_framework_bytes, Some(12_884_901_888));
        assert_eq!(missing_bytes(&o), Some(4 * GIB));
        assert_eq!(need_floor_bytes(&o), Some(12_884_901_888 + 4 * GIB));

        // The error alone: the tensor's size from its shape and type.
        let o = parse("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[64,1024,1024] and type half on /job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc").unwrap();
        assert_eq!(o.gpu, Some(1));
        assert_eq!(o.tried_bytes, Some(64 * 1024 * 1024 * 2));
    }

    #[test]
    fn tensorflow_non_fatal_warning_is_not_an_oom() {
        let log = "\
2025-05-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:290] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.20GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.
Epoch 1/10
1875/1875 [==============================] - 12s 6ms/step - loss: 0.2941
Traceback (most recent call last):
ValueError: Input 0 of layer \"dense\" is incompatible with the layer";
        assert_eq!(parse(log), None);
        assert!(matches!(
            classify(Some("Error"), Some(1), log),
            Failure::Other { .. }
        ));
    }

    #[test]
    fn jax_resource_exhausted() {
        let log = "\
Traceback (most recent call last):
  File \"/app/train.py\", line 51, in <module>
jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.
--------------------
For simplicity, JAX has removed its internal frames from the traceback of the following exception.";
        let o = parse(log).unwrap();
        assert_eq!(o.framework, Framework::Jax);
        assert_eq!(o.tried_bytes, Some(16 * GIB));
        assert_eq!(missing_bytes(&o), Some(16 * GIB));

        let o = parse("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 1.00GiB (1073741824B) on device ordinal 2").unwrap();
        assert_eq!(o.framework, Framework::Jax);
        assert_eq!(o.gpu, Some(2));
        assert_eq!(o.tried_bytes, Some(GIB));

        let o = parse("2025-05-01 12:00:00.000000: W external/xla/xla/tsl/framework/bfc_allocator.cc:497] Allocator (GPU_0_bfc) ran out of memory trying to allocate 26.50GiB (rounded to 28454158336)requested by op").unwrap();
        assert_eq!(o.framework, Framework::Jax);
        assert_eq!(o.tried_bytes, Some(28_454_158_336));
    }

    #[test]
    fn nccl_and_cublas_allocation_failures() {
        let o = parse(
            "gpu-node-3:412:1290 [2] include/alloc.h:103 NCCL WARN Cuda failure 'out of memory'",
        )
        .unwrap();
        assert_eq!(o.framework, Framework::Nccl);
        assert_eq!(missing_bytes(&o), None);
        let o = parse("gpu-node-3:412:1290 [2] NCCL INFO ...\ngpu-node-3:412:1290 [2] transport/p2p.cc:204 NCCL WARN Cuda failure 2 'out of memory'").unwrap();
        assert_eq!(o.framework, Framework::Nccl);
        let log = "\
[rank5]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank5]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank5]: Last error:
[rank5]: Cuda failure 'out of memory'";
        let o = parse(log).unwrap();
        assert_eq!(o.framework, Framework::Nccl);
        assert_eq!(o.rank, Some(5));
        // Any other CUDA failure through NCCL is not a GPU OOM.
        assert_eq!(
            parse(
                "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'invalid device ordinal'"
            ),
            None
        );

        let o = parse("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`").unwrap();
        assert_eq!(o.framework, Framework::Cublas);
        let o = parse("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED").unwrap();
        assert_eq!(o.framework, Framework::Cudnn);
        let o = parse("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to create cuda context: CUDA_ERROR_OUT_OF_MEMORY: out of memory").unwrap();
        assert_eq!(o.framework, Framework::Cuda);
    }

    #[test]
    fn classification() {
        // The kernel killed it: host memory, whatever the log says.
        assert_eq!(
            classify(Some("OOMKilled"), Some(137), TORCH_NEW),
            Failure::HostOom {
                exit_code: Some(137)
            }
        );
        assert_eq!(
            classify(Some("Error"), Some(137), "Killed"),
            Failure::HostOom {
                exit_code: Some(137)
            }
        );
        // Kubelet reports a CUDA OOM as a plain error.
        match classify(Some("Error"), Some(1), TORCH_OLD) {
            Failure::GpuOom(o) => assert_eq!(o.tried_bytes, Some(20 * MIB)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            classify(Some("Error"), Some(2), "ValueError: bad config"),
            Failure::Other {
                reason: Some("Error".into()),
                exit_code: Some(2)
            }
        );
        assert_eq!(
            classify(None, None, ""),
            Failure::Other {
                reason: None,
                exit_code: None
            }
        );
        let host = classify(Some("OOMKilled"), Some(137), "").message();
        assert!(host.contains("host RAM"), "{host}");
        let gpu = classify(None, Some(1), TORCH_NEW).message();
        assert!(gpu.contains("tried to allocate 2.00 GiB"), "{gpu}");
    }

    #[test]
    fn sizes_and_units() {
        assert_eq!(size("2.00 GiB").map(|s| s.0), Some(2 * GIB));
        assert_eq!(size("4.00GiB (rounded").map(|s| s.0), Some(4 * GIB));
        assert_eq!(size("512 bytes").map(|s| s.0), Some(512));
        assert_eq!(size("1073741824B)").map(|s| s.0), Some(GIB));
        assert_eq!(size("832.00 KiB").map(|s| s.0), Some(832 * 1024));
        assert_eq!(size("1.5 TiB").map(|s| s.0), Some(3 << 39));
        assert_eq!(size("1.5 GB").map(|s| s.0), Some(1_500_000_000));
        assert_eq!(size("20 MB").map(|s| s.0), Some(20_000_000));
        assert_eq!(size("3 KB").map(|s| s.0), Some(3_000));
        assert_eq!(size("0.123456789123 GiB").map(|s| s.0), Some(132_560_717));
        assert_eq!(size("GiB"), None);
        assert_eq!(size("12 parsecs"), None);
        // Too big for u64: left out, not wrapped.
        assert_eq!(size("99999999999999999999 TiB"), None);
        assert_eq!(size("999999999999999999999999999999999999999999 B"), None);
        assert_eq!(
            parse("CUDA out of memory. Tried to allocate 99999999999 TiB.").map(|o| o.tried_bytes),
            Some(None)
        );
        assert_eq!(human(2 * GIB), "2.00 GiB");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(u64::MAX), "16777216.00 TiB");
    }

    #[test]
    fn shapes_that_overflow_are_left_out() {
        let o = parse("OOM when allocating tensor with shape[4294967296,4294967296,4294967296] and type float on /device:GPU:0 by allocator GPU_0_bfc").unwrap();
        assert_eq!(o.tried_bytes, None);
        let huge = GpuOom {
            tried_bytes: Some(u64::MAX),
            process_in_use_bytes: Some(1),
            ..GpuOom::new(Framework::PyTorch)
        };
        assert_eq!(need_floor_bytes(&huge), None);
        assert_eq!(missing_bytes(&huge), Some(u64::MAX));
    }

    #[test]
    fn odd_prefixes_do_not_confuse_the_rank() {
        assert_eq!(strip_prefix("[rank99999999999]: x"), (None, " x"));
        assert_eq!(strip_prefix("[rank]: x"), (None, "[rank]: x"));
        assert_eq!(strip_prefix("[0]: x"), (None, "[0]: x"));
        assert_eq!(strip_prefix("[trainer_2]: x").0, Some(2));
        assert_eq!(strip_prefix("[trainer2]:x"), (Some(2), "x"));
        assert_eq!(strip_prefix("["), (None, "["));
        assert_eq!(strip_prefix("[é1]: x"), (None, "[é1]: x"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in "\\PC*") {
            let _ = parse(&s);
            let _ = classify(Some(&s), Some(1), &s);
            let _ = size(&s);
        }

        #[test]
        fn oom_shaped_text_never_panics(
            prefix in "(\\[rank[0-9]{0,12}\\]:|\\[default[0-9]\\]:|)",
            a in "[0-9]{0,25}(\\.[0-9]{0,15})?",
            b in "[0-9]{0,25}(\\.[0-9]{0,15})?",
            unit in "(B|KiB|MiB|GiB|TiB|KB|MB|GB|bytes|)",
            tail in "\\PC{0,40}",
        ) {
            let texts = [
                format!("{prefix} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {a} {unit}. GPU {b} has a total capacity of {b} {unit} of which {a} {unit} is free. Including non-PyTorch memory, this process has {a}{unit} memory in use. Of the allocated memory {b} {unit} is allocated by PyTorch, and {a} {unit} is reserved by PyTorch but unallocated.{tail}"),
                format!("{prefix}RuntimeError: CUDA out of memory. Tried to allocate {a} {unit} (GPU {b}; {a} {unit} total capacity; {b} {unit} already allocated; {a}{unit} free; {b} {unit} reserved in total by PyTorch{tail}"),
                format!("{prefix}Allocator (GPU_{b}_bfc) ran out of memory trying to allocate {a}{unit} (rounded to {b})\nLimit: {a}\nInUse: {b}{tail}"),
                format!("OOM when allocating tensor with shape[{a},{b}] and type float{tail}"),
                format!("RESOURCE_EXHAUSTED: Failed to allocate request for {a}{unit} ({b}{unit}{tail}"),
            ];
            for t in &texts {
                if let Some(o) = parse(t) {
                    let _ = missing_bytes(&o);
                    let _ = need_floor_bytes(&o);
                    let _ = o.reserved_unallocated_bytes();
                    let _ = o.to_string();
                }
            }
        }
    }
}
