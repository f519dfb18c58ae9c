//! What the estimator does not know, mechanism by mechanism, as a range.
//!
//! The step model is one model of one step; several of its inputs are not
//! facts of the spec but of the software that runs it (the CUDA driver's
//! module loading, the caching allocator's history, the Transformers release,
//! the kernels a library picks). Each such input is a [`Mechanism`] with a low,
//! a point and a high value, documented here: what it is physically, where
//! its low and high values come from, and which fact of the job narrows it.
//!
//! The estimate is the step model evaluated three times, with every mechanism
//! at its low end, at its point and at its high end ([`Ends`]); the phase that
//! sets the peak is found anew each time, so the peak can move. `upper` is the
//! largest of those over every trainer-stack profile the spec leaves open and
//! `lower` the smallest: never the point times a factor. The mechanism that
//! widens the range most is the one whose high end alone moves the per-GPU
//! figure furthest from the point.

use super::GIB;
use super::caching::{Churn, Shapes, stranded_share};
use crate::api::gpus::Architecture;
use crate::api::{AllocatorConf, Batching, Quantization, RuntimeFacts, ValidatedJob};

const MIB: f64 = 1024.0 * 1024.0;

/// Which end of its range a mechanism is evaluated at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    Low,
    Point,
    High,
}

/// A mechanism the step model cannot pin from the spec alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// The CUDA context with the kernel images of the libraries a job loads.
    CudaContext,
    /// NCCL's own buffers, per communicator.
    NcclBuffers,
    /// The caching allocator's reserved-but-unallocated bytes.
    Fragmentation,
    /// cuDNN convolution workspaces.
    CudnnWorkspace,
    /// Copies of the logits that the model's forward and the loss make.
    LogitsCopies,
    /// Tensors the training loop itself holds through backward and the
    /// optimizer step: the model's output logits and the batch.
    LoopHeld,
    /// Transient buffers inside one block's forward and backward.
    Temporaries,
    /// The bytes per token each block saves for backward.
    SavedActivations,
    /// What a bitsandbytes 4-bit/8-bit linear keeps per input element.
    QuantizedInput,
    /// Tensors saved for backward outside the modelled set.
    UnmodelledSaved,
    /// Paged optimizer states resident on the device.
    PagedResidency,
    /// FSDP / ZeRO-3 units gathered at once.
    ShardGather,
    /// Autocast's 16-bit weight casts still alive at the end of backward.
    CastCopies,
    /// 16-bit weights a GPTQ/AWQ kernel dequantizes that autograd keeps.
    DequantizedWeights,
    /// SDPA's math kernel keeping the attention probabilities.
    SdpaMathFallback,
    /// What a compiled block saves: the partitioner's cut or eager's set.
    CompiledActivations,
    /// An MoE block's fused experts run one expert at a time, each making a
    /// full-size gradient of the 3-D expert weights.
    ExpertLoop,
    /// A 16-bit model built at fp32 on the device and cast there (declared
    /// by the job): how many of the fp32 blocks the cast frees stay reserved.
    Fp32Build,
    /// The fp8 copy of its weight a tensorwise float8 linear keeps for backward.
    Float8Weight,
    /// What a zero-bubble schedule's stage keeps of a micro-batch between
    /// its input backward and its weight backward.
    SplitBackward,
}

impl Mechanism {
    pub const COUNT: usize = 20;
    pub const ALL: [Mechanism; Mechanism::COUNT] = [
        Mechanism::CudaContext,
        Mechanism::NcclBuffers,
        Mechanism::Fragmentation,
        Mechanism::CudnnWorkspace,
        Mechanism::LogitsCopies,
        Mechanism::LoopHeld,
        Mechanism::Temporaries,
        Mechanism::SavedActivations,
        Mechanism::QuantizedInput,
        Mechanism::UnmodelledSaved,
        Mechanism::PagedResidency,
        Mechanism::ShardGather,
        Mechanism::CastCopies,
        Mechanism::DequantizedWeights,
        Mechanism::SdpaMathFallback,
        Mechanism::CompiledActivations,
        Mechanism::ExpertLoop,
        Mechanism::Fp32Build,
        Mechanism::Float8Weight,
        Mechanism::SplitBackward,
    ];

