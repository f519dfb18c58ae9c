//! A transformer stage's head and loss: the logits and what the loss keeps
//! of them through backward.

use super::{Setting, loss_chunk_tokens};
use crate::api::Loss;
use crate::estimate::bounds::{self, Facts};

/// The logits of the stage's head, in bytes unless named.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Logits {
    /// Positions the head runs over, and the vocabulary on this rank.
    pub(super) logit_tokens: f64,
    pub(super) vocab_rank: f64,
    /// Tokens per loss chunk.
    pub(super) chunk_tokens: f64,
    pub(super) forward: f64,
    pub(super) backward: f64,
    /// Logits the training loop still holds once the loss's backward is done.
    pub(super) kept: f64,
}

/// The logits of the last stage's LM head and what its loss keeps, over
/// `target_tokens` positions (nothing on other stages, or when not training).
pub(super) fn logits(st: &Setting, target_tokens: f64) -> Logits {
    let (t, profile, elem, s, cp) = (st.t, st.profile, st.elem, st.s, st.cp);
    let logit_tokens = target_tokens;
    let vocab_rank = st.vocab_rank;
    let (mut logits_forward, mut logits_backward) = (0.0, 0.0);
    // The model's own logits, while the loop holds them through backward.
    let held = bounds::logits_held(
        st.ends,
        &Facts::of(st.job),
        profile.logits_kept,
        profile.own_loss,
        elem,
    );
    let chunk_tokens = loss_chunk_tokens(profile.loss_chunking, s / cp);
    if st.last && st.lm_head() && !st.inference {
        match t.loss {
            Loss::Standard => {
                // lm_head output, fp32 upcast for the loss, fp32 log-softmax
                // saved for backward. Backward through the log-softmax holds
                // three fp32 planes: its saved output, the gradient nll_loss
                // hands it and the gradient it produces (measured on the
                // meta-device reference, benches/reference).
                let upcast = if elem < 4.0 { 4.0 } else { 0.0 };
                let copies = // A Transformers release that copies the shifted logits.
                    bounds::logits_extra_bytes(st.ends, &Facts::of(st.job), profile.own_loss, elem);
                logits_forward = logit_tokens * vocab_rank * (elem + upcast + 4.0 + copies);
                logits_backward = logit_tokens * vocab_rank * (held + 12.0);
            }
            Loss::Chunked => {
                // The 16-bit logits (kept per chunk) and each chunk's
                // log-softmax; the fp32 upcast is only ever one chunk wide.
                let chunk = st.b * chunk_tokens * vocab_rank * 8.0;
                // Under autocast the log-softmax runs, and is saved, in fp32.
                let saved = if st.mixed { 4.0 } else { elem };
                logits_forward = logit_tokens * vocab_rank * (elem + saved) + chunk;
                logits_backward =
                    logits_forward + chunk - logit_tokens * vocab_rank * (elem - held);
            }
        }
        if st.arch.final_softcap {
            // tanh(z / cap) keeps its 16-bit output per token for backward.
            let tanh = logit_tokens * vocab_rank * elem;
            logits_forward += tanh;
            logits_backward += tanh;
        }
    }
    let kept = if logits_backward > 0.0 {
        logit_tokens * vocab_rank * held
    } else {
        0.0
    };
    Logits {
        logit_tokens,
        vocab_rank,
        chunk_tokens,
        forward: logits_forward,
        backward: logits_backward,
        kept,
    }
}
