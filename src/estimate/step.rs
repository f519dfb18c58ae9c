//! The training step, phase by phase, for one rank of the most loaded
//! pipeline stage. Every number is bytes as f64 (exact below 2^53).

use super::activations::{self, ActContext};
use super::arch::{Arch, Kind};
use super::bounds::{self, Ends, Facts};
use super::caching::Churn;
use super::gpus::{self, GpuProduct};
use super::layers::LayerStack;
use super::params::{self, Counts};
use super::peft::Peft;
use super::stacks::{LossChunking, Profile, QuantLibrary};
use super::{GIB, PhaseBytes};
use crate::api::{
    Attention, Checkpointing, Loss, Offload, Optimizer, OptimizerImplementation, PipelineSchedule,
    Precision, Quantization, ResolvedModel, Strategy, TrainingMode, ValidatedJob,
};

mod quant;

use quant::quantized_bytes;

const MIB: f64 = 1024.0 * 1024.0;

/// Components of one phase. `PagedOptimizerStates` and nothing else live
/// outside the caching allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Weights,
    Gradients,
    OptimizerStates,
    /// bitsandbytes paged optimizers keep their states in CUDA managed memory:
    /// on the device while resident, but invisible to `max_memory_allocated`.
    PagedOptimizerStates,
    Activations,
    Logits,
    Inputs,
    Temporaries,
    /// cuBLAS workspace (allocated through the caching allocator).
    Workspaces,
    /// DDP gradient buckets, ZeRO/FSDP reduce-scatter and gather buffers.
    CommBuffers,
}

impl Component {
    pub const COUNT: usize = 10;
    pub const ALL: [Component; Component::COUNT] = [
        Component::Weights,
        Component::Gradients,
        Component::OptimizerStates,
        Component::PagedOptimizerStates,
        Component::Activations,
        Component::Logits,
        Component::Inputs,
        Component::Temporaries,
        Component::Workspaces,
        Component::CommBuffers,
    ];

    /// Counted by `torch.cuda.memory_allocated`.
    pub fn is_allocated(self) -> bool {
        self != Component::PagedOptimizerStates
    }

    pub fn name(self) -> &'static str {
        match self {
            Component::Weights => "weights",
            Component::Gradients => "gradients",
            Component::OptimizerStates => "optimizerStates",
            Component::PagedOptimizerStates => "pagedOptimizerStates",
            Component::Activations => "activations",
            Component::Logits => "logits",
            Component::Inputs => "inputs",
            Component::Temporaries => "temporaries",
            Component::Workspaces => "workspaces",
            Component::CommBuffers => "communication",
        }
    }
}

/// Phases of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPhase {
    /// End of forward: all activations and the loss's logits are live.
    ForwardEnd,
    /// Start of backward: activations, the loss's saved tensors and its gradients.
    BackwardStart,
    /// Backward through the last block: the loss's tensors are freed, the
    /// logits the caller holds remain; that block's gradients (and, when
    /// checkpointed, its recomputed activations) are live.
    BackwardLastBlock,
    /// End of backward: every gradient, one block's activations.
    BackwardEnd,
    /// Optimizer step: gradients, states and the optimizer's temporaries.
    OptimizerStep,
    /// Inference forward (prefill with the KV cache).
    InferenceForward,
    /// The last generated token: the KV cache at its full length.
    InferenceDecode,
}

impl StepPhase {
    pub fn name(self) -> &'static str {
        match self {
            StepPhase::ForwardEnd => "forward",
            StepPhase::BackwardStart => "backward (start)",
            StepPhase::BackwardLastBlock => "backward (last block)",
            StepPhase::BackwardEnd => "backward (end)",
            StepPhase::OptimizerStep => "optimizer step",
            StepPhase::InferenceForward => "inference forward",
            StepPhase::InferenceDecode => "inference decode",
        }
    }
}

/// Overheads outside the caching allocator.
pub struct Fixed {
    pub context: f64,
    pub nccl: f64,
}

/// DeepSpeed's default `reduce_bucket_size` / `allgather_bucket_size` (5e8 elements).
const DEEPSPEED_BUCKET_ELEMENTS: f64 = 5e8;
/// Average rounding loss per large tensor: blocks above 10 MiB come from
/// their own cudaMalloc rounded up to 2 MiB (CUDACachingAllocator).
const ROUNDING_PER_TENSOR: f64 = 1.0 * MIB;
/// Tokens per loss chunk of `b` samples of `s` tokens under `chunking`.
fn loss_chunk_tokens(chunking: LossChunking, s: f64) -> f64 {
    match chunking {
        LossChunking::Tokens(n) => f64::from(n).min(s),
        LossChunking::Count(k) => (s / f64::from(k.max(1))).ceil(),
    }
}

/// An adapter with this many times the prefix's parameters trains more than
/// the prefix: the only other parameters an adapter trains are norm weights
/// and per-linear scales and biases (LLaMA-Adapter v2), whose gradients need
/// the normalised inputs and the linear outputs.
const ADAPTER_V2_RATIO: f64 = 1.5;

use super::peft::llama_adapter_block_parameters as prefix_adapter_block_parameters;

fn prefix_adapter_parameters(a: &Arch) -> f64 {
    a.layers as f64 * prefix_adapter_block_parameters(a)
}

/// Blocks a prefix adapter keeps activations for. It adapts the top blocks
/// only (LitGPT starts at block 2); below the first trainable tensor autograd
/// records nothing, so those blocks keep nothing for backward. The count
/// follows from the trainable parameters the spec gives.
fn prefix_adapted_blocks(a: &Arch, trainable: Option<f64>) -> f64 {
    let layers = a.layers as f64;
    match trainable {
        Some(n) => (n / prefix_adapter_block_parameters(a).max(1.0))
            .round()
            .clamp(1.0, layers),
        None => layers,
    }
}

/// One rank of one pipeline stage.
#[derive(Clone, Debug, Default)]
pub(super) struct Stage {
    weights: f64,
    weight_transient: f64,
    /// The part of `weight_transient` that is autocast's 16-bit weight casts.
    casts: f64,
    /// Gathered weights that stay unsharded through backward.
    frozen_unsharded: f64,
    /// They are all unsharded from backward's start (else only at its end).
    frozen_from_start: bool,
    grads: f64,
    grads_live_in_backward: f64,
    optimizer: f64,
    optimizer_paged: f64,
    optimizer_temp: f64,
    activations: f64,
    layer_activations: f64,
    logits_forward: f64,
    logits_backward: f64,
    /// Logits the training loop still holds once the loss's backward is done.
    logits_kept: f64,
    /// Temporaries while the loss and head run backward.
    temp_head: f64,
    inputs: f64,
    /// The batch's own tensors inside `inputs` (token ids and labels,
    /// images), which the loop may drop before the optimizer step.
    batch: f64,
    temp_forward: f64,
    temp_backward: f64,
    comm: f64,
    kv_cache: f64,
    /// Generation: the KV cache at its full length, and what the last
    /// token's step holds besides (its logits, the cache's growth copy).
    kv_decode: f64,
    decode_logits: f64,
    decode_temp: f64,
    large_tensors: f64,
    largest_tensor: f64,
    /// What the step allocates and frees, for the caching allocator's replay.
    pub(super) churn: Churn,
}