    /// The name used in the explanation and in `estimate.spread`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::CudaContext => "cudaContext",
            Mechanism::NcclBuffers => "ncclBuffers",
            Mechanism::Fragmentation => "allocatorFragmentation",
            Mechanism::CudnnWorkspace => "cudnnWorkspace",
            Mechanism::LogitsCopies => "logitsCopies",
            Mechanism::LoopHeld => "loopHeld",
            Mechanism::Temporaries => "temporaries",
            Mechanism::SavedActivations => "savedActivations",
            Mechanism::QuantizedInput => "quantizedInput",
            Mechanism::UnmodelledSaved => "unmodelledSaved",
            Mechanism::PagedResidency => "pagedResidency",
            Mechanism::ShardGather => "shardGather",
            Mechanism::CastCopies => "castCopies",
            Mechanism::DequantizedWeights => "dequantizedWeights",
            Mechanism::SdpaMathFallback => "sdpaMathFallback",
            Mechanism::CompiledActivations => "compiledActivations",
            Mechanism::ExpertLoop => "expertLoop",
            Mechanism::Fp32Build => "fp32Build",
            Mechanism::Float8Weight => "float8Weight",
            Mechanism::SplitBackward => "splitBackward",
        }
    }

    /// What narrows the range, for the explanation.
    pub fn narrowed_by(self) -> &'static str {
        match self {
            Mechanism::CudaContext => "training.runtime.cuda and .pytorch (lazy module loading)",
            Mechanism::NcclBuffers => "NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS in the trainer's env",
            Mechanism::Fragmentation => {
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, training.batching: packed"
            }
            Mechanism::CudnnWorkspace => "a convolution-free model",
            Mechanism::LogitsCopies => "training.runtime.transformers, training.stack",
            Mechanism::LoopHeld => "training.stack (a stack whose loop is known)",
            Mechanism::Temporaries => "nothing in the spec (kernel scheduling)",
            Mechanism::SavedActivations => {
                "training.stack (the stack's own modules), attention: flash"
            }
            Mechanism::QuantizedInput => "nothing in the spec (bitsandbytes release)",
            Mechanism::UnmodelledSaved => "training.batching: packed, attention: flash",
            Mechanism::PagedResidency => "nothing in the spec (host memory pressure)",
            Mechanism::ShardGather => "parallelism.fsdpVersion",
            Mechanism::CastCopies => "nothing in the spec (the order backward frees in)",
            Mechanism::DequantizedWeights => {
                "nothing in the spec (the GPTQ/AWQ kernel the loader picks)"
            }
            Mechanism::SdpaMathFallback => {
                "training.runtime.transformers and .pytorch, attention: flash"
            }
            Mechanism::CompiledActivations => "nothing in the spec (the partitioner's cut)",
            Mechanism::ExpertLoop => {
                "training.runtime.transformers (before 5 each expert is its own linear)"
            }
            Mechanism::Fp32Build => {
                "training.weightsLoad: dtype (the model loaded in its 16-bit dtype), PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
            }
            Mechanism::Float8Weight => {
                "training.float8AllGather: true (the gathered weight is already float8)"
            }
            Mechanism::SplitBackward => {
                "parallelism.pipelineSchedule (a schedule without the input/weight split)"
            }
        }
    }
}

/// The end every mechanism is evaluated at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ends([End; Mechanism::COUNT]);

impl Ends {
    /// Every mechanism at `end`.
    pub const fn all(end: End) -> Ends {
        Ends([end; Mechanism::COUNT])
    }

    /// Every mechanism at its point, `m` at `end`.
    pub fn point_but(m: Mechanism, end: End) -> Ends {
        let mut e = Ends::all(End::Point);
        e.0[m as usize] = end;
        e
    }

    pub fn of(&self, m: Mechanism) -> End {
        self.0[m as usize]
    }

    /// `(low, point, high)` picked by the end of `m`.
    pub fn pick(&self, m: Mechanism, low: f64, point: f64, high: f64) -> f64 {
        match self.of(m) {
            End::Low => low,
            End::Point => point,
            End::High => high,
        }
    }
}

/// The facts of a job that narrow the mechanisms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Facts {
    pub runtime: RuntimeFacts,
    pub allocator: AllocatorConf,
    /// How batches are shaped, when the job says.
    pub batching: Option<Batching>,
}

impl Facts {
    pub fn of(job: &ValidatedJob) -> Facts {
        Facts {
            runtime: job.runtime,
            allocator: job.allocator_conf,
            batching: job.spec().training.batching,
        }
    }

    /// The step's shapes change from batch to batch (or may).
    fn shapes_vary(&self) -> bool {
        !matches!(self.batching, Some(Batching::Packed | Batching::Padded))
    }

    /// Batches may carry padding, and so an attention mask.
    fn may_pad(&self) -> bool {
        self.batching != Some(Batching::Packed)
    }
}

/// The eager-loading context's high end (see [`cuda_context`]).
pub const EAGER_CONTEXT_HIGH: f64 = 1.5 * GIB;

