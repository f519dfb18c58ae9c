//! A transformer stage's weights: what is stored, what trains, and the
//! transient copies the step makes of them (ZeRO-3/FSDP gathers, autocast's
//! 16-bit casts).

use super::{Setting, loss_chunk_tokens, uncheckpointed_share};
use crate::api::params;
use crate::api::{Loss, Offload, Stack, Strategy, TrainingMode};
use crate::estimate::bounds;
use crate::estimate::peft;
use crate::estimate::step::quant::quantized_bytes;
use crate::estimate::zero3;

/// The stage's weights and their transient copies, in bytes unless named.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Weights {
    /// Parameters (elements, on this rank) of the stage's block linears,
    /// token embedding, head, and biases and norms.
    pub(super) linear: f64,
    pub(super) embedding: f64,
    pub(super) head: f64,
    pub(super) small: f64,
    /// Bytes per element of quantized base linears (`None`: not quantized).
    pub(super) quant: Option<f64>,
    /// All the stage's parameters (elements, on this rank).
    pub(super) stage_params: f64,
    /// Trainable parameters (elements, on this rank).
    pub(super) trainable: f64,
    /// Stored weights, after ZeRO-3/FSDP sharding and offload.
    pub(super) weights: f64,
    pub(super) weight_transient: f64,
    /// The part of `weight_transient` that is autocast's 16-bit weight casts.
    pub(super) casts: f64,
    /// Gathered weights that stay unsharded through backward.
    pub(super) frozen_unsharded: f64,
    /// They are all unsharded from backward's start (else only at its end).
    pub(super) frozen_from_start: bool,
}

/// The stage's stored parameters, then their gathers and casts.
pub(super) fn weights(st: &Setting) -> Weights {
    let (counts, arch, tp, r) = (&st.counts, st.arch, st.tp, &st.r);
    let linear = counts.linear as f64 * st.stage_share / tp;
    let embedding = if st.first {
        counts.embedding as f64 / tp
    } else {
        0.0
    };
    let head = if st.last {
        if counts.head == 0 && arch.tied && st.pp > 1.0 && !st.first {
            // Tied head on a separate last stage keeps its own copy.
            counts.embedding as f64 / tp
        } else {
            counts.head as f64 / tp
        }
    } else {
        0.0
    };
    let small = counts.small as f64 * st.stage_share;
    let q_in = st.h;
    let quant = quantized_bytes(st.job, q_in);
    let base_linear_bytes = match quant {
        // GPTQ and AWQ checkpoints quantize the blocks' linears only; the
        // head stays in the checkpoint's 16-bit dtype.
        Some(qb) if st.job.quantization.is_prequantized() => linear * qb + head * r.weight,
        Some(qb) => (linear + head) * qb,
        None => (linear + head) * r.weight,
    };
    let base_bytes = base_linear_bytes + (embedding + small) * r.weight;
    let stage_params = linear + head + embedding + small;
    let trainable = trainable(st, stage_params);
    // Adapter weights are extra parameters (full training's are the base's own).
    let extra_params = match st.t.mode {
        TrainingMode::Lora | TrainingMode::Qlora | TrainingMode::Adapter => trainable,
        _ => 0.0,
    };
    let mut w = Weights {
        linear,
        embedding,
        head,
        small,
        quant,
        stage_params,
        trainable,
        weights: base_bytes + extra_params * r.weight,
        ..Weights::default()
    };
    gathers(st, &mut w);
    autocast_casts(st, &mut w);
    w
}

/// Trainable parameters of the stage, on this rank.
pub(super) fn trainable(st: &Setting, stage_params: f64) -> f64 {
    let (t, arch) = (st.t, st.arch);
    // PEFT's `modules_to_save` trains a full-size copy of each module it names
    // (`peft::modules_to_save_parameters`).
    let saved_modules = st.job.lora.as_ref().map_or(0.0, |l| {
        peft::modules_to_save_parameters(&l.modules_to_save, arch, st.first, st.last, st.tp)
    });
    let explicit = t.trainable_parameters.map(|v| v * st.stage_share / st.tp);
    let adapter_default = st.method.trainable_parameters(arch) * st.stage_share;
    match t.mode {
        TrainingMode::Inference => 0.0,
        TrainingMode::Full => explicit.unwrap_or(stage_params),
        TrainingMode::Lora | TrainingMode::Qlora => explicit.unwrap_or_else(|| {
            let l = st
                .job
                .lora
                .as_ref()
                .expect("validated lora modes carry lora");
            params::lora(arch, l.rank, &l.target_modules).unwrap_or(0) as f64 * st.stage_share
                / st.tp
                + saved_modules
        }),
        TrainingMode::Adapter => explicit.unwrap_or(adapter_default),
    }
}

