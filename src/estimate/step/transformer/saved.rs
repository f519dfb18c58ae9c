//! What a transformer stage's blocks keep for backward, and what they hold
//! for a moment while they run (the temporaries).

use super::weights::Weights;
use super::{Setting, uncheckpointed_share};
use crate::api::arch::{Kind, Mlp};
use crate::api::{Checkpointing, Quantization, TrainingMode};
use crate::estimate::activations::{self, ActContext};
use crate::estimate::bounds;
use crate::estimate::peft;
use crate::estimate::pipeline::{self, Rank};
use crate::estimate::stacks::QuantLibrary;
use crate::estimate::step::{float8, quant};

/// The blocks' saved tensors, in bytes unless named.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Saved {
    /// Bytes per token of one whole block (what a recomputed block holds).
    pub(super) full_block: f64,
    /// Encoder (or decoder-only) blocks and decoder blocks of the stage.
    pub(super) enc_blocks: f64,
    pub(super) dec_blocks: f64,
    /// Tokens the decoder of an encoder-decoder runs over (else `tokens`).
    pub(super) target_tokens: f64,
    /// Every micro-batch in flight's saved tensors.
    pub(super) activations: f64,
    /// One whole block's activations.
    pub(super) layer_activations: f64,
    /// What backward of a checkpointed block recomputes (0 without checkpointing).
    pub(super) recompute: f64,
}

/// What the activation model reads of the job and the stack.
pub(super) fn act_context<'a>(st: &'a Setting) -> ActContext<'a> {
    let (job, t, profile, ends, arch) = (st.job, st.t, st.profile, st.ends, st.arch);
    let lora_targets = peft::lora_targets(job);
    ActContext {
        elem: st.elem,
        mixed: st.mixed,
        weights_trainable: t.mode == TrainingMode::Full,
        quantized: job.quantization != Quantization::None,
        // bitsandbytes' and AWQ's autograd Functions save the input; GPTQ's
        // torch kernel saves the dequantized weight instead (`saved`'s
        // `block_dequant`).
        quantized_input_saved: match job.quantization {
            Quantization::Gptq => false,
            Quantization::Awq => true,
            _ => profile.quantization == QuantLibrary::Bitsandbytes,
        },
        quantized_input_bytes: bounds::quantized_input_bytes(ends),
        frozen_linear_saves_input: profile.frozen_linear_saves_input,
        lora_dropout_per_module: profile.lora_dropout_per_module,
        peft: &st.method,
        checkpoint_every: t.checkpoint_every.unwrap_or(1).max(1) as f64,
        attention: t.attention,
        sdpa_math: bounds::sdpa_math_fallback(
            ends,
            job,
            arch,
            profile.own_loss,
            st.gpu.architecture,
        ),
        compiled: bounds::compiled_activations(ends, job, arch),
        sequence: st.s / st.cp,
        tensor_parallel: st.tp,
        sequence_parallel: st.p.sequence_parallel,
        lora_rank: job.lora.as_ref().map(|l| l.rank as f64).unwrap_or(0.0),
        lora_targets,
        lora_dropout: job.lora.as_ref().is_some_and(|l| l.dropout > 0.0),
        scaled_linears: peft::adapter_scales_linears(t.mode, arch, t.trainable_parameters),
        act: activations::act_under(arch, profile.own_loss),
    }
}