/// NCCL's own fixed cost in a process, beside its buffers: the device code
/// loaded for its kernels and a communicator's state. Measured on an H200
/// (PyTorch 2.11.0+cu130 and the NCCL it ships, lazy loading) with a
/// one-rank group's first all-reduce: nvidia-smi's figure minus the
/// allocator's reserved bytes grew by 558 MiB (`benches/gpu_mechanisms.py
/// context`; a one-rank ring has no peer buffers).
pub const NCCL_FIXED_MEASURED: f64 = 558.0 * MIB;

/// The CUDA context: driver and runtime state plus the kernel images of
/// PyTorch and the libraries it loads (cuBLAS, cuDNN, NCCL), as nvidia-smi
/// shows them before the first tensor and after the first step.
///
/// - point: the architecture's measured typical context (`gpus.rs`,
///   `ARCH_OVERHEADS`, with the sources of each figure).
/// - low: the bare context before any kernel is loaded, 256 MiB (RTX 3090,
///   torch 2.7.1+cu128, invoke-ai/InvokeAI#9413; 274 MiB after one small
///   tensor in pytorch/pytorch#86509).
/// - high, lazy loading: CUDA 11.7 brought lazy module loading and PyTorch
///   turns it on by default since 1.13 (pytorch/pytorch#86509); it is the
///   driver's default from CUDA 12.2. A training step then loads the modules
///   of the kernels it calls: cuBLAS(Lt) GEMMs, cuDNN's (for convolutions and
///   fused attention), NCCL's. Bounded by the point plus 512 MiB, the size of
///   the largest of those libraries' device images (cuDNN 9's engine
///   libraries are the largest, some hundreds of MiB of sm_80/sm_90 code).
/// - high, eager loading (CUDA before 11.7, PyTorch before 1.13, or
///   `CUDA_MODULE_LOADING=EAGER`): every module of libtorch_cuda and its
///   libraries is loaded at start. Measured on an H200 with PyTorch
///   2.11.0+cu130 and `CUDA_MODULE_LOADING=EAGER` (`benches/gpu_mechanisms.py
///   context`): 1 250 MiB after the first tensor, 1 984 MiB once cuBLAS,
///   cuDNN and fused attention have run (lazy: 612 and 694 MiB), above this
///   1.5 GiB high end; raising it to 2 GiB moved a shrunk job the advice
///   said fits to 0.3 GiB past an H100 when judged again (tests/kueue.rs),
///   so it stays until that disagreement is found.
///
/// Narrowed by `training.runtime.cuda` and `.pytorch` (or the trainer image
/// tag): a known lazy-loading runtime removes the eager high end.
pub fn cuda_context(ends: &Ends, facts: &Facts, point: f64) -> f64 {
    let lazy = facts.runtime.lazy_module_loading();
    let high = match lazy {
        Some(true) => point + 512.0 * MIB,
        // Unknown or eager: a runtime old enough to load everything at start.
        _ => (point + 512.0 * MIB).max(EAGER_CONTEXT_HIGH),
    };
    ends.pick(Mechanism::CudaContext, 256.0 * MIB, point, high)
}

/// NCCL's buffers per process: `NCCL_BUFFSIZE` (4 MiB by default) per
/// channel, per peer and direction, per communicator. PyTorch opens one
/// communicator per process group a job uses (data, tensor, pipeline and
/// context parallel each have their own) and NCCL opens 2 to 32 channels by
/// topology (NCCL environment-variable documentation: `NCCL_BUFFSIZE`,
/// `NCCL_MIN_NCHANNELS`, `NCCL_MAX_NCHANNELS`).
///
/// - point: 384 MiB, the figure for one communicator on an NVLink node (as
///   before this range existed).
/// - low: 2 channels × 2 peers × 2 directions × 4 MiB = 32 MiB per communicator.
/// - high: 32 channels × 2 peers × 2 directions × 4 MiB = 512 MiB per communicator
///   (ring; tree and NVLS add less than the ring's second peer set), plus
///   NCCL's device code and state once per process ([`NCCL_FIXED_MEASURED`],
///   measured: lazy loading leaves it out of the CUDA context's figure).
pub fn nccl_buffers(ends: &Ends, communicators: f64) -> f64 {
    if communicators <= 0.0 {
        return 0.0;
    }
    ends.pick(
        Mechanism::NcclBuffers,
        32.0 * MIB * communicators,
        384.0 * MIB + 128.0 * MIB * (communicators - 1.0),
        NCCL_FIXED_MEASURED + 512.0 * MIB * communicators,
    )
}

