//! The node agent: what each GPU of this node really has free — the CUDA
//! context's share, other processes, MIG slices and fragmentation included —
//! published as a `GpuNode` for the webhook and operator, and served on demand.
//!
//! `gpu` is the trait the backends implement (`nvidia` = `nvml` + `cuda` on a
//! real node, `simulated` from a YAML file, with the `allocator` model); `probe` turns one pass over the
//! GPUs into a `GpuNodeStatus`; `publish` writes it with server-side apply;
//! `server` answers "can this node give K GPUs N bytes each, now?"; and
//! `pod_resources` asks the kubelet which GPUs pods hold. The judgement of a
//! check comes from `plan::fit`.

pub mod allocator;
pub mod bytes;
pub mod check;
pub mod cuda;
pub mod gpu;
pub mod metrics;
pub mod nvidia;
pub mod nvml;
pub mod pod_resources;
pub mod probe;
pub mod publish;
pub mod server;
pub mod simulated;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus_client::registry::Registry;

use crate::api::GpuNodeStatus;
pub use gpu::{Gpu, GpuError};
use metrics::{AgentMetrics, ProbeErrorKind};
pub use probe::{Assignments, ProbeError, ProbeOptions, Prober};

/// How long the kubelet gets to list pod resources.
pub const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the agent could not probe.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("the probe thread failed: {0}")]
    Join(String),
}

/// A prober plus where to learn pod assignments; probes one at a time, since
/// two concurrent largest-block searches would each see the other's blocks.
/// Each probe's figures go to its metrics, served at `/metrics`.
pub struct Agent {
    prober: Arc<Prober>,
    pod_resources_socket: Option<PathBuf>,
    lock: tokio::sync::Mutex<()>,
    metrics: AgentMetrics,
    registry: Registry,
}

impl Agent {
    pub fn new(
        gpu: Arc<dyn Gpu>,
        options: ProbeOptions,
        pod_resources_socket: Option<PathBuf>,
    ) -> Agent {
        let prober = Prober::new(gpu, options);
        let mut registry = crate::metrics::registry();
        let metrics = AgentMetrics::register(&mut registry, prober.errors().clone());
        Agent {
            prober: Arc::new(prober),
            pod_resources_socket,
            lock: tokio::sync::Mutex::new(()),
            metrics,
            registry,
        }
    }

    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// The registry `/metrics` encodes.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Which GPUs pods hold, where the kubelet's socket is mounted; none otherwise.
    pub async fn assignments(&self) -> Assignments {
        let Some(socket) = &self.pod_resources_socket else {
            return Assignments::default();
        };
        if !socket.exists() {
            tracing::debug!(socket = %socket.display(), "no pod-resources socket: GPU assignments unknown");
            return Assignments::default();
        }
        match pod_resources::list(socket, POD_RESOURCES_TIMEOUT).await {
            Ok(pods) => pod_resources::assignments(&pods),
            Err(error) => {
                tracing::warn!(%error, "GPU assignments unknown");
                Assignments::default()
            }
        }
    }

    /// A fresh probe, on a blocking thread.
    pub async fn probe(&self) -> Result<GpuNodeStatus, AgentError> {
        let _one_at_a_time = self.lock.lock().await;
        let assignments = self.assignments().await;
        let prober = Arc::clone(&self.prober);
        let probed =
            tokio::task::spawn_blocking(move || prober.probe(&assignments, Timestamp::now()))
                .await
                .map_err(|e| AgentError::Join(e.to_string()))
                .and_then(|r| r.map_err(AgentError::Probe));
        match &probed {
            Ok(status) => self.metrics.observe(status),
            Err(_) => self.metrics.error(ProbeErrorKind::Probe),
        }
        probed
    }
}
