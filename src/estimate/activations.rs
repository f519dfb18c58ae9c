//! Bytes a transformer block keeps for backward, per token, by mechanism.
//!
//! Every term names the tensor autograd saves and why (see docs/DESIGN.md,
//! "Activation model"). Terms inside attention and the MLP split over tensor
//! parallelism; norm and residual terms split only with sequence parallelism.

use super::arch::{Act, Arch, Kind, Mlp, Norm};
use super::peft::Peft;
use crate::api::{Attention, Checkpointing};

/// What the activation model needs to know besides the shape.
#[derive(Clone, Copy, Debug)]
pub struct ActContext<'a> {
    /// Bytes per element of activations (2 for 16-bit compute, 4 for fp32/tf32).
    pub elem: f64,
    /// Mixed precision (autocast): norms run and save in fp32.
    pub mixed: bool,
    /// Base weights are trained (full fine-tune / pre-training).
    pub weights_trainable: bool,
    /// Base linears are quantized.
    pub quantized: bool,
    /// A quantized linear keeps `QUANTIZED_INPUT_BYTES` per input element
    /// (bitsandbytes); torchao's NF4 linear keeps only its weight.
    pub quantized_input_saved: bool,
    /// Bytes per input element such a linear keeps (`bounds::quantized_input_bytes`).
    pub quantized_input_bytes: f64,
    /// A frozen 16-bit linear saves its input (the stack's profile says).
    pub frozen_linear_saves_input: bool,
    /// Every LoRA module applies its own dropout to the shared input (PEFT);
    /// otherwise one dropout serves the projections that read one input.
    pub lora_dropout_per_module: bool,
    /// The parameter-efficient method, for what it keeps per block.
    pub peft: &'a Peft,
    /// Every n-th block is checkpointed; the others keep everything.
    pub checkpoint_every: f64,
    pub attention: Attention,
    /// SDPA runs its math kernel (`bounds::sdpa_math_fallback`).
    pub sdpa_math: bool,
    /// The block runs compiled (`torch.compile`), and what it saves is the
    /// partitioner's choice (`compiled_block`; `bounds::compiled_activations`).
    pub compiled: bool,
    pub sequence: f64,
    pub tensor_parallel: f64,
    pub sequence_parallel: bool,
    /// LoRA rank and targeted projections (empty when not LoRA).
    pub lora_rank: f64,
    pub lora_targets: &'a [String],
    /// LoRA dropout is on (its mask and output are kept per input).
    pub lora_dropout: bool,
    /// Norm weights and a scale per linear output are trained (LLaMA-Adapter v2 style).
    pub scaled_linears: bool,
    /// The MLP's activation function as the job's stack runs it: the
    /// model's `Arch::act` under a stack that runs Transformers' modules,
    /// `Act::Fused` under a stack with its own (LitGPT, torchtune, …).
    pub act: Act,
}

/// Bytes per token of the inside of one self-attention sub-block and norms.
struct Parts {
    /// Norms and residual stream (split only by sequence parallelism).
    outer: f64,
    /// Attention and MLP interiors (split by tensor parallelism).
    inner: f64,
}

impl Parts {
    fn per_rank(&self, c: &ActContext) -> f64 {
        let tp = c.tensor_parallel.max(1.0);
        let outer = if c.sequence_parallel {
            self.outer / tp
        } else {
            self.outer
        };
        outer + self.inner / tp
    }
}

fn linear_saves_input(c: &ActContext) -> bool {
    c.weights_trainable || (!c.quantized && c.frozen_linear_saves_input)
}

/// Saved bytes of one norm per token: its input (fp32 when upcast), the fp32
/// normalised tensor when the norm's weight is trained, and the normed output
/// when the next linear keeps it.
fn norm(a: &Arch, c: &ActContext) -> f64 {
    let normed = if linear_saves_input(c) && !c.quantized {
        c.elem * a.hidden as f64
    } else {
        0.0
    };
    norm_without_output(a, c) + normed
}