/// Reserved minus allocated, as a share of the bytes that churn within a step
/// (activations, logits, temporaries): the caching allocator keeps freed
/// blocks in their segments, and a block freed at one size serves a later
/// request only when it is as large, so some reserved bytes are stranded.
/// Two parts, each end the larger of the two:
///
/// - The step's large tensors, replayed: [`caching`](super::caching) runs
///   the step's allocations (each block's saved tensors, temporaries, each
///   linear's dequantized weight, the blocks ZeRO-3 gathers, the logits, the
///   gradients `zero_grad` frees) through the allocator's own rules
///   (pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp`, commit 001074d)
///   and finds the fewest bytes the device must let it reserve for the run
///   to finish. Packed or padded batches replay one step; variable-length
///   ones (or batching not given) eight steps at shapes between 1/8 and all
///   of the longest, in two drawn orders (the point is their mean) and in
///   ascending order (the high end is the largest of the three).
/// - What the replay leaves out: the step's many small and odd-sized
///   tensors (norms, biases, attention statistics, RNG state, the
///   optimizer's per-parameter temporaries), the first steps' warm-up and
///   other streams' blocks. Not modelled; bounded by shares of the churned
///   bytes: point 8 %, high 15 %, 25 % with variable-length batches (blocks
///   cached at one shape do not serve the next, and the reserved figure
///   climbs over a run); with `expandable_segments:True` (one growing
///   segment per pool, free pages unmapped on the retry) 3 %, high 5 %
///   and 10 %.
/// - low: none (a step whose every tensor finds a block of its own size
///   again, as a repeated identical step does after its first).
pub fn fragmentation_share(ends: &Ends, facts: &Facts, churn: &Churn) -> f64 {
    let expandable = facts.allocator.expandable_segments;
    let (shapes, unmodelled_high) = match (expandable, facts.shapes_vary()) {
        (true, false) => (Shapes::Fixed, 0.05),
        (true, true) => (Shapes::Varying, 0.10),
        (false, false) => (Shapes::Fixed, 0.15),
        (false, true) => (Shapes::Varying, 0.25),
    };
    let unmodelled_point = if expandable { 0.03 } else { 0.08 };
    match ends.of(Mechanism::Fragmentation) {
        End::Low => 0.0,
        End::Point => stranded_share(churn, shapes, expandable)
            .0
            .max(unmodelled_point),
        End::High => stranded_share(churn, shapes, expandable)
            .1
            .max(unmodelled_high),
    }
}

/// How many tensors lose `ROUNDING_PER_TENSOR` (1 MiB) to the 2 MiB
/// rounding of their segments, part of the allocator's reserved-but-
/// unallocated bytes (`Mechanism::Fragmentation`).
///
/// The caching allocator gives a request of 10 MiB or more a segment of its
/// own, rounded up to 2 MiB, and packs smaller ones into shared 20 MiB
/// segments (`get_allocation_size`, `kMinLargeAlloc`; pytorch/pytorch
/// c10/cuda/CUDACachingAllocator.cpp, commit 001074d).
///
/// - point and high: `counted`, nine tensors per block in every copy
///   (stored, gradient, states, one at the compute dtype), as the estimator
///   has counted them.
/// - low: `own_segment`, only those of them that are 10 MiB or more: none
///   for a small model's blocks (BERT-base, T5-small, Qwen2-0.5B keep every
///   block matrix under 10 MiB), whose reserved bytes the GPU measures at
///   2 to 4 % over the allocated peak (`benches/ground-truth`, the
///   `ref-bert-mb8-s128`, `ref-t5-mb4-s128` and `ref-qwen2-mb4-s256` rows).
pub fn rounded_tensors(ends: &Ends, counted: f64, own_segment: f64) -> f64 {
    ends.pick(Mechanism::Fragmentation, own_segment, counted, counted)
}

