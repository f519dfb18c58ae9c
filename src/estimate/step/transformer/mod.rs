//! One rank of one pipeline stage of a transformer, in parts a test can
//! call one by one: the weights and their transient copies (`weights`), the
//! gradients and optimizer states (`states`), the blocks' saved tensors and
//! temporaries (`saved`), the head and its loss (`head`) and generation's
//! KV cache (`inference`). [`Setting`] carries what they all read.

use super::{MIB, Recipe, Stage, accumulating, float8, precision_bytes, recipe};
use crate::api::arch::Arch;
use crate::api::gpus::GpuProduct;
use crate::api::params::{self, Counts};
use crate::api::{
    Attention, Loss, Optimizer, ParallelismSpec, Strategy, TrainingMode, TrainingSpec, ValidatedJob,
};
use crate::estimate::activations;
use crate::estimate::bounds::{self, Ends, Facts};
use crate::estimate::caching::Churn;
use crate::estimate::peft::Peft;
use crate::estimate::stacks::{LossChunking, Profile};

mod head;
mod inference;
mod saved;
mod states;
mod weights;

#[cfg(test)]
mod tests;

use head::Logits;
use saved::{Saved, Temporaries};
use states::States;
use weights::Weights;

/// DeepSpeed's default `reduce_bucket_size` / `allgather_bucket_size` (5e8 elements).
const DEEPSPEED_BUCKET_ELEMENTS: f64 = 5e8;

/// Tokens per loss chunk of `b` samples of `s` tokens under `chunking`.
fn loss_chunk_tokens(chunking: LossChunking, s: f64) -> f64 {
    match chunking {
        LossChunking::Tokens(n) => f64::from(n).min(s),
        LossChunking::Count(k) => (s / f64::from(k.max(1))).ceil(),
    }
}

/// What every part of one transformer stage reads: the job, where the stage
/// sits in the pipeline, the stack's profile and the range's ends, and the
/// sizes worked out once from them.
pub(super) struct Setting<'a> {
    job: &'a ValidatedJob,
    gpu: &'a GpuProduct,
    arch: &'a Arch,
    /// The stage holds the embedding (and sees the pipeline's micro-batches first).
    first: bool,
    /// The stage holds the head and the loss.
    last: bool,
    profile: &'a Profile,
    ends: &'a Ends,
    t: &'a TrainingSpec,
    p: &'a ParallelismSpec,
    /// Bytes per activation element, and whether autocast runs.
    elem: f64,
    mixed: bool,
    r: Recipe,
    counts: Counts,
    tp: f64,
    pp: f64,
    cp: f64,
    dp: f64,
    zero: u8,
    stage_blocks: f64,
    stage_share: f64,
    h: f64,
    b: f64,
    method: Peft,
    s: f64,
    tokens: f64,
    /// The vocabulary on this rank.
    vocab_rank: f64,
    inference: bool,
    strategy_is_torch: bool,
    /// The largest single weight matrix on this rank (elements).
    largest_matrix: f64,
    /// The largest weight matrix of one block on this rank (elements).
    largest_block_matrix: f64,
    /// Gradients of earlier micro-batches are live through the step
    /// (`step::accumulating`).
    accumulating: bool,
    /// One block's linears, gathered at the compute dtype, or in float8
    /// under FSDP2's float8 all-gather (bytes).
    block_gathered: f64,
    /// The MLP's width per token on this rank.
    i_width: f64,
}

impl<'a> Setting<'a> {
    pub(super) fn new(
        job: &'a ValidatedJob,
        gpu: &'a GpuProduct,
        arch: &'a Arch,
        first: bool,
        last: bool,
        profile: &'a Profile,
        ends: &'a Ends,
    ) -> Setting<'a> {
        let t = &job.spec().training;
        let p = &job.spec().parallelism;
        let (elem, mixed) = precision_bytes(t.precision);
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
        let blocks = (arch.layers + arch.decoder_layers) as f64;
        let stage_blocks = (blocks / pp).ceil();
        let b = t.micro_batch_size as f64;
        let method = Peft::of(job);
        // Prompt tuning's virtual tokens are positions like any other.
        let s = t.seq_len() as f64 + method.extra_positions() as f64;
        Setting {
            job,
            gpu,
            arch,
            first,
            last,
            profile,
            ends,
            t,
            p,
            elem,
            mixed,
            r: recipe(job),
            tp,
            pp,
            cp,
            dp,
            zero: p.zero(),
            stage_blocks,
            stage_share: stage_blocks / blocks.max(1.0),
            h: arch.hidden as f64,
            b,
            method,
            s,
            tokens: b * s / cp,
            vocab_rank: arch.vocab as f64 / tp,
            inference: t.mode == TrainingMode::Inference,
            strategy_is_torch: matches!(p.strategy, Strategy::Ddp | Strategy::Fsdp),
            largest_matrix: counts.largest_matrix as f64 / tp,
            largest_block_matrix: counts.largest_block_matrix as f64 / tp,
            accumulating: accumulating(job, profile),
            block_gathered: counts.block_linear as f64 / tp * float8::gathered_bytes(t, elem, dp),
            i_width: arch.mlp_width_per_token() / tp,
            counts,
        }
    }

    /// The head is a language model's (a classifier's is small).
    fn lm_head(&self) -> bool {
        self.job.head == crate::api::Head::Lm
    }
}