/// Saved bytes of a norm per token besides its output: what a norm feeding a
/// residual add keeps (Gemma 2's post-attention and post-MLP norms).
fn norm_without_output(a: &Arch, c: &ActContext) -> f64 {
    let h = a.hidden as f64;
    let upcast = match a.norm {
        // Reference RMSNorms upcast to fp32 and keep the fp32 input for backward.
        Norm::RmsNorm => c.elem < 4.0,
        // Autocast runs layer_norm in fp32.
        Norm::LayerNorm => c.mixed,
    };
    let input = if upcast { 4.0 * h } else { c.elem * h };
    // `x_normed * weight` in fp32 keeps x_normed for the weight's gradient.
    let weight_grad = if upcast
        && (c.weights_trainable || c.scaled_linears || c.peft.norms_trainable())
        && a.norm == Norm::RmsNorm
    {
        4.0 * h
    } else {
        0.0
    };
    input + weight_grad
}

/// Per token, the score matrices eager attention keeps: the fp32 softmax
/// output and its 16-bit cast, plus the tanh output when scores are soft-capped.
/// Zero for fused kernels.
fn score_bytes(a: &Arch, c: &ActContext) -> f64 {
    if c.sdpa_math && attention_kind(a, c.attention) == Attention::Sdpa {
        // The math kernel's softmax output, in the compute dtype.
        return c.elem * a.heads as f64 * c.sequence;
    }
    if attention_kind(a, c.attention) != Attention::Eager {
        return 0.0;
    }
    let e = c.elem;
    let softcap = if a.attention_softcap { e } else { 0.0 };
    (4.0 + e + softcap) * a.heads as f64 * c.sequence
}

/// Backward's gradients of the attention scores, in elements of the compute
/// dtype per token: eager attention's fp32 softmax backward and the 16-bit
/// gradient of the probabilities, the math kernel's two 16-bit planes
/// (`s` per head per token each); none for fused kernels.
pub fn scores_grad(a: &Arch, c: &ActContext, tp: f64) -> f64 {
    let per_head = a.heads as f64 / tp * c.sequence;
    match attention_kind(a, c.attention) {
        Attention::Eager => per_head * (4.0 + c.elem) / c.elem,
        Attention::Sdpa if c.sdpa_math => per_head * 2.0,
        _ => 0.0,
    }
}

/// The activation function as a stack runs it: the model's own under a
/// stack that runs Transformers' modules, a fused one under a stack with its
/// own (`own_modules`: LitGPT, torchtune, …).
pub fn act_under(a: &Arch, own_modules: bool) -> Act {
    if own_modules { Act::Fused } else { a.act }
}

/// The attention path that runs for the one asked for: soft-capped scores
/// need the eager one.
pub fn attention_kind(a: &Arch, asked: Attention) -> Attention {
    if a.attention_softcap {
        Attention::Eager
    } else {
        asked
    }
}

/// Bytes a quantized linear module keeps per token over an input `width`:
/// `c.quantized_input_bytes` per input element, counted per module in place
/// of the shared input a frozen 16-bit linear saves (its range and source:
/// `bounds::quantized_input_bytes`).
fn quantized_input(c: &ActContext, width: f64) -> f64 {
    if c.quantized && c.quantized_input_saved {
        c.quantized_input_bytes * width
    } else {
        0.0
    }
}

/// LoRA branches of projections that read one input tensor: the dropout's
/// mask and output (kept by lora_A) once per input, or once per module where
/// each module drops out on its own (PEFT's `lora_dropout[adapter](x)` in
/// every `Linear.forward`); without dropout lora_A keeps the input itself,
/// unless the base linear already does; one lora_A output per module.
fn lora_branch(c: &ActContext, groups: &[(&[&str], f64)]) -> f64 {
    let mut total = 0.0;
    for (names, width) in groups {
        let targeted = names
            .iter()
            .filter(|n| c.lora_targets.iter().any(|t| t == *n))
            .count() as f64;
        if targeted == 0.0 {
            continue;
        }
        if c.lora_dropout {
            let copies = if c.lora_dropout_per_module {
                targeted
            } else {
                1.0
            };
            total += copies * (c.elem + 1.0) * width;
        } else if !linear_saves_input(c) || c.quantized {
            total += c.elem * width;
        }
        total += targeted * c.elem * c.lora_rank;
    }
    total
}