/// The saved tensors of every block of the stage, times the micro-batches
/// in flight.
pub(super) fn saved(st: &Setting, w: &Weights, ctx: &ActContext) -> Saved {
    let (t, arch, tokens, elem, tp) = (st.t, st.arch, st.tokens, st.elem, st.tp);
    let full_block = activations::block_bytes_per_token(arch, ctx, false);
    let kept_enc = activations::kept_bytes_per_token(arch, ctx, t.gradient_checkpointing, false);
    let kept_dec = activations::kept_bytes_per_token(arch, ctx, t.gradient_checkpointing, true);
    let enc_blocks = arch.layers as f64 * st.stage_share;
    let dec_blocks = arch.decoder_layers as f64 * st.stage_share;
    let kept_enc_blocks = kept_encoder_blocks(st, ctx, enc_blocks);
    // An encoder-decoder's decoder runs over the target tokens; its
    // cross-attention keeps the encoder's projected keys and values, one
    // per source token, in every decoder block that is not checkpointed.
    let target_tokens = if arch.kind == Kind::EncoderDecoder {
        t.target_length.map_or(tokens, |l| st.b * l as f64 / st.cp)
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
        * bounds::saved_activations_share(st.ends);
    if st.last {
        per_microbatch += tokens * activations::final_norm_bytes_per_token(arch, ctx);
    }
    // A GPTQ kernel that dequantizes with tracked tensor ops keeps each
    // quantized linear's 16-bit weight for backward
    // (`bounds::dequantized_saved_share`): a block's worth in every block
    // that is not checkpointed, and in the block being recomputed.
    let block_dequant = if st.inference {
        0.0
    } else {
        bounds::dequantized_saved_share(st.ends, st.job.quantization)
            * st.counts.block_linear as f64
            / tp
            * elem
    };
    let dequant_kept_share = uncheckpointed_share(t);
    per_microbatch += block_dequant * (kept_enc_blocks + dec_blocks) * dequant_kept_share;
    if t.activation_offloading && t.gradient_checkpointing != Checkpointing::None {
        // Checkpointed inputs go to host memory; two blocks' stay for prefetch.
        per_microbatch =
            per_microbatch.min(2.0 * tokens * activations::block_input_bytes_per_token(arch, ctx));
    }
    let activations = in_flight_bytes(st, per_microbatch, kept_enc_blocks + dec_blocks);
    // During backward of a checkpointed block, that block is recomputed whole.
    let layer_activations = tokens * full_block;
    let recompute = if t.gradient_checkpointing == Checkpointing::None {
        0.0
    } else {
        // The recomputed block, with its autocast weight casts (or the fp8
        // weights its float8 linears keep, `bounds::float8_weight_saved`).
        let casts = if t.float8.is_some() {
            st.counts.block_linear as f64 / tp * bounds::float8_weight_saved(st.ends, t)
        } else if st.mixed && st.zero < 3 && st.strategy_is_torch && w.quant.is_none() {
            st.block_gathered
        } else {
            0.0
        };
        layer_activations + casts + block_dequant
    };
    Saved {
        full_block,
        enc_blocks,
        dec_blocks,
        target_tokens,
        activations,
        layer_activations,
        recompute,
    }
}

/// Encoder (or decoder-only) blocks that keep activations. A prefix adapter
/// on one stage: the blocks under the first adapted one keep nothing (with
/// pipeline stages every block is counted, the safe side).
pub(super) fn kept_encoder_blocks(st: &Setting, ctx: &ActContext, enc_blocks: f64) -> f64 {
    let adapted = if st.t.mode == TrainingMode::Adapter
        && !ctx.scaled_linears
        && st.pp <= 1.0
        && st.arch.kind == Kind::Decoder
    {
        st.method
            .adapted_top_blocks(st.arch, st.t.trainable_parameters)
    } else {
        None
    };
    adapted.map_or(enc_blocks, |n| n.min(enc_blocks))
}

/// What this stage's rank holds at its peak (`pipeline::in_flight`): rank 0
/// for the first stage (under a V schedule also the last), else rank p − 1.
pub(super) fn pipeline_in_flight(st: &Setting) -> pipeline::InFlight {
    let p = st.p;
    // The number of micro-batches per step, where globalBatchSize gives it.
    let m =
        st.t.global_batch_size
            .map(|_| st.job.gradient_accumulation_steps.max(1));
    let rank = if st.first { Rank::First } else { Rank::Last };
    pipeline::in_flight(
        p.pipeline_schedule,
        p.pipeline_parallel,
        p.virtual_stages,
        m,
        rank,
    )
}

/// Every micro-batch in flight's saved tensors, `per_microbatch` bytes
/// each over the stage's `blocks`: those between their input and weight
/// backward (zero-bubble schedules) keep what `bounds::split_backward_held`
/// says instead, and the loss's stage the gradient of each one's logits.
fn in_flight_bytes(st: &Setting, per_microbatch: f64, blocks: f64) -> f64 {
    let f = pipeline_in_flight(st);
    if f.split <= 0.0 {
        return per_microbatch * f.held;
    }
    let (q, kv) = (
        (st.arch.heads * st.arch.head_dim) as f64 / st.tp,
        (st.arch.kv_heads * st.arch.head_dim) as f64 / st.tp,
    );
    let mlp_in = st.arch.mlp.input_projections() as f64;
    // Per token of one block, in elements: the inputs of q/k/v (one
    // tensor), o, the MLP's input projections (one tensor) and its down
    // projection; the gradients of their outputs.
    let inputs = 2.0 * st.h + q + st.i_width;
    let grads = q + 2.0 * kv + st.h + mlp_in * st.i_width + st.h;
    let per_block = st.tokens * st.elem * blocks;
    let split = bounds::split_backward_held(
        st.ends,
        per_microbatch,
        inputs * per_block,
        grads * per_block,
    );
    let logit_grads = if st.last && st.lm_head() {
        f.extra_logit_grads * st.tokens * st.vocab_rank * st.elem
    } else {
        0.0
    };
    per_microbatch * (f.held - f.split) + split * f.split + logit_grads
}

/// What one block holds for a moment while it runs, in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Temporaries {
    pub(super) forward: f64,
    pub(super) backward: f64,
    /// While the loss and head run backward.
    pub(super) head: f64,
    /// The largest quantized linear's dequantized weight, in forward and in backward.
    pub(super) dequant: f64,
    pub(super) dequant_backward: f64,
}

