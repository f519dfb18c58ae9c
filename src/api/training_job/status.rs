//! `TrainingJob.status`: what vramguard decided and observed (the estimate, the plan,
//! the placement, OOMs and what they taught).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

/// What vramguard decided and observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Human name of the model, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Per-GPU estimate in GiB, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<EstimateStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    #[serde(default)]
    pub oom_retries: u32,
    /// The batch/v1 Job running the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Why the job waits, failed or was rejected, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last out-of-memory death, with the numbers its message gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_oom: Option<OomRecord>,
    /// What earlier attempts taught about this job's real memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<Learned>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One condition per type (a list-map keyed by `type`, so server-side apply merges them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One out-of-memory death as recorded in status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OomRecord {
    /// `GpuOutOfMemory` or `HostOutOfMemory`.
    pub kind: String,
    /// Attempt (0-based) that died.
    pub attempt: u32,
    /// Pod and container that reported it.
    pub pod: String,
    pub container: String,
    /// PyTorch, TensorFlow, JAX, NCCL, cuBLAS, cuDNN or CUDA (GPU OOMs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tried_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// What the attempt's plan was estimated to need per GPU.
    #[serde(default)]
    pub estimated_bytes: u64,
    /// What the message proves the attempt needed per GPU, at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_bytes: Option<u64>,
    pub message: String,
}

/// Corrections learnt from earlier attempts of this job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Learned {
    /// Estimates of this job are multiplied by this (≥ 1).
    pub scale: f64,
    /// The next attempt runs PyTorch with `expandable_segments:True`.
    #[serde(default)]
    pub expandable_segments: bool,
    /// The MemoryProfile that holds the evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Pending | Admitted | Running | Succeeded | Failed | Rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    Pending,
    Admitted,
    Running,
    Succeeded,
    Failed,
    Rejected,
}

/// Per-rank memory estimate (`status.estimate`, and `estimate` in `-o json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EstimateStatus {
    /// Tensors live at the peak: `torch.cuda.max_memory_allocated()`.
    pub peak_allocated_bytes: u64,
    /// Plus caching-allocator rounding and fragmentation: `max_memory_reserved()`.
    pub peak_reserved_bytes: u64,
    /// Plus CUDA context, library workspaces, NCCL buffers: what nvidia-smi shows.
    pub per_gpu_bytes: u64,
    pub breakdown: Breakdown,
    /// Largest single allocation: must fit in the largest free block.
    pub largest_tensor_bytes: u64,
    /// Step phase at which the peak is reached.
    pub peak_phase: String,
    /// GPU product the estimate was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The upper end over the behaviours the spec leaves open (the trainer
    /// stack and what it decides): fit, shrinking and placement use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<EstimateBounds>,
    /// The low end: every mechanism the estimator cannot pin at its low
    /// value, under the least costly behaviour the spec leaves open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<EstimateBounds>,
    /// How far each mechanism's low and high ends alone move `perGpuBytes`
    /// from the point, widest first (`stackBehaviour`: the trainer stacks
    /// the spec leaves open).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread: Vec<RangeSpread>,
}

impl EstimateStatus {
    /// Per-GPU bytes a fit must find room for: the upper end when there is one.
    pub fn fit_per_gpu_bytes(&self) -> u64 {
        self.upper.as_ref().map_or(self.per_gpu_bytes, |u| {
            u.per_gpu_bytes.max(self.per_gpu_bytes)
        })
    }

    /// Reserved bytes an allocator limit must allow: the upper end when there is one.
    pub fn fit_reserved_bytes(&self) -> u64 {
        self.upper.as_ref().map_or(self.peak_reserved_bytes, |u| {
            u.peak_reserved_bytes.max(self.peak_reserved_bytes)
        })
    }
}

/// One mechanism's share of the estimate's range.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RangeSpread {
    /// cudaContext, ncclBuffers, allocatorFragmentation, cudnnWorkspace,
    /// logitsCopies, backwardTemporaries, quantizedInput, unmodelledSaved,
    /// pagedResidency or stackBehaviour.
    pub mechanism: String,
    /// Per-GPU bytes below the point at the mechanism's low end.
    pub below_bytes: u64,
    /// Per-GPU bytes above the point at the mechanism's high end.
    pub above_bytes: u64,
}

/// The three totals of an estimate, for either end of its interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EstimateBounds {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub per_gpu_bytes: u64,
}

/// Bytes per component at the peak phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer_states: u64,
    pub activations: u64,
    pub logits: u64,
    pub inputs: u64,
    pub temporaries: u64,
    pub allocator_overhead: u64,
    pub cuda_context: u64,
    pub workspaces: u64,
    pub communication: u64,
}

/// The plan applied to the job (never written into the spec).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    pub micro_batch_size: u64,
    pub gradient_accumulation_steps: u64,
    pub precision: Precision,
    pub gradient_checkpointing: Checkpointing,
    pub optimizer: Optimizer,
    pub zero_stage: u8,
    #[serde(default)]
    pub loss: Loss,
    /// PyTorch's allocator runs with `expandable_segments:True`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expandable_segments: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

/// Where the job runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    pub node: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    pub gpus: Vec<u32>,
    /// Every node's GPUs (and MIG slices), as reserved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<PlacedNode>,
    /// Memory held for the job on each of those GPUs until it ends.
    #[serde(default)]
    pub reserved_bytes_per_gpu: u64,
}

/// The GPUs of one node a job was placed on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacedNode {
    pub node: String,
    pub gpus: Vec<PlacedGpu>,
}

/// One GPU, or one MIG slice of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacedGpu {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_index: Option<u32>,
    /// MIG profile (`1g.10gb`): the pod asks for `nvidia.com/mig-<profile>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    pub product: String,
}