/// Self-attention interior bytes per token.
fn attention(a: &Arch, c: &ActContext) -> f64 {
    let e = c.elem;
    let h = a.hidden as f64;
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let heads = a.heads as f64;
    let mut bytes = match attention_kind(a, c.attention) {
        // Eager attention repeats K/V to all heads and keeps the fp32
        // softmax output and its 16-bit cast, s per head per token.
        Attention::Eager => e * 3.0 * q + score_bytes(a, c),
        // PyTorch SDPA callers repeat K/V to every query head (GQA) and the
        // kernel keeps q, k, v, the output and an fp32 log-sum-exp.
        // Its math kernel keeps the probabilities instead of the log-sum-exp.
        Attention::Sdpa if c.sdpa_math => e * 3.0 * q + score_bytes(a, c),
        Attention::Sdpa => e * 3.0 * q + 4.0 * heads,
        // FlashAttention takes grouped K/V as they are.
        Attention::Flash => e * (q + 2.0 * kv) + 4.0 * heads,
    };
    // Inputs of the q/k/v projections and of o_proj as quantized linears keep them.
    bytes += quantized_input(c, h) + quantized_input(c, q);
    // Attention output, kept by the kernel. Fused kernels write it in
    // (batch, token, head) order, so o_proj reads it through a view; eager
    // attention's `scores @ v` is head-major and o_proj keeps a contiguous copy.
    bytes += e * q;
    if linear_saves_input(c) && !c.quantized && attention_kind(a, c.attention) == Attention::Eager {
        bytes += e * q;
    }
    bytes += lora_branch(c, &[(&["q_proj", "k_proj", "v_proj"], h), (&["o_proj"], q)]);
    bytes
}

/// Bytes per intermediate element the MLP's activation function saves for
/// its own backward, not counting its output.
///
/// - `Fused`: its input, at e.
/// - `GeluNew` (`0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3))))`), by
///   the derivatives in PyTorch's tools/autograd/derivatives.yaml: `pow`
///   saves its input, `tanh` its output `t`, the final product both factors
///   (`0.5 * x` and `1 + t`); products and sums with a Python scalar save
///   nothing. Under autocast `pow` is on the fp32 list
///   (aten/src/ATen/autocast_mode.cpp), so it saves an fp32 copy of x and
///   everything after it promotes to fp32 except `0.5 * x`: 4 + 4 + e + 4.
///   Without autocast: 4 tensors at e. On the meta-device reference GPT-2's
///   activations at backward's head (bf16-mixed, micro-batch 1 × 2048) are
///   1522 MiB estimated against 1592 measured, 658 before this was modelled
///   (`python3 benches/reference/report.py --only gpt2-mb1-s2048 -v`).
pub fn act_saved(act: Act, e: f64, mixed: bool) -> f64 {
    match act {
        Act::Fused => e,
        Act::GeluNew if mixed => 12.0 + e,
        Act::GeluNew => 4.0 * e,
    }
}

/// Bytes per element of the activation function's output: `gelu_new`'s
/// last product promotes to fp32 under autocast.
fn act_output(act: Act, e: f64, mixed: bool) -> f64 {
    match act {
        Act::GeluNew if mixed => 4.0,
        _ => e,
    }
}

/// MLP interior bytes per token of one dense MLP of width `i`.
fn dense_mlp(a: &Arch, c: &ActContext, i: f64) -> f64 {
    let e = c.elem;
    let h = a.hidden as f64;
    let saves_in = linear_saves_input(c) && !c.quantized;
    let one = match a.mlp {
        // gate and up outputs (kept by SiLU and the product), SiLU output,
        // and the product that down_proj keeps.
        Mlp::Gated => {
            (act_saved(c.act, e, c.mixed) + e + act_output(c.act, e, c.mixed)) * i
                + if saves_in { e * i } else { 0.0 }
                + 2.0 * quantized_input(c, h)
                + quantized_input(c, i)
        }
        // fc1 output (kept by GELU) and GELU output that fc2 keeps.
        Mlp::Standard => {
            act_saved(c.act, e, c.mixed) * i
                + if saves_in { e * i } else { 0.0 }
                + quantized_input(c, h)
                + quantized_input(c, i)
        }
    };
    let lora = lora_branch(
        c,
        &[(&["gate_proj"], h), (&["up_proj"], h), (&["down_proj"], i)],
    );
    one + lora
}

