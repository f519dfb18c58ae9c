//! The `GpuNode` custom resource: what a node agent measured on each GPU of
//! one node. Written by the agent, read by the webhook, the operator and
//! `vramguard estimate --cluster`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One Kubernetes node's GPUs as the agent last saw them.
// Several printer columns repeat `type_`, which clippy reads as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "vramguard.io",
    version = "v1alpha1",
    kind = "GpuNode",
    status = "GpuNodeStatus",
    shortname = "gn",
    category = "vramguard",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".status.gpuCount"),
    printcolumn(name = "Product", type_ = "string", json_path = ".status.product"),
    printcolumn(name = "Probed", type_ = "date", json_path = ".status.probeTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuNodeSpec {
    /// The Kubernetes node these GPUs belong to.
    pub node_name: String,
    /// Seconds after `probeTime` at which the data is stale.
    #[serde(default = "default_ttl_seconds")]
    pub ttl_seconds: u64,
    /// Taints of the node, copied so placement can honour them offline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<NodeTaint>,
}

fn default_ttl_seconds() -> u64 {
    120
}

/// A node taint (key, value, effect), as on the Node object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeTaint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// The per-GPU view of one probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    #[serde(default)]
    pub gpus: Vec<GpuStatus>,
    #[serde(default)]
    pub gpu_count: u32,
    /// Product of the node's GPUs (the first one's when mixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
}

/// One GPU (or MIG device) as probed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuStatus {
    pub index: u32,
    #[serde(default)]
    pub uuid: String,
    /// Product name as NVML reports it.
    pub product: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    pub total_bytes: u64,
    pub free_bytes: u64,
    #[serde(default)]
    pub used_bytes: u64,
    /// Driver-reserved memory (NVML v2 memory info).
    #[serde(default)]
    pub reserved_bytes: u64,
    /// Largest block a job could allocate now, from a real allocation probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_block_bytes: Option<u64>,
    /// Measured CUDA context overhead of one process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_overhead_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
    #[serde(default = "healthy")]
    pub healthy: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_message: Option<String>,
    /// Pod the kubelet assigned this GPU to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_pod: Option<String>,
}

fn healthy() -> bool {
    true
}

/// A MIG slice of a GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    pub index: u32,
    #[serde(default)]
    pub uuid: String,
    /// Profile, e.g. `1g.10gb`.
    pub profile: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// A compute process holding GPU memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    pub pid: u32,
    pub used_bytes: u64,
}
