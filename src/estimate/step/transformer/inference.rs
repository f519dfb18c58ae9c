//! Generation: the KV cache of a transformer stage, at the prompt and at
//! the last generated token.

use super::Setting;
use crate::estimate::bounds;

/// What inference holds besides the weights, in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Decode {
    /// The KV cache for the prompt (or a cache allocated up front).
    pub(super) kv_cache: f64,
    /// The KV cache at its full length, and what the last token's step
    /// holds besides (its logits, the cache's growth copy).
    pub(super) kv_decode: f64,
    pub(super) decode_logits: f64,
    pub(super) decode_temp: f64,
    /// The head's logits at prefill.
    pub(super) prefill_logits: f64,
}

/// What generation holds over `blocks` blocks of the stage (nothing when
/// the job trains).
pub(super) fn decode(st: &Setting, blocks: f64) -> Decode {
    let mut d = Decode::default();
    if !st.inference {
        return d;
    }
    let (t, b, cp, elem, vocab_rank) = (st.t, st.b, st.cp, st.elem, st.vocab_rank);
    let lm_head = st.last && st.lm_head();
    // K and V of one block for one position of the batch.
    let kv_position = 2.0 * b * (st.arch.kv_heads * st.arch.head_dim) as f64 / st.tp * elem;
    let generation = t.generation.clone().unwrap_or_default();
    // K and V per block for the prompt (or a cache allocated up front).
    let positions = generation.cache_length.map_or(st.s / cp, |c| c as f64 / cp);
    d.kv_cache = blocks * kv_position * positions;
    if generation.new_tokens > 0 || generation.cache_length.is_some() {
        let full = generation
            .cache_length
            .unwrap_or(t.seq_len() + generation.new_tokens) as f64
            / cp;
        d.kv_decode = blocks * kv_position * full;
        // `generate` keeps the last position's logits as an fp32 copy
        // (`outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)`,
        // src/transformers/generation/utils.py) beside the head's output.
        d.decode_logits = if lm_head {
            b * vocab_rank * (elem + 4.0)
        } else {
            0.0
        };
        // A growing cache appends with `torch.cat` (`DynamicLayer.update`,
        // src/transformers/cache_utils.py): the new K (then V) of one block
        // exists beside the old one until it replaces it.
        d.decode_temp = if generation.cache_length.is_none() {
            kv_position / 2.0 * full
        } else {
            0.0
        };
    }
    // LitGPT and Transformers before 4.45 keep prefill logits for every
    // prompt position; since then generation asks the head for the last
    // position only (`logits_to_keep`): the low end of the logits copies.
    let positions = match st.ends.of(bounds::Mechanism::LogitsCopies) {
        bounds::End::Low => b,
        _ => st.tokens,
    };
    d.prefill_logits = if lm_head {
        positions * vocab_rank * elem
    } else {
        0.0
    };
    d
}
