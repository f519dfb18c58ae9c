//! The simulated backend: a node's GPUs from a YAML file (`examples/gpus.yaml`),
//! for CI, demos and clusters without GPUs. Each GPU has an allocator model
//! (`allocator`: segments, best-fit at the driver's 2 MiB granularity) into
//! which the other processes' memory and a given allocation history are
//! replayed. Freeing every other block of a history leaves holes, so the
//! largest free block can be far below free memory, and the largest-block
//! question is answered by the same bounded search the CUDA backend runs,
//! against the model instead of cuMemAlloc.
//!
//! Reads a file once, at load; answers are then pure.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::allocator::{Allocator, field, replay};
pub use super::allocator::{SimError, SimProcessSpec};
use super::bytes::{ByteSize, human};
use super::gpu::{
    BlockProbe, DEFAULT_GRANULARITY_BYTES, DeviceInfo, Gpu, GpuError, Health, MemoryCheck,
    MemoryInfo, MigInfo, MigMode, ProcessInfo, SearchLimits, search_largest_block,
};
use crate::estimate::gpus::{self, DRIVER_RESERVE_BYTES};
use crate::inventory::catalog_product;

/// Context size used when neither the file nor the catalog gives one.
const DEFAULT_CONTEXT_BYTES: u64 = 512 << 20;

/// Most GPUs one simulated node holds: each is a copy of its allocator, so a
/// `count` of four billion would take the agent's memory with it.
pub const MAX_GPUS: usize = 1024;

/// The file: one node.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimNodeSpec {
    #[serde(default, deserialize_with = "version")]
    pub driver_version: Option<String>,
    /// `"12.8"`; an unquoted `12.8` is read as the same (but quote `"12.10"`).
    #[serde(default, deserialize_with = "version")]
    pub cuda_version: Option<String>,
    pub gpus: Vec<SimGpuSpec>,
}

/// One GPU entry (or `count` identical ones).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimGpuSpec {
    /// A catalog name (`h100-80gb`) or the NVML product name.
    pub product: String,
    /// Identical GPUs this entry stands for.
    #[serde(default = "one")]
    pub count: u32,
    /// Default: `GPU-00000000-0000-4000-8000-<index>`. With `count` > 1, `-<n>` is appended.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Default: the catalog's.
    #[serde(default)]
    pub architecture: Option<String>,
    /// NVML's memory.total. Default: the catalog's.
    #[serde(default)]
    pub total_bytes: Option<ByteSize>,
    /// Driver-reserved memory (NVML v2). Default: 640 MiB.
    #[serde(default)]
    pub reserved_bytes: Option<ByteSize>,
    /// Memory a new CUDA context takes. Default: the catalog architecture's.
    #[serde(default)]
    pub context_overhead_bytes: Option<ByteSize>,
    /// Allocation granularity. Default: 2 MiB.
    #[serde(default)]
    pub granularity_bytes: Option<ByteSize>,
    /// Other processes on the GPU, placed in this order.
    #[serde(default)]
    pub processes: Vec<SimProcessSpec>,
    /// MIG slices; non-empty means MIG mode is on.
    #[serde(default)]
    pub mig: Vec<SimMigSpec>,
    #[serde(default)]
    pub health: SimHealthSpec,
    /// Every query of this GPU fails with this message (a GPU that fell off the bus).
    #[serde(default)]
    pub error: Option<String>,
    /// Data the driver does not give for this GPU.
    #[serde(default)]
    pub unreadable: Vec<Unreadable>,
    /// What a memory check measures, GB/s.
    #[serde(default)]
    pub bandwidth_gb_per_s: Option<f64>,
}

/// A version written as a string, or as a YAML number.
fn version<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(serde::de::Error::custom(format!(
                "expected a version such as \"12.8\", found {other}"
            )));
        }
    })
}

fn one() -> u32 {
    1
}

/// Optional data a driver may not give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Unreadable {
    Uuid,
    Product,
    Architecture,
    Processes,
    /// NVML v1 only: the reserve is inside `used`.
    Reserved,
    Health,
    /// No libcuda: no context measurement and no largest-block probe.
    Cuda,
}

/// A MIG slice.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimMigSpec {
    /// e.g. `3g.40gb`.
    pub profile: String,
    #[serde(default)]
    pub uuid: Option<String>,
    /// Default: the catalog's size of this profile on this product.
    #[serde(default)]
    pub total_bytes: Option<ByteSize>,
    #[serde(default)]
    pub used_bytes: Option<ByteSize>,
}

