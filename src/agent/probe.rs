//! One probe of a node: every GPU read through the `Gpu` trait and turned into
//! the published `GpuNodeStatus` (per-GPU view, probe time, agent version).
//!
//! What it decides:
//! - A GPU that cannot be read is still listed, unhealthy, with the error as
//!   its health message, so consumers skip it instead of mistaking it for absent.
//! - Allocating measurements (context overhead, largest block, memory check)
//!   run only on whole, healthy GPUs with no other process and no pod assigned:
//!   a probe that briefly takes all free memory must not race a running job
//!   (`probe_busy_gpus` lifts the process rule, not the pod rule). The context overhead is measured once
//!   per GPU and kept.
//! - A GPU the kubelet gave a pod exclusively has nothing free for another
//!   job: its free memory and largest block are published as 0. Shared GPUs
//!   (time-slicing or MPS replicas, `GPU-…::n`) keep their numbers.
//! - A memory check that reads back wrong words marks the GPU unhealthy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::bytes::human;
use super::gpu::{DeviceInfo, Gpu, GpuError, MigMode, SearchLimits};
use super::metrics::{ErrorLabels, ProbeErrorKind, ProbeErrors};
use crate::api::{GpuNodeStatus, GpuProcess, GpuStatus, MigDevice};

/// The agent's version, published with every probe.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What one probe measures besides reading the driver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeOptions {
    pub context_overhead: bool,
    pub largest_block: bool,
    /// Run the allocating measurements on GPUs where other processes run.
    pub probe_busy_gpus: bool,
    /// Time budget of one GPU's largest-block search.
    pub block_budget: Duration,
    /// Bytes of the touch-and-verify pass per GPU; 0 skips it.
    pub verify_bytes: u64,
}

impl Default for ProbeOptions {
    fn default() -> ProbeOptions {
        ProbeOptions {
            context_overhead: true,
            largest_block: true,
            probe_busy_gpus: false,
            block_budget: Duration::from_secs(1),
            verify_bytes: 0,
        }
    }
}

/// A pod holding a GPU, from the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// `namespace/name` (several, comma-separated, when shared).
    pub pod: String,
    /// Time-sliced or MPS: other pods may still use what is free.
    pub shared: bool,
}

/// Which GPUs pods hold, by device UUID (whole GPUs and MIG devices) and, for
/// device plugins that name GPUs by index, by index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignments {
    pub by_uuid: BTreeMap<String, Assignment>,
    pub by_index: BTreeMap<u32, Assignment>,
}

impl Assignments {
    pub fn lookup(&self, uuid: Option<&str>, index: u32) -> Option<&Assignment> {
        uuid.and_then(|u| self.by_uuid.get(u))
            .or_else(|| self.by_index.get(&index))
    }
}

/// Why a probe produced nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("counting GPUs: {0}")]
    DeviceCount(GpuError),
}

/// Probes one node's GPUs; keeps what does not change between probes.
pub struct Prober {
    gpu: Arc<dyn Gpu>,
    options: ProbeOptions,
    /// Context overhead per GPU UUID, measured once.
    context: Mutex<BTreeMap<String, u64>>,
    /// Measurements that failed (not those a GPU does not support), by kind.
    errors: ProbeErrors,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("backend", &self.gpu.backend())
            .field("options", &self.options)
            .finish()
    }
}

impl Prober {
    pub fn new(gpu: Arc<dyn Gpu>, options: ProbeOptions) -> Prober {
        Prober {
            gpu,
            options,
            context: Mutex::new(BTreeMap::new()),
            errors: ProbeErrors::default(),
        }
    }

    /// Failed measurements by kind, counted as the probe goes.
    pub fn errors(&self) -> &ProbeErrors {
        &self.errors
    }

    fn measurement_failed(&self, index: u32, kind: ProbeErrorKind, what: &str, e: &GpuError) {
        if let GpuError::Unsupported { .. } = e {
            tracing::debug!(gpu = index, error = %e, "{what} not measured");
        } else {
            tracing::warn!(gpu = index, error = %e, "{what} not measured");
            self.errors.get_or_create(&ErrorLabels { kind }).inc();
        }
    }

    pub fn gpu(&self) -> &Arc<dyn Gpu> {
        &self.gpu
    }