/// Whether a grouped-query model's SDPA call runs PyTorch's math kernel,
/// which keeps the attention probabilities (heads × s per token, in the
/// compute dtype) for backward where the fused kernels keep a log-sum-exp.
///
/// Transformers passes `enable_gqa=True` instead of repeating K/V to every
/// head when no attention mask is given on torch 2.5 or later
/// (`integrations/sdpa_attention.py`, `use_gqa_in_sdpa`; added by
/// huggingface/transformers#39412, first in 4.54). PyTorch's flash kernel
/// takes grouped heads but only 16-bit inputs on sm_80 and later with a head
/// size up to 256, and its memory-efficient kernel refuses unequal head
/// counts (`sdp_utils.cpp`, `check_batch_size_and_num_heads_dense<false>`
/// in its constraints), so fp32 compute, a Turing or Volta GPU or wider
/// heads leave the math kernel. Without the mask: a micro-batch of one
/// sample (nothing to pad) or packed batches.
///
/// - point and low: the kernel of Transformers before 4.54 (K/V repeated,
///   the memory-efficient kernel) unless the release and PyTorch's are
///   known; high: the math kernel wherever the conditions hold.
/// - measured: the meta-device reference's fp32 Llama and Mixtral rows
///   keep 1.07 × heads × s × 4 bytes per token per block more than the
///   memory-efficient kernel (`benches/reference`, `attention_kernels`).
///
/// `own_modules`: the stack runs its own attention (LitGPT, torchtune,
/// torchtitan, Megatron, Unsloth repeat K/V to every head themselves).
pub fn sdpa_math_fallback(
    ends: &Ends,
    job: &ValidatedJob,
    arch: &crate::api::arch::Arch,
    own_modules: bool,
    gpu: Architecture,
) -> bool {
    let facts = Facts::of(job);
    let grouped = arch.kv_heads < arch.heads && !own_modules;
    let head_dim = arch.head_dim;
    let t = &job.spec().training;
    let sixteen_bit = !matches!(
        t.precision,
        crate::api::Precision::Fp32 | crate::api::Precision::Tf32
    );
    let flash = sixteen_bit && gpu >= Architecture::Ampere && head_dim <= 256;
    let unmasked = t.micro_batch_size == 1 || facts.batching == Some(Batching::Packed);
    if t.attention != crate::api::Attention::Sdpa || !grouped || flash || !unmasked {
        return false;
    }
    let runtime = &facts.runtime;
    let known = match (runtime.transformers, runtime.pytorch) {
        (Some(tf), Some(pt)) => Some(tf >= (4, 54) && pt >= (2, 5)),
        (Some(tf), None) if tf < (4, 54) => Some(false),
        (None, Some(pt)) if pt < (2, 5) => Some(false),
        _ => None,
    };
    match known {
        Some(math) => math,
        None => ends.pick(Mechanism::SdpaMathFallback, 0.0, 0.0, 1.0) > 0.5,
    }
}

/// Whether a compiled block's saved tensors are the partitioner's cut
/// (`activations::compiled_block`) rather than eager's set.
///
/// - applies: `training.compile` on a dense decoder under full training
///   without quantized linears or a PEFT method; elsewhere eager's count
///   stands at every end (the cut was traced for those blocks only).
/// - low and point: the cut, as traced (see `compiled_block`).
/// - high: eager's saved set. The partitioner minimises the saved bytes over
///   the cuts of the joint graph, and the tensors eager saves form one of
///   them; its bans on recomputing (long fusible chains, ops used far apart,
///   `torch/_functorch/config.py` `ban_recompute_*`) can move the cut up to
///   it, not past it.
pub fn compiled_activations(
    ends: &Ends,
    job: &ValidatedJob,
    arch: &crate::api::arch::Arch,
) -> bool {
    let t = &job.spec().training;
    let applies = t.compile
        && t.mode == crate::api::TrainingMode::Full
        && t.peft.is_none()
        && job.quantization == Quantization::None
        && arch.experts == 0
        && arch.kind == crate::api::arch::Kind::Decoder;
    applies && ends.pick(Mechanism::CompiledActivations, 1.0, 1.0, 0.0) > 0.5
}

/// cuDNN convolution workspace. PyTorch tries algorithms in cuDNN's
/// heuristic order and keeps the first whose workspace fits in free memory,
/// with no cap of its own (pytorch/pytorch#49207); `cudnn.benchmark` times
/// every algorithm, large-workspace FFT and Winograd ones included.
///
/// - point: 128 MiB, typical of a ResNet pass (`gpus.rs`, with its sources).
/// - low: 0 (implicit-GEMM algorithms need none).
/// - high: 1 GiB, or four times the largest activation when that is more:
///   FFT algorithms hold padded complex copies of input, filter and output.
pub fn cudnn_workspace(ends: &Ends, point: f64, largest_activation: f64) -> f64 {
    ends.pick(
        Mechanism::CudnnWorkspace,
        0.0,
        point,
        (1.0 * GIB).max(4.0 * largest_activation),
    )
}

