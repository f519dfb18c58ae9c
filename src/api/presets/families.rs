//! The families' shapes the catalog's entries are built from (GPT-2, BERT, Qwen2, Phi,
//! GPT-NeoX, Gemma 2, T5): what a family fixes, with the sizes left to each entry.

use crate::api::arch::{Act, Arch, Kind, Mlp, Norm};

/// GPT-2: learned positions (1024), LayerNorm, biases everywhere, fc 4x wide,
/// output head tied to the token embedding.
pub(super) const fn gpt2(layers: u64, hidden: u64, heads: u64) -> Arch {
    Arch {
        kind: Kind::Decoder,
        layers,
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate: 4 * hidden,
        vocab: 50257,
        mlp: Mlp::Standard,
        // config.json: "activation_function": "gelu_new"
        act: Act::GeluNew,
        tied: true,
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions: 1024,
        type_vocab: 0,
        parallel_block: false,
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// BERT / RoBERTa encoder: learned positions, token-type embeddings,
/// LayerNorm, biases everywhere.
pub(super) const fn bert(
    layers: u64,
    hidden: u64,
    heads: u64,
    intermediate: u64,
    vocab: u64,
    max_positions: u64,
    type_vocab: u64,
) -> Arch {
    Arch {
        kind: Kind::Encoder,
        layers,
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate,
        vocab,
        mlp: Mlp::Standard,
        act: Act::Fused,
        tied: true,
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions,
        type_vocab,
        parallel_block: false,
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// Qwen2.5: a Llama shape whose q/k/v projections carry a bias.
pub(super) const fn qwen2(
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    intermediate: u64,
    vocab: u64,
    tied: bool,
) -> Arch {
    Arch {
        qkv_bias: true,
        ..Arch::llama(
            layers,
            hidden,
            heads,
            kv_heads,
            hidden / heads,
            intermediate,
            vocab,
            tied,
        )
    }
}

/// Phi-1.5 / Phi-2: one shared LayerNorm feeding attention and MLP in
/// parallel, gelu MLP 4x wide, biases everywhere, untied head.
pub(super) const fn phi(layers: u64, hidden: u64, heads: u64, intermediate: u64) -> Arch {
    Arch {
        kind: Kind::Decoder,
        layers,
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate,
        vocab: 51200,
        mlp: Mlp::Standard,
        // config.json: "hidden_act": "gelu_new"
        act: Act::GeluNew,
        tied: false,
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions: 0,
        type_vocab: 0,
        parallel_block: true,
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// GPT-NeoX / Pythia: parallel residual, LayerNorm, biases everywhere, fc 4x
/// wide, untied head (`embed_out`).
pub(super) const fn neox(layers: u64, hidden: u64, heads: u64, vocab: u64) -> Arch {
    Arch {
        kind: Kind::Decoder,
        layers,
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate: 4 * hidden,
        vocab,
        mlp: Mlp::Standard,
        act: Act::Fused,
        tied: false,
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions: 0,
        type_vocab: 0,
        parallel_block: true,
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// Gemma 2: a Llama-shaped decoder (GeGLU, RMSNorm, tied head) with norms
/// after attention and the MLP and tanh soft-capping of the attention scores
/// and the final logits.
pub(super) const fn gemma2(llama: Arch) -> Arch {
    Arch {
        post_norms: true,
        attention_softcap: true,
        final_softcap: true,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
        ..llama
    }
}

/// T5 v1.0: equal encoder and decoder depth, d_kv 64, relu MLP, RMS-style
/// norm without bias, no linear biases, relative positions, tied head.
pub(super) const fn t5(layers: u64, hidden: u64, heads: u64, intermediate: u64) -> Arch {
    Arch {
        kind: Kind::EncoderDecoder,
        layers,
        decoder_layers: layers,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: 64,
        intermediate,
        vocab: 32128,
        mlp: Mlp::Standard,
        act: Act::Fused,
        tied: true,
        experts: 0,
        experts_per_token: 0,
        norm: Norm::RmsNorm,
        qkv_bias: false,
        linear_bias: false,
        max_positions: 0,
        type_vocab: 0,
        parallel_block: false,
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}
