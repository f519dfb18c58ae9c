//! Publishing: every interval a fresh probe, written to this node's `GpuNode`
//! (cluster-scoped, named after the node) when it differs from what was last
//! written, with server-side apply under one field manager, `vramguard-agent`,
//! forced — so the agent owns exactly the fields it writes and never clobbers
//! another writer's. The spec (node name, TTL, the node's taints) and the
//! status subresource are applied separately: the spec when it changed (or
//! the object is gone), the status when a measurement changed or, unchanged,
//! once its `probeTime` is a heartbeat old ([`PublishConfig::heartbeat`],
//! half the TTL by default). `probeTime` is when the published figures were
//! last confirmed by a probe, so a consumer judging staleness by it (older
//! than `spec.ttlSeconds`: distrusted) sees a live agent's node as at most a
//! heartbeat plus an interval old, and a dead agent's go stale after its TTL.
//!
//! A probe or write that fails is logged and retried at the next tick; nothing
//! is published meanwhile, so consumers see the object go stale after its TTL
//! and stop trusting it, which is the point of the TTL.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;

use super::Agent;
use super::metrics::ProbeErrorKind;
use crate::api::{GpuNode, GpuNodeSpec, GpuNodeStatus, NodeTaint};

/// The one field manager the agent writes with.
pub const FIELD_MANAGER: &str = "vramguard-agent";

/// Where and how often to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishConfig {
    /// The Kubernetes node (and GpuNode) name.
    pub node_name: String,
    pub interval: Duration,
    /// Published as `spec.ttlSeconds`: consumers distrust the data after this.
    pub ttl_seconds: u64,
    /// Copy the Node's taints into the GpuNode (needs `get` on nodes).
    pub copy_taints: bool,
    /// An unchanged probe is written again (refreshing `probeTime`) once the
    /// last one written is this old; zero: every interval.
    pub heartbeat: Duration,
}

/// The heartbeat when none is given: half the TTL, so an agent whose probes
/// never change still refreshes its `probeTime` well before consumers would
/// call the node stale (at most a heartbeat plus an interval old).
pub fn default_heartbeat(ttl_seconds: u64) -> Duration {
    Duration::from_secs(ttl_seconds) / 2
}

/// Whether two probes measured the same: every field but `probeTime`.
pub fn same_measurement(a: &GpuNodeStatus, b: &GpuNodeStatus) -> bool {
    // Destructured so a new status field cannot be forgotten here.
    let GpuNodeStatus {
        gpus,
        gpu_count,
        product,
        probe_time: _,
        agent_version,
        driver_version,
        cuda_version,
    } = a;
    *gpus == b.gpus
        && *gpu_count == b.gpu_count
        && *product == b.product
        && *agent_version == b.agent_version
        && *driver_version == b.driver_version
        && *cuda_version == b.cuda_version
}

/// Why one publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("applying GpuNode {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("applying the status of GpuNode {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The Node's taints, or none (logged) when the Node cannot be read.
async fn node_taints(client: &Client, node: &str) -> Vec<NodeTaint> {
    match Api::<Node>::all(client.clone()).get_opt(node).await {
        Ok(Some(n)) => n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| NodeTaint {
                key: t.key,
                value: t.value,
                effect: t.effect,
            })
            .collect(),
        Ok(None) => {
            tracing::warn!(node, "Node not found: publishing without taints");
            Vec::new()
        }
        Err(error) => {
            tracing::warn!(node, %error, "Node unreadable: publishing without taints");
            Vec::new()
        }
    }
}

/// The spec to apply: the node's name, the TTL and (when copied) its taints.
async fn spec_of(client: &Client, config: &PublishConfig) -> GpuNodeSpec {
    let name = config.node_name.as_str();
    let taints = if config.copy_taints {
        node_taints(client, name).await
    } else {
        Vec::new()
    };
    GpuNodeSpec {
        node_name: name.to_string(),
        ttl_seconds: config.ttl_seconds,
        taints,
    }
}

/// Write `status` to the node's GpuNode (creating it if needed), applying
/// the spec too: a one-off publish. The loop keeps a [`Publisher`] instead.
pub async fn publish(
    client: &Client,
    config: &PublishConfig,
    status: &GpuNodeStatus,
) -> Result<GpuNode, PublishError> {
    Publisher::default().write(client, config, status).await
}

/// Publishes one node's GpuNode round after round, remembering the spec it
/// last applied and the status it last wrote. The spec (node name, TTL,
/// taints) changes rarely, so it is applied only when it differs from the
/// last one applied or the object is gone (the status write then answers
/// 404). The status is written when a measurement differs from the last one
/// written, or when that one's `probeTime` is a heartbeat old: an idle node
/// costs the API server (and every watcher) one write per heartbeat, not one
/// per interval.
#[derive(Debug, Default)]
pub struct Publisher {
    applied: Option<GpuNodeSpec>,
    written: Option<GpuNodeStatus>,
}

