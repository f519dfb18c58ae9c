//! The `MemoryProfile` custom resource: what real runs taught about the memory
//! of jobs of one shape. Cluster-scoped, named after a fingerprint of the
//! model's dimensions and the recipe; written by the operator after a GPU
//! out-of-memory death, read by the operator and the webhook for later
//! estimates of jobs with the same fingerprint.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Evidence about the memory of one job shape.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "vramguard.io",
    version = "v1alpha1",
    kind = "MemoryProfile",
    status = "MemoryProfileStatus",
    shortname = "mp",
    category = "vramguard",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model"),
    printcolumn(name = "Ratio", type_ = "number", json_path = ".status.ratio"),
    printcolumn(
        name = "Evidence",
        type_ = "integer",
        json_path = ".status.observationCount"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryProfileSpec {
    /// 16 hex digits over the model's dimensions and the recipe.
    pub fingerprint: String,
    /// Human name of the model.
    pub model: String,
    /// What the fingerprint covers, in words.
    pub recipe: String,
}

/// What was observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryProfileStatus {
    /// Observed / estimated per-GPU memory: later estimates of this shape are
    /// multiplied by it. The largest ratio any observation proved (an OOM
    /// proves a lower bound of what was needed).
    #[serde(default)]
    pub ratio: f64,
    #[serde(default)]
    pub observation_count: u64,
    /// The most recent observations (at most [`MAX_OBSERVATIONS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observations: Vec<Observation>,
}

/// Observations kept per profile; older ones are dropped (the ratio keeps
/// what they proved).
pub const MAX_OBSERVATIONS: usize = 16;

/// One run's evidence.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// `namespace/name` of the TrainingJob, and its attempt.
    pub job: String,
    pub attempt: u32,
    /// GPU product it ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Per-GPU estimate of the plan it ran with.
    pub estimated_bytes: u64,
    /// What the run proved it needed per GPU, at least.
    pub observed_bytes: u64,
    /// `GpuOutOfMemory`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}