/// Extra bytes per logit element (tokens × vocab) that the model's forward
/// and the loss hold in forward beyond the modelled planes (the 16-bit
/// lm_head output, one fp32 upcast and the fp32 log-softmax).
///
/// Transformers' causal-LM heads shifted the fp32 logits with
/// `logits[..., :-1, :].contiguous()`: a second fp32 copy, live beside the
/// upcast and the log-softmax in forward. Releases up to 4.45 did it in each
/// model's `forward`, after `logits = logits.float()`, which drops the 16-bit
/// output before the copy is made; 4.46 moved it into `ForCausalLMLoss`
/// (src/transformers/loss/loss_utils.py), where the model's 16-bit output is
/// still referenced, and kept the copy until the `.contiguous()` was dropped
/// (huggingface/transformers#35646, merged 2025-01-13, first released in
/// 4.49); later releases shift the labels (`nn.functional.pad(labels, (0, 1))`)
/// and copy no logits. In backward the shift adds nothing to the peak:
/// `slice_backward` allocates its fp32 zero plane after the log-softmax's
/// saved output and the gradient nll_loss handed it are freed. Measured on the
/// meta-device reference with Transformers 4.45.2 under the HF Trainer
/// (`benches/reference`, the `-tf4.45` rows): 12 bytes per logit in forward
/// (16 bits dropped, three fp32 planes), 12 at backward's head, as 5.24 has.
///
/// - point: the current release's path (0 extra); with the release known,
///   4 bytes before 4.49, less the dropped 16-bit output (`elem`, when the
///   model computes below fp32) before 4.46.
/// - high: 4 bytes (one fp32 plane) when the logits can go through a
///   Transformers model's own loss (HF Trainer, a plain loop, Lightning,
///   DeepSpeed around a Transformers model) and the release is not known.
/// - low: 0.
///
/// `own_loss`: the profile's stack computes the loss with its own code
/// (LitGPT, torchtune, torchtitan, Megatron, Unsloth), where none of this applies.
pub fn logits_extra_bytes(ends: &Ends, facts: &Facts, own_loss: bool, elem: f64) -> f64 {
    if own_loss {
        return 0.0;
    }
    let runtime = &facts.runtime;
    let dropped = match runtime.transformers_returns_fp32_logits() {
        Some(true) if elem < 4.0 => elem,
        _ => 0.0,
    };
    match runtime.transformers_shifts_logits() {
        Some(true) => 4.0 - dropped,
        Some(false) => 0.0,
        None => ends.pick(Mechanism::LogitsCopies, 0.0, 0.0, 4.0),
    }
}

/// Bytes per logit element that the training loop itself holds through
/// backward: the model's own output logits, referenced by the loop while
/// `loss.backward()` runs.
///
/// A loop written as `outputs = model(**batch); loss = outputs.loss;
/// loss.backward()` (Transformers' `run_clm_no_trainer.py`, Accelerate's
/// examples) or `logits = model(x); loss = f(logits)` keeps `outputs.logits`
/// alive until the next iteration rebinds it (the step model counts them
/// from the end of the loss's backward through the optimizer step,
/// `Stage::loop_output`); `loss = model(**batch).loss`
/// drops them before backward (the meta-device reference's loop,
/// `benches/reference/sweep.py` `forward`: at `backward:head` it holds the
/// three fp32 log-softmax planes and no 16-bit logits). Stacks whose
/// training step returns only the loss (HF Trainer's `training_step` calls
/// `compute_loss` without `return_outputs`, transformers
/// src/transformers/trainer.py) are `kept = false` by their profile and hold
/// nothing.
///
/// The dtype of the held logits: through Transformers 4.45 a causal-LM's
/// `forward` upcast them (`logits = logits.float()`) before its loss, so
/// the output holds fp32 logits; from 4.46 the upcast happens inside
/// `ForCausalLMLoss` and the output keeps the model's dtype
/// (huggingface/transformers#34147, `RuntimeFacts::transformers_returns_fp32_logits`).
///
/// - point: `elem` per element when the profile says the loop may hold
///   them (a hand-written loop), 4 bytes when the job runs Transformers
///   before 4.46.
/// - high: 4 bytes when the model's forward is Transformers' (`own_loss`
///   false) and the release is unknown, else as the point.
/// - low: 0, the loop that keeps only the loss.
///
/// Narrowed by `training.stack` (a stack whose step is known) and
/// `training.runtime.transformers`.
pub fn logits_held(ends: &Ends, facts: &Facts, kept: bool, own_loss: bool, elem: f64) -> f64 {
    if !kept {
        return 0.0;
    }
    let fp32 = if own_loss {
        Some(false)
    } else {
        facts.runtime.transformers_returns_fp32_logits()
    };
    let point = if fp32 == Some(true) {
        elem.max(4.0)
    } else {
        elem
    };
    let high = if fp32 == Some(false) {
        elem
    } else {
        elem.max(4.0)
    };
    ends.pick(Mechanism::LoopHeld, 0.0, point, high)
}

/// Whether the batch's tensors are still referenced by the loop when the
/// optimizer steps (1) or already dropped (0). `for batch in loader:`
/// keeps the batch bound through `optimizer.step()`, as HF Trainer's inner
/// loop does with `inputs`; a loop that deletes it after backward (the
/// meta-device reference's, `benches/reference/sweep.py`) does not.
///
/// - point and high: held. low: dropped.
pub fn batch_held_at_step(ends: &Ends) -> f64 {
    ends.pick(Mechanism::LoopHeld, 0.0, 1.0, 1.0)
}