/// One block's temporaries in forward and in backward, where backward
/// includes `recompute` (a checkpointed block run again).
pub(super) fn temporaries(st: &Setting, ctx: &ActContext, recompute: f64) -> Temporaries {
    let (t, arch, tokens, elem, tp) = (st.t, st.arch, st.tokens, st.elem, st.tp);
    let (i_width, largest_matrix) = (st.i_width, st.largest_matrix);
    let (dequant, dequant_backward) = quant::transients(
        st.job,
        st.profile.quantization,
        t.precision,
        largest_matrix,
        st.b,
    );
    let mlp_planes = match arch.mlp {
        Mlp::Gated => 3.0,
        Mlp::Standard => 2.0,
    };
    let (f8_forward, f8_backward) = float8_transients(st);
    let forward = tokens * elem * bounds::forward_temporaries(st.ends, i_width, mlp_planes)
        + dequant
        + f8_forward
        + st.method.forward_transient(arch, elem, ctx.lora_targets) / tp;
    // Gradients of one block's largest activations plus what is live beside
    // its largest matrix's gradient as backward makes it; the head's matrix
    // (the largest of the model where the vocabulary is large) only while
    // the head runs backward, once per loss chunk under a chunked loss.
    let block_grad_temp = weight_grad_transient(st, st.largest_block_matrix, false, false);
    let head_grad_temp = weight_grad_transient(
        st,
        largest_matrix,
        true,
        t.loss == crate::api::Loss::Chunked,
    );
    let scores_grad = activations::scores_grad(arch, ctx, tp);
    let backward =
        tokens * elem * bounds::backward_temporaries(st.ends, i_width, st.h, scores_grad)
            + dequant_backward
            + f8_backward
            + block_grad_temp
            + recompute;
    Temporaries {
        forward,
        backward,
        head: dequant + head_grad_temp,
        dequant,
        dequant_backward,
    }
}