/// Health as the driver would report it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimHealthSpec {
    #[serde(default)]
    pub ecc_uncorrected: u64,
    #[serde(default)]
    pub retired_pages_pending: bool,
    #[serde(default)]
    pub xids: Vec<u64>,
    /// A memory check finds words that do not read back.
    #[serde(default)]
    pub bad_memory: bool,
}

/// One simulated device, resolved from its spec.
#[derive(Clone, Debug)]
struct SimDevice {
    uuid: String,
    product: String,
    architecture: Option<String>,
    total_bytes: u64,
    reserved_bytes: u64,
    context_bytes: u64,
    allocator: Allocator,
    pids: Vec<u32>,
    mig: Vec<MigInfo>,
    health: Health,
    bad_memory: bool,
    error: Option<String>,
    unreadable: BTreeSet<Unreadable>,
    bandwidth_gb_per_s: Option<f64>,
}

/// GPUs from a file.
#[derive(Clone, Debug)]
pub struct Simulated {
    driver_version: Option<String>,
    cuda_version: Option<String>,
    devices: Vec<SimDevice>,
}

fn default_uuid(index: usize) -> String {
    format!("GPU-00000000-0000-4000-8000-{index:012x}")
}

impl Simulated {
    /// Read a simulated node from a file.
    pub fn from_path(path: &Path) -> Result<Simulated, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Simulated::from_yaml(&text)
    }

    /// Read a simulated node from YAML text.
    pub fn from_yaml(text: &str) -> Result<Simulated, SimError> {
        let mut docs =
            crate::api::parse::documents(text).map_err(|e| SimError::Syntax(e.to_string()))?;
        if docs.len() != 1 {
            return Err(SimError::Syntax(format!(
                "expected one document (one node), found {}",
                docs.len()
            )));
        }
        let doc: Value = docs.remove(0);
        let spec: SimNodeSpec = serde_path_to_error::deserialize(doc).map_err(|e| {
            let path = e.path().to_string();
            field(
                if path == "." {
                    "(top level)".to_string()
                } else {
                    path
                },
                e.into_inner().to_string(),
            )
        })?;
        Simulated::from_spec(&spec)
    }

    /// Resolve a spec: catalog defaults, allocation histories replayed.
    pub fn from_spec(spec: &SimNodeSpec) -> Result<Simulated, SimError> {
        let mut devices = Vec::new();
        for (g, gpu) in spec.gpus.iter().enumerate() {
            let path = format!("gpus[{g}]");
            let catalog = catalog_product(&gpu.product);
            let product = catalog
                .map(|c| c.product.to_string())
                .unwrap_or_else(|| gpu.product.clone());
            let total = match (gpu.total_bytes, catalog) {
                (Some(t), _) => t.bytes(),
                (None, Some(c)) => c.total_bytes,
                (None, None) => {
                    return Err(field(
                        format!("{path}.totalBytes"),
                        format!(
                            "{:?} is not in the catalog, so give totalBytes (catalog names: {})",
                            gpu.product,
                            gpus::names().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            };
            let reserved = gpu
                .reserved_bytes
                .map_or(DRIVER_RESERVE_BYTES, ByteSize::bytes);
            if reserved > total {
                return Err(field(
                    format!("{path}.reservedBytes"),
                    format!(
                        "{} is more than totalBytes {}",
                        human(reserved),
                        human(total)
                    ),
                ));
            }
            let architecture = gpu
                .architecture
                .clone()
                .or_else(|| catalog.map(|c| c.architecture.as_str().to_string()));
            let context_bytes = gpu.context_overhead_bytes.map_or_else(
                || {
                    catalog.map_or(DEFAULT_CONTEXT_BYTES, |c| {
                        gpus::overheads(c.architecture).cuda_context_bytes
                    })
                },
                ByteSize::bytes,
            );
            let granularity = gpu
                .granularity_bytes
                .map_or(DEFAULT_GRANULARITY_BYTES, ByteSize::bytes);
            if granularity == 0 {
                return Err(field(
                    format!("{path}.granularityBytes"),
                    "0 is not allowed",
                ));
            }
            let mut allocator = Allocator::new(total - reserved, granularity);
            if !gpu.mig.is_empty() && !gpu.processes.is_empty() {
                return Err(field(
                    format!("{path}.processes"),
                    "a MIG GPU's memory is in its slices: give usedBytes per slice instead",
                ));
            }
            for (p, proc_) in gpu.processes.iter().enumerate() {
                replay(&mut allocator, proc_, &format!("{path}.processes[{p}]"))?;
            }
            let mig = mig_slices(gpu, &product, &path)?;
            let slices: u64 = mig.iter().map(|m| m.memory.total_bytes).sum();
            if slices > total - reserved {
                return Err(field(
                    format!("{path}.mig"),
                    format!(
                        "the slices hold {}, more than the GPU's {}",
                        human(slices),
                        human(total - reserved)
                    ),
                ));
            }
            check_count(gpu, &path, devices.len())?;
            for n in 0..gpu.count {
                let index = devices.len();
                let uuid = match (&gpu.uuid, gpu.count) {
                    (Some(u), 1) => u.clone(),
                    (Some(u), _) => format!("{u}-{n}"),
                    (None, _) => default_uuid(index),
                };
                devices.push(SimDevice {
                    uuid,
                    product: product.clone(),
                    architecture: architecture.clone(),
                    total_bytes: total,
                    reserved_bytes: reserved,
                    context_bytes,
                    allocator: allocator.clone(),
                    pids: gpu.processes.iter().map(|p| p.pid).collect(),
                    mig: mig.clone(),
                    health: Health {
                        ecc_uncorrected_volatile: Some(gpu.health.ecc_uncorrected),
                        retired_pages_pending: Some(gpu.health.retired_pages_pending),
                        xids: gpu.health.xids.clone(),
                    },
                    bad_memory: gpu.health.bad_memory,
                    error: gpu.error.clone(),
                    unreadable: gpu.unreadable.iter().copied().collect(),
                    bandwidth_gb_per_s: gpu.bandwidth_gb_per_s,
                });
            }
        }
        Ok(Simulated {
            driver_version: spec.driver_version.clone(),
            cuda_version: spec.cuda_version.clone(),
            devices,
        })
    }

    fn get(&self, index: u32) -> Result<&SimDevice, GpuError> {
        let d = usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(GpuError::NoSuchDevice {
                index,
                count: u32::try_from(self.devices.len()).unwrap_or(u32::MAX),
            })?;
        match &d.error {
            Some(message) => Err(GpuError::call("simulated device", Some(index), message)),
            None => Ok(d),
        }
    }

    /// The allocator of a device, for tests and demos.
    pub fn allocator(&self, index: u32) -> Option<&Allocator> {
        self.devices
            .get(usize::try_from(index).ok()?)
            .map(|d| &d.allocator)
    }

    /// The CUDA context a new process creates on a device.
    pub fn context_bytes(&self, index: u32) -> Option<u64> {
        self.get(index).ok().map(|d| d.context_bytes)
    }

    /// A process (`pid`, e.g. a simulated trainer) allocates `bytes` on a
    /// device: the block's offset, or None when no free block is that large
    /// (what cudaMalloc answers with an out-of-memory error). The process is
    /// listed on the device from its first allocation.
    pub fn alloc(&mut self, index: u32, pid: u32, bytes: u64) -> Option<u64> {
        let d = self.devices.get_mut(usize::try_from(index).ok()?)?;
        let offset = d.allocator.alloc(bytes, pid)?;
        if !d.pids.contains(&pid) {
            d.pids.push(pid);
        }
        Some(offset)
    }

    /// [`Simulated::alloc`] as the CUDA driver backs it: pages mapped into
    /// the process's own address range, so one allocation may take several
    /// holes ([`Allocator::alloc_pages`]). The segments' offsets, or None
    /// when less than `bytes` is free.
    pub fn alloc_pages(&mut self, index: u32, pid: u32, bytes: u64) -> Option<Vec<u64>> {
        let d = self.devices.get_mut(usize::try_from(index).ok()?)?;
        let offsets = d.allocator.alloc_pages(bytes, pid)?;
        if !d.pids.contains(&pid) {
            d.pids.push(pid);
        }
        Some(offsets)
    }

    /// The process `pid` exits: its blocks at `offsets` are freed and it
    /// leaves the device's process list.
    pub fn exit(&mut self, index: u32, pid: u32, offsets: &[u64]) {
        let Some(d) = usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get_mut(i))
        else {
            return;
        };
        for &o in offsets {
            d.allocator.free(o);
        }
        d.pids.retain(|&p| p != pid);
    }
}

impl SimDevice {
    fn memory(&self) -> MemoryInfo {
        let (used, free) = if self.mig.is_empty() {
            (self.allocator.used_bytes(), self.allocator.free_bytes())
        } else {
            let used: u64 = self.mig.iter().map(|m| m.memory.used_bytes).sum();
            (
                used,
                (self.total_bytes - self.reserved_bytes).saturating_sub(used),
            )
        };
        if self.unreadable.contains(&Unreadable::Reserved) {
            MemoryInfo {
                total_bytes: self.total_bytes,
                free_bytes: free,
                used_bytes: used + self.reserved_bytes,
                reserved_bytes: None,
            }
        } else {
            MemoryInfo {
                total_bytes: self.total_bytes,
                free_bytes: free,
                used_bytes: used,
                reserved_bytes: Some(self.reserved_bytes),
            }
        }
    }

    fn without_cuda(&self, what: &'static str) -> Result<(), GpuError> {
        if self.unreadable.contains(&Unreadable::Cuda) {
            Err(GpuError::Unsupported {
                backend: "simulated (no libcuda)",
                what,
            })
        } else {
            Ok(())
        }
    }
}

impl Gpu for Simulated {
    fn backend(&self) -> &'static str {
        "simulated"
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        u32::try_from(self.devices.len())
            .map_err(|_| GpuError::call("simulated device count", None, "too many devices"))
    }

    fn device(&self, index: u32) -> Result<DeviceInfo, GpuError> {
        let d = self.get(index)?;
        let unreadable = |u: Unreadable| d.unreadable.contains(&u);
        let mut missing = Vec::new();
        let mut note = |u: Unreadable, what: &str| {
            if d.unreadable.contains(&u) {
                missing.push(format!("{what}: not given by the (simulated) driver"));
            }
        };
        note(Unreadable::Uuid, "uuid");
        note(Unreadable::Product, "product");
        note(Unreadable::Architecture, "architecture");
        note(Unreadable::Processes, "processes");
        note(Unreadable::Health, "health");
        let processes = d
            .pids
            .iter()
            .map(|&pid| ProcessInfo {
                pid,
                used_bytes: Some(d.allocator.used_by(pid)),
            })
            .collect();
        Ok(DeviceInfo {
            index,
            uuid: (!unreadable(Unreadable::Uuid)).then(|| d.uuid.clone()),
            product: (!unreadable(Unreadable::Product)).then(|| d.product.clone()),
            architecture: if unreadable(Unreadable::Architecture) {
                None
            } else {
                d.architecture.clone()
            },
            memory: d.memory(),
            processes: (!unreadable(Unreadable::Processes)).then_some(processes),
            mig_mode: if d.mig.is_empty() {
                MigMode::Disabled
            } else {
                MigMode::Enabled
            },
            mig_devices: d.mig.clone(),
            health: if unreadable(Unreadable::Health) {
                Health::default()
            } else {
                d.health.clone()
            },
            missing,
        })
    }

    fn driver_version(&self) -> Result<Option<String>, GpuError> {
        Ok(self.driver_version.clone())
    }

    fn cuda_version(&self) -> Result<Option<String>, GpuError> {
        Ok(self.cuda_version.clone())
    }

    fn context_overhead_bytes(&self, index: u32) -> Result<u64, GpuError> {
        let d = self.get(index)?;
        d.without_cuda("context overhead measurement")?;
        Ok(d.context_bytes)
    }

    /// As the CUDA backend does it: a new process's context is placed first,
    /// then the bisection runs against the model, capped at what is free.
    fn largest_allocatable_block(
        &self,
        index: u32,
        max_bytes: u64,
        limits: SearchLimits,
    ) -> Result<BlockProbe, GpuError> {
        let d = self.get(index)?;
        d.without_cuda("the largest-block probe")?;
        if !d.mig.is_empty() {
            return Err(GpuError::Unsupported {
                backend: "simulated",
                what: "the largest-block probe on a MIG-enabled GPU",
            });
        }
        let mut model = d.allocator.clone();
        if model.alloc(d.context_bytes, u32::MAX).is_none() {
            return Ok(BlockProbe {
                bytes: 0,
                limit_bytes: 0,
                exact: true,
                steps: 0,
                elapsed: std::time::Duration::ZERO,
            });
        }
        let limits = SearchLimits {
            granularity_bytes: model.granularity_bytes(),
            ..limits
        };
        search_largest_block(max_bytes.min(model.free_bytes()), limits, |bytes| {
            Ok(model.fits(bytes))
        })
    }

    fn verify_block(&self, index: u32, bytes: u64) -> Result<MemoryCheck, GpuError> {
        let d = self.get(index)?;
        d.without_cuda("memory verification")?;
        let bytes = bytes.min(d.allocator.largest_hole());
        let words = bytes / 8;
        Ok(MemoryCheck {
            bytes,
            mismatched_words: if d.bad_memory { words.min(1024) } else { 0 },
            first_bad_word: (d.bad_memory && words > 0).then_some(words / 2),
            write_gb_per_s: d.bandwidth_gb_per_s,
            read_gb_per_s: d.bandwidth_gb_per_s,
        })
    }
}

/// The MIG slices of `gpu` (of `product`, at `path`), their sizes from the spec or the catalog.
fn mig_slices(gpu: &SimGpuSpec, product: &str, path: &str) -> Result<Vec<MigInfo>, SimError> {
    let mut mig = Vec::new();
    for (m, slice) in gpu.mig.iter().enumerate() {
        let mpath = format!("{path}.mig[{m}]");
        let total = match slice.total_bytes {
            Some(t) => t.bytes(),
            None => catalog_product(&format!("{product} MIG {}", slice.profile))
                .map(|c| c.total_bytes)
                .ok_or_else(|| {
                    field(
                        format!("{mpath}.totalBytes"),
                        format!(
                            "the catalog has no {} slice of {product}: give totalBytes",
                            slice.profile
                        ),
                    )
                })?,
        };
        let used = slice.used_bytes.map_or(0, ByteSize::bytes);
        if used > total {
            return Err(field(
                format!("{mpath}.usedBytes"),
                format!("{} is more than the slice's {}", human(used), human(total)),
            ));
        }
        mig.push(MigInfo {
            index: u32::try_from(m).unwrap_or(u32::MAX),
            uuid: slice.uuid.clone(),
            profile: slice.profile.clone(),
            memory: MemoryInfo {
                total_bytes: total,
                free_bytes: total - used,
                used_bytes: used,
                reserved_bytes: Some(0),
            },
        });
    }
    Ok(mig)
}

/// `gpu.count` is at least 1 and, with the `have` devices before it, at most [`MAX_GPUS`].
fn check_count(gpu: &SimGpuSpec, path: &str, have: usize) -> Result<(), SimError> {
    if gpu.count == 0 {
        return Err(field(
            format!("{path}.count"),
            "0 is not allowed; minimum is 1",
        ));
    }
    if usize::try_from(gpu.count)
        .ok()
        .is_none_or(|n| n > MAX_GPUS - have)
    {
        return Err(field(
            format!("{path}.count"),
            format!(
                "{} more GPUs would make more than {MAX_GPUS} on the node",
                gpu.count
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn catalog_defaults_and_unknown_products() {
        let s = Simulated::from_yaml("gpus: [{product: h100-80gb, count: 2}]").unwrap();
        assert_eq!(s.device_count().unwrap(), 2);
        let d = s.device(1).unwrap();
        assert_eq!(d.product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(d.architecture.as_deref(), Some("hopper"));
        assert_eq!(d.memory.total_bytes, 81_559 * MIB);
        assert_eq!(
            d.memory.free_bytes + d.memory.used_bytes + d.memory.reserved_bytes.unwrap(),
            d.memory.total_bytes
        );
        let e = Simulated::from_yaml("gpus: [{product: quantum-9000}]").unwrap_err();
        assert!(e.to_string().starts_with("gpus[0].totalBytes: "), "{e}");
        let e = Simulated::from_yaml("gpus: [{product: t4, totl: 1}]").unwrap_err();
        assert!(e.to_string().contains("totl"), "{e}");
    }

    #[test]
    fn largest_block_accounts_for_the_new_context() {
        let s = Simulated::from_yaml(
            "gpus: [{product: a100-40gb, contextOverheadBytes: 512MiB, reservedBytes: 0, totalBytes: 10GiB}]",
        )
        .unwrap();
        let p = s
            .largest_allocatable_block(0, u64::MAX, SearchLimits::within(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(p.bytes, 10 * GIB - 512 * MIB);
        assert!(p.exact);
    }
}
