//! Reading a Hugging Face `config.json` object into an [`Arch`]. Pure: the
//! caller passes the parsed object; every problem names the key under
//! `spec.model.hfConfig`.

use serde_json::{Map, Value};

use super::arch::{Act, Arch, Kind, Mlp, Norm};

/// The `model_type`s we can read.
pub const MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "phi3",
    "gpt2",
    "gpt_neox",
    "falcon",
    "bert",
    "roberta",
    "t5",
];

const PATH: &str = "spec.model.hfConfig";
const MAX_DIM: u64 = 1 << 24;

/// One problem with one key: (path, reason).
pub type KeyError = (String, String);

struct Reader<'a> {
    map: &'a Map<String, Value>,
    errs: Vec<KeyError>,
}

impl Reader<'_> {
    fn err(&mut self, key: &str, reason: impl Into<String>) {
        self.errs.push((format!("{PATH}.{key}"), reason.into()));
    }

    /// A positive integer under the first of `keys` present.
    fn dim(&mut self, keys: &[&str], default: Option<u64>) -> u64 {
        for key in keys {
            match self.map.get(*key) {
                None | Some(Value::Null) => continue,
                Some(v) => {
                    return match v.as_u64() {
                        Some(n) if (1..=MAX_DIM).contains(&n) => n,
                        _ => {
                            self.err(
                                key,
                                format!(
                                    "{v} is not allowed; expected an integer from 1 to {MAX_DIM}"
                                ),
                            );
                            1
                        }
                    };
                }
            }
        }
        match default {
            Some(d) => d,
            None => {
                self.err(keys[0], "missing; this model_type's config.json has it");
                1
            }
        }
    }

    /// A count that may be 0 under `key`, `default` when absent.
    fn count(&mut self, key: &str, default: u64) -> u64 {
        match self.map.get(key) {
            None | Some(Value::Null) => default,
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_DIM => n,
                _ => {
                    self.err(
                        key,
                        format!("{v} is not allowed; expected an integer from 0 to {MAX_DIM}"),
                    );
                    0
                }
            },
        }
    }

    fn flag(&mut self, key: &str, default: bool) -> bool {
        match self.map.get(key) {
            None | Some(Value::Null) => default,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                self.err(key, format!("{v} is not a boolean"));
                default
            }
        }
    }

    /// A soft-capping threshold: a positive number turns it on, null off.
    fn softcap(&mut self, key: &str, default: bool) -> bool {
        match self.map.get(key) {
            None => default,
            Some(Value::Null) => false,
            Some(Value::Number(n)) if n.as_f64().is_some_and(|v| v > 0.0 && v.is_finite()) => true,
            Some(v) => {
                self.err(key, format!("must be a positive number or null, got {v}"));
                false
            }
        }
    }

    /// The MLP's activation function named by `key` (`default` when the key
    /// is absent): Transformers' `gelu_new` runs as Python pointwise ops;
    /// every other name is one op here (`Act`).
    fn act(&mut self, key: &str, default: &str) -> Act {
        let name = self.text(key).unwrap_or_else(|| default.to_string());
        if name == "gelu_new" {
            Act::GeluNew
        } else {
            Act::Fused
        }
    }

    fn text(&mut self, key: &str) -> Option<String> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                self.err(key, format!("{v} is not a string"));
                None
            }
        }
    }
}

