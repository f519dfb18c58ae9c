//! Limits a framework's allocator puts on itself, below the GPU's free memory.
//!
//! PyTorch's caching allocator takes what the device has. XLA's BFC allocator
//! (JAX) never holds more than a fraction of the device's memory
//! (`XLA_PYTHON_CLIENT_MEM_FRACTION`, 0.75 unless set), whether or not it
//! preallocates; TensorFlow's BFC allocator takes the memory free at start
//! less a reserve it leaves for the system (1050 MiB on compute capability 7,
//! 1536 MiB on 8, 1800 MiB on 9 and later, 225 MiB when less than 2 GiB is
//! free; `TF_DEVICE_MIN_SYS_MEMORY_IN_MB` overrides it). A job whose reserved
//! bytes pass that limit dies of out-of-memory with the GPU half empty.
//!
//! The operator renders `XLA_PYTHON_CLIENT_PREALLOCATE=false` and
//! `TF_FORCE_GPU_ALLOW_GROWTH=true` on the trainer, so neither framework maps
//! memory it does not use; the limits above hold all the same. They are read
//! from `framework` and the trainer container's environment (the first
//! container of `spec.template`, the one that gets the GPUs).

use super::gpus::{Architecture, GpuProduct};
use crate::api::{Framework, TrainingJobSpec};
use serde_json::Value;

const MIB: u64 = 1024 * 1024;

/// XLA's default `memory_fraction`.
pub const JAX_DEFAULT_FRACTION: f64 = 0.75;

/// The allocator policy a job's framework and environment select.
#[derive(Clone, Debug, PartialEq)]
pub enum FrameworkAllocator {
    /// Bounded only by the device's free memory (PyTorch; JAX's `platform` allocator).
    Unbounded,
    /// XLA's BFC allocator: `fraction` of the device's memory.
    Fraction {
        fraction: f64,
        /// The variable that set it; `None` for XLA's default.
        variable: Option<&'static str>,
    },
    /// TensorFlow's BFC allocator: free memory at start less a system reserve.
    SystemReserve {
        /// `TF_DEVICE_MIN_SYS_MEMORY_IN_MB` when set.
        override_mib: Option<u64>,
    },
}

/// The allocator limit on one GPU product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AllocatorLimit {
    /// A fraction of the device's memory.
    Fraction {
        fraction: f64,
        variable: Option<&'static str>,
    },
    /// Free memory less `reserve_bytes`.
    Reserve {
        reserve_bytes: u64,
        overridden: bool,
    },
}

impl AllocatorLimit {
    /// The limit in bytes on a device with `total` bytes, `free` of them free.
    pub fn bytes(&self, total: u64, free: u64) -> u64 {
        match self {
            AllocatorLimit::Fraction { fraction, .. } => {
                let b = (total as f64 * fraction).floor();
                if b >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    b as u64
                }
            }
            AllocatorLimit::Reserve { reserve_bytes, .. } => free.saturating_sub(*reserve_bytes),
        }
    }

    /// Why the limit exists, for people.
    pub fn reason(&self) -> String {
        match self {
            AllocatorLimit::Fraction { fraction, variable } => {
                let set = match variable {
                    Some(v) => format!("{v}={fraction}"),
                    None => format!(
                        "XLA_PYTHON_CLIENT_MEM_FRACTION unset, default {JAX_DEFAULT_FRACTION}"
                    ),
                };
                format!(
                    "JAX's allocator holds at most {:.0} % of the GPU's memory ({set})",
                    fraction * 100.0
                )
            }
            AllocatorLimit::Reserve {
                reserve_bytes,
                overridden,
            } => format!(
                "TensorFlow's allocator leaves {} MiB of the free memory to the system{}",
                reserve_bytes / MIB,
                if *overridden {
                    " (TF_DEVICE_MIN_SYS_MEMORY_IN_MB)"
                } else {
                    ""
                }
            ),
        }
    }

    /// The setting that would let `need` bytes through on a device of `total`
    /// bytes with `free` free, when one exists.
    pub fn fix(&self, need: u64, total: u64, free: u64) -> Option<String> {
        match self {
            AllocatorLimit::Fraction { .. } => {
                if total == 0 {
                    return None;
                }
                // Two decimals, rounded up, so the new limit covers the need.
                let f = ((need as f64 / total as f64) * 100.0).ceil() / 100.0;
                (f <= 0.98).then(|| {
                    format!("set XLA_PYTHON_CLIENT_MEM_FRACTION={f:.2} in the trainer's env")
                })
            }
            AllocatorLimit::Reserve { .. } => {
                let room = free.saturating_sub(need) / MIB;
                (room >= 512).then(|| {
                    format!("set TF_DEVICE_MIN_SYS_MEMORY_IN_MB={room} in the trainer's env")
                })
            }
        }
    }
}

