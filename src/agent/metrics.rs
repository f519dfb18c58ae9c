//! The agent's Prometheus metrics (prefix `vramguard_agent`): per GPU of this
//! node (label `gpu`, its index: bounded by the GPUs a node has; the node
//! comes from the scrape's target labels) the total and free bytes, the
//! largest block an allocation got, the CUDA context's overhead; and probe
//! errors by what failed.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::GpuNodeStatus;
use crate::metrics::gauge_bytes;

/// What failed, in a bounded set.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ProbeErrorKind {
    /// A whole probe (NVML unreadable, the probe thread died): nothing published.
    Probe,
    /// Measuring one GPU's CUDA context overhead.
    ContextOverhead,
    /// The largest-block search on one GPU.
    LargestBlock,
    /// The touch-and-verify memory check on one GPU (NVRTC missing included).
    MemoryCheck,
    /// Writing the GpuNode.
    Publish,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: ProbeErrorKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: String,
}

/// Probe errors by kind; the prober counts its per-GPU measurement errors here.
pub type ProbeErrors = Family<ErrorLabels, Counter>;

/// The agent's metric families.
#[derive(Clone, Debug, Default)]
pub struct AgentMetrics {
    pub total_bytes: Family<GpuLabels, Gauge>,
    pub free_bytes: Family<GpuLabels, Gauge>,
    pub largest_free_block_bytes: Family<GpuLabels, Gauge>,
    pub context_overhead_bytes: Family<GpuLabels, Gauge>,
    pub errors: ProbeErrors,
}

impl AgentMetrics {
    /// Register the families; `errors` is the prober's counter family.
    pub fn register(registry: &mut Registry, errors: ProbeErrors) -> AgentMetrics {
        let m = AgentMetrics {
            errors,
            ..AgentMetrics::default()
        };
        let agent = registry.sub_registry_with_prefix("agent");
        agent.register(
            "gpu_total_bytes",
            "Memory of the GPU, as NVML reports it",
            m.total_bytes.clone(),
        );
        agent.register(
            "gpu_free_bytes",
            "Free memory of the GPU at the last probe",
            m.free_bytes.clone(),
        );
        agent.register(
            "gpu_largest_free_block_bytes",
            "Largest block one allocation got at the last probe (absent when not measured)",
            m.largest_free_block_bytes.clone(),
        );
        agent.register(
            "gpu_context_overhead_bytes",
            "Memory one process's CUDA context takes on the GPU (absent when not measured)",
            m.context_overhead_bytes.clone(),
        );
        agent.register(
            "probe_errors",
            "Probe errors by what failed",
            m.errors.clone(),
        );
        m
    }

    /// The gauges after a probe: exactly the GPUs it saw, and only what it measured.
    pub fn observe(&self, status: &GpuNodeStatus) {
        for family in [
            &self.total_bytes,
            &self.free_bytes,
            &self.largest_free_block_bytes,
            &self.context_overhead_bytes,
        ] {
            family.clear();
        }
        for g in &status.gpus {
            let labels = GpuLabels {
                gpu: g.index.to_string(),
            };
            let set = |family: &Family<GpuLabels, Gauge>, bytes: Option<u64>| {
                if let Some(b) = bytes {
                    family.get_or_create(&labels).set(gauge_bytes(b));
                }
            };
            set(&self.total_bytes, Some(g.total_bytes));
            set(&self.free_bytes, Some(g.free_bytes));
            set(&self.largest_free_block_bytes, g.largest_free_block_bytes);
            set(&self.context_overhead_bytes, g.context_overhead_bytes);
        }
    }

    pub fn error(&self, kind: ProbeErrorKind) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::GpuStatus;

    fn text(registry: &Registry) -> String {
        crate::metrics::encode(registry).expect("the text encoding")
    }

    fn gpu(index: u32, free: u64, block: Option<u64>) -> GpuStatus {
        GpuStatus {
            index,
            total_bytes: 80,
            free_bytes: free,
            largest_free_block_bytes: block,
            context_overhead_bytes: Some(5),
            ..GpuStatus::default()
        }
    }

    #[test]
    fn gauges_follow_the_last_probe_and_leave_out_what_was_not_measured() {
        let mut registry = Registry::with_prefix("vramguard");
        let m = AgentMetrics::register(&mut registry, ProbeErrors::default());
        m.observe(&GpuNodeStatus {
            gpus: vec![gpu(0, 70, Some(60)), gpu(1, 10, None)],
            ..GpuNodeStatus::default()
        });
        let out = text(&registry);
        for line in [
            "vramguard_agent_gpu_free_bytes{gpu=\"0\"} 70",
            "vramguard_agent_gpu_free_bytes{gpu=\"1\"} 10",
            "vramguard_agent_gpu_total_bytes{gpu=\"1\"} 80",
            "vramguard_agent_gpu_largest_free_block_bytes{gpu=\"0\"} 60",
            "vramguard_agent_gpu_context_overhead_bytes{gpu=\"1\"} 5",
        ] {
            assert!(out.contains(line), "{line} missing from\n{out}");
        }
        assert!(
            !out.contains("largest_free_block_bytes{gpu=\"1\"}"),
            "{out}"
        );
        // GPU 1 is gone (a MIG reconfiguration, a fallen-off-the-bus GPU): so are its series.
        m.observe(&GpuNodeStatus {
            gpus: vec![gpu(0, 50, Some(40))],
            ..GpuNodeStatus::default()
        });
        let out = text(&registry);
        assert!(
            out.contains("vramguard_agent_gpu_free_bytes{gpu=\"0\"} 50"),
            "{out}"
        );
        assert!(!out.contains("gpu=\"1\""), "{out}");
    }

    #[test]
    fn errors_count_by_kind() {
        let mut registry = Registry::with_prefix("vramguard");
        let errors = ProbeErrors::default();
        let m = AgentMetrics::register(&mut registry, errors.clone());
        m.error(ProbeErrorKind::Publish);
        m.error(ProbeErrorKind::Publish);
        errors
            .get_or_create(&ErrorLabels {
                kind: ProbeErrorKind::LargestBlock,
            })
            .inc();
        let out = text(&registry);
        assert!(
            out.contains("vramguard_agent_probe_errors_total{kind=\"Publish\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("vramguard_agent_probe_errors_total{kind=\"LargestBlock\"} 1"),
            "{out}"
        );
    }
}