/// What the largest float8 linear of a block casts while it runs
/// (`step::float8::transients`), `(forward, backward)`: the MLP's up (or
/// gate) projection, hidden in and intermediate out, or its down projection
/// the other way, whichever holds more. The weight reaches the function at
/// the stored dtype, or at the compute dtype where ZeRO-3 / FSDP gathers it.
fn float8_transients(st: &Setting) -> (f64, f64) {
    let Some(recipe) = st.t.float8 else {
        return (0.0, 0.0);
    };
    let i = st.arch.intermediate as f64 / st.tp;
    let weight_bytes = if st.zero == 3 { st.elem } else { st.r.weight };
    let saved = bounds::float8_weight_saved(st.ends, st.t);
    let of = |input, output| {
        let l = float8::Linear {
            tokens: st.tokens,
            input,
            output,
            weight_bytes,
        };
        float8::transients(recipe, l, st.elem, saved, st.t.float8_all_gather)
    };
    let (up, down) = (of(st.h, i), of(i, st.h));
    (up.0.max(down.0), up.1.max(down.1))
}

/// Bytes live beside a trainable matrix's gradient (of `matrix` elements)
/// while backward makes it, beyond the gradient itself.
///
/// - Autocast: the matmul's backward computes the gradient of the weight's
///   16-bit cast (`elem` bytes per element) and the cast's backward
///   (`ToCopyBackward0`) makes the gradient in the weight's dtype from it:
///   the 16-bit one is the transient. `cast_freed`: by then the engine has
///   released the cast the matmul saved (a node's saved tensors go when it
///   has run), and the phase counts that cast among the weights, so the
///   16-bit gradient only takes its place: the head's, whose phase counts
///   every cast (the meta-device reference's `backward:head` holds the stored
///   weights and every cast but the head's beside the head's 16-bit and
///   fp32 gradients).
/// - The gradient the engine hands `AccumulateGrad` becomes `.grad` as it is
///   when the parameter has none (`zero_grad(set_to_none=True)`, PyTorch's
///   default since 2.0): no copy (torch/csrc/autograd/functions/accumulate_grad.h,
///   `accumulateGrad`, "we aren't setting up for double-backward"). When a
///   `.grad` exists (gradient accumulation), it is added into it in place
///   and freed: one gradient-sized transient.
/// - `chunked`: a matrix used once per loss chunk (the head under a chunked
///   loss) gets one gradient per chunk in the compute dtype, each summed in
///   place into the engine's input buffer of the weight (or of its cast)
///   before the gradient is made (torch/csrc/autograd/input_buffer.cpp,
///   `accumulate`): one more `elem`-sized transient.
///
/// Measured on the meta-device reference (`benches/reference`,
/// `backward:head`): Phi's untied 51200 x 2048 head, 202 MiB of temporaries
/// beside its 400 MiB fp32 gradient under bf16 autocast, with the head's
/// 200 MiB cast gone; 4 MiB in fp32; Llama's tied 128256 x 2048 head with
/// two accumulated micro-batches, 1 505 MiB (its 501 MiB 16-bit gradient and
/// the 1 002 MiB fp32 one being added), its 501 MiB cast gone.
///
/// DeepSpeed, Megatron and ZeRO/FSDP sharding keep their own gradient
/// buffers: there the whole gradient in the gradient's dtype is counted, as
/// before this was known.
fn weight_grad_transient(st: &Setting, matrix: f64, cast_freed: bool, chunked: bool) -> f64 {
    if st.t.mode != TrainingMode::Full {
        return 0.0;
    }
    let r = &st.r;
    if !st.strategy_is_torch || st.zero > 0 {
        return matrix * r.grad;
    }
    let cast = if st.mixed && !cast_freed {
        matrix * st.elem
    } else {
        0.0
    };
    let per_chunk = if chunked { matrix * st.elem } else { 0.0 };
    let added = if st.accumulating {
        matrix * r.grad
    } else {
        0.0
    };
    cast + per_chunk + added
}