impl FrameworkAllocator {
    /// The limit on `gpu`, if any.
    pub fn limit(&self, gpu: &GpuProduct) -> Option<AllocatorLimit> {
        match self {
            FrameworkAllocator::Unbounded => None,
            FrameworkAllocator::Fraction { fraction, variable } => Some(AllocatorLimit::Fraction {
                fraction: *fraction,
                variable: *variable,
            }),
            FrameworkAllocator::SystemReserve { override_mib } => Some(AllocatorLimit::Reserve {
                reserve_bytes: match override_mib {
                    Some(mib) => mib.saturating_mul(MIB),
                    None => tensorflow_reserve(gpu),
                },
                overridden: override_mib.is_some(),
            }),
        }
    }
}

/// TensorFlow's `MinSystemMemory` for a whole card of `gpu`.
fn tensorflow_reserve(gpu: &GpuProduct) -> u64 {
    if gpu.usable_bytes() < 2 * 1024 * MIB {
        return 225 * MIB;
    }
    match gpu.architecture {
        Architecture::Volta | Architecture::Turing => 1050 * MIB,
        Architecture::Ampere | Architecture::Ada => 1536 * MIB,
        Architecture::Hopper | Architecture::Blackwell => 1800 * MIB,
    }
}

/// The field path of the trainer container's variable `name`.
fn env_path(name: &str) -> String {
    format!("spec.template.spec.containers[0].env[{name}]")
}

/// One environment variable of the trainer container: its value, or an error
/// when it is set in a way vramguard cannot read.
pub(crate) fn env_var(
    spec: &TrainingJobSpec,
    name: &str,
) -> Result<Option<String>, (String, String)> {
    let path = env_path(name);
    let Some(env) = spec
        .template
        .as_ref()
        .and_then(|t| t.get("spec"))
        .and_then(|s| s.get("containers"))
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("env"))
        .and_then(Value::as_array)
    else {
        return Ok(None);
    };
    // Kubernetes keeps the last of duplicate names.
    let Some(var) = env
        .iter()
        .rev()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(name))
    else {
        return Ok(None);
    };
    match var.get("value") {
        Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
        None | Some(Value::Null) if var.get("valueFrom").is_some() => Err((
            path,
            "set from valueFrom; vramguard needs the value itself to know the allocator's limit"
                .to_string(),
        )),
        None | Some(Value::Null) => Ok(Some(String::new())),
        Some(other) => Err((path, format!("{other} is not a string"))),
    }
}

fn parse_fraction(name: &'static str, value: &str) -> Result<f64, (String, String)> {
    match value.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err((
            env_path(name),
            format!("{value:?} is not a fraction above 0 (XLA reads it as a float, e.g. 0.9)"),
        )),
    }
}

