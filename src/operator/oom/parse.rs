//! Reading a GPU OOM's numbers out of the text: the triggers of each
//! framework, torchrun's line prefixes, sizes.

use super::{Framework, GpuOom};

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
pub(super) fn strip_prefix(line: &str) -> (Option<u32>, &str) {
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