pub struct StepModel {
    pub(super) stage: Stage,
    ends: Ends,
    facts: Facts,
    inference: bool,
    workspaces: f64,
    fixed: Fixed,
    /// Gradients of earlier micro-batches are live through forward.
    accumulating: bool,
}

fn precision_bytes(p: Precision) -> (f64, bool) {
    match p {
        Precision::Fp32 | Precision::Tf32 => (4.0, false),
        Precision::Fp16Mixed | Precision::Bf16Mixed => (2.0, true),
        Precision::Fp16 | Precision::Bf16 => (2.0, false),
    }
}

impl StepModel {
    /// One model per pipeline stage worth checking (the first and the last
    /// when there are several; they hold the embedding and the head).
    pub fn candidates(
        job: &ValidatedJob,
        gpu: &'static GpuProduct,
        profile: &Profile,
        ends: &Ends,
    ) -> Vec<StepModel> {
        let pp = job.spec().parallelism.pipeline_parallel.max(1);
        match &job.model {
            ResolvedModel::Transformer(arch) if pp > 1 => vec![
                StepModel::with_stage(
                    job,
                    gpu,
                    profile,
                    ends,
                    transformer_stage(job, gpu, arch, true, false, profile, ends),
                ),
                StepModel::with_stage(
                    job,
                    gpu,
                    profile,
                    ends,
                    transformer_stage(job, gpu, arch, false, true, profile, ends),
                ),
            ],
            _ => vec![StepModel::new(job, gpu, profile, ends)],
        }
    }

    pub fn new(
        job: &ValidatedJob,
        gpu: &'static GpuProduct,
        profile: &Profile,
        ends: &Ends,
    ) -> StepModel {
        let stage = match &job.model {
            ResolvedModel::Transformer(arch) => {
                transformer_stage(job, gpu, arch, true, true, profile, ends)
            }
            ResolvedModel::Custom {
                parameters,
                activation_bytes_per_sample,
            } => custom_stage(
                job,
                profile,
                *parameters as f64,
                *activation_bytes_per_sample as f64,
            ),
            ResolvedModel::Layers(stack) => layers_stage(job, profile, stack, ends),
        };
        StepModel::with_stage(job, gpu, profile, ends, stage)
    }

    fn with_stage(
        job: &ValidatedJob,
        gpu: &'static GpuProduct,
        profile: &Profile,
        ends: &Ends,
        stage: Stage,
    ) -> StepModel {
        let t = &job.spec().training;
        let p = &job.spec().parallelism;
        let overheads = gpus::overheads(gpu.architecture);
        let inference = t.mode == TrainingMode::Inference;
        let facts = Facts::of(job);
        // One NCCL communicator per process group the job spans.
        let communicators = if p.gpus > 1 {
            [
                job.data_parallel,
                p.tensor_parallel,
                p.pipeline_parallel,
                p.context_parallel,
            ]
            .iter()
            .filter(|n| **n > 1)
            .count()
            .max(1) as f64
        } else {
            0.0
        };
        let nccl = bounds::nccl_buffers(ends, communicators);
        // cuDNN convolution workspaces come through the caching allocator too.
        let cudnn = if matches!(&job.model, ResolvedModel::Layers(s) if s.has_conv) {
            bounds::cudnn_workspace(
                ends,
                overheads.cudnn_workspace_bytes as f64,
                stage.largest_tensor,
            )
        } else {
            0.0
        };
        StepModel {
            stage,
            ends: *ends,
            facts,
            inference,
            workspaces: overheads.cublas_workspace_bytes as f64 + cudnn,
            fixed: Fixed {
                context: bounds::cuda_context(ends, &facts, overheads.cuda_context_bytes as f64),
                nccl,
            },
            // With a globalBatchSize the steps are known; without one, the
            // stack's default decides (a plain PyTorch loop does not accumulate).
            accumulating: match job.spec().training.global_batch_size {
                Some(_) => job.gradient_accumulation_steps > 1,
                None => profile.accumulates_by_default,
            },
        }
    }

    pub fn phases(&self) -> Vec<PhaseBytes> {
        let s = &self.stage;
        let mut out = Vec::new();
        let base = |phase| {
            let mut c = [0.0; Component::COUNT];
            c[Component::Weights as usize] = s.weights;
            c[Component::OptimizerStates as usize] = s.optimizer;
            c[Component::PagedOptimizerStates as usize] = s.optimizer_paged;
            c[Component::Inputs as usize] = s.inputs;
            c[Component::Workspaces as usize] = self.workspaces;
            PhaseBytes {
                phase,
                components: c,
            }
        };
        if self.inference {
            let mut p = base(StepPhase::InferenceForward);
            p.components[Component::Activations as usize] = s.kv_cache + s.layer_activations;
            p.components[Component::Logits as usize] = s.logits_forward;
            p.components[Component::Temporaries as usize] = s.temp_forward + s.weight_transient;
            out.push(p);
            if s.kv_decode > 0.0 {
                let mut d = base(StepPhase::InferenceDecode);
                d.components[Component::Activations as usize] = s.kv_decode;
                d.components[Component::Logits as usize] = s.decode_logits;
                d.components[Component::Temporaries as usize] = s.decode_temp + s.weight_transient;
                out.push(d);
            }
            return out;
        }
        // Gradients from earlier micro-batches are live while accumulating.
        let accumulated = if self.accumulating { s.grads } else { 0.0 };

        let mut fwd = base(StepPhase::ForwardEnd);
        fwd.components[Component::Weights as usize] += s.weight_transient;
        fwd.components[Component::Gradients as usize] = accumulated;
        fwd.components[Component::Activations as usize] = s.activations;
        fwd.components[Component::Logits as usize] = s.logits_forward;
        fwd.components[Component::Temporaries as usize] = s.temp_forward;
        fwd.components[Component::CommBuffers as usize] =
            if accumulated > 0.0 { s.comm } else { 0.0 };
        out.push(fwd);

        // The loss's backward runs before the head's: no weight gradient and
        // no head temporaries yet (measured on the meta-device reference).
        let mut bs = base(StepPhase::BackwardStart);
        let frozen_early = if s.frozen_from_start {
            s.frozen_unsharded
        } else {
            0.0
        };
        bs.components[Component::Weights as usize] += s.weight_transient + frozen_early;
        bs.components[Component::Gradients as usize] = accumulated;
        bs.components[Component::Activations as usize] = s.activations;
        bs.components[Component::Logits as usize] = s.logits_backward;
        bs.components[Component::CommBuffers as usize] = s.comm;

        // Then the head and the last block: the loss's tensors are gone, the
        // logits the loop holds remain, the first gradients and the block's
        // temporaries are live.
        let mut bl = bs.clone();
        bl.phase = StepPhase::BackwardLastBlock;
        bl.components[Component::Gradients as usize] = accumulated.max(s.grads_live_in_backward);
        bl.components[Component::Logits as usize] = s.logits_kept;
        bl.components[Component::Temporaries as usize] = s.temp_backward.max(s.temp_head);
        out.push(bs);
        out.push(bl);

        let mut be = base(StepPhase::BackwardEnd);
        // Autocast's casts die with the saved tensors of their blocks' matmuls
        // as backward walks down (`bounds::casts_at_backward_end`).
        let casts_left = s.casts * bounds::casts_at_backward_end(&self.ends);
        be.components[Component::Weights as usize] +=
            s.weight_transient - s.casts + casts_left + s.frozen_unsharded;
        be.components[Component::Gradients as usize] = s.grads;
        be.components[Component::Activations as usize] = s.layer_activations;
        be.components[Component::Temporaries as usize] = s.temp_backward;
        be.components[Component::CommBuffers as usize] = s.comm;
        out.push(be);

        let mut opt = base(StepPhase::OptimizerStep);
        opt.components[Component::Gradients as usize] = s.grads;
        opt.components[Component::Temporaries as usize] = s.optimizer_temp;
        opt.components[Component::Inputs as usize] -=
            s.batch * (1.0 - bounds::batch_held_at_step(&self.ends));
        out.push(opt);
        out
    }

