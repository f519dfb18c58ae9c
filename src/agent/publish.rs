//! Publishing: every interval, a fresh probe written to this node's `GpuNode`
//! (cluster-scoped, named after the node) with server-side apply under one
//! field manager, `vramguard-agent`, forced — so the agent owns exactly the
//! fields it writes and never clobbers another writer's. The spec (node name,
//! TTL, the node's taints) and the status subresource are applied separately:
//! the spec when it changed (or the object is gone), the status every round.
//!
//! A probe or write that fails is logged and retried at the next tick; nothing
//! is published meanwhile, so consumers see the object go stale after its TTL
//! and stop trusting it, which is the point of the TTL.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
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

/// Write `status` to the node's GpuNode (creating it if needed), applying
/// the spec too: a one-off publish. The loop keeps a [`Publisher`] instead.
pub async fn publish(
    client: &Client,
    config: &PublishConfig,
    status: &GpuNodeStatus,
) -> Result<GpuNode, PublishError> {
    Publisher::default().publish(client, config, status).await
}

/// Publishes one node's GpuNode round after round, remembering the spec it
/// last applied: the spec (node name, TTL, taints) changes rarely, so it is
/// applied only when it differs from the last one applied or the object is
/// gone (the status write then answers 404), not every round. Each round is
/// one write, not two, which halves what every agent costs the API server.
#[derive(Debug, Default)]
pub struct Publisher {
    applied: Option<GpuNodeSpec>,
}

impl Publisher {
    /// Write `status` (and the spec when it changed) to the node's GpuNode.
    pub async fn publish(
        &mut self,
        client: &Client,
        config: &PublishConfig,
        status: &GpuNodeStatus,
    ) -> Result<GpuNode, PublishError> {
        let name = config.node_name.as_str();
        let api: Api<GpuNode> = Api::all(client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let taints = if config.copy_taints {
            node_taints(client, name).await
        } else {
            Vec::new()
        };
        let spec = GpuNodeSpec {
            node_name: name.to_string(),
            ttl_seconds: config.ttl_seconds,
            taints,
        };
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

/// Probe and publish every `config.interval`, forever; failures are logged
/// and retried at the next tick.
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
            Ok(_) => tracing::debug!(
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