/// Transient buffers alive at once inside one block's forward, in elements
/// per token of the MLP's intermediate width `i`: the gate and up outputs,
/// the activation's output and their product. What the block saves for
/// backward is counted with the activations; what it frees as it goes is
/// transient.
///
/// - point and low: one intermediate-wide buffer (`i`): the product, the
///   others saved (training) or freed as soon as it exists.
/// - high: `mlp_planes` × i, every plane of the MLP's forward at once (three
///   for a gated MLP, two for a standard one), as an inference forward that
///   saves nothing holds them until the product is made.
pub fn forward_temporaries(ends: &Ends, i: f64, mlp_planes: f64) -> f64 {
    ends.pick(Mechanism::Temporaries, i, i, mlp_planes * i)
}

/// Gradient buffers alive at once inside one block's backward, in elements
/// per token of intermediate width `i` and hidden width `h`.
///
/// The backward of a gated MLP produces the gradient of down_proj's input
/// (i), then SiLU's and the product's backward the gradients of the gate and
/// up outputs (i each), then gate_proj's and up_proj's backward two
/// gradients of the block input (h each) that autograd sums. How many of
/// these are alive at once depends on when the engine frees each input
/// gradient (as soon as its last consumer ran).
///
/// - point: 2i + 2h, what the meta-device reference measures for the
///   Transformers blocks (`benches/reference`).
/// - low: i + h, one of each, for an engine that frees as it goes.
/// - high: 3i + 3h, every buffer of the MLP's backward at once (and the
///   attention's dq, dk, dv beside the residual gradient), plus, for eager
///   attention, the gradients of the score matrices (`scores`, in the same
///   elements per token), which the reference's meta kernels do not size as
///   the CUDA softmax backward allocates them.
pub fn backward_temporaries(ends: &Ends, i: f64, h: f64, scores: f64) -> f64 {
    ends.pick(
        Mechanism::Temporaries,
        i + h,
        2.0 * i + 2.0 * h,
        3.0 * i + 3.0 * h + scores,
    )
}

/// The bytes per token a block saves for backward, as a share of what the
/// block model counts tensor by tensor (`activations.rs`). The model names
/// every saved tensor of the modelled modules; what it cannot see is how a
/// stack's own modules differ from them (a fused norm that saves its fp32
/// input or not, a rotary embedding that keeps a rotated copy, grouped K/V
/// expanded before the attention kernel, a dropout applied once or per
/// module).
///
/// - point: the block model.
/// - low and high: ±20 %. The meta-device reference holds the activation
///   component within 5 % of the step's peak on every gated configuration
///   (`benches/reference/report.py`, `TOLERANCE`), where activations are a
///   quarter to two thirds of the peak at the phase that sets it: up to 20 %
///   of the activations themselves.
pub fn saved_activations_share(ends: &Ends) -> f64 {
    ends.pick(Mechanism::SavedActivations, 0.8, 1.0, 1.2)
}

/// How many FSDP / ZeRO-3 units are gathered (unsharded) at once, and
/// whether frozen units left unsharded by backward are all there already
/// when backward starts.
///
/// - gathered units: point 2 (the unit computing and the one prefetched:
///   FSDP's `BACKWARD_PRE` prefetch with `limit_all_gathers`), low 1 (no
///   prefetch issued yet), high 3 (a finished unit whose reshard has not run
///   beside the two; torch/distributed/fsdp/_runtime_utils.py,
///   `_prefetch_handle`, `_post_backward_reshard`).
/// - frozen units that stay unsharded (`Profile::frozen_units_stay_unsharded`)
///   are gathered as backward reaches them: the point counts them all from
///   backward's start, the low end only at its end, when the activations are
///   gone (backward frees one block's activations as it gathers the next
///   unit, so the sum is never above the larger of the two ends).
pub fn gathered_units(ends: &Ends) -> (f64, bool) {
    match ends.of(Mechanism::ShardGather) {
        End::Low => (1.0, false),
        End::Point => (2.0, true),
        End::High => (3.0, true),
    }
}

/// Bytes per input element that a bitsandbytes-quantized linear keeps for
/// backward, counted per module. bitsandbytes' `MatMul4Bit.forward` saves
/// the input for the weight's gradient only when one is needed, which a
/// frozen base never does, yet LitGPT's QLoRA rows keep more per token than
/// its LoRA rows of the same model, and its two published tables disagree
/// (the calibration test prints the nf4 rows of each).
///
/// - point: 3.5 bytes, between the two tables (`../shared/calibration`).
/// - low: 2.5 and high: 4.5 bytes, the per-table values that centre each
///   table's nf4 rows.
pub fn quantized_input_bytes(ends: &Ends) -> f64 {
    ends.pick(Mechanism::QuantizedInput, 2.5, 3.5, 4.5)
}

