//! Parameter-efficient fine-tuning methods: where each trains (which blocks
//! keep activations), what it adds per token and per step, and how many
//! parameters it trains when the spec does not say. Read from Hugging Face
//! PEFT (huggingface/peft src/peft/tuners/*/layer.py and
//! src/peft/peft_model.py) unless named otherwise.

use super::arch::{Arch, Mlp};
use crate::api::{LoraVariant, PeftMethod, TrainingMode, ValidatedJob};

/// An adapter with this many times the prefix's parameters trains more than
/// the prefix: the only other parameters an adapter trains are norm weights
/// and per-linear scales and biases (LLaMA-Adapter v2), whose gradients need
/// the normalised inputs and the linear outputs.
const ADAPTER_V2_RATIO: f64 = 1.5;

/// PEFT's default number of virtual tokens is the user's; 20 is the value its
/// documentation and examples use.
pub const DEFAULT_VIRTUAL_TOKENS: u64 = 20;
/// VeRA's default rank (`VeraConfig.r = 256`).
pub const DEFAULT_VERA_RANK: u64 = 256;
/// GaLore's rank in its paper's and the `galore-torch` examples' recipes.
pub const DEFAULT_GALORE_RANK: u64 = 128;

/// The method one job trains with, its defaults resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum Peft {
    /// Full training or inference: nothing added.
    None,
    /// LoRA and its variants (the shape lives in `ValidatedJob::lora`).
    Lora { dora: bool },
    /// LLaMA-Adapter: a learned prefix and gate in the top `layers` blocks.
    LlamaAdapter { layers: Option<u64> },
    /// (IA)³: learned vectors scaling k, v and the input of down_proj.
    Ia3 { targets: Vec<String> },
    /// VeRA: frozen shared random projections, trained scaling vectors.
    Vera { rank: u64, targets: Vec<String> },
    /// Prompt tuning: virtual tokens prepended to the input embeddings.
    PromptTuning { tokens: u64 },
    /// Prefix tuning: learned keys and values prepended in every block.
    PrefixTuning { tokens: u64 },
    /// LayerNorm tuning: only the norms' weights train.
    LnTuning,
    /// GaLore: full-parameter training with low-rank projected optimizer states.
    Galore { rank: u64 },
}

/// LLaMA-Adapter's trainable prompt: 10 prefix vectors per adapted block.
const ADAPTER_PREFIX_LENGTH: f64 = 10.0;

/// Trainable parameters of one LLaMA-Adapter block: its prefix and a gate per head.
pub fn llama_adapter_block_parameters(a: &Arch) -> f64 {
    ADAPTER_PREFIX_LENGTH * a.hidden as f64 + a.heads as f64
}

/// LLaMA-Adapter's prefix in every block of `a.layers`.
fn prefix_adapter_parameters(a: &Arch) -> f64 {
    a.layers as f64 * llama_adapter_block_parameters(a)
}

/// Blocks a prefix adapter keeps activations for. It adapts the top blocks
/// only (LitGPT starts at block 2); below the first trainable tensor autograd
/// records nothing, so those blocks keep nothing for backward. The count
/// follows from the trainable parameters the spec gives.
fn prefix_adapted_blocks(a: &Arch, trainable: Option<f64>) -> f64 {
    let layers = a.layers as f64;
    match trainable {
        Some(n) => (n / llama_adapter_block_parameters(a).max(1.0))
            .round()
            .clamp(1.0, layers),
        None => layers,
    }
}

/// An adapter job that trains more than a prefix would (`ADAPTER_V2_RATIO`
/// times its parameters) trains norm weights and a scale per linear output
/// too (LLaMA-Adapter v2 style).
pub fn adapter_scales_linears(mode: TrainingMode, a: &Arch, trainable: Option<f64>) -> bool {
    mode == TrainingMode::Adapter
        && trainable.is_some_and(|n| n > ADAPTER_V2_RATIO * prefix_adapter_parameters(a))
}