/// One rank of one pipeline stage of a transformer (`first` holds the
/// embedding, `last` the head and the loss): its parts, put into a `Stage`.
pub(super) fn transformer_stage(
    job: &ValidatedJob,
    gpu: &GpuProduct,
    arch: &Arch,
    first: bool,
    last: bool,
    profile: &Profile,
    ends: &Ends,
) -> Stage {
    let st = Setting::new(job, gpu, arch, first, last, profile, ends);
    let w = weights::weights(&st);
    let g = states::states(&st, &w);
    let ctx = saved::act_context(&st);
    let mut a = saved::saved(&st, &w, &ctx);
    let mut l = head::logits(&st, a.target_tokens);
    let inputs = inputs(&st, a.target_tokens);
    let tmp = saved::temporaries(&st, &ctx, a.recompute);
    let comm = comm(&st, &w, &g);
    let decode = inference::decode(&st, a.enc_blocks + a.dec_blocks);
    if st.inference {
        // Nothing is kept for backward; the head's logits are prefill's.
        a.activations = 0.0;
        l.forward = decode.prefill_logits;
    }
    let (large_tensors, own_segment_tensors, largest_tensor) = tensors(&st, w.trainable, &l);
    Stage {
        weights: w.weights,
        weight_transient: w.weight_transient,
        casts: w.casts,
        frozen_unsharded: w.frozen_unsharded,
        frozen_from_start: w.frozen_from_start,
        grads: g.grads,
        grads_live_in_backward: g.grads_live_in_backward,
        grads_after_blocks: g.grads_after_blocks,
        tail_temp: g.tail_temp,
        optimizer: g.optimizer,
        optimizer_paged: g.optimizer_paged,
        optimizer_temp: g.optimizer_temp,
        activations: a.activations,
        layer_activations: if st.inference {
            st.tokens * a.full_block
        } else {
            a.layer_activations
                .min(a.activations.max(a.layer_activations))
        },
        logits_forward: l.forward,
        logits_backward: l.backward,
        logits_kept: l.kept,
        loop_output: l.kept,
        temp_head: tmp.head,
        inputs,
        batch: st.b * st.s * 16.0,
        temp_forward: tmp.forward,
        temp_backward: tmp.backward,
        comm,
        kv_cache: decode.kv_cache,
        kv_decode: decode.kv_decode,
        decode_logits: decode.decode_logits,
        decode_temp: decode.decode_temp,
        large_tensors,
        own_segment_tensors,
        largest_tensor,
        churn: churn(&st, &a, &l, &tmp, g.grads),
    }
}

/// What the step allocates and frees, for the caching allocator's replay.
fn churn(st: &Setting, a: &Saved, l: &Logits, tmp: &Temporaries, grads: f64) -> Churn {
    Churn {
        blocks: st.stage_blocks,
        saved: a.activations / st.stage_blocks.max(1.0),
        // The recomputed block's activations; its weight casts and
        // dequantized weights are the weight transients below.
        recompute: if a.recompute > 0.0 {
            a.layer_activations
        } else {
            0.0
        },
        width_ratio: st.i_width / st.h.max(1.0),
        temp_forward: (tmp.forward - tmp.dequant).max(0.0),
        temp_backward: (tmp.backward - tmp.dequant_backward - a.recompute).max(0.0),
        weight_forward: tmp.dequant,
        weight_backward: tmp.dequant_backward,
        gathered: if st.zero == 3 && !st.inference {
            st.block_gathered
        } else {
            0.0
        },
        // One fp32 plane of the logits: the loss upcasts, takes the
        // log-softmax and its gradient, each a plane.
        logits: if l.forward > 0.0 {
            l.logit_tokens * l.vocab_rank * 4.0
        } else {
            0.0
        },
        // Without ZeRO each step's `.grad` tensors are allocated in
        // backward and freed by `zero_grad(set_to_none=True)`.
        grads: if st.zero == 0 {
            grads / st.stage_blocks.max(1.0)
        } else {
            0.0
        },
        expert_grads: expert_grads(st),
        edge_grads: edge_grads(st),
        expert_loop: bounds::expert_loop(
            st.ends,
            &Facts::of(st.job),
            st.arch.experts,
            !transformers_modules(st.t),
        ),
    }
}

