//! `spec.parallelism`: how a job is split over GPUs (data, tensor, pipeline, context
//! parallelism, the sharding strategy and what is offloaded).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

/// How the job is split over GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.gpus % (self.tensorParallel * self.pipelineParallel * self.contextParallel) == 0", "message": "gpus must be a multiple of tensorParallel × pipelineParallel × contextParallel"},
        {"rule": "!self.sequenceParallel || self.tensorParallel >= 2", "message": "sequenceParallel needs tensorParallel >= 2"},
        {"rule": "self.virtualStages == 1 || self.pipelineSchedule in ['interleaved-1f1b', 'looped-bfs', 'interleaved-zero-bubble', 'zbv-zero-bubble', 'dualpipev']", "message": "virtualStages > 1 needs a multi-stage pipelineSchedule: interleaved-1f1b, looped-bfs, interleaved-zero-bubble, zbv-zero-bubble or dualpipev"},
        {"rule": "!(self.pipelineSchedule in ['zbv-zero-bubble', 'dualpipev']) || self.pipelineParallel == 1 || self.virtualStages == 2", "message": "pipelineSchedule zbv-zero-bubble and dualpipev place exactly 2 virtual stages per rank: virtualStages must be 2"},
        {"rule": "self.offload != 'optimizer' || self.strategy == 'ddp' || (has(self.zeroStage) ? self.zeroStage >= 1 : (self.strategy == 'fsdp' && (!has(self.sharding) || self.sharding != 'no-shard')))", "message": "optimizer offload needs zeroStage >= 1, or strategy ddp (torchao's CPUOffloadOptimizer)"},
        {"rule": "!self.offloadGradients || (self.offload == 'optimizer' && self.strategy == 'ddp')", "message": "offloadGradients is torchao's CPUOffloadOptimizer option; it needs offload optimizer and strategy ddp"},
        {"rule": "self.offload != 'optimizer-and-parameters' || (has(self.zeroStage) ? self.zeroStage == 3 : (self.strategy == 'fsdp' && (!has(self.sharding) || self.sharding == 'full-shard')))", "message": "parameter offload needs zeroStage 3"},
        {"rule": "!has(self.sharding) || self.strategy == 'fsdp'", "message": "sharding is FSDP's sharding strategy; it needs strategy fsdp"},
        {"rule": "!has(self.sharding) || !has(self.zeroStage) || (self.sharding == 'full-shard' && self.zeroStage == 3) || (self.sharding == 'shard-grad-op' && self.zeroStage == 2) || (self.sharding == 'no-shard' && self.zeroStage == 0)", "message": "sharding and zeroStage disagree: full-shard is zeroStage 3, shard-grad-op 2, no-shard 0"}
]))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParallelismSpec {
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub gpus: u64,
    /// GPUs per node; default: min(gpus, 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u64>,
    /// 0 DDP | 1 optimizer | 2 +gradients | 3 +parameters. Default: 3 with
    /// `strategy: fsdp` (FSDP's default, full sharding, or what `sharding` says), else 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 3))]
    pub zero_stage: Option<u8>,
    #[serde(default)]
    pub strategy: Strategy,
    /// FSDP's sharding strategy (`strategy: fsdp` only): full-shard (ZeRO 3, the
    /// default) | shard-grad-op (ZeRO 2) | no-shard (ZeRO 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding: Option<Sharding>,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub tensor_parallel: u64,
    #[serde(default)]
    pub sequence_parallel: bool,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub pipeline_parallel: u64,
    #[serde(default)]
    pub pipeline_schedule: PipelineSchedule,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub virtual_stages: u64,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub context_parallel: u64,
    /// none | optimizer | optimizer-and-parameters. Under ZeRO (DeepSpeed, or
    /// FSDP's `CPUOffload` / `CPUOffloadPolicy` with parameters) the host holds
    /// the offloaded shards and gradients leave the GPU as they are reduced;
    /// `optimizer` with strategy ddp is torchao's `CPUOffloadOptimizer`.
    #[serde(default)]
    pub offload: Offload,
    /// torchao `CPUOffloadOptimizer(offload_gradients=True)`: each gradient is
    /// freed on the GPU once copied to the host (needs offload optimizer,
    /// strategy ddp and no gradient accumulation).
    #[serde(default)]
    pub offload_gradients: bool,
    /// FSDP1 or FSDP2, when the job says (overrides the stack's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp_version: Option<FsdpVersion>,
}