/// MLP interior bytes per token of one block, averaged over the blocks: a
/// dense MLP, or an MoE layer's routed experts (with the router and the
/// dispatch) and shared experts, and an MoE model's leading dense blocks.
fn mlp(a: &Arch, c: &ActContext) -> f64 {
    let i = a.intermediate as f64;
    if a.experts == 0 {
        return dense_mlp(a, c, i);
    }
    let e = c.elem;
    let h = a.hidden as f64;
    let k = a.experts_per_token as f64;
    // Each token visits k experts; the router keeps fp32 logits and the
    // dispatch keeps a permuted copy of the hidden state per expert.
    let mut moe = dense_mlp(a, c, i) * k + 4.0 * a.experts as f64 + 2.0 * e * h * k;
    if a.shared_intermediate > 0 {
        moe += dense_mlp(a, c, a.shared_intermediate as f64);
    }
    let layers = a.layers.max(1) as f64;
    let dense = a.layers.saturating_sub(a.moe_layers()) as f64;
    if dense == 0.0 {
        return moe;
    }
    let dense_one = dense_mlp(a, c, a.dense_intermediate as f64);
    (moe * (layers - dense) + dense_one * dense) / layers
}

/// A trained scale on a linear's output (`scale * linear(x)`) keeps that
/// output for the scale's gradient: every projection's output width at e.
fn scaled_outputs(a: &Arch, c: &ActContext) -> f64 {
    if !c.scaled_linears {
        return 0.0;
    }
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let h = a.hidden as f64;
    let i = a.intermediate as f64;
    let mlp_out = match a.mlp {
        Mlp::Gated => 2.0 * i + h,
        Mlp::Standard => i + h,
    };
    c.elem * (q + 2.0 * kv + h + mlp_out)
}

/// What a compiled block (`torch.compile`, TorchInductor) keeps for
/// backward. AOTAutograd traces forward and backward as one joint graph and
/// `min_cut_rematerialization_partition` (torch/_functorch/partitioners.py)
/// picks the saved set: the cut of least bytes, where matmuls, the attention
/// kernel and reductions may not be recomputed and pointwise ops may. Traced
/// on the meta device with torch 2.15 and Transformers 5.24 (Llama and GPT-2
/// blocks, bf16, the partitioner inductor uses), it keeps, per token:
///
/// - per norm: its input (the residual stream: fp32 under autocast), its
///   output (the next matmul's input) and a per-token statistic; the fp32
///   upcast and normalised copies eager saves are recomputed;
/// - attention: q before the rotary embedding, k and v after it at their own
///   width (the repeat to every query head is recomputed), the kernel's
///   output and log-sum-exp (eager attention: its softmax output as well);
/// - the MLP: every matmul's output and the down (fc2) projection's input:
///   gate, up and their product (gated), fc1's output and the activation's
///   output (standard); the activation function's own inputs are recomputed.
///
/// The same for every dense decoder block under full training; other blocks
/// (LoRA, quantized linears, experts, encoders) keep eager's count
/// (`bounds::compiled_activations` says where the partition applies).
fn compiled_block(a: &Arch, c: &ActContext) -> Parts {
    let e = c.elem;
    let h = a.hidden as f64;
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let i = a.intermediate as f64;
    let residual = if c.mixed { 4.0 } else { e };
    let norms = if a.parallel_block { 1.0 } else { 2.0 };
    let post = if a.post_norms {
        2.0 * (e * h + 4.0)
    } else {
        0.0
    };
    let scores = match attention_kind(a, c.attention) {
        Attention::Eager => score_bytes(a, c),
        Attention::Sdpa if c.sdpa_math => score_bytes(a, c),
        _ => 4.0 * a.heads as f64,
    };
    let mlp = match a.mlp {
        Mlp::Gated => 3.0 * e * i,
        Mlp::Standard => 2.0 * e * i,
    };
    Parts {
        outer: norms * (residual * h + e * h + 8.0) + post,
        inner: e * (q + 2.0 * kv) + e * q + scores + mlp,
    }
}