/// The gradients of one block's fused 3-D expert projections (gate-and-up
/// or up, then down) on this rank, in the gradients' dtype, when backward
/// allocates them: full training without sharding, through the
/// Transformers modules (`transformers_modules`) of a release that fuses the
/// experts (5 or later; an unknown release fuses them but at the low end of
/// `expertLoop`, where each expert is its own linear).
fn expert_grads(st: &Setting) -> [f64; 2] {
    let a = st.arch;
    let fused = match st.job.runtime.transformers {
        Some(t) => t >= (5, 0),
        None => st.ends.of(bounds::Mechanism::ExpertLoop) != bounds::End::Low,
    };
    let applies = a.experts > 1
        && fused
        && transformers_modules(st.t)
        && st.t.mode == TrainingMode::Full
        && st.zero == 0
        && !st.inference;
    if !applies {
        return [0.0; 2];
    }
    let one = a.experts as f64 * a.intermediate as f64 * st.h / st.tp * st.r.grad;
    let up = a.mlp.input_projections() as f64;
    [up * one, one]
}

/// The head's and the embedding's gradients on this rank, where the
/// experts' are placed (`expert_grads`): a tied table's is made at the head.
fn edge_grads(st: &Setting) -> [f64; 2] {
    if expert_grads(st)[0] <= 0.0 {
        return [0.0; 2];
    }
    let bytes = |elems: u64| elems as f64 / st.tp * st.r.grad;
    let (head, embedding) = (bytes(st.counts.head), bytes(st.counts.embedding));
    let head = if st.last { head } else { 0.0 };
    let embedding = if st.first { embedding } else { 0.0 };
    if st.arch.tied {
        [head.max(embedding), 0.0]
    } else {
        [head, embedding]
    }
}

/// The model runs Transformers' modules: every stack but those that build
/// their own (LitGPT, torchtune, torchtitan, Megatron); a chunked loss is
/// computed apart but over the same modules.
fn transformers_modules(t: &TrainingSpec) -> bool {
    use crate::api::Stack;
    !matches!(
        t.stack,
        Some(Stack::Litgpt | Stack::Torchtune | Stack::Torchtitan | Stack::Megatron)
    )
}

/// The batch's tensors and what the model keeps beside its parameters.
fn inputs(st: &Setting, target_tokens: f64) -> f64 {
    let (t, s) = (st.t, st.s);
    // A padded batch's additive attention mask (saved once for every layer)
    // and the model's buffers besides its parameters.
    let mask =
        if !st.inference && activations::attention_kind(st.arch, t.attention) != Attention::Flash {
            st.b * (s / st.cp) * s * st.elem
        } else {
            0.0
        };
    let unmodelled = bounds::unmodelled_saved(
        st.ends,
        &Facts::of(st.job),
        mask,
        s * s
            + 32.0 * MIB
            + st.counts.largest_matrix.max(st.counts.embedding) as f64 / st.tp * st.r.weight,
    );
    // ---- Inputs ----
    // input_ids and labels (int64), plus data kept on the GPU.
    // With a target apart from the source, its labels and decoder input ids.
    (st.tokens + target_tokens) * 8.0 * st.cp + t.data_on_gpu_bytes as f64 + unmodelled
}

// ---- Communication buffers ----
/// Gradient buckets and reduce-scatter buffers.
fn comm(st: &Setting, w: &Weights, g: &States) -> f64 {
    let r = &st.r;
    if st.dp > 1.0 && !st.inference && w.trainable > 0.0 {
        match (st.p.strategy, st.zero) {
            // DDP copies gradients into flat buckets (gradient_as_bucket_view=false).
            (Strategy::Ddp, 0) => g.grads_full,
            (Strategy::Deepspeed, 1 | 2) => {
                (DEEPSPEED_BUCKET_ELEMENTS * r.grad * 2.0).min(2.0 * g.grads_full)
            }
            // Reduce-scatter of one block's gradients.
            (_, _) => {
                2.0 * st.counts.block_linear as f64 / st.tp * r.grad * w.trainable
                    / w.stage_params.max(1.0)
            }
        }
    } else {
        0.0
    }
}