/// Read `config` into an architecture, or every problem found.
pub fn arch_from_config(config: &Map<String, Value>) -> Result<Arch, Vec<KeyError>> {
    let mut r = Reader {
        map: config,
        errs: Vec::new(),
    };
    let Some(model_type) = r.text("model_type") else {
        if r.errs.is_empty() {
            r.err(
                "model_type",
                format!("missing; known: {}", MODEL_TYPES.join(", ")),
            );
        }
        return Err(r.errs);
    };
    let arch = match model_type.as_str() {
        "llama" | "mistral" | "mixtral" | "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe"
        | "deepseek" | "gemma" | "gemma2" | "gemma3_text" | "phi3" => {
            llama_like(&mut r, &model_type)
        }
        "gemma3" => {
            r.err(
                "model_type",
                "gemma3 is the multimodal checkpoint: give its text_config object here (its \
                 model_type is gemma3_text); the vision tower (a SigLIP encoder, about 0.4B \
                 parameters, frozen in text fine-tuning) is not modelled",
            );
            return Err(r.errs);
        }
        "deepseek_v2" | "deepseek_v3" => {
            r.err(
                "model_type",
                format!(
                    "{model_type} uses multi-head latent attention, which the transformer \
                     shape cannot express; describe it with spec.model.transformer (its \
                     routed experts as experts and expertsPerToken, n_shared_experts × \
                     moe_intermediate_size as sharedIntermediateSize, first_k_dense_replace \
                     as denseLayers with intermediate_size as denseIntermediateSize) and say \
                     the attention widths as kvHeads and headDim, or use spec.model.custom \
                     with its parameter count"
                ),
            );
            return Err(r.errs);
        }
        "phi" => phi_arch(&mut r),
        "gpt2" => gpt2_arch(&mut r),
        "gpt_neox" => gpt_neox_arch(&mut r),
        "falcon" => falcon_arch(&mut r),
        "bert" | "roberta" => bert_arch(&mut r),
        "t5" => t5_arch(&mut r),
        other => {
            r.err(
                "model_type",
                format!(
                    "unknown model_type {other:?}; known: {}; for another architecture give \
                     its dimensions under spec.model.transformer (layers, hiddenSize, \
                     attentionHeads, kvHeads, intermediateSize, vocabSize)",
                    MODEL_TYPES.join(", ")
                ),
            );
            return Err(r.errs);
        }
    };
    let mut arch = arch;
    if arch.kv_heads == 0 {
        arch.kv_heads = arch.heads;
    }
    if arch.head_dim == 0 {
        if arch.hidden % arch.heads.max(1) != 0 {
            r.err(
                "num_attention_heads",
                format!(
                    "{} does not divide the hidden size {}",
                    arch.heads, arch.hidden
                ),
            );
        }
        arch.head_dim = (arch.hidden / arch.heads.max(1)).max(1);
    }
    if arch.heads % arch.kv_heads.max(1) != 0 {
        r.err(
            "num_key_value_heads",
            format!(
                "{} does not divide the {} attention heads",
                arch.kv_heads, arch.heads
            ),
        );
    }
    if r.errs.is_empty() {
        Ok(arch)
    } else {
        Err(r.errs)
    }
}

