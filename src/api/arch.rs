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

impl Mlp {
    /// Weight matrices of one MLP: gate, up and down, or fc1 and fc2.
    pub const fn matrices(self) -> u64 {
        match self {
            Mlp::Gated => 3,
            Mlp::Standard => 2,
        }
    }

    /// Of them, the projections out of the hidden width (gate and up, or
    /// fc1); the last one projects back.
    pub const fn input_projections(self) -> u64 {
        self.matrices() - 1
    }
}

/// How the MLP's activation function runs, which sets what it saves for
/// backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// One ATen op (SiLU, GELU with or without the tanh approximation, ReLU):
    /// it saves its input and returns one tensor of the input's dtype.
    Fused,
    /// Transformers' `gelu_new` (`NewGELUActivation`,
    /// src/transformers/activations.py): `0.5 * x * (1 + tanh(sqrt(2 / pi) *
    /// (x + 0.044715 * pow(x, 3))))` as eight pointwise ops in Python (GPT-2,
    /// Phi-1/1.5/2, T5 v1.1's `gated-gelu`); see `activations::act_saved`.
    GeluNew,
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
    /// The MLP's activation function as the model's own code runs it.
    pub act: Act,
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
    /// MLP width every token of an MoE layer passes through beside its
    /// routed experts: the shared experts together (DeepSeek-MoE's
    /// `n_shared_experts × moe_intermediate_size`, Qwen2-MoE's
    /// `shared_expert_intermediate_size`); 0 for none.
    pub shared_intermediate: u64,
    /// Leading blocks whose MLP is dense instead of routed (DeepSeek's
    /// `first_k_dense_replace`); 0 for none.
    pub dense_layers: u64,
    /// MLP width of those dense blocks.
    pub dense_intermediate: u64,
}

impl Arch {
    /// Blocks whose MLP routes to experts (all of them in a plain MoE; none
    /// in a dense model).
    pub fn moe_layers(&self) -> u64 {
        if self.experts == 0 {
            0
        } else {
            self.layers.saturating_sub(self.dense_layers)
        }
    }

    /// MLP widths a token passes through in one block, averaged over the
    /// blocks (a dense block's intermediate; an MoE block's routed experts
    /// and shared width), with the routed experts' count per token: what a
    /// block keeps per token for the MLP scales with it.
    pub fn mlp_width_per_token(&self) -> f64 {
        if self.experts == 0 {
            return self.intermediate as f64;
        }
        let moe = self.intermediate as f64 * self.experts_per_token as f64
            + self.shared_intermediate as f64;
        let layers = self.layers.max(1) as f64;
        let dense = self.dense_layers.min(self.layers) as f64;
        (moe * (layers - dense) + self.dense_intermediate as f64 * dense) / layers
    }

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
            act: Act::Fused,
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
            shared_intermediate: 0,
            dense_layers: 0,
            dense_intermediate: 0,
        }
    }
}
