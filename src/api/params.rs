//! Parameter counts of a transformer, by part, with checked arithmetic: the
//! dimensions come from users, so every product may overflow.

use super::arch::{Arch, Kind, Mlp, Norm};
use crate::api::Head;

/// Parameters by part. `linear` is what weight quantization applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub total: u64,
    /// Token, position and token-type embeddings.
    pub embedding: u64,
    /// Output head (0 when tied to the embedding, except a classification head).
    pub head: u64,
    /// Matrices of one average block (attention + MLP incl. all experts).
    pub block_linear: u64,
    /// All block matrices of the model.
    pub linear: u64,
    /// Biases and norm weights of the whole model (never quantized).
    pub small: u64,
    /// The largest single weight matrix (elements).
    pub largest_matrix: u64,
    /// The largest weight matrix inside a block (elements): the embedding
    /// and the head left out.
    pub largest_block_matrix: u64,
}

fn mul(a: u64, b: u64) -> Option<u64> {
    a.checked_mul(b)
}

fn add(a: u64, b: u64) -> Option<u64> {
    a.checked_add(b)
}

/// Matrices and small parameters of one self-attention sub-block.
fn attention(a: &Arch) -> Option<(u64, u64, u64)> {
    let q = mul(a.heads, a.head_dim)?;
    let kv = mul(a.kv_heads, a.head_dim)?;
    let qkv_out = add(q, mul(kv, 2)?)?;
    let matrices = add(mul(a.hidden, qkv_out)?, mul(q, a.hidden)?)?;
    let mut small = 0;
    if a.qkv_bias {
        small = add(small, qkv_out)?;
    }
    if a.linear_bias {
        small = add(small, a.hidden)?;
    }
    let largest = mul(a.hidden, qkv_out.max(q))?;
    Some((matrices, small, largest))
}

/// Matrices, small parameters and largest matrix of one dense MLP of width `i`.
fn dense_mlp(a: &Arch, i: u64) -> Option<(u64, u64, u64)> {
    let per_matrix = mul(a.hidden, i)?;
    let n = a.mlp.matrices();
    let small = if a.linear_bias {
        match a.mlp {
            Mlp::Gated => add(mul(i, 2)?, a.hidden)?,
            Mlp::Standard => add(i, a.hidden)?,
        }
    } else {
        0
    };
    Some((mul(per_matrix, n)?, small, per_matrix))
}

/// Matrices and small parameters of one MLP: dense, or an MoE layer's
/// experts, router and shared experts.
fn mlp(a: &Arch) -> Option<(u64, u64, u64)> {
    let (one, one_small, largest) = dense_mlp(a, a.intermediate)?;
    if a.experts == 0 {
        return Some((one, one_small, largest));
    }
    // Routed experts and the router (hidden → experts).
    let mut matrices = add(mul(one, a.experts)?, mul(a.hidden, a.experts)?)?;
    let mut small = mul(one_small, a.experts)?;
    let mut largest = largest;
    if a.shared_intermediate > 0 {
        let (m, s, l) = dense_mlp(a, a.shared_intermediate)?;
        matrices = add(matrices, m)?;
        small = add(small, s)?;
        largest = largest.max(l);
    }
    Some((matrices, small, largest))
}

fn norm_params(a: &Arch) -> Option<u64> {
    match a.norm {
        Norm::LayerNorm => mul(a.hidden, 2),
        Norm::RmsNorm => Some(a.hidden),
    }
}