    pub fn fixed_overheads(&self) -> &Fixed {
        &self.fixed
    }

    /// Bytes on the device outside the caching allocator at `peak`.
    pub fn unallocated(&self, peak: &PhaseBytes) -> f64 {
        peak.get(Component::PagedOptimizerStates) * bounds::paged_residency(&self.ends)
    }

    /// Reserved minus allocated: rounding of large blocks plus fragmentation.
    pub fn allocator_overhead(&self, peak: &PhaseBytes) -> f64 {
        let churned = peak.get(Component::Activations)
            + peak.get(Component::Logits)
            + peak.get(Component::Temporaries);
        ROUNDING_PER_TENSOR * self.stage.large_tensors
            + bounds::fragmentation_share(&self.ends, &self.facts, &self.stage.churn) * churned
    }

    pub fn largest_tensor(&self) -> f64 {
        self.stage.largest_tensor
    }
}

/// Per-parameter byte sizes of the recipe.
struct Recipe {
    /// Stored bytes of unquantized weights.
    weight: f64,
    /// Bytes per gradient element.
    grad: f64,
    /// fp32 master copy bytes per trainable parameter (in the optimizer).
    master: f64,
    /// Bytes per optimizer state element.
    state: f64,
}

fn recipe(job: &ValidatedJob) -> Recipe {
    let t = &job.spec().training;
    let strategy = job.spec().parallelism.strategy;
    let (_, mixed) = precision_bytes(t.precision);
    let pure16 = matches!(t.precision, Precision::Bf16 | Precision::Fp16);
    // DeepSpeed and Megatron keep 16-bit modules with an fp32 master copy and
    // fp32 optimizer states; plain PyTorch (DDP, FSDP) keeps states in the
    // parameter's dtype: fp32 under autocast, 16-bit under a pure recipe.
    let framework_master = matches!(strategy, Strategy::Deepspeed | Strategy::Megatron);
    if framework_master && (mixed || pure16) {
        Recipe {
            weight: 2.0,
            grad: if strategy == Strategy::Megatron {
                4.0
            } else {
                2.0
            },
            master: 4.0,
            state: 4.0,
        }
    } else if pure16 {
        Recipe {
            weight: 2.0,
            grad: 2.0,
            master: 0.0,
            state: 2.0,
        }
    } else {
        Recipe {
            weight: 4.0,
            grad: 4.0,
            master: 0.0,
            state: 4.0,
        }
    }
}

/// Optimizer bytes per trainable parameter: (allocated, paged, step temporaries).
fn optimizer_bytes(
    job: &ValidatedJob,
    profile: &Profile,
    r: &Recipe,
    hidden: f64,
) -> (f64, f64, f64) {
    let strategy = job.spec().parallelism.strategy;
    // DeepSpeed and Megatron step their own fused optimizers whatever the loop.
    let foreach = matches!(strategy, Strategy::Ddp | Strategy::Fsdp)
        && profile.optimizer == OptimizerImplementation::Foreach;
    let s = r.state;
    match job.spec().training.optimizer {
        // Two moments; the foreach implementation materialises one
        // moment-sized temporary (`_foreach_sqrt` of the second moments) over
        // the whole group (torch/optim/adamw.py, `_multi_tensor_adamw`); the
        // fused kernel and the for-loop one tensor's worth at most.
        Optimizer::Adam | Optimizer::Adamw => {
            (r.master + 2.0 * s, 0.0, if foreach { s } else { 0.0 })
        }
        // Same states in CUDA managed memory.
        Optimizer::PagedAdamw => (r.master, 2.0 * s, 0.0),
        // Two 8-bit states plus an fp32 absmax per 2048-element block each.
        Optimizer::Adamw8bit => (r.master + 2.0 + 8.0 / 2048.0, 0.0, 0.0),
        Optimizer::PagedAdamw8bit => (r.master, 2.0 + 8.0 / 2048.0, 0.0),
        // torchao's `AdamW4bit`: each moment packs two 4-bit codes per byte
        // with an fp32 scale per 128-value block (torchao/optim/subclass_4bit.py,
        // `OptimState4bit.zeros`; tensors under 4096 values keep fp32 moments,
        // `_AdamBase._new_buffer`, a share the biases and norms make small).
        // The step dequantizes one parameter's moments to fp32 at a time:
        // two fp32 copies of the largest tensor (`step_temp_largest`).
        Optimizer::Adamw4bit => (r.master + 2.0 * (0.5 + 4.0 / 128.0), 0.0, 0.0),
        Optimizer::Sgd => (r.master, 0.0, 0.0),
        Optimizer::SgdMomentum => (r.master + s, 0.0, 0.0),
        // Factored second moment: a row and a column vector per matrix
        // (≈ 2/hidden of the matrix), no first moment by default.
        Optimizer::Adafactor => (r.master + 4.0 * 2.0 / hidden.max(1.0), 0.0, 0.0),
    }
}