/// Bytes per token one full (not checkpointed) block keeps for backward.
pub fn block_bytes_per_token(a: &Arch, c: &ActContext, decoder_block: bool) -> f64 {
    if c.compiled {
        return compiled_block(a, c).per_rank(c);
    }
    let norms = if a.parallel_block { 1.0 } else { 2.0 };
    let post = if a.post_norms {
        2.0 * norm_without_output(a, c)
    } else {
        0.0
    };
    let mut parts = Parts {
        outer: norms * norm(a, c) + post,
        inner: attention(a, c)
            + mlp(a, c)
            + scaled_outputs(a, c)
            + c.peft.block_bytes_per_token(a, c.elem, c.lora_targets),
    };
    if decoder_block && a.kind == Kind::EncoderDecoder {
        // Cross-attention: its norm, q, projected encoder k/v, output.
        let e = c.elem;
        let q = (a.heads * a.head_dim) as f64;
        let kv = (a.kv_heads * a.head_dim) as f64;
        parts.outer += norm(a, c);
        parts.inner += e * (2.0 * q + 2.0 * kv);
    }
    parts.per_rank(c)
}

/// Bytes per token a checkpointed block keeps: its input only.
pub fn block_input_bytes_per_token(a: &Arch, c: &ActContext) -> f64 {
    let h = a.hidden as f64 * c.elem;
    if c.sequence_parallel {
        h / c.tensor_parallel.max(1.0)
    } else {
        h
    }
}

/// Bytes per token a block keeps under the given checkpointing.
pub fn kept_bytes_per_token(
    a: &Arch,
    c: &ActContext,
    checkpointing: Checkpointing,
    decoder_block: bool,
) -> f64 {
    let full = block_bytes_per_token(a, c, decoder_block);
    let checkpointed = match checkpointing {
        Checkpointing::None => return full,
        Checkpointing::Full => block_input_bytes_per_token(a, c),
        Checkpointing::OpSelective => op_selective_bytes_per_token(a, c),
        Checkpointing::Selective => {
            // Recompute the attention core (scores) and the MLP activation
            // function: drop the score matrix and the activation output.
            let full = block_bytes_per_token(a, c, decoder_block);
            let e = c.elem;
            let tp = c.tensor_parallel.max(1.0);
            let scores = score_bytes(a, c);
            let act = e * a.mlp_width_per_token();
            (full - (scores + act) / tp).max(block_input_bytes_per_token(a, c))
        }
    };
    // Only every n-th block is checkpointed; the rest keep everything.
    let n = c.checkpoint_every.max(1.0);
    (checkpointed + (n - 1.0) * full) / n
}

/// PyTorch's op-level selective checkpointing as torchtitan configures it
/// (`selective_ac_option: op`, torchtitan/distributed/activation_checkpoint.py
/// `_get_custom_policy`, pytorch/torchtitan @ 6404b932421f5ce382e7dac5ad381b2c17b1373c):
/// the block's input, every other matmul's output (of q, k, v, o, gate/up,
/// up, down in call order: q, v, gate and down), and the attention kernel's
/// output and log-sum-exp are saved; everything else is recomputed.
fn op_selective_bytes_per_token(a: &Arch, c: &ActContext) -> f64 {
    let e = c.elem;
    let h = a.hidden as f64;
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let i = a.mlp_width_per_token();
    let tp = c.tensor_parallel.max(1.0);
    let saved_mm = match a.mlp {
        // q, v, gate (w1), down (w2): the 1st, 3rd, 5th and 7th of seven.
        Mlp::Gated => q + kv + i + h,
        // q, v, fc1 of six (q, k, v, o, fc1, fc2).
        Mlp::Standard => q + kv + i,
    };
    let attention = q + 4.0 * a.heads as f64 / e;
    block_input_bytes_per_token(a, c) + e * (saved_mm + attention) / tp
}

/// Bytes per token of the final norm before the head.
pub fn final_norm_bytes_per_token(a: &Arch, c: &ActContext) -> f64 {
    let n = norm(a, c) + lora_branch(c, &[(&["lm_head"], a.hidden as f64)]);
    if c.sequence_parallel {
        n / c.tensor_parallel.max(1.0)
    } else {
        n
    }
}
