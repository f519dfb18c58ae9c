//! The training step, phase by phase, for one rank of the most loaded
//! pipeline stage. Every number is bytes as f64 (exact below 2^53).
//!
//! Here: the phases and their components, and `StepModel`, which puts a
//! stage's bytes into the phases. A stage comes from `transformer` (a
//! transformer's shape, in parts), or from `layers` (a layer list, or a
//! custom model's counts); `optimizer` has the gradients' and optimizer
//! states' bytes per parameter, `quant` the quantized weights'.

use super::PhaseBytes;
use super::bounds::{self, Ends, Facts};
use super::caching::Churn;
use super::gpus::{self, GpuProduct};
use super::stacks::Profile;
use crate::api::{Precision, ResolvedModel, Strategy, TrainingMode, ValidatedJob};

mod float8;
mod layers;
mod optimizer;
mod quant;
mod transformer;

use layers::{custom_stage, layers_stage};
use transformer::transformer_stage;

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

/// Average rounding loss per large tensor: blocks above 10 MiB come from
/// their own cudaMalloc rounded up to 2 MiB (CUDACachingAllocator).
const ROUNDING_PER_TENSOR: f64 = 1.0 * MIB;

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
    /// A gradient backward makes after every block (an untied token
    /// embedding's, without accumulation): not yet live while the first
    /// block runs backward.
    grads_after_blocks: f64,
    /// What the embedding's backward holds beside every gradient at the end
    /// of backward (a tied embedding's new gradient, summed into the head's).
    tail_temp: f64,
    optimizer: f64,
    optimizer_paged: f64,
    optimizer_temp: f64,
    activations: f64,
    layer_activations: f64,
    logits_forward: f64,
    logits_backward: f64,
    /// Logits the training loop still holds once the loss's backward is done.
    logits_kept: f64,
    /// The model's output the loop holds after backward: bound to a Python
    /// name (`outputs = model(**batch)`, `out = model(x)`), it lives through
    /// the rest of backward and the optimizer step, and through the next
    /// forward until that forward's output is bound to the name in its
    /// place. Part of `logits_kept` for a transformer; 0 where none is held.
    loop_output: f64,
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
    /// Those of them large enough for a segment of their own.
    own_segment_tensors: f64,
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
    /// Reserved bytes an fp32 build of the 16-bit weights leaves behind
    /// (`bounds::fp32_build`).
    fp32_build: f64,
}

/// Gradients of earlier micro-batches are live through the step. With a
/// globalBatchSize the steps are known; without one, the stack's default
/// decides (a plain PyTorch loop does not accumulate).
fn accumulating(job: &ValidatedJob, profile: &Profile) -> bool {
    match job.spec().training.global_batch_size {
        Some(_) => job.gradient_accumulation_steps > 1,
        None => profile.accumulates_by_default,
    }
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
    /// when there are several; they hold the embedding and the head). A V
    /// schedule puts the first and the last stage on rank 0 and the two
    /// middle ones on rank p − 1: those two ranks.
    pub fn candidates(
        job: &ValidatedJob,
        gpu: &'static GpuProduct,
        profile: &Profile,
        ends: &Ends,
    ) -> Vec<StepModel> {
        let p = &job.spec().parallelism;
        let pp = p.pipeline_parallel.max(1);
        let v = p.pipeline_schedule.v_shape();
        match &job.model {
            ResolvedModel::Transformer(arch) if pp > 1 => vec![
                StepModel::with_stage(
                    job,
                    gpu,
                    profile,
                    ends,
                    transformer_stage(job, gpu, arch, true, v, profile, ends),
                ),
                StepModel::with_stage(
                    job,
                    gpu,
                    profile,
                    ends,
                    transformer_stage(job, gpu, arch, false, !v, profile, ends),
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
        let fp32_build = bounds::fp32_build(ends, job) * stage.weights;
        StepModel {
            stage,
            fp32_build,
            ends: *ends,
            facts,
            inference,
            workspaces: overheads.cublas_workspace_bytes as f64 + cudnn,
            fixed: Fixed {
                context: bounds::cuda_context(ends, &facts, overheads.cuda_context_bytes as f64),
                nccl,
            },
            accumulating: accumulating(job, profile),
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
                carried_churn: 0.0,
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
        // The previous step's output, still bound in the loop, is freed when
        // this forward's output takes its name, before the loss allocates its
        // fp32 planes: `logits_forward` (at least the new output, the upcast
        // and the log-softmax) covers the moment both outputs are live.
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

        // The end of backward is the larger of two moments. First the first
        // block's backward: its activations and temporaries, every gradient
        // but those made after it.
        let mut be = base(StepPhase::BackwardEnd);
        // Autocast's casts die with the saved tensors of their blocks' matmuls
        // as backward walks down (`bounds::casts_at_backward_end`).
        let casts_left = s.casts * bounds::casts_at_backward_end(&self.ends);
        be.components[Component::Weights as usize] +=
            s.weight_transient - s.casts + casts_left + s.frozen_unsharded;
        be.components[Component::Gradients as usize] = s.grads - s.grads_after_blocks;
        be.components[Component::Activations as usize] = s.layer_activations;
        be.components[Component::Logits as usize] = s.loop_output;
        be.components[Component::Temporaries as usize] = s.temp_backward;
        be.components[Component::CommBuffers as usize] = s.comm;
        // Then the embedding's backward: every gradient, no block's saved
        // tensors or casts left (the meta-device reference's `backward:tail`).
        let mut tail = base(StepPhase::BackwardEnd);
        tail.components[Component::Weights as usize] +=
            s.weight_transient - s.casts + s.frozen_unsharded;
        tail.components[Component::Gradients as usize] = s.grads;
        tail.components[Component::Temporaries as usize] = s.tail_temp;
        tail.components[Component::CommBuffers as usize] = s.comm;
        tail.components[Component::Logits as usize] = s.loop_output;
        out.push(if tail.allocated() > be.allocated() {
            tail.carried_churn = Self::churned(&be);
            tail
        } else {
            be
        });

        let mut opt = base(StepPhase::OptimizerStep);
        opt.components[Component::Gradients as usize] = s.grads;
        opt.components[Component::Temporaries as usize] = s.optimizer_temp;
        opt.components[Component::Logits as usize] = s.loop_output;
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
        let churned = if peak.carried_churn > 0.0 {
            peak.carried_churn
        } else {
            Self::churned(peak)
        };
        ROUNDING_PER_TENSOR
            * bounds::rounded_tensors(
                &self.ends,
                self.stage.large_tensors,
                self.stage.own_segment_tensors,
            )
            + bounds::fragmentation_share(&self.ends, &self.facts, &self.stage.churn) * churned
    }

    /// The bytes of `p` the step makes and frees over and over (what strands cache).
    fn churned(p: &PhaseBytes) -> f64 {
        p.get(Component::Activations) + p.get(Component::Logits) + p.get(Component::Temporaries)
    }

    /// Reserved bytes the cast of an fp32 build left cached
    /// (`bounds::fp32_build`), beyond every phase's.
    pub fn fp32_build(&self) -> f64 {
        self.fp32_build
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