/// Parameters of the full-size copies PEFT's `modules_to_save` trains, on one
/// rank of a stage (`first` holds the embedding, `last` the head) at tensor
/// parallelism `tp`.
///
/// PEFT's `modules_to_save` wraps the module in a `ModulesToSaveWrapper`
/// that keeps the frozen original and trains a deep copy
/// (huggingface/peft src/peft/utils/other.py, `ModulesToSaveWrapper`):
/// the copy's weights, gradients and optimizer states are the module's
/// full size. A tied head's copy is its own matrix, untied from the
/// embedding.
pub fn modules_to_save_parameters(
    modules: &[String],
    a: &Arch,
    first: bool,
    last: bool,
    tp: f64,
) -> f64 {
    let (v, h) = (a.vocab as f64, a.hidden as f64);
    modules
        .iter()
        .map(|m| match m.as_str() {
            // The token embedding (not the position embedding beside it)
            // and the head: vocab × hidden each.
            "embed_tokens" if first => v * h / tp,
            "lm_head" if last => v * h / tp,
            _ => 0.0,
        })
        .sum::<f64>()
}

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Peft {
    pub fn of(job: &ValidatedJob) -> Peft {
        let t = &job.spec().training;
        let spec = t.peft.as_ref();
        match (t.mode, spec.map(|p| p.method)) {
            (TrainingMode::Lora | TrainingMode::Qlora, _) => Peft::Lora {
                dora: job
                    .lora
                    .as_ref()
                    .is_some_and(|l| l.variant == LoraVariant::Dora),
            },
            (TrainingMode::Full, Some(PeftMethod::Galore)) => Peft::Galore {
                rank: spec.and_then(|p| p.rank).unwrap_or(DEFAULT_GALORE_RANK),
            },
            (TrainingMode::Adapter, method) => {
                let p = spec;
                let targets = |default: &[&str]| {
                    p.and_then(|p| p.target_modules.clone())
                        .unwrap_or_else(|| owned(default))
                };
                let tokens = p
                    .and_then(|p| p.virtual_tokens)
                    .unwrap_or(DEFAULT_VIRTUAL_TOKENS);
                match method {
                    None | Some(PeftMethod::LlamaAdapter) => Peft::LlamaAdapter {
                        layers: p.and_then(|p| p.layers),
                    },
                    // IA3's defaults for Llama-style models (peft/utils/constants.py,
                    // TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING).
                    Some(PeftMethod::Ia3) => Peft::Ia3 {
                        targets: targets(&["k_proj", "v_proj", "down_proj"]),
                    },
                    Some(PeftMethod::Vera) => Peft::Vera {
                        rank: p.and_then(|p| p.rank).unwrap_or(DEFAULT_VERA_RANK),
                        targets: targets(&["q_proj", "v_proj"]),
                    },
                    Some(PeftMethod::PromptTuning) => Peft::PromptTuning { tokens },
                    Some(PeftMethod::PrefixTuning) => Peft::PrefixTuning { tokens },
                    Some(PeftMethod::LnTuning) => Peft::LnTuning,
                    // Validation keeps GaLore to mode full.
                    Some(PeftMethod::Galore) => Peft::None,
                }
            }
            _ => Peft::None,
        }
    }

    /// Positions every block sees beyond the sample's own tokens: prompt
    /// tuning concatenates its virtual tokens to the input embeddings (and
    /// pads the labels), so they are real positions everywhere
    /// (peft/peft_model.py, `PeftModelForCausalLM.forward`).
    pub fn extra_positions(&self) -> u64 {
        match self {
            Peft::PromptTuning { tokens } => *tokens,
            _ => 0,
        }
    }

    /// Blocks under the first trainable tensor keep nothing for backward;
    /// only LLaMA-Adapter trains in the top blocks alone. Every other method
    /// has a trainable tensor in (or below) the first block: `None`.
    /// LLaMA-Adapter's adapted blocks are its `layers`, or without them as
    /// many as the spec's trainable parameters make (`prefix_adapted_blocks`).
    pub fn adapted_top_blocks(&self, a: &Arch, trainable: Option<f64>) -> Option<f64> {
        match self {
            Peft::LlamaAdapter {
                layers: Some(layers),
            } => Some(*layers as f64),
            Peft::LlamaAdapter { layers: None } => Some(prefix_adapted_blocks(a, trainable)),
            _ => None,
        }
    }

    /// The norms' weights train (their normalised input is kept for the weight's gradient).
    pub fn norms_trainable(&self) -> bool {
        matches!(self, Peft::LnTuning)
    }

    /// Trainable parameters of one whole model, when the spec gives no count.
    pub fn trainable_parameters(&self, a: &Arch) -> f64 {
        let l = (a.layers + a.decoder_layers) as f64;
        let h = a.hidden as f64;
        let kv = (a.kv_heads * a.head_dim) as f64;
        match self {
            Peft::None | Peft::Lora { .. } | Peft::Galore { .. } => 0.0,
            // Without `layers`, the prefix of every block of `a.layers`
            // (the blocks `prefix_adapted_blocks` counts in).
            Peft::LlamaAdapter { layers: None } => prefix_adapter_parameters(a),
            Peft::LlamaAdapter { layers: Some(n) } => {
                let blocks = (*n as f64).min(l);
                blocks * llama_adapter_block_parameters(a)
            }
            // IA3: one vector per targeted module, as wide as what it scales;
            // VeRA: lambda_d (rank) and lambda_b (output width) per module.
            Peft::Ia3 { .. } | Peft::Vera { .. } => l * self.scale_widths(a),
            Peft::PromptTuning { tokens } => *tokens as f64 * h,
            // A key and a value per virtual token in every block.
            Peft::PrefixTuning { tokens } => l * *tokens as f64 * 2.0 * kv,
            // Two norms per block and the final norm.
            Peft::LnTuning => (2.0 * l + 1.0) * h,
        }
    }

    /// Bytes per token one block keeps for the method besides the base
    /// model's own, at `elem` bytes per element.
    pub fn block_bytes_per_token(&self, a: &Arch, elem: f64, lora_targets: &[String]) -> f64 {
        match self {
            // Each trained scale keeps the tensor it multiplies, as wide as
            // the scale: IA3's `result * ia3_scaling` keeps the k/v
            // projection's output and `x * ia3_scaling` down_proj's input
            // (peft/tuners/ia3/layer.py, `Linear.forward`); VeRA's
            // `lambda_b * linear(lambda_d * linear(x, A), B)` keeps an r-wide
            // and an out-wide operand, the frozen A and B nothing
            // (peft/tuners/vera/layer.py, `Linear.forward`).
            Peft::Ia3 { .. } | Peft::Vera { .. } => elem * self.scale_widths(a),
            // DoRA scales the base output and the LoRA output by the trained
            // magnitude over the (detached) weight norm: both products keep
            // an output-wide operand per targeted module
            // (peft/tuners/lora/dora.py, `DoraLinearLayer.forward`).
            Peft::Lora { dora: true } => {
                2.0 * elem
                    * lora_targets
                        .iter()
                        .filter(|t| t.as_str() != "lm_head")
                        .map(|t| module_out(a, t))
                        .sum::<f64>()
            }
            _ => 0.0,
        }
    }

    /// Elements of the trained scaling vectors of one block (IA3, VeRA): as
    /// many as the tensors they multiply are wide.
    fn scale_widths(&self, a: &Arch) -> f64 {
        match self {
            Peft::Ia3 { targets } => targets
                .iter()
                .map(|t| match t.as_str() {
                    "down_proj" => a.intermediate as f64,
                    other => module_out(a, other),
                })
                .sum(),
            Peft::Vera { rank, targets } => targets
                .iter()
                .map(|t| *rank as f64 + module_out(a, t))
                .sum(),
            _ => 0.0,
        }
    }

    /// A transient per forward of the largest adapted module: DoRA builds
    /// `lora_B(lora_A(eye(in)))` (in × in through lora_A, in × out out) and
    /// the merged weight whose norm it takes, once per module and call.
    pub fn forward_transient(&self, a: &Arch, elem: f64, lora_targets: &[String]) -> f64 {
        match self {
            Peft::Lora { dora: true } => lora_targets
                .iter()
                .filter(|t| t.as_str() != "lm_head")
                .map(|t| {
                    let (inp, out) = module_shape(a, t);
                    elem * (inp * inp + 2.0 * inp * out)
                })
                .fold(0.0, f64::max),
            _ => 0.0,
        }
    }

    /// GaLore's optimizer state elements for one block's matrices, in place
    /// of Adam's two per parameter: the projected gradient of an m × n matrix
    /// is r × max(m, n) wide, Adam keeps two moments of it, and the projector
    /// keeps r × min(m, n) (galore_torch/galore_projector.py, `GaLoreProjector`).
    pub fn galore_block_state_elements(&self, a: &Arch) -> Option<(f64, f64)> {
        let Peft::Galore { rank } = self else {
            return None;
        };
        let r = *rank as f64;
        let mut projected = 0.0;
        let mut params = 0.0;
        for m in crate::api::validate::block_projections() {
            if a.mlp == Mlp::Standard && *m == "gate_proj" {
                continue;
            }
            let (inp, out) = module_shape(a, m);
            let rr = r.min(inp.min(out));
            projected += 2.0 * rr * inp.max(out) + rr * inp.min(out);
            params += inp * out;
        }
        Some((projected, params))
    }
}

/// The projections LoRA targets (none when the job is not LoRA).
pub fn lora_targets(job: &ValidatedJob) -> &[String] {
    job.lora
        .as_ref()
        .map(|l| l.target_modules.as_slice())
        .unwrap_or(&[])
}

/// (input, output) width of a named projection.
pub fn module_shape(a: &Arch, name: &str) -> (f64, f64) {
    let h = a.hidden as f64;
    let q = (a.heads * a.head_dim) as f64;
    let kv = (a.kv_heads * a.head_dim) as f64;
    let i = a.intermediate as f64;
    match name {
        "q_proj" => (h, q),
        "k_proj" | "v_proj" => (h, kv),
        "o_proj" => (q, h),
        "gate_proj" | "up_proj" => (h, i),
        "down_proj" => (i, h),
        "lm_head" => (h, a.vocab as f64),
        _ => (h, h),
    }
}

fn module_out(a: &Arch, name: &str) -> f64 {
    module_shape(a, name).1
}