// ---- Tensor bookkeeping ----
/// Requests of at least this many bytes get a segment of their own, rounded
/// up to 2 MiB; smaller ones share 20 MiB segments (`kMinLargeAlloc`,
/// `get_allocation_size`, c10/cuda/CUDACachingAllocator.cpp, pytorch/pytorch
/// @ 001074d25084fdb87a799823e395a50f5ec044d3).
const OWN_SEGMENT: f64 = 10.0 * MIB;

/// Tensors counted for the 2 MiB rounding of their segments (nine per
/// block, in every copy: stored, gradient, optimizer states and one at the
/// compute dtype), those of them that do get a segment of their own, and the
/// largest tensor.
///
/// A copy of at least [`OWN_SEGMENT`] bytes gets its own segment and loses
/// `ROUNDING_PER_TENSOR` on average to its rounding; smaller ones (the
/// norms, and every matrix of a small model: BERT-base's 768 x 3072 is
/// 4.5 MiB in bf16) are packed into shared 20 MiB segments and lose nothing
/// to it (`bounds::rounded_tensors`).
fn tensors(st: &Setting, trainable: f64, l: &Logits) -> (f64, f64, f64) {
    let (t, a, r) = (st.t, st.arch, &st.r);
    let (h, tp) = (st.h, st.tp);
    let q = (a.heads * a.head_dim) as f64 / tp;
    let kv = (a.kv_heads * a.head_dim) as f64 / tp;
    let mlp_matrices = a.mlp.matrices() as f64 * a.experts.max(1) as f64;
    // (elements, how many) of one block's matrices on this rank.
    let i = a.intermediate as f64 / tp;
    let matrices = [(h * q, 2.0), (h * kv, 2.0), (h * i, mlp_matrices)];
    let mut copies = vec![r.weight, st.elem];
    if trainable > 0.0 && t.mode == TrainingMode::Full {
        copies.push(r.grad);
        let states = match t.optimizer {
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum => 1,
            _ => 2,
        };
        copies.extend(std::iter::repeat_n(r.state, states));
    }
    let own_per_block: f64 = copies
        .iter()
        .flat_map(|bytes| matrices.iter().map(move |(n, k)| (n * bytes, *k)))
        .filter(|(bytes, _)| *bytes >= OWN_SEGMENT)
        .map(|(_, k)| k)
        .sum();
    let per_block_tensors = 9.0;
    let large_tensors = st.stage_blocks * per_block_tensors * copies.len() as f64;
    let own_segment = (st.stage_blocks * own_per_block).min(large_tensors);
    let logits_tensor = if st.last && st.lm_head() && !st.inference {
        match t.loss {
            Loss::Standard => l.logit_tokens * l.vocab_rank * 4.0,
            Loss::Chunked => st.b * l.chunk_tokens * l.vocab_rank * 4.0,
        }
    } else {
        0.0
    };
    let (s, cp) = (st.s, st.cp);
    let scores = if activations::attention_kind(st.arch, t.attention) == Attention::Eager {
        st.b * (st.arch.heads as f64 / st.tp) * (s / cp) * (s / cp) * 4.0
    } else {
        0.0
    };
    let largest_tensor = (st.largest_matrix * st.r.weight.max(st.elem))
        .max(logits_tensor)
        .max(scores)
        .max(st.tokens * st.i_width * st.elem)
        .max(st.b * s * 8.0);
    (large_tensors, own_segment, largest_tensor)
}

/// Autocast casts and saved dequantized weights: the share of blocks that are
/// not checkpointed (a checkpointed block's are dropped and recomputed).
fn uncheckpointed_share(t: &TrainingSpec) -> f64 {
    let every = t.checkpoint_every.unwrap_or(1).max(1) as f64;
    match t.gradient_checkpointing {
        crate::api::Checkpointing::None | crate::api::Checkpointing::Selective => 1.0,
        crate::api::Checkpointing::Full | crate::api::Checkpointing::OpSelective => {
            (every - 1.0) / every
        }
    }
}
