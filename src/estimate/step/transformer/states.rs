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
    States {
        grads,
        grads_full,
        grads_live_in_backward,
        ..States::default()
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