    /// Read every GPU now. Blocks (driver calls, allocations).
    pub fn probe(
        &self,
        assignments: &Assignments,
        now: Timestamp,
    ) -> Result<GpuNodeStatus, ProbeError> {
        let count = self.gpu.device_count().map_err(ProbeError::DeviceCount)?;
        let gpus: Vec<GpuStatus> = (0..count)
            .map(|i| match self.gpu.device(i) {
                Ok(info) => self.status_of(info, assignments),
                Err(e) => {
                    tracing::warn!(gpu = i, error = %e, "GPU could not be read");
                    unreadable(i, &e)
                }
            })
            .collect();
        let optional = |r: Result<Option<String>, GpuError>, what: &str| {
            r.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "{what} unknown");
                None
            })
        };
        Ok(GpuNodeStatus {
            gpu_count: count,
            product: gpus
                .iter()
                .find(|g| !g.product.is_empty() && g.product != UNKNOWN_PRODUCT)
                .map(|g| g.product.clone()),
            gpus,
            probe_time: Some(Time(now)),
            agent_version: Some(AGENT_VERSION.to_string()),
            driver_version: optional(self.gpu.driver_version(), "driver version"),
            cuda_version: optional(self.gpu.cuda_version(), "CUDA version"),
        })
    }

    fn status_of(&self, info: DeviceInfo, assignments: &Assignments) -> GpuStatus {
        let index = info.index;
        for m in &info.missing {
            tracing::debug!(gpu = index, "not read: {m}");
        }
        let mut problems = info.health.problems();
        let assignment = assignments.lookup(info.uuid.as_deref(), index);
        let exclusive = assignment.is_some_and(|a| !a.shared);
        let others = info.processes.as_ref().is_some_and(|p| !p.is_empty());
        let mig = info.mig_mode == MigMode::Enabled;
        let mut st = GpuStatus {
            index,
            uuid: info.uuid.clone().unwrap_or_default(),
            product: info
                .product
                .clone()
                .unwrap_or_else(|| UNKNOWN_PRODUCT.to_string()),
            architecture: info.architecture.clone(),
            total_bytes: info.memory.total_bytes,
            free_bytes: info.memory.free_bytes,
            used_bytes: info.memory.used_bytes,
            reserved_bytes: info.memory.reserved_bytes.unwrap_or(0),
            largest_free_block_bytes: None,
            context_overhead_bytes: None,
            mig_devices: info
                .mig_devices
                .iter()
                .map(|m| {
                    let taken = m
                        .uuid
                        .as_deref()
                        .and_then(|u| assignments.by_uuid.get(u))
                        .is_some_and(|a| !a.shared);
                    MigDevice {
                        index: m.index,
                        uuid: m.uuid.clone().unwrap_or_default(),
                        profile: m.profile.clone(),
                        total_bytes: m.memory.total_bytes,
                        free_bytes: if taken { 0 } else { m.memory.free_bytes },
                    }
                })
                .collect(),
            processes: info
                .processes
                .iter()
                .flatten()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_bytes: p.used_bytes.unwrap_or(0),
                })
                .collect(),
            healthy: true,
            health_message: None,
            assigned_pod: assignment.map(|a| a.pod.clone()),
        };

        let skip = if mig {
            Some("MIG is on")
        } else if !problems.is_empty() {
            Some("unhealthy")
        } else if assignment.is_some() {
            Some("assigned to a pod")
        } else if others && !self.options.probe_busy_gpus {
            Some("other processes are running")
        } else {
            None
        };
        match skip {
            Some(why) => tracing::debug!(gpu = index, "allocating measurements skipped: {why}"),
            None => self.measure(&mut st, &mut problems),
        }

        if exclusive {
            st.free_bytes = 0;
            st.largest_free_block_bytes = Some(0);
        }
        if !problems.is_empty() {
            st.healthy = false;
            st.health_message = Some(problems.join("; "));
        }
        st
    }

    /// Context overhead, largest block and memory check of one idle GPU.
    fn measure(&self, st: &mut GpuStatus, problems: &mut Vec<String>) {
        let index = st.index;
        let key = if st.uuid.is_empty() {
            format!("#{index}")
        } else {
            st.uuid.clone()
        };
        if self.options.context_overhead {
            let cached = self.context.lock().ok().and_then(|c| c.get(&key).copied());
            st.context_overhead_bytes = match cached {
                Some(b) => Some(b),
                None => match self.gpu.context_overhead_bytes(index) {
                    Ok(b) => {
                        if let Ok(mut c) = self.context.lock() {
                            c.insert(key, b);
                        }
                        Some(b)
                    }
                    Err(e) => {
                        self.measurement_failed(
                            index,
                            ProbeErrorKind::ContextOverhead,
                            "context overhead",
                            &e,
                        );
                        None
                    }
                },
            };
        }
        if self.options.largest_block {
            let limits = SearchLimits::within(self.options.block_budget);
            match self
                .gpu
                .largest_allocatable_block(index, st.free_bytes, limits)
            {
                Ok(p) => {
                    if !p.exact {
                        tracing::info!(
                            gpu = index,
                            steps = p.steps,
                            bytes = p.bytes,
                            "largest-block search stopped early; publishing the lower bound"
                        );
                    }
                    st.largest_free_block_bytes = Some(p.bytes.min(st.free_bytes));
                }
                Err(e) => self.measurement_failed(
                    index,
                    ProbeErrorKind::LargestBlock,
                    "largest block",
                    &e,
                ),
            }
        }
        if self.options.verify_bytes > 0 {
            match self.gpu.verify_block(index, self.options.verify_bytes) {
                Ok(c) if c.mismatched_words > 0 => problems.push(format!(
                    "memory check: {} of {} words read back wrong{}",
                    c.mismatched_words,
                    c.bytes / 8,
                    c.first_bad_word
                        .map(|w| format!(", the first at byte {} of the block", w * 8))
                        .unwrap_or_default()
                )),
                Ok(c) => tracing::debug!(
                    gpu = index,
                    bytes = %human(c.bytes),
                    write_gb_per_s = c.write_gb_per_s,
                    read_gb_per_s = c.read_gb_per_s,
                    "memory check passed"
                ),
                Err(e) => {
                    self.measurement_failed(index, ProbeErrorKind::MemoryCheck, "memory check", &e)
                }
            }
        }
    }
}