/// The allocator policy of a spec, or the fields that make it unreadable.
pub fn allocator_of(spec: &TrainingJobSpec) -> Result<FrameworkAllocator, Vec<(String, String)>> {
    let mut errors = Vec::new();
    let read = |errors: &mut Vec<(String, String)>, name: &str| match env_var(spec, name) {
        Ok(v) => v,
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let policy = match spec.training.framework {
        Framework::Pytorch => FrameworkAllocator::Unbounded,
        Framework::Jax => {
            let allocator = read(&mut errors, "XLA_PYTHON_CLIENT_ALLOCATOR");
            let unified = read(&mut errors, "TF_FORCE_UNIFIED_MEMORY")
                .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
            let mut fraction = None;
            for name in ["XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"] {
                if fraction.is_none()
                    && let Some(v) = read(&mut errors, name)
                {
                    match parse_fraction(name, &v) {
                        Ok(f) => fraction = Some((f, name)),
                        Err(e) => errors.push(e),
                    }
                }
            }
            match allocator.as_deref() {
                Some("platform") => FrameworkAllocator::Unbounded,
                // Unified memory spills past the device instead of failing.
                _ if unified => FrameworkAllocator::Unbounded,
                None | Some("" | "default" | "bfc" | "cuda_async") => match fraction {
                    Some((f, name)) => FrameworkAllocator::Fraction {
                        fraction: f,
                        variable: Some(name),
                    },
                    None => FrameworkAllocator::Fraction {
                        fraction: JAX_DEFAULT_FRACTION,
                        variable: None,
                    },
                },
                Some(other) => {
                    errors.push((
                        env_path("XLA_PYTHON_CLIENT_ALLOCATOR"),
                        format!("{other:?} is not one of default, bfc, cuda_async, platform"),
                    ));
                    FrameworkAllocator::Unbounded
                }
            }
        }
        Framework::Tensorflow => {
            let name = "TF_DEVICE_MIN_SYS_MEMORY_IN_MB";
            let override_mib = match read(&mut errors, name) {
                None => None,
                Some(v) => match v.parse::<u64>() {
                    Ok(mib) => Some(mib),
                    Err(_) => {
                        errors.push((
                            env_path(name),
                            format!("{v:?} is not a whole number of MiB"),
                        ));
                        None
                    }
                },
            };
            FrameworkAllocator::SystemReserve { override_mib }
        }
    };
    if errors.is_empty() {
        Ok(policy)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::gpus::find;

    fn spec(framework: &str, env: &str) -> TrainingJobSpec {
        let yaml = format!(
            "model: {{preset: llama-3.2-1b}}\ntraining: {{framework: {framework}}}\ntemplate:\n  spec:\n    containers:\n    - name: trainer\n      image: trainer\n      env: {env}\n"
        );
        serde_saphyr::from_str(&yaml).unwrap()
    }

    #[test]
    fn pytorch_is_unbounded_whatever_the_env() {
        let s = spec(
            "pytorch",
            "[{name: XLA_PYTHON_CLIENT_MEM_FRACTION, value: nonsense}]",
        );
        assert_eq!(allocator_of(&s).unwrap(), FrameworkAllocator::Unbounded);
    }

    #[test]
    fn jax_defaults_to_three_quarters_of_the_device() {
        let s = spec("jax", "[]");
        let a = allocator_of(&s).unwrap();
        let h100 = find("h100-80gb").unwrap();
        let limit = a.limit(h100).unwrap();
        assert_eq!(limit.bytes(100 << 30, 10 << 30), 75 << 30);
        assert!(
            limit.reason().contains("default 0.75"),
            "{}",
            limit.reason()
        );
        let fix = limit.fix(80 << 30, 100 << 30, 100 << 30).unwrap();
        assert!(fix.contains("XLA_PYTHON_CLIENT_MEM_FRACTION=0.80"), "{fix}");
    }

    #[test]
    fn jax_reads_the_fraction_and_the_platform_allocator() {
        let s = spec(
            "jax",
            "[{name: XLA_PYTHON_CLIENT_MEM_FRACTION, value: '0.9'}]",
        );
        assert_eq!(
            allocator_of(&s).unwrap(),
            FrameworkAllocator::Fraction {
                fraction: 0.9,
                variable: Some("XLA_PYTHON_CLIENT_MEM_FRACTION")
            }
        );
        let s = spec(
            "jax",
            "[{name: XLA_PYTHON_CLIENT_ALLOCATOR, value: platform}]",
        );
        assert_eq!(allocator_of(&s).unwrap(), FrameworkAllocator::Unbounded);
        let s = spec(
            "jax",
            "[{name: TF_FORCE_UNIFIED_MEMORY, value: '1'}, {name: XLA_PYTHON_CLIENT_MEM_FRACTION, value: '4.0'}]",
        );
        assert_eq!(allocator_of(&s).unwrap(), FrameworkAllocator::Unbounded);
    }

    #[test]
    fn unreadable_settings_name_the_variable() {
        let s = spec(
            "jax",
            "[{name: XLA_PYTHON_CLIENT_MEM_FRACTION, value: 'lots'}]",
        );
        let e = allocator_of(&s).unwrap_err();
        assert_eq!(
            e[0].0,
            "spec.template.spec.containers[0].env[XLA_PYTHON_CLIENT_MEM_FRACTION]"
        );
        assert!(e[0].1.contains("\"lots\""), "{}", e[0].1);
        let s = spec(
            "jax",
            "[{name: XLA_PYTHON_CLIENT_MEM_FRACTION, valueFrom: {configMapKeyRef: {name: c, key: k}}}]",
        );
        assert!(allocator_of(&s).unwrap_err()[0].1.contains("valueFrom"));
        let s = spec("jax", "[{name: XLA_PYTHON_CLIENT_ALLOCATOR, value: magic}]");
        assert!(allocator_of(&s).unwrap_err()[0].1.contains("platform"));
        let s = spec(
            "tensorflow",
            "[{name: TF_DEVICE_MIN_SYS_MEMORY_IN_MB, value: '-1'}]",
        );
        assert!(allocator_of(&s).unwrap_err()[0].1.contains("MiB"));
    }

    #[test]
    fn tensorflow_leaves_a_reserve_by_architecture() {
        let s = spec("tensorflow", "[]");
        let a = allocator_of(&s).unwrap();
        let reserve = |gpu: &str| match a.limit(find(gpu).unwrap()).unwrap() {
            AllocatorLimit::Reserve { reserve_bytes, .. } => reserve_bytes / MIB,
            other => panic!("{other:?}"),
        };
        assert_eq!(reserve("v100-16gb"), 1050);
        assert_eq!(reserve("a100-80gb"), 1536);
        assert_eq!(reserve("h100-80gb"), 1800);
        let s = spec(
            "tensorflow",
            "[{name: TF_DEVICE_MIN_SYS_MEMORY_IN_MB, value: '600'}]",
        );
        let limit = allocator_of(&s)
            .unwrap()
            .limit(find("h100-80gb").unwrap())
            .unwrap();
        assert_eq!(limit.bytes(80 << 30, 10 << 30), (10 << 30) - 600 * MIB);
    }
}