impl Publisher {
    /// Whether `status` is to be written: a measurement changed since the
    /// last write, or the heartbeat is due (or nothing was written yet).
    pub fn due(&self, config: &PublishConfig, status: &GpuNodeStatus) -> bool {
        let Some(last) = &self.written else {
            return true;
        };
        let (Some(then), Some(now)) = (&last.probe_time, &status.probe_time) else {
            return true;
        };
        let age = now.0.duration_since(then.0);
        let heartbeat = SignedDuration::try_from(config.heartbeat).unwrap_or(SignedDuration::MAX);
        age >= heartbeat || !same_measurement(last, status)
    }

    /// Write `status` to the node's GpuNode when it is [due](Self::due), and
    /// the spec when it changed (the Node's taints are read every round, so
    /// a taint change is written at once); `None`: nothing needed writing.
    pub async fn publish(
        &mut self,
        client: &Client,
        config: &PublishConfig,
        status: &GpuNodeStatus,
    ) -> Result<Option<GpuNode>, PublishError> {
        let spec = spec_of(client, config).await;
        if self.applied.as_ref() == Some(&spec) && !self.due(config, status) {
            return Ok(None);
        }
        self.write_with(client, spec, status).await.map(Some)
    }

    /// Write `status` (and the spec when it changed) to the node's GpuNode.
    pub async fn write(
        &mut self,
        client: &Client,
        config: &PublishConfig,
        status: &GpuNodeStatus,
    ) -> Result<GpuNode, PublishError> {
        let spec = spec_of(client, config).await;
        self.write_with(client, spec, status).await
    }

    async fn write_with(
        &mut self,
        client: &Client,
        spec: GpuNodeSpec,
        status: &GpuNodeStatus,
    ) -> Result<GpuNode, PublishError> {
        self.written = None;
        let written = self.write_status(client, spec, status).await?;
        self.written = Some(status.clone());
        Ok(written)
    }

    async fn write_status(
        &mut self,
        client: &Client,
        spec: GpuNodeSpec,
        status: &GpuNodeStatus,
    ) -> Result<GpuNode, PublishError> {
        let name = spec.node_name.as_str();
        let api: Api<GpuNode> = Api::all(client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let status_patch = json!({
            "apiVersion": GpuNode::api_version(&()),
            "kind": GpuNode::kind(&()),
            "metadata": { "name": name },
            "status": status,
        });
        let mut spec_fresh = false;
        if self.applied.as_ref() != Some(&spec) {
            self.apply_spec(&api, &params, &spec).await?;
            spec_fresh = true;
        }
        match api
            .patch_status(name, &params, &Patch::Apply(&status_patch))
            .await
        {
            Ok(g) => Ok(g),
            // Deleted since the spec was applied: create it again.
            Err(kube::Error::Api(e)) if e.code == 404 && !spec_fresh => {
                self.applied = None;
                self.apply_spec(&api, &params, &spec).await?;
                api.patch_status(name, &params, &Patch::Apply(&status_patch))
                    .await
                    .map_err(|source| PublishError::Status {
                        name: name.to_string(),
                        source,
                    })
            }
            Err(source) => Err(PublishError::Status {
                name: name.to_string(),
                source,
            }),
        }
    }

    async fn apply_spec(
        &mut self,
        api: &Api<GpuNode>,
        params: &PatchParams,
        spec: &GpuNodeSpec,
    ) -> Result<(), PublishError> {
        let name = spec.node_name.as_str();
        let object = GpuNode::new(name, spec.clone());
        self.applied = None;
        api.patch(name, params, &Patch::Apply(&object))
            .await
            .map_err(|source| PublishError::Apply {
                name: name.to_string(),
                source,
            })?;
        self.applied = Some(spec.clone());
        Ok(())
    }
}

/// Probe every `config.interval` and publish what changed (and a heartbeat),
/// forever; failures are logged and retried at the next tick.
pub async fn run(agent: &Agent, client: Client, config: PublishConfig) {
    let mut tick = tokio::time::interval(config.interval.max(Duration::from_millis(10)));
    let mut publisher = Publisher::default();
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let status = match agent.probe().await {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(%error, "probe failed; nothing published this round");
                continue;
            }
        };
        match publisher.publish(&client, &config, &status).await {
            Ok(None) => tracing::trace!(node = %config.node_name, "unchanged; not published"),
            Ok(Some(_)) => tracing::debug!(
                node = %config.node_name,
                gpus = status.gpu_count,
                "GpuNode published"
            ),
            Err(error) => {
                agent.metrics().error(ProbeErrorKind::Publish);
                tracing::warn!(%error, "publishing failed; retrying next round")
            }
        }
    }
}