/// Product name published for a GPU whose name could not be read.
pub const UNKNOWN_PRODUCT: &str = "unknown";

fn unreadable(index: u32, e: &GpuError) -> GpuStatus {
    GpuStatus {
        index,
        product: UNKNOWN_PRODUCT.to_string(),
        healthy: false,
        health_message: Some(format!("could not be read: {e}")),
        ..GpuStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::simulated::Simulated;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    fn prober(yaml: &str) -> Prober {
        let sim = Simulated::from_yaml(yaml).expect("valid simulation");
        Prober::new(Arc::new(sim), ProbeOptions::default())
    }

    #[test]
    fn status_carries_time_version_and_drivers() {
        let p = prober("driverVersion: 570.1\ncudaVersion: '12.8'\ngpus: [{product: l4}]");
        let s = p.probe(&Assignments::default(), at(1_700_000_000)).unwrap();
        assert_eq!(s.gpu_count, 1);
        assert_eq!(s.product.as_deref(), Some("NVIDIA L4"));
        assert_eq!(s.agent_version.as_deref(), Some(AGENT_VERSION));
        assert_eq!(s.driver_version.as_deref(), Some("570.1"));
        assert_eq!(s.cuda_version.as_deref(), Some("12.8"));
        assert_eq!(s.probe_time, Some(Time(at(1_700_000_000))));
        let g = &s.gpus[0];
        assert!(g.healthy);
        assert!(g.context_overhead_bytes.is_some());
        assert!(
            g.largest_free_block_bytes
                .is_some_and(|b| b <= g.free_bytes)
        );
    }

    #[test]
    fn busy_and_assigned_gpus_are_not_allocated_on() {
        let p = prober(
            "gpus:\n- {product: l4, uuid: GPU-a, processes: [{pid: 9, usedBytes: 1GiB}]}\n- {product: l4, uuid: GPU-b}\n- {product: l4, uuid: GPU-c}",
        );
        let mut a = Assignments::default();
        a.by_uuid.insert(
            "GPU-b".into(),
            Assignment {
                pod: "ml/trainer-0".into(),
                shared: false,
            },
        );
        a.by_uuid.insert(
            "GPU-c".into(),
            Assignment {
                pod: "ml/a, ml/b".into(),
                shared: true,
            },
        );
        let s = p.probe(&a, at(0)).unwrap();
        assert_eq!(s.gpus[0].largest_free_block_bytes, None, "busy");
        assert_eq!(
            s.gpus[0].processes,
            vec![GpuProcess {
                pid: 9,
                used_bytes: 1 << 30
            }]
        );
        assert_eq!(s.gpus[1].free_bytes, 0, "exclusively assigned");
        assert_eq!(s.gpus[1].assigned_pod.as_deref(), Some("ml/trainer-0"));
        assert!(s.gpus[2].free_bytes > 0, "shared keeps its free memory");
        assert_eq!(
            s.gpus[2].largest_free_block_bytes, None,
            "but is not probed"
        );
    }

    #[test]
    fn unreadable_gpus_are_listed_unhealthy() {
        let p = prober(
            "gpus:\n- {product: a10g}\n- {product: a10g, error: GPU has fallen off the bus}",
        );
        let s = p.probe(&Assignments::default(), at(0)).unwrap();
        assert_eq!(s.gpu_count, 2);
        assert!(s.gpus[0].healthy);
        assert!(!s.gpus[1].healthy);
        let msg = s.gpus[1].health_message.as_deref().unwrap();
        assert!(
            msg.contains("fallen off the bus") && msg.contains("GPU 1"),
            "{msg}"
        );
    }
}