/// Count the parameters of `arch` with the given head.
pub fn count(a: &Arch, head: Head, num_labels: u64) -> Option<Counts> {
    let (attn_m, attn_s, attn_l) = attention(a)?;
    let (mlp_m, mlp_s, mlp_l) = mlp(a)?;
    let norm = norm_params(a)?;
    let norms_per_block = if a.parallel_block { 1 } else { 2 } + if a.post_norms { 2 } else { 0 };

    let enc_block_m = add(attn_m, mlp_m)?;
    let enc_block_s = add(add(attn_s, mlp_s)?, mul(norm, norms_per_block)?)?;
    // Leading dense blocks of an MoE model (DeepSeek's first_k_dense_replace).
    let dense = a.layers.saturating_sub(a.moe_layers());
    let routed = a.layers - dense;
    let (dense_m, dense_s, dense_l) = if dense > 0 && a.experts > 0 {
        dense_mlp(a, a.dense_intermediate)?
    } else {
        (mlp_m, mlp_s, mlp_l)
    };
    let dense_block_m = add(attn_m, dense_m)?;
    let dense_block_s = add(add(attn_s, dense_s)?, mul(norm, norms_per_block)?)?;
    let mut linear = add(mul(enc_block_m, routed)?, mul(dense_block_m, dense)?)?;
    let mut small = add(mul(enc_block_s, routed)?, mul(dense_block_s, dense)?)?;
    let mut blocks = a.layers;
    if a.kind == Kind::EncoderDecoder {
        // Decoder blocks add cross-attention and its norm.
        let dec_m = add(enc_block_m, attn_m)?;
        let dec_s = add(add(enc_block_s, attn_s)?, norm)?;
        linear = add(linear, mul(dec_m, a.decoder_layers)?)?;
        small = add(small, mul(dec_s, a.decoder_layers)?)?;
        // Final norm of the encoder stack.
        small = add(small, norm)?;
        blocks = add(blocks, a.decoder_layers)?;
    }
    // Final norm.
    small = add(small, norm)?;

    let mut embedding = mul(a.vocab, a.hidden)?;
    embedding = add(embedding, mul(a.max_positions, a.hidden)?)?;
    embedding = add(embedding, mul(a.type_vocab, a.hidden)?)?;
    if a.kind == Kind::Encoder {
        // BERT-style embedding LayerNorm.
        small = add(small, norm)?;
    }

    let head_params = match head {
        Head::Lm if a.tied => 0,
        Head::Lm => mul(a.vocab, a.hidden)?,
        Head::Classification => add(mul(a.hidden, num_labels)?, num_labels)?,
        Head::None => 0,
    };
    if head == Head::Lm && a.kind == Kind::Encoder {
        // Masked-LM head transform (dense + LayerNorm) and decoder bias.
        small = add(small, add(add(a.hidden, norm)?, a.vocab)?)?;
        linear = add(linear, mul(a.hidden, a.hidden)?)?;
    }
    if head == Head::Classification && a.kind == Kind::Encoder {
        // Pooler dense layer.
        linear = add(linear, mul(a.hidden, a.hidden)?)?;
        small = add(small, a.hidden)?;
    }

    let total = add(add(add(embedding, head_params)?, linear)?, small)?;
    let largest_matrix = attn_l
        .max(mlp_l)
        .max(dense_l)
        .max(mul(a.vocab, a.hidden)?)
        .max(head_params);
    Some(Counts {
        total,
        embedding,
        head: head_params,
        block_linear: enc_block_m
            .max(dense_block_m)
            .max(linear.checked_div(blocks.max(1)).unwrap_or(0)),
        linear,
        small,
        largest_matrix,
        largest_block_matrix: attn_l.max(mlp_l).max(dense_l),
    })
}

/// An MLP projection that LoRA can target in `a`.
fn is_mlp_target(a: &Arch, t: &str) -> bool {
    matches!(t, "up_proj" | "down_proj") || (t == "gate_proj" && a.mlp == Mlp::Gated)
}