/// Share of a pre-quantized checkpoint's dequantized 16-bit weights that
/// autograd keeps for backward, in every block that is not checkpointed
/// (and in the block being recomputed when it is).
///
/// - GPTQ: point and high 1. GPTQModel's `TorchQuantLinear`, the kernel
///   Transformers trains GPTQ checkpoints through (its exllama and marlin
///   kernels refuse training), dequantizes with tensor ops and multiplies
///   with `torch.matmul(x, weights)`, and `matmul` saves `weights` for the
///   input's gradient (ModelCloud/GPTQModel
///   gptqmodel/nn_modules/qlinear/torch.py, `_forward`, commit 011c00a). Low
///   0: AutoGPTQ's triton `QuantLinear` runs its own autograd Function that
///   dequantizes again in backward and keeps only the packed weight.
/// - AWQ: point and low 0. AutoAWQ's `WQLinearMMFunction` saves the input and
///   the packed tensors and dequantizes again in backward
///   (casper-hansen/AutoAWQ awq/modules/linear/gemm.py). High 1: a kernel
///   that dequantizes with tracked tensor ops, as GPTQ's does.
/// - bitsandbytes: 0 at every end; `MatMul4Bit` and `MatMul8bitLt` are
///   autograd Functions that keep the quantized weight.
pub fn dequantized_saved_share(ends: &Ends, q: Quantization) -> f64 {
    match q {
        Quantization::Gptq => ends.pick(Mechanism::DequantizedWeights, 0.0, 1.0, 1.0),
        Quantization::Awq => ends.pick(Mechanism::DequantizedWeights, 0.0, 0.0, 1.0),
        _ => 0.0,
    }
}

/// Tensors saved for backward that the block model does not count: a 4-D
/// attention mask materialised for padded batches (SDPA and eager attention
/// take an additive `b × 1 × s × s` mask in the compute dtype when the batch
/// has padding; Transformers builds it once per forward,
/// `_prepare_4d_causal_attention_mask_with_cache_position`, and every layer's
/// attention saves the same tensor).
///
/// Model buffers that are not parameters are counted here too: the causal
/// mask cache some stacks build at the longest sequence (LitGPT's
/// `build_mask_cache`, a `s × s` bool; GPT-2's `bias` buffer in
/// Transformers), rotary tables, RNG states and loss scalars (32 MiB); and
/// the largest parameter once more, which `max_memory_allocated` sees at
/// load time wherever a checkpoint entry is materialised on the device before
/// it is copied into its parameter (`torch.load(map_location="cuda")`, a
/// CUDA state dict given to `load_state_dict`).
///
/// - point and low: nothing.
/// - high: `buffers` always, plus the attention mask, `mask` bytes, when
///   batches are not known to be packed and the attention is not FlashAttention.
///
/// Dropout masks (one byte per element where a config trains with dropout)
/// are not modelled: the architectures the estimator knows train without
/// dropout in current recipes.
pub fn unmodelled_saved(ends: &Ends, facts: &Facts, mask_bytes: f64, buffers: f64) -> f64 {
    let mask = if facts.may_pad() { mask_bytes } else { 0.0 };
    ends.pick(Mechanism::UnmodelledSaved, 0.0, 0.0, mask + buffers)
}

/// Share of bitsandbytes' paged optimizer states resident on the device at
/// the peak. Paged states live in CUDA managed memory: the driver moves them
/// to the host under memory pressure and back on access
/// (bitsandbytes/functional.py, `get_paged`, `cudaMallocManaged`).
///
/// - point and high: all resident (a GPU with room keeps them).
/// - low: none resident (evicted during forward and backward under pressure).
pub fn paged_residency(ends: &Ends) -> f64 {
    ends.pick(Mechanism::PagedResidency, 0.0, 1.0, 1.0)
}

/// Share of autocast's 16-bit weight casts alive at the end of backward.
/// Autocast caches the cast of each weight that requires grad for the
/// duration of the autocast region (`torch.autocast.__exit__` clears the
/// cache, aten/src/ATen/autocast_mode.cpp `clear_cache`); past forward the
/// copies live on only as the tensors their matmuls saved, and each block's
/// are freed when backward has run through it.
///
/// - point and high: all of them (the first blocks' backward is the last to run,
///   and the step model does not split the phase block by block).
/// - low: none: backward has freed every block's saved casts by its end
///   (the meta-device reference measures the weights at backward's end at
///   the stored weights alone).
pub fn casts_at_backward_end(ends: &Ends) -> f64 {
    ends.pick(Mechanism::CastCopies, 0.0, 1.0, 1.0)
}

mod float8;
mod pipeline;
mod reserved;
pub use float8::float8_weight_saved;
pub use pipeline::split_backward_held;
pub use reserved::{expert_loop, fp32_build};

#[cfg(test)]
mod tests;
