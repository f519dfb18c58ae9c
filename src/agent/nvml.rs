//! The NVML backend: device inventory, memory, processes, MIG and health from
//! `libnvidia-ml`, loaded at run time (nothing NVIDIA is needed to build).
//!
//! Every NVML call that can fail is mapped: the memory query is required (a
//! device whose memory cannot be read is reported as an error), everything
//! else is optional and a failure leaves the field empty with the reason in
//! `DeviceInfo::missing`. A library without a function (an older driver, or
//! the test stub) gives `FailedToLoadSymbol`, never a panic. NVML alone cannot
//! allocate: context overhead and the largest block come from `cuda`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::{DeviceArchitecture, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::{Device, EventSet, Nvml};

use super::gpu::{
    BlockProbe, DeviceInfo, Gpu, GpuError, Health, MemoryInfo, MigInfo, MigMode, ProcessInfo,
    SearchLimits,
};

/// The library name the dynamic loader is asked for when no path is given.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// Most XID events drained per probe (the rest wait for the next one).
const MAX_EVENTS_PER_PROBE: usize = 256;

/// NVML, initialised once for the life of the process.
pub struct NvmlGpu {
    // Leaked on purpose: the agent keeps NVML for its whole life, and the XID
    // event set borrows it. Never shutting NVML down also avoids the wrapper's
    // `Drop`, which panics on a library without `nvmlShutdown`.
    nvml: &'static Nvml,
    library: String,
    xids: Option<Mutex<XidWatch>>,
}

struct XidWatch {
    set: EventSet<'static>,
    /// Per device UUID, the XIDs seen since the agent started (last 16).
    seen: BTreeMap<String, Vec<u64>>,
}

impl std::fmt::Debug for NvmlGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpu")
            .field("library", &self.library)
            .field("xid_events", &self.xids.is_some())
            .finish()
    }
}

/// Map an NVML error of `call` to a `GpuError` that says what to do.
fn map_err(library: &str, call: &str, device: Option<u32>, e: NvmlError) -> GpuError {
    match e {
        NvmlError::LibloadingError(e) => GpuError::LibraryMissing {
            library: library.to_string(),
            reason: format!(
                "{e}; is the NVIDIA driver installed, and mounted into this container \
                 (NVIDIA container toolkit)? Use --simulate FILE to run without a GPU"
            ),
        },
        NvmlError::FailedToLoadSymbol(_) => GpuError::MissingSymbol {
            library: library.to_string(),
            symbol: call.to_string(),
        },
        NvmlError::DriverNotLoaded => GpuError::call(
            call,
            device,
            "the NVIDIA kernel driver is not loaded (does `nvidia-smi` work on the host?)",
        ),
        NvmlError::NoPermission => GpuError::call(
            call,
            device,
            "permission denied: the agent needs the /dev/nvidia* devices \
             (NVIDIA container runtime, or NVIDIA_VISIBLE_DEVICES=all)",
        ),
        NvmlError::GpuLost => GpuError::call(
            call,
            device,
            "the GPU has fallen off the bus or is otherwise inaccessible",
        ),
        other => GpuError::call(call, device, other),
    }
}

/// `Some(value)`, or `None` with the reason noted in `missing`.
fn optional<T>(
    r: Result<T, NvmlError>,
    what: &str,
    call: &str,
    library: &str,
    missing: &mut Vec<String>,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => {
            missing.push(format!("{what}: not supported on this device ({call})"));
            None
        }
        Err(e) => {
            missing.push(format!("{what}: {}", map_err(library, call, None, e)));
            None
        }
    }
}

/// NVML's architecture as the lowercase name the rest of vramguard uses.
fn architecture_name(a: DeviceArchitecture) -> Option<String> {
    let name = match a {
        DeviceArchitecture::Kepler => "kepler",
        DeviceArchitecture::Maxwell => "maxwell",
        DeviceArchitecture::Pascal => "pascal",
        DeviceArchitecture::Volta => "volta",
        DeviceArchitecture::Turing => "turing",
        DeviceArchitecture::Ampere => "ampere",
        DeviceArchitecture::Ada => "ada",
        DeviceArchitecture::Hopper => "hopper",
        DeviceArchitecture::Blackwell => "blackwell",
        DeviceArchitecture::Unknown => return None,
    };
    Some(name.to_string())
}

