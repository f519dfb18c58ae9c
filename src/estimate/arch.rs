//! The resolved shape of a model: what the estimator consumes, whatever the
//! user wrote (`preset`, `transformer` dims, later `hfConfig`). Pure data.

/// Which stacks a transformer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Causal decoder (GPT, Llama, ...).
    Decoder,
    /// Bidirectional encoder (BERT, RoBERTa).
    Encoder,
    /// Encoder plus decoder with cross-attention (T5).
    EncoderDecoder,
}

/// Feed-forward block shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mlp {
    /// gate_proj, up_proj, down_proj (SwiGLU / GeGLU): 3 matrices.
    Gated,
    /// fc1, activation, fc2: 2 matrices.
    Standard,
}

/// Normalisation layer kind (LayerNorm has a bias, RMSNorm does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    LayerNorm,
    RmsNorm,
}

/// Everything about a transformer's shape that changes its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arch {
    pub kind: Kind,
    /// Transformer blocks (for encoder-decoder: the encoder's).
    pub layers: u64,
    /// Decoder blocks of an encoder-decoder model; 0 otherwise.
    pub decoder_layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub mlp: Mlp,
    /// Output projection shares the input embedding's weights.
    pub tied: bool,
    /// Experts per MoE layer (0 = dense).
    pub experts: u64,
    /// Experts each token is routed to (0 = dense).
    pub experts_per_token: u64,
    pub norm: Norm,
    /// q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// Attention output and MLP projections carry biases.
    pub linear_bias: bool,
    /// Learned absolute position embeddings (rows); 0 for rotary / relative.
    pub max_positions: u64,
    /// Token-type (segment) embeddings rows, BERT style; 0 otherwise.
    pub type_vocab: u64,
    /// Attention and MLP read the same normed input (GPT-J, NeoX, Phi, Falcon).
    pub parallel_block: bool,
    /// Extra norms after attention and after the MLP, before each residual
    /// add (Gemma 2's sandwich norms).
    pub post_norms: bool,
    /// Attention scores pass through `tanh(s / cap) * cap` (Gemma 2): no
    /// fused kernel takes that, so attention runs eagerly and keeps the
    /// score matrices.
    pub attention_softcap: bool,
    /// Logits pass through `tanh(z / cap) * cap` before the loss, which
    /// keeps the tanh output per token for backward.
    pub final_softcap: bool,
}

impl Arch {
    /// A Llama-style decoder: RMSNorm, gated MLP, rotary positions, no biases.
    #[allow(clippy::too_many_arguments)]
    pub const fn llama(
        layers: u64,
        hidden: u64,
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        intermediate: u64,
        vocab: u64,
        tied: bool,
    ) -> Self {
        Arch {
            kind: Kind::Decoder,
            layers,
            decoder_layers: 0,
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            mlp: Mlp::Gated,
            tied,
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
        }
    }
}