/// The architecture of a `phi` config.
fn phi_arch(r: &mut Reader<'_>) -> Arch {
    let layers = r.dim(&["num_hidden_layers"], None);
    let hidden = r.dim(&["hidden_size"], None);
    let heads = r.dim(&["num_attention_heads"], None);
    let kv_heads = r.dim(&["num_key_value_heads"], Some(heads));
    Arch {
        kind: Kind::Decoder,
        layers,
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads.max(1),
        intermediate: r.dim(&["intermediate_size"], Some(hidden * 4)),
        vocab: r.dim(&["vocab_size"], None),
        mlp: Mlp::Standard,
        act: r.act("hidden_act", "gelu_new"),
        tied: r.flag("tie_word_embeddings", false),
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

/// The architecture of a `gpt2` config.
fn gpt2_arch(r: &mut Reader<'_>) -> Arch {
    let hidden = r.dim(&["n_embd"], None);
    Arch {
        kind: Kind::Decoder,
        layers: r.dim(&["n_layer"], None),
        decoder_layers: 0,
        hidden,
        heads: r.dim(&["n_head"], None),
        kv_heads: 0,
        head_dim: 0,
        intermediate: r.dim(&["n_inner"], Some(hidden * 4)),
        vocab: r.dim(&["vocab_size"], None),
        mlp: Mlp::Standard,
        act: r.act("activation_function", "gelu_new"),
        tied: r.flag("tie_word_embeddings", true),
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions: r.dim(&["n_positions"], Some(1024)),
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

/// The architecture of a `gpt_neox` config.
fn gpt_neox_arch(r: &mut Reader<'_>) -> Arch {
    let hidden = r.dim(&["hidden_size"], None);
    Arch {
        kind: Kind::Decoder,
        layers: r.dim(&["num_hidden_layers"], None),
        decoder_layers: 0,
        hidden,
        heads: r.dim(&["num_attention_heads"], None),
        kv_heads: 0,
        head_dim: 0,
        intermediate: r.dim(&["intermediate_size"], Some(hidden * 4)),
        vocab: r.dim(&["vocab_size"], None),
        mlp: Mlp::Standard,
        act: r.act("hidden_act", "gelu"),
        tied: r.flag("tie_word_embeddings", false),
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions: 0,
        type_vocab: 0,
        parallel_block: r.flag("use_parallel_residual", true),
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// The architecture of a `falcon` config.
fn falcon_arch(r: &mut Reader<'_>) -> Arch {
    let hidden = r.dim(&["hidden_size", "n_embed"], None);
    let heads = r.dim(&["num_attention_heads", "n_head"], None);
    let new_arch = r.flag("new_decoder_architecture", false);
    let multi_query = r.flag("multi_query", true);
    let kv_default = if new_arch {
        heads
    } else if multi_query {
        1
    } else {
        heads
    };
    Arch {
        kind: Kind::Decoder,
        layers: r.dim(&["num_hidden_layers", "n_layer"], None),
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads: r.dim(&["num_kv_heads", "n_head_kv"], Some(kv_default)),
        head_dim: 0,
        intermediate: r.dim(&["ffn_hidden_size"], Some(hidden * 4)),
        vocab: r.dim(&["vocab_size"], None),
        mlp: Mlp::Standard,
        // FalconMLP runs nn.GELU(): one op.
        act: Act::Fused,
        tied: r.flag("tie_word_embeddings", true),
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: r.flag("bias", false),
        linear_bias: r.flag("bias", false),
        max_positions: 0,
        type_vocab: 0,
        parallel_block: r.flag("parallel_attn", true),
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// The architecture of a `bert` config.
fn bert_arch(r: &mut Reader<'_>) -> Arch {
    let hidden = r.dim(&["hidden_size"], None);
    Arch {
        kind: Kind::Encoder,
        layers: r.dim(&["num_hidden_layers"], None),
        decoder_layers: 0,
        hidden,
        heads: r.dim(&["num_attention_heads"], None),
        kv_heads: 0,
        head_dim: 0,
        intermediate: r.dim(&["intermediate_size"], Some(hidden * 4)),
        vocab: r.dim(&["vocab_size"], None),
        mlp: Mlp::Standard,
        act: r.act("hidden_act", "gelu"),
        tied: r.flag("tie_word_embeddings", true),
        experts: 0,
        experts_per_token: 0,
        norm: Norm::LayerNorm,
        qkv_bias: true,
        linear_bias: true,
        max_positions: r.dim(&["max_position_embeddings"], Some(512)),
        type_vocab: r.dim(&["type_vocab_size"], Some(2)),
        parallel_block: false,
        post_norms: false,
        attention_softcap: false,
        final_softcap: false,
        shared_intermediate: 0,
        dense_layers: 0,
        dense_intermediate: 0,
    }
}

/// The architecture of a `t5` config.
fn t5_arch(r: &mut Reader<'_>) -> Arch {
    let layers = r.dim(&["num_layers"], None);
    let heads = r.dim(&["num_heads"], None);
    let proj = r.text("feed_forward_proj").unwrap_or_else(|| "relu".into());
    Arch {
        kind: Kind::EncoderDecoder,
        layers,
        decoder_layers: r.dim(&["num_decoder_layers"], Some(layers)),
        hidden: r.dim(&["d_model"], None),
        heads,
        kv_heads: heads,
        head_dim: r.dim(&["d_kv"], None),
        intermediate: r.dim(&["d_ff"], None),
        vocab: r.dim(&["vocab_size"], None),
        mlp: if proj.starts_with("gated") {
            Mlp::Gated
        } else {
            Mlp::Standard
        },
        // T5Config maps `gated-gelu` to `dense_act_fn: gelu_new`
        // (src/transformers/models/t5/configuration_t5.py).
        act: r.act(
            "dense_act_fn",
            if proj == "gated-gelu" {
                "gelu_new"
            } else {
                proj.rsplit('-').next().unwrap_or("relu")
            },
        ),
        tied: r.flag("tie_word_embeddings", true),
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

fn llama_like(r: &mut Reader, model_type: &str) -> Arch {
    let layers = r.dim(&["num_hidden_layers"], None);
    let hidden = r.dim(&["hidden_size"], None);
    let heads = r.dim(&["num_attention_heads"], None);
    let kv_heads = r.dim(&["num_key_value_heads"], Some(heads));
    // head_dim is optional (Gemma sets it); 0 means hidden / heads below.
    let head_dim = match r.map.get("head_dim") {
        None | Some(Value::Null) => 0,
        Some(_) => r.dim(&["head_dim"], None),
    };
    let tied_default = matches!(model_type, "gemma" | "gemma2" | "gemma3_text");
    let (experts, per_token, intermediate) = match model_type {
        "mixtral" => (
            r.dim(&["num_local_experts"], None),
            r.dim(&["num_experts_per_tok"], None),
            r.dim(&["intermediate_size"], None),
        ),
        // Qwen3-MoE has no shared expert; Qwen2-MoE's is read below.
        "qwen2_moe" | "qwen3_moe" => (
            r.dim(&["num_experts"], None),
            r.dim(&["num_experts_per_tok"], None),
            r.dim(&["moe_intermediate_size"], None),
        ),
        "deepseek" => (
            r.dim(&["n_routed_experts"], None),
            r.dim(&["num_experts_per_tok"], None),
            r.dim(&["moe_intermediate_size"], None),
        ),
        _ => (0, 0, r.dim(&["intermediate_size"], None)),
    };
    // The MLP every token passes through beside its routed experts, and the
    // leading dense blocks. Qwen2MoeSparseMoeBlock: one shared expert of
    // shared_expert_intermediate_size (its 1-wide gate is not counted);
    // DeepseekMoE: n_shared_experts experts of moe_intermediate_size in one
    // MLP, and the first first_k_dense_replace blocks dense with
    // intermediate_size (modeling_deepseek.py, deepseek-ai/deepseek-moe-16b-base).
    let (shared_intermediate, dense_layers, dense_intermediate) = match model_type {
        "qwen2_moe" => {
            if r.count("decoder_sparse_step", 1) > 1 {
                r.err(
                    "decoder_sparse_step",
                    "only every block routed (1) is read here; describe a model with dense \
                     blocks between routed ones with spec.model.transformer",
                );
            }
            (r.count("shared_expert_intermediate_size", 0), 0, 0)
        }
        "deepseek" => {
            if r.count("moe_layer_freq", 1) != 1 {
                r.err(
                    "moe_layer_freq",
                    "only 1 (every block after the dense ones routed) is read here; describe \
                     other layouts with spec.model.transformer",
                );
            }
            let shared = r.count("n_shared_experts", 0).saturating_mul(intermediate);
            let dense = r.count("first_k_dense_replace", 0);
            let dense_width = if dense > 0 {
                r.dim(&["intermediate_size"], None)
            } else {
                0
            };
            (shared, dense, dense_width)
        }
        _ => (0, 0, 0),
    };
    if experts > 0 && dense_layers >= layers {
        r.err(
            "first_k_dense_replace",
            format!(
                "{dense_layers} is not allowed; must be fewer than num_hidden_layers ({layers})"
            ),
        );
    }
    let qkv_bias = matches!(model_type, "qwen2" | "qwen2_moe");
    let gemma2 = model_type == "gemma2";
    // Gemma 3 keeps Gemma 2's norms after attention and MLP and drops soft-capping for
    // a norm on queries and keys (head_dim weights per layer, not counted).
    let post_norms = matches!(model_type, "gemma2" | "gemma3_text");
    // Gemma 2 soft-caps by default (Gemma2Config: 50 and 30); null turns it off.
    let attention_softcap = r.softcap("attn_logit_softcapping", gemma2);
    let final_softcap = r.softcap("final_logit_softcapping", gemma2);
    Arch {
        kind: Kind::Decoder,
        layers,
        decoder_layers: 0,
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab: r.dim(&["vocab_size"], None),
        mlp: Mlp::Gated,
        act: r.act("hidden_act", "silu"),
        tied: r.flag("tie_word_embeddings", tied_default),
        experts,
        experts_per_token: per_token,
        norm: Norm::RmsNorm,
        qkv_bias,
        linear_bias: false,
        max_positions: 0,
        type_vocab: 0,
        parallel_block: false,
        post_norms,
        attention_softcap,
        final_softcap,
        shared_intermediate,
        dense_layers,
        dense_intermediate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::presets;

    fn config(v: serde_json::Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn llama_3_1_8b_config_matches_the_preset() {
        let c = config(serde_json::json!({
            "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "tie_word_embeddings": false, "rope_theta": 500000.0
        }));
        let arch = arch_from_config(&c).unwrap();
        assert_eq!(arch, presets::find("llama-3.1-8b").unwrap().arch);
    }

    #[test]
    fn gpt2_config_matches_the_preset() {
        let c = config(serde_json::json!({
            "model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
            "n_inner": null, "vocab_size": 50257, "n_positions": 1024
        }));
        let arch = arch_from_config(&c).unwrap();
        let preset = presets::find("gpt2").unwrap().arch;
        assert_eq!(arch.layers, preset.layers);
        assert_eq!(arch.intermediate, preset.intermediate);
        assert_eq!(arch.vocab, preset.vocab);
        assert!(arch.tied);
    }

    #[test]
    fn qwen3_qwen3_moe_and_gemma3_text_configs_match_their_presets() {
        let cases = [
            (
                serde_json::json!({
                    "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": false
                }),
                "qwen3-8b",
            ),
            (
                serde_json::json!({
                    "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                    "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": false
                }),
                "qwen3-30b-a3b",
            ),
            (
                serde_json::json!({
                    "model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152,
                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                    "intermediate_size": 6912, "vocab_size": 262144,
                    "attn_logit_softcapping": null, "final_logit_softcapping": null
                }),
                "gemma-3-1b",
            ),
        ];
        for (c, preset) in cases {
            let arch = arch_from_config(&config(c)).unwrap();
            assert_eq!(arch, presets::find(preset).unwrap().arch, "{preset}");
        }
    }

    #[test]
    fn latent_attention_and_the_multimodal_gemma3_say_what_to_write() {
        let errs = arch_from_config(&config(serde_json::json!({"model_type": "deepseek_v3"})))
            .unwrap_err();
        assert!(errs[0].1.contains("spec.model.transformer"), "{errs:?}");
        let errs =
            arch_from_config(&config(serde_json::json!({"model_type": "gemma3"}))).unwrap_err();
        assert!(errs[0].1.contains("text_config"), "{errs:?}");
        let errs =
            arch_from_config(&config(serde_json::json!({"model_type": "mamba"}))).unwrap_err();
        assert!(errs[0].1.contains("spec.model.transformer"), "{errs:?}");
    }

    #[test]
    fn unknown_model_type_lists_the_known_ones() {
        let c = config(serde_json::json!({"model_type": "mamba"}));
        let errs = arch_from_config(&c).unwrap_err();
        assert_eq!(errs[0].0, "spec.model.hfConfig.model_type");
        assert!(errs[0].1.contains("llama") && errs[0].1.contains("t5"));
    }

    #[test]
    fn every_problem_names_its_key() {
        let c = config(serde_json::json!({
            "model_type": "mistral", "num_hidden_layers": 0, "hidden_size": "big",
            "num_attention_heads": 32, "vocab_size": 32000
        }));
        let errs = arch_from_config(&c).unwrap_err();
        let paths: Vec<&str> = errs.iter().map(|e| e.0.as_str()).collect();
        assert!(paths.contains(&"spec.model.hfConfig.num_hidden_layers"));
        assert!(paths.contains(&"spec.model.hfConfig.hidden_size"));
        assert!(paths.contains(&"spec.model.hfConfig.intermediate_size"));
    }

    #[test]
    fn gemma2_config_matches_the_preset_and_null_turns_softcapping_off() {
        let mut v = serde_json::json!({
            "model_type": "gemma2", "num_hidden_layers": 26, "hidden_size": 2304,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
            "intermediate_size": 9216, "vocab_size": 256000,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0
        });
        let arch = arch_from_config(&config(v.clone())).unwrap();
        assert_eq!(arch, presets::find("gemma-2-2b").unwrap().arch);
        v["attn_logit_softcapping"] = Value::Null;
        let arch = arch_from_config(&config(v.clone())).unwrap();
        assert!(!arch.attention_softcap && arch.final_softcap && arch.post_norms);
        v["final_logit_softcapping"] = serde_json::json!("thirty");
        let errs = arch_from_config(&config(v)).unwrap_err();
        assert!(
            format!("{errs:?}").contains("final_logit_softcapping"),
            "{errs:?}"
        );
    }

    #[test]
    fn mixtral_reads_its_experts() {
        let c = config(serde_json::json!({
            "model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2
        }));
        let arch = arch_from_config(&c).unwrap();
        assert_eq!((arch.experts, arch.experts_per_token), (8, 2));
        assert_eq!(arch, presets::find("mixtral-8x7b").unwrap().arch);
    }

    #[test]
    fn deepseek_moe_reads_its_shared_experts_and_dense_blocks() {
        let mut v = serde_json::json!({
            "model_type": "deepseek", "num_hidden_layers": 28, "hidden_size": 2048,
            "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 10944,
            "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
            "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "vocab_size": 102400, "tie_word_embeddings": false
        });
        let arch = arch_from_config(&config(v.clone())).unwrap();
        assert_eq!(arch, presets::find("deepseek-moe-16b").unwrap().arch);
        v["first_k_dense_replace"] = serde_json::json!(28);
        v["moe_layer_freq"] = serde_json::json!(2);
        let errs = format!("{:?}", arch_from_config(&config(v)).unwrap_err());
        assert!(
            errs.contains("first_k_dense_replace") && errs.contains("moe_layer_freq"),
            "{errs}"
        );
    }

    #[test]
    fn qwen2_moe_reads_its_shared_expert() {
        let c = config(serde_json::json!({
            "model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
            "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
            "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
            "tie_word_embeddings": false
        }));
        let arch = arch_from_config(&c).unwrap();
        assert_eq!(arch, presets::find("qwen1.5-moe-a2.7b").unwrap().arch);
    }
}
