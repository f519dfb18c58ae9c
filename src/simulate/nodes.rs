//! The simulated nodes and the clock they keep: each node's GPUs are the
//! agent's simulated backend, shared between the agent's prober and the
//! trainers that allocate on them.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::agent::gpu::{BlockProbe, DeviceInfo, Gpu, GpuError, MemoryCheck, SearchLimits};
use crate::agent::probe::{ProbeOptions, Prober};
use crate::agent::simulated::Simulated;

use super::capacity_bytes;
use super::scenario::NodeSpec;

/// Simulated time: seconds since the scenario started, on tokio's clock
/// (paused: it jumps to the next timer whenever every task waits).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: tokio::time::Instant,
    epoch_unix: i64,
}

/// The wall-clock time the scenario starts at: 2026-01-05T00:00:00Z.
pub const EPOCH_UNIX: i64 = 1_767_571_200;

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: tokio::time::Instant::now(),
            epoch_unix: EPOCH_UNIX,
        }
    }

    pub fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub fn unix(&self) -> i64 {
        self.epoch_unix + self.start.elapsed().as_secs() as i64
    }

    pub fn timestamp(&self) -> Timestamp {
        Timestamp::from_second(self.unix()).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// Sleep until `secs` after the start.
    pub async fn until(&self, secs: f64) {
        let at = self.start + Duration::from_secs_f64(secs.max(0.0));
        tokio::time::sleep_until(at).await;
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// One node's GPUs behind a lock, so the agent probes what trainers hold.
struct SharedGpu(Arc<Mutex<Simulated>>);

impl SharedGpu {
    fn lock(&self) -> MutexGuard<'_, Simulated> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Gpu for SharedGpu {
    fn backend(&self) -> &'static str {
        "simulated"
    }
    fn device_count(&self) -> Result<u32, GpuError> {
        self.lock().device_count()
    }
    fn device(&self, index: u32) -> Result<DeviceInfo, GpuError> {
        self.lock().device(index)
    }
    fn driver_version(&self) -> Result<Option<String>, GpuError> {
        self.lock().driver_version()
    }
    fn cuda_version(&self) -> Result<Option<String>, GpuError> {
        self.lock().cuda_version()
    }
    fn context_overhead_bytes(&self, index: u32) -> Result<u64, GpuError> {
        self.lock().context_overhead_bytes(index)
    }
    fn largest_allocatable_block(
        &self,
        index: u32,
        max_bytes: u64,
        limits: SearchLimits,
    ) -> Result<BlockProbe, GpuError> {
        self.lock()
            .largest_allocatable_block(index, max_bytes, limits)
    }
    fn verify_block(&self, index: u32, bytes: u64) -> Result<MemoryCheck, GpuError> {
        self.lock().verify_block(index, bytes)
    }
}

/// One simulated node.
pub struct Node {
    pub spec: NodeSpec,
    gpu: Arc<Mutex<Simulated>>,
    pub(super) prober: Prober,
    /// The agent publishes (false after an `agentStops` fault).
    pub publishing: bool,
    /// The node is gone (a `nodeLost` fault).
    pub lost: bool,
    /// When the agent last published (scenario seconds).
    pub last_publish: Option<f64>,
}

impl Node {
    pub fn new(spec: &NodeSpec) -> Result<Node, String> {
        let sim = Simulated::from_yaml(&format!(
            "gpus: [{{product: {}, count: {}}}]",
            spec.product.name, spec.gpus
        ))
        .map_err(|e| e.to_string())?;
        let gpu = Arc::new(Mutex::new(sim));
        let prober = Prober::new(Arc::new(SharedGpu(gpu.clone())), ProbeOptions::default());
        Ok(Node {
            spec: spec.clone(),
            gpu,
            prober,
            publishing: true,
            lost: false,
            last_publish: None,
        })
    }

    pub(super) fn sim(&self) -> MutexGuard<'_, Simulated> {
        self.gpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes in use on the node's GPUs, and their capacity.
    pub fn memory(&self) -> (u64, u64) {
        let sim = self.sim();
        let mut used = 0;
        for i in 0..self.spec.gpus {
            if let Some(a) = sim.allocator(i) {
                used += a.used_bytes();
            }
        }
        (
            used,
            capacity_bytes(self.spec.product) * u64::from(self.spec.gpus),
        )
    }
}