/// `12080` → `12.8`.
pub fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The MIG profile at the end of a MIG device's name
/// (`NVIDIA A100-SXM4-80GB MIG 3g.40gb` → `3g.40gb`).
pub fn mig_profile(name: &str) -> String {
    name.rsplit_once("MIG ")
        .map(|(_, p)| p.trim().to_string())
        .unwrap_or_else(|| name.trim().to_string())
}

impl NvmlGpu {
    /// Load and initialise NVML from `path` (a file), or from the dynamic
    /// loader's search path (`libnvidia-ml.so.1`) when `None`.
    pub fn load(path: Option<&Path>) -> Result<NvmlGpu, GpuError> {
        let library = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| DEFAULT_LIBRARY.to_string());
        let mut builder = Nvml::builder();
        if let Some(p) = path {
            builder.lib_path(p.as_os_str());
        }
        let nvml = builder
            .init()
            .map_err(|e| map_err(&library, "nvmlInit_v2", None, e))?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let mut gpu = NvmlGpu {
            nvml,
            library,
            xids: None,
        };
        gpu.xids = gpu.watch_xids();
        Ok(gpu)
    }

    /// The library this backend loaded.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Register every device for critical XID events, where the driver can.
    fn watch_xids(&self) -> Option<Mutex<XidWatch>> {
        let lib = self.nvml.lib();
        if lib.nvmlEventSetFree.is_err() || lib.nvmlEventSetWait_v2.is_err() {
            return None;
        }
        let count = self.nvml.device_count().ok()?;
        let mut set = self.nvml.create_event_set().ok()?;
        let mut registered = 0;
        for i in 0..count {
            let Ok(dev) = self.nvml.device_by_index(i) else {
                continue;
            };
            set = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    registered += 1;
                    s
                }
                // The set is released on failure; start a new one for the rest.
                Err(_) => self.nvml.create_event_set().ok()?,
            };
        }
        (registered > 0).then(|| {
            Mutex::new(XidWatch {
                set,
                seen: BTreeMap::new(),
            })
        })
    }

    /// Drain pending XID events; return those seen on `uuid` so far.
    fn xids_of(&self, uuid: Option<&str>) -> Vec<u64> {
        let Some(watch) = &self.xids else {
            return Vec::new();
        };
        let Ok(mut w) = watch.lock() else {
            return Vec::new();
        };
        for _ in 0..MAX_EVENTS_PER_PROBE {
            let Ok(event) = w.set.wait(0) else { break };
            let Ok(from) = event.device.uuid() else {
                continue;
            };
            if let Some(XidError::Value(x)) = event.event_data {
                let list = w.seen.entry(from).or_default();
                list.push(x);
                if list.len() > 16 {
                    list.remove(0);
                }
            }
        }
        uuid.and_then(|u| w.seen.get(u).cloned())
            .unwrap_or_default()
    }

    /// Free bytes of one device, without the rest of `device`.
    pub fn free_bytes(&self, index: u32) -> Result<u64, GpuError> {
        let dev = self.handle(index)?;
        Ok(self.memory(&dev, index)?.free_bytes)
    }

    fn handle(&self, index: u32) -> Result<Device<'static>, GpuError> {
        let count = self.device_count()?;
        if index >= count {
            return Err(GpuError::NoSuchDevice { index, count });
        }
        self.nvml.device_by_index(index).map_err(|e| {
            map_err(
                &self.library,
                "nvmlDeviceGetHandleByIndex_v2",
                Some(index),
                e,
            )
        })
    }

    /// Memory of a device: the v2 query (with the driver's reserve) where the
    /// driver has it, else the v1 query.
    fn memory(&self, dev: &Device<'_>, index: u32) -> Result<MemoryInfo, GpuError> {
        match dev.memory_info() {
            Ok(m) => Ok(MemoryInfo {
                total_bytes: m.total,
                free_bytes: m.free,
                used_bytes: m.used,
                reserved_bytes: Some(m.reserved),
            }),
            Err(
                NvmlError::FailedToLoadSymbol(_)
                | NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::InvalidArg
                // NVML_ERROR_ARGUMENT_VERSION_MISMATCH: a driver without memory v2.
                | NvmlError::UnexpectedVariant(25),
            ) => self.memory_v1(dev, index),
            Err(e) => Err(map_err(
                &self.library,
                "nvmlDeviceGetMemoryInfo_v2",
                Some(index),
                e,
            )),
        }
    }

    fn memory_v1(&self, dev: &Device<'_>, index: u32) -> Result<MemoryInfo, GpuError> {
        const CALL: &str = "nvmlDeviceGetMemoryInfo";
        let sym = self
            .nvml
            .lib()
            .nvmlDeviceGetMemoryInfo
            .as_ref()
            .map_err(|_| GpuError::MissingSymbol {
                library: self.library.clone(),
                symbol: CALL.to_string(),
            })?;
        let mut m = nvml_wrapper_sys::bindings::nvmlMemory_t {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: the handle comes from `device_by_index` on this NVML and `m`
        // is a live nvmlMemory_t the call fills.
        let rc = unsafe { sym(dev.handle(), &mut m) };
        nvml_try(rc).map_err(|e| map_err(&self.library, CALL, Some(index), e))?;
        Ok(MemoryInfo {
            total_bytes: m.total,
            free_bytes: m.free,
            used_bytes: m.used,
            reserved_bytes: None,
        })
    }

    fn processes(&self, dev: &Device<'_>, missing: &mut Vec<String>) -> Option<Vec<ProcessInfo>> {
        // v3 (drivers from R510); older drivers leave the list unknown.
        let list = optional(
            dev.running_compute_processes(),
            "processes",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            &self.library,
            missing,
        )?;
        Some(
            list.into_iter()
                .map(|p| ProcessInfo {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect(),
        )
    }

    fn mig(
        &self,
        dev: &Device<'_>,
        index: u32,
        missing: &mut Vec<String>,
    ) -> (MigMode, Vec<MigInfo>) {
        let mode = match dev.mig_mode() {
            Ok(m) if m.current == 1 => MigMode::Enabled,
            Ok(_) => MigMode::Disabled,
            Err(NvmlError::NotSupported) => MigMode::Unsupported,
            Err(e) => {
                missing.push(format!(
                    "MIG mode: {}",
                    map_err(&self.library, "nvmlDeviceGetMigMode", Some(index), e)
                ));
                MigMode::Unsupported
            }
        };
        if mode != MigMode::Enabled {
            return (mode, Vec::new());
        }
        let Some(max) = optional(
            dev.mig_device_count(),
            "MIG devices",
            "nvmlDeviceGetMaxMigDeviceCount",
            &self.library,
            missing,
        ) else {
            return (mode, Vec::new());
        };
        let mut out = Vec::new();
        for i in 0..max {
            let mig = match dev.mig_device_by_index(i) {
                Ok(m) => m,
                // Unused slots answer NotFound.
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => {
                    missing.push(format!(
                        "MIG device {i}: {}",
                        map_err(
                            &self.library,
                            "nvmlDeviceGetMigDeviceHandleByIndex",
                            Some(index),
                            e
                        )
                    ));
                    continue;
                }
            };
            let memory = match self.memory(&mig, index) {
                Ok(m) => m,
                Err(e) => {
                    missing.push(format!("MIG device {i} memory: {e}"));
                    continue;
                }
            };
            let name = mig.name().unwrap_or_default();
            out.push(MigInfo {
                index: i,
                uuid: mig.uuid().ok(),
                profile: mig_profile(&name),
                memory,
            });
        }
        (mode, out)
    }

    fn health(&self, dev: &Device<'_>, uuid: Option<&str>, missing: &mut Vec<String>) -> Health {
        // ECC counters exist only where ECC is on; "not supported" is not news.
        let ecc = match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
            Ok(n) => Some(n),
            Err(NvmlError::NotSupported) => None,
            Err(e) => {
                missing.push(format!(
                    "ECC errors: {}",
                    map_err(&self.library, "nvmlDeviceGetTotalEccErrors", None, e)
                ));
                None
            }
        };
        let pending = dev.are_pages_pending_retired().ok();
        Health {
            ecc_uncorrected_volatile: ecc,
            retired_pages_pending: pending,
            xids: self.xids_of(uuid),
        }
    }
}

impl Gpu for NvmlGpu {
    fn backend(&self) -> &'static str {
        "nvml"
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        self.nvml
            .device_count()
            .map_err(|e| map_err(&self.library, "nvmlDeviceGetCount_v2", None, e))
    }

    fn device(&self, index: u32) -> Result<DeviceInfo, GpuError> {
        let dev = self.handle(index)?;
        let memory = self.memory(&dev, index)?;
        let lib = self.library.as_str();
        let mut missing = Vec::new();
        let uuid = optional(dev.uuid(), "uuid", "nvmlDeviceGetUUID", lib, &mut missing);
        let product = optional(
            dev.name(),
            "product",
            "nvmlDeviceGetName",
            lib,
            &mut missing,
        );
        let architecture = optional(
            dev.architecture(),
            "architecture",
            "nvmlDeviceGetArchitecture",
            lib,
            &mut missing,
        )
        .and_then(architecture_name);
        let processes = self.processes(&dev, &mut missing);
        let (mig_mode, mig_devices) = self.mig(&dev, index, &mut missing);
        let health = self.health(&dev, uuid.as_deref(), &mut missing);
        Ok(DeviceInfo {
            index,
            uuid,
            product,
            architecture,
            memory,
            processes,
            mig_mode,
            mig_devices,
            health,
            missing,
        })
    }

    fn driver_version(&self) -> Result<Option<String>, GpuError> {
        match self.nvml.sys_driver_version() {
            Ok(v) => Ok(Some(v)),
            Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::NotSupported) => Ok(None),
            Err(e) => Err(map_err(
                &self.library,
                "nvmlSystemGetDriverVersion",
                None,
                e,
            )),
        }
    }

    fn cuda_version(&self) -> Result<Option<String>, GpuError> {
        match self.nvml.sys_cuda_driver_version() {
            Ok(v) => Ok(Some(cuda_version_string(v))),
            Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::NotSupported) => Ok(None),
            Err(e) => Err(map_err(
                &self.library,
                "nvmlSystemGetCudaDriverVersion_v2",
                None,
                e,
            )),
        }
    }

    fn context_overhead_bytes(&self, _index: u32) -> Result<u64, GpuError> {
        Err(GpuError::Unsupported {
            backend: "nvml",
            what: "context overhead measurement (needs libcuda)",
        })
    }

    fn largest_allocatable_block(
        &self,
        _index: u32,
        _max_bytes: u64,
        _limits: SearchLimits,
    ) -> Result<BlockProbe, GpuError> {
        Err(GpuError::Unsupported {
            backend: "nvml",
            what: "the largest-block probe (needs libcuda)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_it() {
        let e = NvmlGpu::load(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        match &e {
            GpuError::LibraryMissing { library, .. } => {
                assert_eq!(library, "/nonexistent/libnvidia-ml.so.1")
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("--simulate"), "{e}");
    }

    #[test]
    fn names() {
        assert_eq!(cuda_version_string(12080), "12.8");
        assert_eq!(cuda_version_string(11040), "11.4");
        assert_eq!(mig_profile("NVIDIA A100-SXM4-80GB MIG 3g.40gb"), "3g.40gb");
        assert_eq!(mig_profile("1g.10gb"), "1g.10gb");
        assert_eq!(
            architecture_name(DeviceArchitecture::Hopper).as_deref(),
            Some("hopper")
        );
        assert_eq!(architecture_name(DeviceArchitecture::Unknown), None);
    }
}
