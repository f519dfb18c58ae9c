//! The backend of a real node: NVML for everything it can read, CUDA for what
//! only allocating can tell (context overhead, largest block, memory check).
//! Devices are matched by UUID, since NVML counts in PCI order and CUDA, by
//! default, fastest first. Without libcuda the node is still probed with NVML
//! alone; the measurements are then left out.

use std::path::Path;

use super::cuda::Cuda;
use super::gpu::{BlockProbe, DeviceInfo, Gpu, GpuError, MemoryCheck, SearchLimits};
use super::nvml::NvmlGpu;

/// NVML plus, where libcuda loads, CUDA.
#[derive(Debug)]
pub struct Nvidia {
    nvml: NvmlGpu,
    cuda: Option<Cuda>,
    /// Why CUDA is not used, when it is not.
    cuda_unavailable: Option<String>,
}

impl Nvidia {
    /// Load NVML (required) and, when `use_cuda`, CUDA (optional: its absence
    /// is logged and the measurements that need it are skipped).
    pub fn load(nvml_library: Option<&Path>, use_cuda: bool) -> Result<Nvidia, GpuError> {
        let nvml = NvmlGpu::load(nvml_library)?;
        let (cuda, cuda_unavailable) = if use_cuda {
            match Cuda::load() {
                Ok(c) => (Some(c), None),
                Err(e) => {
                    tracing::warn!(error = %e, "CUDA unavailable: no context-overhead or largest-block measurements");
                    (None, Some(e.to_string()))
                }
            }
        } else {
            (None, Some("disabled (--no-cuda)".to_string()))
        };
        Ok(Nvidia {
            nvml,
            cuda,
            cuda_unavailable,
        })
    }

    /// Why CUDA measurements are skipped, if they are.
    pub fn cuda_unavailable(&self) -> Option<&str> {
        self.cuda_unavailable.as_deref()
    }

    fn cuda_for(&self, index: u32, what: &'static str) -> Result<(&Cuda, i32), GpuError> {
        let Some(cuda) = &self.cuda else {
            return Err(GpuError::Unsupported {
                backend: "nvml",
                what,
            });
        };
        let info = self.nvml.device(index)?;
        let uuid = info.uuid.ok_or_else(|| {
            GpuError::call(
                "nvmlDeviceGetUUID",
                Some(index),
                "no UUID: cannot find this GPU among CUDA's devices",
            )
        })?;
        let ordinal = cuda.ordinal_of(&uuid).ok_or_else(|| {
            GpuError::call(
                "cuDeviceGetUuid",
                Some(index),
                format!(
                    "CUDA does not see {uuid} (it sees {} device(s); is CUDA_VISIBLE_DEVICES set?)",
                    cuda.device_count()
                ),
            )
        })?;
        Ok((cuda, ordinal))
    }
}

impl Gpu for Nvidia {
    fn backend(&self) -> &'static str {
        if self.cuda.is_some() {
            "nvml+cuda"
        } else {
            "nvml"
        }
    }

    fn device_count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count()
    }

    fn device(&self, index: u32) -> Result<DeviceInfo, GpuError> {
        self.nvml.device(index)
    }

    fn driver_version(&self) -> Result<Option<String>, GpuError> {
        self.nvml.driver_version()
    }

    fn cuda_version(&self) -> Result<Option<String>, GpuError> {
        self.nvml.cuda_version()
    }

    fn context_overhead_bytes(&self, index: u32) -> Result<u64, GpuError> {
        let (cuda, ordinal) = self.cuda_for(index, "context overhead measurement")?;
        let free = || self.nvml.free_bytes(index);
        cuda.context_overhead(ordinal, Some(&free))
    }

    fn largest_allocatable_block(
        &self,
        index: u32,
        max_bytes: u64,
        limits: SearchLimits,
    ) -> Result<BlockProbe, GpuError> {
        let (cuda, ordinal) = self.cuda_for(index, "the largest-block probe")?;
        cuda.largest_block(ordinal, max_bytes, limits)
    }

    fn verify_block(&self, index: u32, bytes: u64) -> Result<MemoryCheck, GpuError> {
        let (cuda, ordinal) = self.cuda_for(index, "memory verification")?;
        cuda.verify(ordinal, bytes)
    }
}