fn transformer_stage(
    job: &ValidatedJob,
    gpu: &GpuProduct,
    arch: &Arch,
    first: bool,
    last: bool,
    profile: &Profile,
    ends: &Ends,
) -> Stage {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let (elem, mixed) = precision_bytes(t.precision);
    let r = recipe(job);
    let counts: Counts = params::count(arch, job.head, job.num_labels)
        .expect("validation proved the parameter count fits in u64");
    let tp = p.tensor_parallel.max(1) as f64;
    let pp = p.pipeline_parallel.max(1) as f64;
    let cp = p.context_parallel.max(1) as f64;
    // The ranks ZeRO/FSDP shard over: data parallel, times context parallel
    // where the stack applies FSDP over the dp × cp mesh.
    let dp = job.data_parallel.max(1) as f64
        * if profile.shards_over_context_parallel {
            cp
        } else {
            1.0
        };
    let zero = p.zero();
    let blocks = (arch.layers + arch.decoder_layers) as f64;
    let stage_blocks = (blocks / pp).ceil();
    let stage_share = stage_blocks / blocks.max(1.0);
    let h = arch.hidden as f64;
    let b = t.micro_batch_size as f64;
    let method = Peft::of(job);
    // Prompt tuning's virtual tokens are positions like any other.
    let s = t.sequence_length as f64 + method.extra_positions() as f64;
    let tokens = b * s / cp;
    let v = arch.vocab as f64;
    let inference = t.mode == TrainingMode::Inference;
    let strategy_is_torch = matches!(p.strategy, Strategy::Ddp | Strategy::Fsdp);

    // ---- Weights ----
    let linear = counts.linear as f64 * stage_share / tp;
    let embedding = if first {
        counts.embedding as f64 / tp
    } else {
        0.0
    };
    let head = if last {
        if counts.head == 0 && arch.tied && pp > 1.0 && !first {
            // Tied head on a separate last stage keeps its own copy.
            counts.embedding as f64 / tp
        } else {
            counts.head as f64 / tp
        }
    } else {
        0.0
    };
    let small = counts.small as f64 * stage_share;
    let q_in = h;
    let quant = quantized_bytes(job, q_in);
    let base_linear_bytes = match quant {
        // GPTQ and AWQ checkpoints quantize the blocks' linears only; the
        // head stays in the checkpoint's 16-bit dtype.
        Some(qb) if job.quantization.is_prequantized() => linear * qb + head * r.weight,
        Some(qb) => (linear + head) * qb,
        None => (linear + head) * r.weight,
    };
    let base_bytes = base_linear_bytes + (embedding + small) * r.weight;
    let stage_params = linear + head + embedding + small;

    // ---- Trainable parameters ----
    // PEFT's `modules_to_save` wraps the module in a `ModulesToSaveWrapper`
    // that keeps the frozen original and trains a deep copy
    // (huggingface/peft src/peft/utils/other.py, `ModulesToSaveWrapper`):
    // the copy's weights, gradients and optimizer states are the module's
    // full size. A tied head's copy is its own matrix, untied from the
    // embedding.
    let saved_modules = job.lora.as_ref().map_or(0.0, |l| {
        l.modules_to_save
            .iter()
            .map(|m| match m.as_str() {
                // The token embedding (not the position embedding beside it)
                // and the head: vocab × hidden each.
                "embed_tokens" if first => v * h / tp,
                "lm_head" if last => v * h / tp,
                _ => 0.0,
            })
            .sum::<f64>()
    });
    let explicit = t.trainable_parameters.map(|v| v * stage_share / tp);
    let adapter_default = match method {
        Peft::LlamaAdapter { layers: None } => prefix_adapter_parameters(arch),
        _ => method.trainable_parameters(arch),
    } * stage_share;
    let trainable = match t.mode {
        TrainingMode::Inference => 0.0,
        TrainingMode::Full => explicit.unwrap_or(stage_params),
        TrainingMode::Lora | TrainingMode::Qlora => explicit.unwrap_or_else(|| {
            let l = job.lora.as_ref().expect("validated lora modes carry lora");
            params::lora(arch, l.rank, &l.target_modules).unwrap_or(0) as f64 * stage_share / tp
                + saved_modules
        }),
        TrainingMode::Adapter => explicit.unwrap_or(adapter_default),
    };
    // Adapter weights are extra parameters (full training's are the base's own).
    let extra_params = match t.mode {
        TrainingMode::Lora | TrainingMode::Qlora | TrainingMode::Adapter => trainable,
        _ => 0.0,
    };
    let mut weights = base_bytes + extra_params * r.weight;

    // ZeRO-3 / FSDP full shard: parameters sharded, one or two blocks gathered.
    let block_gathered = counts.block_linear as f64 / tp * elem;
    let mut weight_transient = 0.0;
    let mut frozen_unsharded = 0.0;
    let mut casts = 0.0;
    let (gathered, frozen_from_start) = bounds::gathered_units(ends);
    if zero == 3 && !inference {
        weights /= dp;
        // The block being computed plus the prefetched next one; every block
        // of the stage where FSDP keeps them gathered between a stage's
        // forward and its backward (`Profile::unsharded_stage_under_pp`).
        weight_transient += if profile.unsharded_stage_under_pp {
            block_gathered * stage_blocks.max(gathered)
        } else {
            gathered * block_gathered
        };
        if profile.frozen_units_stay_unsharded {
            // FSDP1 reshards a unit after backward from its gradient hook;
            // frozen units get no gradient, so without the reshard-only hook
            // they stay unsharded once backward has gathered them (16-bit
            // copies of every frozen weight).
            frozen_unsharded = (linear + head + embedding + small) * elem;
        }
    }
    if p.offload == Offload::OptimizerAndParameters {
        // Parameters live on the host; only gathered blocks are on the GPU.
        weights = 0.0;
        if inference {
            weight_transient += 2.0 * block_gathered;
        }
    }
    // Autocast casts every weight a matmul uses to 16 bit; the copies are
    // saved for backward, so all of them are live at the end of forward.
    // Quantized linears dequantize per call instead (a transient, below).
    if mixed && zero < 3 && strategy_is_torch && !inference && quant.is_none() {
        // A checkpointed block keeps none of its casts (its saved tensors are
        // dropped and recomputed; op-level selective checkpointing recomputes
        // casts too), so only the blocks that are not checkpointed hold theirs.
        let every = t.checkpoint_every.unwrap_or(1).max(1) as f64;
        let kept_share = match t.gradient_checkpointing {
            Checkpointing::None | Checkpointing::Selective => 1.0,
            Checkpointing::Full | Checkpointing::OpSelective => (every - 1.0) / every,
        };
        // A tied head multiplies by the embedding's matrix: its 16-bit cast is
        // saved by the head's matmul for the hidden states' gradient.
        let tied_head = if last && head == 0.0 && arch.tied && job.head == crate::api::Head::Lm {
            embedding
        } else {
            0.0
        };
        weight_transient += (linear * kept_share + head + tied_head) * elem;
        casts = (linear * kept_share + head + tied_head) * elem;
        // Autocast caches the cast only of weights that require grad: a
        // frozen head run once per loss chunk is cast, and saved, per chunk.
        if t.mode != TrainingMode::Full && t.loss == Loss::Chunked && last {
            let chunks = (s / cp / loss_chunk_tokens(profile.loss_chunking, s / cp))
                .ceil()
                .max(1.0);
            weight_transient += head * elem * (chunks - 1.0);
        }
    }

    // ---- Gradients ----
    let mut grads = trainable * r.grad;
    if zero >= 2 {
        grads /= dp;
    }
    let largest_matrix = counts.largest_matrix as f64 / tp;
    let grads_full = grads;
    let lm_head = job.head == crate::api::Head::Lm;
    let mut grads_live_in_backward = if t.mode == TrainingMode::Full && last && lm_head {
        // The LM head's gradient is the first one backward produces (a
        // classifier's is small, and a tied embedding's then comes last).
        (head.max(if arch.tied { embedding } else { 0.0 })) * r.grad
            / if zero >= 2 { dp } else { 1.0 }
    } else {
        0.0
    };
    if t.optimizer_in_backward {
        // The step runs per parameter as soon as its gradient is ready.
        grads = (largest_matrix * r.grad).min(grads_full);
        grads_live_in_backward = grads_live_in_backward.min(grads);
    }

    // ---- Optimizer ----
    let (opt_alloc, opt_paged, opt_temp) = optimizer_bytes(job, profile, &r, h);
    let mut optimizer = trainable * opt_alloc;
    let mut optimizer_paged = trainable * opt_paged;
    let mut optimizer_temp = trainable * opt_temp;
    if t.optimizer == Optimizer::Adamw4bit {
        // One tensor's moments dequantized to fp32 during its update.
        optimizer_temp += largest_matrix.min(trainable) * 8.0;
    }
    if let Some((projected, matrices)) = method.galore_block_state_elements(arch) {
        // GaLore: the block matrices' states are the projected ones; the
        // rest (embedding, head, norms) keep the optimizer's own.
        let per_param = (opt_alloc - r.master).max(0.0) / 2.0;
        let block_matrices = matrices * stage_blocks / tp;
        let projected = projected * stage_blocks / tp;
        let full_states = (trainable - block_matrices).max(0.0);
        optimizer = trainable * r.master + (full_states * 2.0 + projected) * per_param;
        optimizer_temp = optimizer_temp.min(projected * per_param);
    }
    if zero >= 1 {
        optimizer /= dp;
        optimizer_paged /= dp;
        optimizer_temp /= dp;
    }
    if matches!(
        p.offload,
        Offload::Optimizer | Offload::OptimizerAndParameters
    ) {
        optimizer = 0.0;
        optimizer_paged = 0.0;
        optimizer_temp = 0.0;
    }
    if t.optimizer_in_backward {
        optimizer_temp = optimizer_temp.min(largest_matrix * r.state);
    }
    if let Some(g) = offloaded_gradients(job, largest_matrix.min(trainable) * r.grad) {
        grads = grads.min(g);
        grads_live_in_backward = grads_live_in_backward.min(grads);
    }

    // ---- Activations ----
    let lora_targets = super::peft::lora_targets(job);
    let ctx = ActContext {
        elem,
        mixed,
        weights_trainable: t.mode == TrainingMode::Full,
        quantized: job.quantization != Quantization::None,
        // bitsandbytes' and AWQ's autograd Functions save the input; GPTQ's
        // torch kernel saves the dequantized weight instead (above).
        quantized_input_saved: match job.quantization {
            Quantization::Gptq => false,
            Quantization::Awq => true,
            _ => profile.quantization == QuantLibrary::Bitsandbytes,
        },
        quantized_input_bytes: bounds::quantized_input_bytes(ends),
        frozen_linear_saves_input: profile.frozen_linear_saves_input,
        lora_dropout_per_module: profile.lora_dropout_per_module,
        peft: &method,
        checkpoint_every: t.checkpoint_every.unwrap_or(1).max(1) as f64,
        attention: t.attention,
        sdpa_math: bounds::sdpa_math_fallback(ends, job, arch, profile.own_loss, gpu.architecture),
        compiled: bounds::compiled_activations(ends, job, arch),
        sequence: s / cp,
        tensor_parallel: tp,
        sequence_parallel: p.sequence_parallel,
        lora_rank: job.lora.as_ref().map(|l| l.rank as f64).unwrap_or(0.0),
        lora_targets,
        lora_dropout: job.lora.as_ref().is_some_and(|l| l.dropout > 0.0),
        scaled_linears: t.mode == TrainingMode::Adapter
            && t.trainable_parameters
                .is_some_and(|n| n > ADAPTER_V2_RATIO * prefix_adapter_parameters(arch)),
        act: activations::act_under(arch, profile.own_loss),
    };
    let full_block = activations::block_bytes_per_token(arch, &ctx, false);
    let kept_enc = activations::kept_bytes_per_token(arch, &ctx, t.gradient_checkpointing, false);
    let kept_dec = activations::kept_bytes_per_token(arch, &ctx, t.gradient_checkpointing, true);
    let enc_blocks = arch.layers as f64 * stage_share;
    let dec_blocks = arch.decoder_layers as f64 * stage_share;
    // A prefix adapter on one stage: the blocks under the first adapted one
    // keep nothing (with pipeline stages every block is counted, the safe side).
    let kept_enc_blocks = if t.mode == TrainingMode::Adapter
        && method.trains_top_blocks_only()
        && !ctx.scaled_linears
        && pp <= 1.0
        && arch.kind == Kind::Decoder
    {
        match method {
            Peft::LlamaAdapter {
                layers: Some(layers),
            } => (layers as f64).min(enc_blocks),
            _ => prefix_adapted_blocks(arch, t.trainable_parameters).min(enc_blocks),
        }
    } else {
        enc_blocks
    };
    // An encoder-decoder's decoder runs over the target tokens; its
    // cross-attention keeps the encoder's projected keys and values, one
    // per source token, in every decoder block that is not checkpointed.
    let target_tokens = if arch.kind == Kind::EncoderDecoder {
        t.target_length.map_or(tokens, |l| b * l as f64 / cp)
    } else {
        tokens
    };
    let cross_kv =
        if arch.kind == Kind::EncoderDecoder && t.gradient_checkpointing == Checkpointing::None {
            (tokens - target_tokens) * elem * 2.0 * (arch.kv_heads * arch.head_dim) as f64 / tp
        } else {
            0.0
        };
    let mut per_microbatch = (tokens * kept_enc_blocks * kept_enc
        + dec_blocks * (target_tokens * kept_dec + cross_kv))
        * bounds::saved_activations_share(ends);
    if last {
        per_microbatch += tokens * activations::final_norm_bytes_per_token(arch, &ctx);
    }
    // A GPTQ kernel that dequantizes with tracked tensor ops keeps each
    // quantized linear's 16-bit weight for backward
    // (`bounds::dequantized_saved_share`): a block's worth in every block
    // that is not checkpointed, and in the block being recomputed.
    let block_dequant = if inference {
        0.0
    } else {
        bounds::dequantized_saved_share(ends, job.quantization) * counts.block_linear as f64 / tp
            * elem
    };
    let dequant_kept_share = {
        let every = t.checkpoint_every.unwrap_or(1).max(1) as f64;
        match t.gradient_checkpointing {
            Checkpointing::None | Checkpointing::Selective => 1.0,
            Checkpointing::Full | Checkpointing::OpSelective => (every - 1.0) / every,
        }
    };
    per_microbatch += block_dequant * (kept_enc_blocks + dec_blocks) * dequant_kept_share;
    if t.activation_offloading && t.gradient_checkpointing != Checkpointing::None {
        // Checkpointed inputs go to host memory; two blocks' stay for prefetch.
        per_microbatch =
            per_microbatch.min(2.0 * tokens * activations::block_input_bytes_per_token(arch, &ctx));
    }
    // Micro-batches in flight on this stage.
    let in_flight = if pp > 1.0 && first {
        let m = job.gradient_accumulation_steps.max(1) as f64;
        match p.pipeline_schedule {
            PipelineSchedule::Gpipe => m,
            PipelineSchedule::OneFOneB => pp.min(m.max(pp)),
            PipelineSchedule::Interleaved1f1b => {
                let vs = p.virtual_stages.max(1) as f64;
                pp * (1.0 + (pp - 1.0) / (pp * vs))
            }
        }
    } else {
        1.0
    };
    let mut activations_total = per_microbatch * in_flight;
    // During backward of a checkpointed block, that block is recomputed whole.
    let layer_activations = tokens * full_block;
    let recompute = if t.gradient_checkpointing == Checkpointing::None {
        0.0
    } else {
        // The recomputed block, with its autocast weight casts.
        let casts = if mixed && zero < 3 && strategy_is_torch && quant.is_none() {
            block_gathered
        } else {
            0.0
        };
        layer_activations + casts + block_dequant
    };

    // ---- Logits and loss ----
    let logit_tokens = target_tokens;
    let vocab_rank = v / tp;
    let (mut logits_forward, mut logits_backward) = (0.0, 0.0);
    // The model's own logits, while the loop holds them through backward.
    let held = bounds::logits_held(
        ends,
        &Facts::of(job),
        profile.logits_kept,
        profile.own_loss,
        elem,
    );
    let chunk_tokens = loss_chunk_tokens(profile.loss_chunking, s / cp);
    if last && job.head == crate::api::Head::Lm && !inference {
        match t.loss {
            Loss::Standard => {
                // lm_head output, fp32 upcast for the loss, fp32 log-softmax
                // saved for backward. Backward through the log-softmax holds
                // three fp32 planes: its saved output, the gradient nll_loss
                // hands it and the gradient it produces (measured on the
                // meta-device reference, benches/reference).
                let upcast = if elem < 4.0 { 4.0 } else { 0.0 };
                let copies = // A Transformers release that copies the shifted logits.
                    bounds::logits_extra_bytes(ends, &Facts::of(job), profile.own_loss, elem);
                logits_forward = logit_tokens * vocab_rank * (elem + upcast + 4.0 + copies);
                logits_backward = logit_tokens * vocab_rank * (held + 12.0);
            }
            Loss::Chunked => {
                // The 16-bit logits (kept per chunk) and each chunk's
                // log-softmax; the fp32 upcast is only ever one chunk wide.
                let chunk = b * chunk_tokens * vocab_rank * 8.0;
                // Under autocast the log-softmax runs, and is saved, in fp32.
                let saved = if mixed { 4.0 } else { elem };
                logits_forward = logit_tokens * vocab_rank * (elem + saved) + chunk;
                logits_backward =
                    logits_forward + chunk - logit_tokens * vocab_rank * (elem - held);
            }
        }
        if arch.final_softcap {
            // tanh(z / cap) keeps its 16-bit output per token for backward.
            let tanh = logit_tokens * vocab_rank * elem;
            logits_forward += tanh;
            logits_backward += tanh;
        }
    }

    // A padded batch's additive attention mask (saved once for every layer)
    // and the model's buffers besides its parameters.
    let mask = if !inference && activations::attention_kind(arch, t.attention) != Attention::Flash {
        b * (s / cp) * s * elem
    } else {
        0.0
    };
    let unmodelled = bounds::unmodelled_saved(
        ends,
        &Facts::of(job),
        mask,
        s * s + 32.0 * MIB + counts.largest_matrix.max(counts.embedding) as f64 / tp * r.weight,
    );
    // ---- Inputs ----
    // input_ids and labels (int64), plus data kept on the GPU.
    // With a target apart from the source, its labels and decoder input ids.
    let inputs = (tokens + target_tokens) * 8.0 * cp + t.data_on_gpu_bytes as f64 + unmodelled;

    // ---- Temporaries ----
    let i_width = arch.mlp_width_per_token() / tp;
    let (dequant, dequant_backward) =
        quant::transients(job, profile.quantization, t.precision, largest_matrix, b);
    let mlp_planes = match arch.mlp {
        crate::estimate::arch::Mlp::Gated => 3.0,
        crate::estimate::arch::Mlp::Standard => 2.0,
    };
    let temp_forward = tokens * elem * bounds::forward_temporaries(ends, i_width, mlp_planes)
        + dequant
        + method.forward_transient(arch, elem, lora_targets) / tp;
    // Gradients of one block's largest activations plus a weight gradient
    // buffer before it is accumulated.
    let weight_grad_temp = if t.mode == TrainingMode::Full {
        largest_matrix * r.grad
    } else {
        0.0
    };
    let scores_grad = activations::scores_grad(arch, &ctx, tp);
    let temp_backward = tokens * elem * bounds::backward_temporaries(ends, i_width, h, scores_grad)
        + dequant_backward
        + weight_grad_temp
        + recompute;
    let temp_head = dequant + weight_grad_temp;
    let logits_kept = if logits_backward > 0.0 {
        logit_tokens * vocab_rank * held
    } else {
        0.0
    };

    // ---- Communication buffers ----
    let comm = if dp > 1.0 && !inference && trainable > 0.0 {
        match (p.strategy, zero) {
            // DDP copies gradients into flat buckets (gradient_as_bucket_view=false).
            (Strategy::Ddp, 0) => grads_full,
            (Strategy::Deepspeed, 1 | 2) => {
                (DEEPSPEED_BUCKET_ELEMENTS * r.grad * 2.0).min(2.0 * grads_full)
            }
            // Reduce-scatter of one block's gradients.
            (_, _) => {
                2.0 * counts.block_linear as f64 / tp * r.grad * trainable / stage_params.max(1.0)
            }
        }
    } else {
        0.0
    };

    // ---- Inference ----
    // K and V of one block for one position of the batch.
    let kv_position = 2.0 * b * (arch.kv_heads * arch.head_dim) as f64 / tp * elem;
    let generation = t.generation.clone().unwrap_or_default();
    let kv_cache = if inference {
        // K and V per block for the prompt (or a cache allocated up front).
        let positions = generation.cache_length.map_or(s / cp, |c| c as f64 / cp);
        (enc_blocks + dec_blocks) * kv_position * positions
    } else {
        0.0
    };
    let (mut kv_decode, mut decode_logits, mut decode_temp) = (0.0, 0.0, 0.0);
    if inference && (generation.new_tokens > 0 || generation.cache_length.is_some()) {
        let full = generation
            .cache_length
            .unwrap_or(t.sequence_length + generation.new_tokens) as f64
            / cp;
        kv_decode = (enc_blocks + dec_blocks) * kv_position * full;
        // `generate` keeps the last position's logits as an fp32 copy
        // (`outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)`,
        // src/transformers/generation/utils.py) beside the head's output.
        decode_logits = if last && job.head == crate::api::Head::Lm {
            b * vocab_rank * (elem + 4.0)
        } else {
            0.0
        };
        // A growing cache appends with `torch.cat` (`DynamicLayer.update`,
        // src/transformers/cache_utils.py): the new K (then V) of one block
        // exists beside the old one until it replaces it.
        decode_temp = if generation.cache_length.is_none() {
            kv_position / 2.0 * full
        } else {
            0.0
        };
    }
    if inference {
        activations_total = 0.0;
        // LitGPT and Transformers before 4.45 keep prefill logits for every
        // prompt position; since then generation asks the head for the last
        // position only (`logits_to_keep`): the low end of the logits copies.
        let positions = match ends.of(bounds::Mechanism::LogitsCopies) {
            bounds::End::Low => b,
            _ => tokens,
        };
        logits_forward = if last && job.head == crate::api::Head::Lm {
            positions * vocab_rank * elem
        } else {
            0.0
        };
    }

    // ---- Tensor bookkeeping ----
    let per_block_tensors = 9.0;
    let copies = 1.0
        + if trainable > 0.0 && t.mode == TrainingMode::Full {
            1.0 + match t.optimizer {
                Optimizer::Sgd => 0.0,
                Optimizer::SgdMomentum => 1.0,
                _ => 2.0,
            }
        } else {
            0.0
        };
    let large_tensors = stage_blocks * per_block_tensors * (copies + 1.0);
    let logits_tensor = if last && job.head == crate::api::Head::Lm && !inference {
        match t.loss {
            Loss::Standard => logit_tokens * vocab_rank * 4.0,
            Loss::Chunked => b * chunk_tokens * vocab_rank * 4.0,
        }
    } else {
        0.0
    };
    let scores = if activations::attention_kind(arch, t.attention) == crate::api::Attention::Eager {
        b * (arch.heads as f64 / tp) * (s / cp) * (s / cp) * 4.0
    } else {
        0.0
    };
    let largest_tensor = (largest_matrix * r.weight.max(elem))
        .max(logits_tensor)
        .max(scores)
        .max(tokens * i_width * elem)
        .max(b * s * 8.0);

    Stage {
        weights,
        weight_transient,
        casts,
        frozen_unsharded,
        frozen_from_start,
        grads,
        grads_live_in_backward,
        optimizer,
        optimizer_paged,
        optimizer_temp,
        activations: activations_total,
        layer_activations: if inference {
            tokens * full_block
        } else {
            layer_activations.min(activations_total.max(layer_activations))
        },
        logits_forward,
        logits_backward,
        logits_kept,
        temp_head,
        inputs,
        batch: b * s * 16.0,
        temp_forward,
        temp_backward,
        comm,
        kv_cache,
        kv_decode,
        decode_logits,
        decode_temp,
        large_tensors,
        largest_tensor,
        churn: Churn {
            blocks: stage_blocks,
            saved: activations_total / stage_blocks.max(1.0),
            // The recomputed block's activations; its weight casts and
            // dequantized weights are the weight transients below.
            recompute: if recompute > 0.0 {
                layer_activations
            } else {
                0.0
            },
            width_ratio: i_width / h.max(1.0),
            temp_forward: (temp_forward - dequant).max(0.0),
            temp_backward: (temp_backward - dequant_backward - recompute).max(0.0),
            weight_forward: dequant,
            weight_backward: dequant_backward,
            gathered: if zero == 3 && !inference {
                block_gathered
            } else {
                0.0
            },
            // One fp32 plane of the logits: the loss upcasts, takes the
            // log-softmax and its gradient, each a plane.
            logits: if logits_forward > 0.0 {
                logit_tokens * vocab_rank * 4.0
            } else {
                0.0
            },
            // Without ZeRO each step's `.grad` tensors are allocated in
            // backward and freed by `zero_grad(set_to_none=True)`.
            grads: if zero == 0 {
                grads / stage_blocks.max(1.0)
            } else {
                0.0
            },
        },
    }
}