/// ZeRO-3 / FSDP full shard: parameters sharded, two or three blocks
/// gathered (FSDP) or DeepSpeed's modules kept and prefetched;
/// offloaded parameters: only gathered blocks are on the GPU.
pub(super) fn gathers(st: &Setting, w: &mut Weights) {
    let (profile, block_gathered) = (st.profile, st.block_gathered);
    let (gathered, frozen_from_start) = bounds::gathered_units(st.ends);
    w.frozen_from_start = frozen_from_start;
    if st.zero == 3 && !st.inference {
        w.weights /= st.dp;
        // The block being computed plus the prefetched next one; every block
        // of the stage where FSDP keeps them gathered between a stage's
        // forward and its backward (`Profile::unsharded_stage_under_pp`).
        w.weight_transient += if st.p.strategy == Strategy::Deepspeed {
            // DeepSpeed gathers module by module, prefetches by a bucket of
            // elements and keeps forward's last modules (the head always)
            // into backward (`zero3`): not FSDP's whole blocks.
            let trace = zero3::Trace::of(st.arch, &st.counts, st.stage_blocks, st.first, st.last);
            let hf_auto = st.t.stack == Some(Stack::HfTrainer);
            zero3::deepspeed_gathered(&trace, st.h, hf_auto, st.ends) / st.tp * st.elem
        } else if profile.unsharded_stage_under_pp {
            block_gathered * st.stage_blocks.max(gathered)
        } else {
            gathered * block_gathered
        };
        if profile.frozen_units_stay_unsharded {
            // FSDP1 reshards a unit after backward from its gradient hook;
            // frozen units get no gradient, so without the reshard-only hook
            // they stay unsharded once backward has gathered them (16-bit
            // copies of every frozen weight).
            w.frozen_unsharded = (w.linear + w.head + w.embedding + w.small) * st.elem;
        }
    }
    if st.p.offload == Offload::OptimizerAndParameters {
        // Parameters live on the host; only gathered blocks are on the GPU.
        w.weights = 0.0;
        if st.inference {
            w.weight_transient += 2.0 * block_gathered;
        }
    }
}

/// Autocast casts every weight a matmul uses to 16 bit; the copies are
/// saved for backward, so all of them are live at the end of forward.
/// Quantized linears dequantize per call instead (a transient, in
/// `saved::temporaries`).
///
/// Float8 linears (`training.float8`, the blocks' linears; the head stays a
/// plain linear, as torchtitan's `filter_fqns = ["output"]` and Accelerate's
/// first-and-last filter keep it) take no autocast cast: `Float8Linear.forward`
/// casts its input to the autocast dtype and its weight straight to float8
/// without `F.linear`. What such a linear keeps of its weight is the fp8
/// copy (`bounds::float8_weight_saved`), held as the casts are.
pub(super) fn autocast_casts(st: &Setting, w: &mut Weights) {
    let (t, elem) = (st.t, st.elem);
    // A checkpointed block keeps none of its casts (its saved tensors are
    // dropped and recomputed; op-level selective checkpointing recomputes
    // casts too), so only the blocks that are not checkpointed hold theirs.
    let kept_share = uncheckpointed_share(t);
    let float8 = t.float8.is_some() && !st.inference;
    if float8 {
        let fp8_copies = w.linear * kept_share * bounds::float8_weight_saved(st.ends, t);
        w.weight_transient += fp8_copies;
        w.casts += fp8_copies;
    }
    let linear_casts = if float8 { 0.0 } else { w.linear * kept_share };
    if st.mixed && st.zero < 3 && st.strategy_is_torch && !st.inference && w.quant.is_none() {
        // A tied head multiplies by the embedding's matrix: its 16-bit cast is
        // saved by the head's matmul for the hidden states' gradient.
        let tied_head = if st.last && w.head == 0.0 && st.arch.tied && st.lm_head() {
            w.embedding
        } else {
            0.0
        };
        w.weight_transient += (linear_casts + w.head + tied_head) * elem;
        w.casts += (linear_casts + w.head + tied_head) * elem;
        // Autocast caches the cast only of weights that require grad: a
        // frozen head run once per loss chunk is cast, and saved, per chunk.
        if t.mode != TrainingMode::Full && t.loss == Loss::Chunked && st.last {
            let chunks = (st.s / st.cp / loss_chunk_tokens(st.profile.loss_chunking, st.s / st.cp))
                .ceil()
                .max(1.0);
            w.weight_transient += w.head * elem * (chunks - 1.0);
        }
    }
}
