//! A transformer stage's gradients and optimizer states.

use super::Setting;
use super::weights::Weights;
use crate::api::{Offload, Optimizer, TrainingMode};
use crate::estimate::step::optimizer::{offloaded_gradients, optimizer_bytes};

/// Gradients and optimizer states of the stage on this rank, in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct States {
    pub(super) grads: f64,
    /// Every gradient, before the optimizer in backward or offload frees them.
    pub(super) grads_full: f64,
    pub(super) grads_live_in_backward: f64,
    /// The embedding's gradient where backward makes it after every block.
    pub(super) grads_after_blocks: f64,
    /// What the embedding's backward holds beside every gradient.
    pub(super) tail_temp: f64,
    pub(super) optimizer: f64,
    pub(super) optimizer_paged: f64,
    pub(super) optimizer_temp: f64,
}

pub(super) fn states(st: &Setting, w: &Weights) -> States {
    let mut g = gradients(st, w);
    optimizer(st, w, &mut g);
    g
}

/// Gradients on this rank: every one of them, and what backward and the
/// optimizer step hold.
pub(super) fn gradients(st: &Setting, w: &Weights) -> States {
    let (t, r, dp, zero) = (st.t, &st.r, st.dp, st.zero);
    let largest_matrix = st.largest_matrix;
    let mut grads = w.trainable * r.grad;
    if zero >= 2 {
        grads /= dp;
    }
    let grads_full = grads;
    let mut grads_live_in_backward = if t.mode == TrainingMode::Full && st.last && st.lm_head() {
        // The LM head's gradient is the first one backward produces (a
        // classifier's is small, and a tied embedding's then comes last).
        (w.head.max(if st.arch.tied { w.embedding } else { 0.0 })) * r.grad
            / if zero >= 2 { dp } else { 1.0 }
    } else {
        0.0
    };
    if t.optimizer_in_backward {
        // The step runs per parameter as soon as its gradient is ready.
        grads = (largest_matrix * r.grad).min(grads_full);
        grads_live_in_backward = grads_live_in_backward.min(grads);
    }
    if let Some(g) = offloaded_gradients(st.job, largest_matrix.min(w.trainable) * r.grad) {
        grads = grads.min(g);
        grads_live_in_backward = grads_live_in_backward.min(grads);
    }
    let (grads_after_blocks, tail_temp) = embedding_backward(st, w);
    States {
        grads,
        grads_full,
        grads_live_in_backward,
        grads_after_blocks: grads_after_blocks.min(grads),
        tail_temp,
        ..States::default()
    }
}

/// The token embedding's backward, the last of the step: (the gradient it
/// makes that is not live before it, what it holds beside every gradient).
///
/// Its gradient is a new `vocab x hidden` tensor (`embedding_dense_backward`;
/// the embedding runs outside autocast, so in the weight's dtype).
/// - Untied: `AccumulateGrad` keeps it as `.grad` (no `.grad` yet, PyTorch's
///   `zero_grad(set_to_none=True)`), so it exists only from the end of
///   backward, after the first block's backward has freed its activations.
/// - Tied to the head: the head's gradient of the same parameter waits in
///   the engine's input buffer from the head's backward on (counted with
///   the gradients live in backward), and the new one is added into it in
///   place (torch/csrc/autograd/input_buffer.cpp, `accumulate`, "If we hold
///   the last reference to `old_var`..."): one gradient-sized transient.
/// - Accumulating: the summed gradient is then added into the existing
///   `.grad` in place (torch/csrc/autograd/functions/accumulate_grad.h), one
///   more transient.
///
/// Measured on an H200 (`benches/ground-truth`, Gemma 2 at 2304 x 256000,
/// tied, bf16 autocast, SGD with momentum): the steady step peaks 2.45 GB
/// over the stored weights, gradients and momentum, one fp32 embedding-sized
/// tensor (2.36 GB) and the cuBLAS workspace; Phi at 2048 x 51200, untied,
/// fused AdamW: 73 MB over the weights, gradients and states. The meta-device reference keeps
/// two such transients at `backward:tail` for tied models: its `add` of the
/// buffer is out of place.
///
/// DeepSpeed, Megatron, ZeRO/FSDP sharding, the optimizer in backward and
/// offloaded gradients keep their own buffers: there the largest matrix's
/// gradient is counted as a transient at every end, as before.
fn embedding_backward(st: &Setting, w: &Weights) -> (f64, f64) {
    let (t, r) = (st.t, &st.r);
    if t.mode != TrainingMode::Full || !st.first {
        return (0.0, 0.0);
    }
    let special = !st.strategy_is_torch
        || st.zero > 0
        || t.optimizer_in_backward
        || st.p.offload != Offload::None;
    if special {
        return (0.0, st.largest_matrix * r.grad);
    }
    let grad = w.embedding * r.grad;
    let tied = st.arch.tied && st.last && st.lm_head() && w.head == 0.0;
    let summed = if st.accumulating { grad } else { 0.0 };
    match (tied, st.accumulating) {
        (true, _) => (0.0, grad + summed),
        (false, true) => (0.0, summed),
        (false, false) => (grad, 0.0),
    }
}

/// The optimizer's states and the step's temporaries, into `g`.
pub(super) fn optimizer(st: &Setting, w: &Weights, g: &mut States) {
    let (t, r, dp, arch, tp) = (st.t, &st.r, st.dp, st.arch, st.tp);
    let (largest_matrix, trainable, stage_blocks) =
        (st.largest_matrix, w.trainable, st.stage_blocks);
    let (opt_alloc, opt_paged, opt_temp) = optimizer_bytes(st.job, st.profile, r, st.h);
    let mut optimizer = trainable * opt_alloc;
    let mut optimizer_paged = trainable * opt_paged;
    let mut optimizer_temp = trainable * opt_temp;
    if t.optimizer == Optimizer::Adamw4bit {
        // One tensor's moments dequantized to fp32 during its update.
        optimizer_temp += largest_matrix.min(trainable) * 8.0;
    }
    if let Some((projected, matrices)) = st.method.galore_block_state_elements(arch) {
        // GaLore: the block matrices' states are the projected ones; the
        // rest (embedding, head, norms) keep the optimizer's own.
        let per_param = (opt_alloc - r.master).max(0.0) / 2.0;
        let block_matrices = matrices * stage_blocks / tp;
        let projected = projected * stage_blocks / tp;
        let full_states = (trainable - block_matrices).max(0.0);
        optimizer = trainable * r.master + (full_states * 2.0 + projected) * per_param;
        optimizer_temp = optimizer_temp.min(projected * per_param);
    }
    if st.zero >= 1 {
        optimizer /= dp;
        optimizer_paged /= dp;
        optimizer_temp /= dp;
    }
    if matches!(
        st.p.offload,
        Offload::Optimizer | Offload::OptimizerAndParameters
    ) {
        optimizer = 0.0;
        optimizer_paged = 0.0;
        optimizer_temp = 0.0;
    }
    if t.optimizer_in_backward {
        optimizer_temp = optimizer_temp.min(largest_matrix * r.state);
    }
    g.optimizer = optimizer;
    g.optimizer_paged = optimizer_paged;
    g.optimizer_temp = optimizer_temp;
}