impl Default for ParallelismSpec {
    fn default() -> Self {
        ParallelismSpec {
            gpus: 1,
            gpus_per_node: None,
            zero_stage: None,
            strategy: Strategy::default(),
            sharding: None,
            tensor_parallel: 1,
            sequence_parallel: false,
            pipeline_parallel: 1,
            pipeline_schedule: PipelineSchedule::default(),
            virtual_stages: 1,
            context_parallel: 1,
            offload: Offload::default(),
            offload_gradients: false,
            fsdp_version: None,
        }
    }
}

/// ddp | fsdp | deepspeed | megatron.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    #[default]
    Ddp,
    Fsdp,
    Deepspeed,
    Megatron,
}

impl ParallelismSpec {
    /// The ZeRO stage the job runs at: `zeroStage` as written, else what FSDP's
    /// sharding strategy means (full sharding by default), else 0.
    pub fn zero(&self) -> u8 {
        self.zero_stage
            .unwrap_or(match (self.strategy, self.sharding) {
                (Strategy::Fsdp, Some(s)) => s.zero_stage(),
                (Strategy::Fsdp, None) => 3,
                _ => 0,
            })
    }
}

/// FSDP's sharding strategy: full-shard | shard-grad-op | no-shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Sharding {
    /// `FULL_SHARD` (FSDP1) / `reshard_after_forward=True` (FSDP2): parameters,
    /// gradients and optimizer states sharded, ZeRO 3.
    FullShard,
    /// `SHARD_GRAD_OP` / `reshard_after_forward=False`: gradients and optimizer
    /// states sharded, parameters kept whole between forward and backward, ZeRO 2.
    ShardGradOp,
    /// `NO_SHARD`: every rank holds everything, as DDP, ZeRO 0.
    NoShard,
}

impl Sharding {
    pub fn zero_stage(self) -> u8 {
        match self {
            Sharding::FullShard => 3,
            Sharding::ShardGradOp => 2,
            Sharding::NoShard => 0,
        }
    }
}

/// gpipe | 1f1b | interleaved-1f1b | looped-bfs | interleaved-zero-bubble |
/// zbv-zero-bubble | dualpipev: the schedules of `torch.distributed.pipelining`
/// (torchtitan's `pipeline_parallel_schedule`: GPipe, 1F1B, Interleaved1F1B,
/// LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PipelineSchedule {
    #[serde(rename = "gpipe")]
    Gpipe,
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    #[serde(rename = "interleaved-1f1b")]
    Interleaved1f1b,
    /// Every micro-batch's forward through each local stage before any backward.
    #[serde(rename = "looped-bfs")]
    LoopedBfs,
    /// ZB-H1: interleaved 1F1B with backward split into input (I) and weight (W) passes.
    #[serde(rename = "interleaved-zero-bubble")]
    InterleavedZeroBubble,
    /// ZB-V: two virtual stages per rank in a V (rank 0 holds the first and the last).
    #[serde(rename = "zbv-zero-bubble")]
    ZbvZeroBubble,
    /// DeepSeek's DualPipeV: two virtual stages per rank in a V, forward and backward overlapped.
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

impl PipelineSchedule {
    /// The value as the spec spells it.
    pub fn name(self) -> &'static str {
        match self {
            PipelineSchedule::Gpipe => "gpipe",
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::Interleaved1f1b => "interleaved-1f1b",
            PipelineSchedule::LoopedBfs => "looped-bfs",
            PipelineSchedule::InterleavedZeroBubble => "interleaved-zero-bubble",
            PipelineSchedule::ZbvZeroBubble => "zbv-zero-bubble",
            PipelineSchedule::DualPipeV => "dualpipev",
        }
    }

    /// The schedules that place several virtual stages on a rank.
    pub fn multi_stage(self) -> bool {
        !matches!(self, PipelineSchedule::Gpipe | PipelineSchedule::OneFOneB)
    }

    /// The V schedules: exactly two virtual stages per rank, the first and
    /// the last on rank 0 (`generate_stage_to_rank_mapping(style="v")`).
    pub fn v_shape(self) -> bool {
        matches!(
            self,
            PipelineSchedule::ZbvZeroBubble | PipelineSchedule::DualPipeV
        )
    }
}

/// none | optimizer | optimizer-and-parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Offload {
    #[default]
    None,
    Optimizer,
    OptimizerAndParameters,
}