/// Bytes of gradients left on the GPU when the optimizer is offloaded, given
/// the largest single gradient's bytes; `None`: they stay as without offload.
///
/// - DeepSpeed ZeRO-Offload moves each gradient partition to the host's fp32
///   buffer as its bucket is reduced (deepspeed/runtime/zero/stage_1_and_2.py,
///   `async_accumulate_grad_in_cpu_via_gpu` with a parameter-sized GPU
///   staging buffer; stage3.py `partition_grads`): the buckets are counted as
///   communication buffers, and one gradient being staged plus the next remain.
/// - FSDP offloading parameters (FSDP1 `CPUOffload(offload_params=True)`,
///   FSDP2 `CPUOffloadPolicy`) copies the sharded gradients to the host after
///   the reduce-scatter, whose buffers are counted as communication.
/// - torchao's `CPUOffloadOptimizer(offload_gradients=True)` copies each
///   gradient to the host from its post-accumulate hook and frees it
///   (torchao/optim/cpu_offload.py): the one being copied and the next.
///   Without `offload_gradients` the gradients stay on the GPU.
fn offloaded_gradients(job: &ValidatedJob, largest_grad: f64) -> Option<f64> {
    let p = &job.spec().parallelism;
    match (p.offload, p.strategy) {
        (Offload::None, _) => None,
        (_, Strategy::Deepspeed) => Some(2.0 * largest_grad),
        (Offload::OptimizerAndParameters, Strategy::Fsdp) => Some(0.0),
        (Offload::Optimizer, Strategy::Ddp) if p.offload_gradients => Some(2.0 * largest_grad),
        _ => None,
    }
}