/// Trainable LoRA parameters for `targets` of rank `rank`. The MLP targets
/// match every expert's projections, the shared experts' and the leading
/// dense blocks' (PEFT matches module names, which all of them share).
pub fn lora(a: &Arch, rank: u64, targets: &[String]) -> Option<u64> {
    let q = mul(a.heads, a.head_dim)?;
    let kv = mul(a.kv_heads, a.head_dim)?;
    let h = a.hidden;
    // One MLP projection's LoRA pair per block kind, times how many there are.
    let routed_layers = a.moe_layers();
    let dense_layers = a.layers.saturating_sub(routed_layers);
    let dense_width = if a.experts > 0 && dense_layers > 0 {
        a.dense_intermediate
    } else {
        a.intermediate
    };
    // (width, count) of the MLPs of every block: dense blocks' one MLP; MoE
    // blocks' experts and shared MLP.
    let mlps: [(u64, u64); 3] = [
        (dense_width, dense_layers),
        (a.intermediate, mul(routed_layers, a.experts)?),
        (
            a.shared_intermediate,
            if a.shared_intermediate > 0 {
                routed_layers
            } else {
                0
            },
        ),
    ];
    let mut attention = 0u64;
    let mut total = 0u64;
    for t in targets {
        let (inp, out) = match t.as_str() {
            "q_proj" => (h, q),
            "k_proj" | "v_proj" => (h, kv),
            "o_proj" => (q, h),
            "lm_head" => {
                total = add(total, mul(rank, add(h, a.vocab)?)?)?;
                continue;
            }
            "gate_proj" if a.mlp == Mlp::Gated => (h, h),
            "up_proj" | "down_proj" => (h, h),
            _ => continue,
        };
        if !is_mlp_target(a, t) {
            attention = add(attention, mul(rank, add(inp, out)?)?)?;
            continue;
        }
        // An MLP projection: hidden on one side, the MLP's width on the other.
        for (width, count) in mlps {
            total = add(total, mul(mul(rank, add(h, width)?)?, count)?)?;
        }
    }
    let blocks = add(a.layers, a.decoder_layers)?;
    // Encoder-decoder decoders repeat the dense MLP.
    if a.decoder_layers > 0 {
        let per = targets
            .iter()
            .filter(|t| {
                matches!(t.as_str(), "up_proj" | "down_proj")
                    || (t.as_str() == "gate_proj" && a.mlp == Mlp::Gated)
            })
            .count() as u64;
        total = add(
            total,
            mul(
                mul(per, mul(rank, add(h, a.intermediate)?)?)?,
                a.decoder_layers,
            )?,
        )?;
    }
    add(mul(attention, blocks)?, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::presets::PRESETS;

    #[test]
    fn every_preset_counts_to_its_published_size() {
        let mut bad = Vec::new();
        for p in PRESETS {
            let ours = count(&p.arch, Head::Lm, 2).unwrap().total as f64;
            let published = p.published_parameters as f64;
            let err = ours / published - 1.0;
            // Encoders' published counts carry a pooler instead of the MLM
            // transform, and a few models have extra norms: 1 % covers both.
            if err.abs() > 0.01 {
                bad.push(format!(
                    "{}: ours {ours:.0} vs {published:.0} ({:+.2}%)",
                    p.name,
                    err * 100.0
                ));
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn llama_3_8b_is_exact() {
        let p = crate::api::presets::find("llama-3-8b").unwrap();
        assert_eq!(count(&p.arch, Head::Lm, 2).unwrap().total, 8_030_261_248);
    }

    #[test]
    fn overflowing_dims_give_none() {
        let mut a = crate::api::presets::find("gpt2").unwrap().arch;
        a.hidden = u64::MAX / 2;
        assert!(count(&a, Head::Lm, 2).is_none());
    }

    #[test]
    fn lora_counts_rank_times_in_plus_out() {
        let a = crate::api::presets::find("llama-2-7b").unwrap().arch;
        let n = lora(&a, 8, &["q_proj".into(), "v_proj".into()]).unwrap();
        assert_eq!(n, 32 * 2 * 8 * (4096 + 4096));
    }

    #[test]
    fn lora_on_an_mlp_projection_counts_every_expert_the_shared_ones_and_dense_blocks() {
        let a = crate::api::presets::find("deepseek-moe-16b").unwrap().arch;
        let (r, h) = (8, 2048);
        let got = lora(&a, r, &["down_proj".to_string()]).unwrap();
        // One dense block (10944 wide), 27 MoE blocks of 64 experts (1408 wide)
        // and their shared MLP (2 × 1408 wide).
        let want = r * (h + 10944) + 27 * 64 * r * (h + 1408) + 27 * r * (h + 2816);
        assert_eq!(got, want);
        let attention = lora(&a, r, &["q_proj".to_string()]).unwrap();
        assert_eq!(attention, 28 * r * (h + h));
    }
}