/// Gradients and optimizer states of `trainable` parameters under the job's
/// ZeRO stage and offload: (grads, optimizer, paged optimizer, optimizer temporaries).
fn sharded_states(
    job: &ValidatedJob,
    profile: &Profile,
    r: &Recipe,
    trainable: f64,
    hidden: f64,
) -> (f64, f64, f64, f64) {
    let p = &job.spec().parallelism;
    let dp = job.data_parallel.max(1) as f64;
    let mut grads = trainable * r.grad;
    if p.zero() >= 2 {
        grads /= dp;
    }
    if let Some(g) = offloaded_gradients(job, grads) {
        grads = grads.min(g);
    }
    if matches!(
        p.offload,
        Offload::Optimizer | Offload::OptimizerAndParameters
    ) {
        return (grads, 0.0, 0.0, 0.0);
    }
    let (oa, op, ot) = optimizer_bytes(job, profile, r, hidden);
    let div = if p.zero() >= 1 { dp } else { 1.0 };
    (
        grads,
        trainable * oa / div,
        trainable * op / div,
        trainable * ot / div,
    )
}

fn custom_stage(
    job: &ValidatedJob,
    profile: &Profile,
    parameters: f64,
    act_per_sample: f64,
) -> Stage {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let (elem, mixed) = precision_bytes(t.precision);
    let r = recipe(job);
    let dp = job.data_parallel.max(1) as f64;
    let zero = p.zero();
    let b = t.micro_batch_size as f64;
    let inference = t.mode == TrainingMode::Inference;
    let trainable = match t.mode {
        TrainingMode::Inference => 0.0,
        TrainingMode::Full => t.trainable_parameters.unwrap_or(parameters),
        // Without a shape the adapter size must be given; 1 % is the usual LoRA order.
        _ => t.trainable_parameters.unwrap_or(parameters * 0.01),
    };
    let qb = quantized_bytes(job, 4096.0).unwrap_or(r.weight);
    let mut weights = parameters * qb;
    if t.mode != TrainingMode::Full {
        weights += trainable * r.weight;
    }
    let mut weight_transient = if mixed && zero < 3 && !inference {
        parameters * elem
    } else {
        0.0
    };
    if zero == 3 && !inference {
        weights /= dp;
        weight_transient = 0.0;
    }
    let (grads, optimizer, optimizer_paged, optimizer_temp) =
        sharded_states(job, profile, &r, trainable, 4096.0);
    let activations = act_per_sample * b;
    Stage {
        weights,
        weight_transient,
        casts: 0.0,
        frozen_unsharded: 0.0,
        frozen_from_start: false,
        grads,
        grads_live_in_backward: 0.0,
        optimizer,
        optimizer_paged,
        optimizer_temp,
        activations: if inference { 0.0 } else { activations },
        layer_activations: activations * 0.1,
        logits_forward: 0.0,
        logits_backward: 0.0,
        logits_kept: 0.0,
        temp_head: 0.0,
        inputs: t.data_on_gpu_bytes as f64,
        batch: 0.0,
        temp_forward: 0.0,
        temp_backward: 0.0,
        comm: if dp > 1.0 && zero == 0 && !inference {
            grads
        } else {
            0.0
        },
        kv_cache: if inference { activations } else { 0.0 },
        kv_decode: 0.0,
        decode_logits: 0.0,
        decode_temp: 0.0,
        large_tensors: (parameters * 4.0 / (64.0 * MIB)).min(1e6),
        largest_tensor: (parameters / 100.0 * elem).min(4.0 * GIB),
        churn: Churn {
            blocks: 1.0,
            saved: if inference { 0.0 } else { activations },
            ..Churn::default()
        },
    }
}

/// An MLP/CNN from a layer list: activations from shape propagation.
fn layers_stage(job: &ValidatedJob, profile: &Profile, stack: &LayerStack, ends: &Ends) -> Stage {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let (elem, mixed) = precision_bytes(t.precision);
    let r = recipe(job);
    let dp = job.data_parallel.max(1) as f64;
    let zero = p.zero();
    let b = t.micro_batch_size as f64;
    let inference = t.mode == TrainingMode::Inference;
    let params = stack.parameters as f64;
    let matrices = stack.autocast_parameters as f64;
    let others = (params - matrices).max(0.0);
    let trainable = match t.mode {
        TrainingMode::Inference => 0.0,
        TrainingMode::Full => t.trainable_parameters.unwrap_or(params),
        // Validation requires the count for adapter modes on layer lists.
        _ => t.trainable_parameters.unwrap_or(0.0),
    };
    let qb = quantized_bytes(job, 4096.0);
    let mut weights = match qb {
        Some(q) => matrices * q + others * r.weight,
        None => params * r.weight,
    } + stack.buffer_bytes as f64;
    if t.mode != TrainingMode::Full {
        weights += trainable * r.weight;
    }
    let mut weight_transient = if mixed && zero < 3 && !inference && qb.is_none() {
        matrices * elem
    } else {
        0.0
    };
    if zero == 3 && !inference {
        weights /= dp;
        weight_transient = 0.0;
    }
    let (grads, optimizer, optimizer_paged, optimizer_temp) =
        sharded_states(job, profile, &r, trainable, 1024.0);
    let fused = t.attention != Attention::Eager;
    let full = (stack.saved_bytes_per_sample_with(elem, mixed, fused) * b
        + stack.saved_fp32_elems_per_batch as f64 * 4.0)
        * bounds::saved_activations_share(ends);
    let largest_layer = stack.largest_layer_saved_bytes_per_sample(elem, mixed, fused) * b;
    let activations = match t.gradient_checkpointing {
        // Segment checkpointing of n layers keeps O(√n) of them (Chen et al.
        // 2016, "Training Deep Nets with Sublinear Memory Cost").
        Checkpointing::Full => (full / (stack.layer_count.max(1) as f64).sqrt()).max(largest_layer),
        _ => full,
    };
    let largest_act = stack.largest_activation_bytes_per_sample(elem, mixed, fused) * b;
    let out_elems = stack.output_elems_per_sample() as f64 * b;
    let logits_backward = if inference {
        0.0
    } else {
        out_elems * (elem + 8.0)
    };
    Stage {
        weights,
        weight_transient,
        casts: 0.0,
        frozen_unsharded: 0.0,
        frozen_from_start: false,
        grads,
        grads_live_in_backward: 0.0,
        optimizer,
        optimizer_paged,
        optimizer_temp,
        activations: if inference { 0.0 } else { activations },
        layer_activations: largest_layer,
        // Classifier output, its fp32 log-softmax and gradient.
        logits_forward: if inference {
            out_elems * elem
        } else {
            out_elems * (elem + 4.0)
        },
        logits_backward,
        // A classifier's output is small: count it, and the largest
        // activation's gradients, in both backward phases.
        logits_kept: logits_backward,
        temp_head: 2.0 * largest_act,
        // Images as fp32, labels as int64.
        inputs: stack.input_elems_per_sample as f64 * b * 4.0
            + b * 8.0
            + t.data_on_gpu_bytes as f64,
        batch: stack.input_elems_per_sample as f64 * b * 4.0 + b * 8.0,
        temp_forward: largest_act,
        // The gradients of the largest layer's input and output, plus what
        // its backward kernels hold besides (`bounds::backward_temporaries`).
        temp_backward: bounds::backward_temporaries(ends, largest_act, 0.0, 0.0),
        comm: if dp > 1.0 && zero == 0 && !inference && trainable > 0.0 {
            grads
        } else {
            0.0
        },
        kv_cache: 0.0,
        kv_decode: 0.0,
        decode_logits: 0.0,
        decode_temp: 0.0,
        large_tensors: stack.parameter_tensors as f64,
        largest_tensor: (stack.largest_param_elems as f64 * r.weight.max(elem)).max(largest_act),
        churn: Churn {
            blocks: 1.0,
            saved: if inference { 0.0 } else { activations },
            temp_forward: largest_act,
            temp_backward: bounds::backward_temporaries(ends, largest_act, 0.0, 0.0),
            ..Churn::default()
        },
    }
}
