//! The model part of validation: `spec.model` (a preset, a spelled-out transformer,
//! `hfConfig`, `layers`, a vision preset or `custom`) resolved against the catalogs,
//! and the preset hint checked against what was spelled out.

use super::*;

/// The transformer preset the preset-hint annotation names (`None`: no hint, or a vision
/// preset's, which adds nothing), checked against the model; `Err` once a problem with it
/// is reported.
fn preset_hint(
    errs: &mut Errors,
    m: &ModelSpec,
    hint: Option<&str>,
) -> Result<Option<&'static presets::Preset>, ()> {
    let hinted = match hint {
        None => None,
        Some(h) => match presets::find(h) {
            Some(p) => Some(p),
            // A vision preset's hint names what a layer list (or the same
            // preset) is; its dims are the layers themselves, nothing to add.
            None if crate::api::vision::find(h).is_some() => {
                let v = crate::api::vision::find(h).map(|v| v.name);
                let same = m
                    .preset
                    .as_deref()
                    .and_then(crate::api::vision::find)
                    .map(|p| p.name)
                    == v;
                if !(same || m.layers.is_some()) {
                    errs.push(
                        HINT_PATH,
                        format!(
                            "names the vision preset {} but is read only with spec.model.layers (or the same spec.model.preset)",
                            v.unwrap_or(h)
                        ),
                    );
                    return Err(());
                }
                None
            }
            None => {
                errs.push(
                    HINT_PATH,
                    format!(
                        "unknown preset {h:?}; known: {}",
                        presets::names()
                            .chain(crate::api::vision::names())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                return Err(());
            }
        },
    };
    if let Some(h) = hinted
        && m.transformer.is_none()
        && m.preset.as_deref().and_then(presets::find).map(|p| p.name) != Some(h.name)
    {
        errs.push(
            HINT_PATH,
            format!(
                "names {} but is read only with spec.model.transformer (or the same spec.model.preset)",
                h.name
            ),
        );
        return Err(());
    }
    Ok(hinted)
}

/// `spec.model.preset`: a transformer of the catalog, or a vision preset's layers.
fn from_preset(errs: &mut Errors, m: &ModelSpec, name: &str) -> (Option<ResolvedModel>, String) {
    if let Some(p) = presets::find(name) {
        return (Some(ResolvedModel::Transformer(p.arch)), p.name.to_string());
    }
    match crate::api::vision::find(name) {
        Some(v) => match v.analyze(m.input_shape.as_deref(), m.num_labels) {
            Ok(stack) => (
                Some(ResolvedModel::Layers(Box::new(stack))),
                v.name.to_string(),
            ),
            Err(problems) => {
                for (path, reason) in problems {
                    errs.push(&path, reason);
                }
                (None, String::new())
            }
        },
        None => {
            errs.push(
                "spec.model.preset",
                format!(
                    "unknown preset {name:?}; known: {}",
                    presets::names()
                        .chain(crate::api::vision::names())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            (None, String::new())
        }
    }
}

/// `spec.model.custom`: a model known by its parameter count and activation bytes.
fn custom_model(errs: &mut Errors, c: &CustomModel) -> (Option<ResolvedModel>, String) {
    let before = errs.0.len();
    let parameters = count_from_f64(
        errs,
        "spec.model.custom.parameters",
        c.parameters,
        1.0,
        MAX_PARAMETERS,
    );
    let act = count_from_f64(
        errs,
        "spec.model.custom.activationBytesPerSample",
        c.activation_bytes_per_sample,
        0.0,
        MAX_BYTES,
    );
    if errs.0.len() != before {
        return (None, String::new());
    }
    let (Some(parameters), Some(activation_bytes_per_sample)) = (parameters, act) else {
        return (None, String::new());
    };
    let name = format!("custom {:.2}B", parameters as f64 / 1e9);
    (
        Some(ResolvedModel::Custom {
            parameters,
            activation_bytes_per_sample,
        }),
        name,
    )
}

/// Tensor parallelism splits the attention heads.
pub(super) fn sizes_the_model_takes(errs: &mut Errors, arch: &Arch, tensor_parallel: u64) {
    if !arch.heads.is_multiple_of(tensor_parallel.max(1)) {
        errs.push(
            "spec.parallelism.tensorParallel",
            format!(
                "{tensor_parallel} does not divide the model's {} attention heads",
                arch.heads
            ),
        );
    }
}

pub(super) fn resolve_model(
    errs: &mut Errors,
    m: &ModelSpec,
    hint: Option<&str>,
) -> (Option<ResolvedModel>, String) {
    let given: Vec<&str> = [
        ("preset", m.preset.is_some()),
        ("transformer", m.transformer.is_some()),
        ("hfConfig", m.hf_config.is_some()),
        ("layers", m.layers.is_some()),
        ("custom", m.custom.is_some()),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| name)
    .collect();
    match given.len() {
        0 => {
            errs.push(
                "spec.model",
                "no model given; set exactly one of preset, transformer, hfConfig, layers, custom",
            );
            return (None, String::new());
        }
        1 => {}
        _ => {
            errs.push(
                "spec.model",
                format!(
                    "several model sources given ({}); set exactly one",
                    given.join(", ")
                ),
            );
            return (None, String::new());
        }
    }
    let Ok(hinted) = preset_hint(errs, m, hint) else {
        return (None, String::new());
    };
    if let Some(name) = &m.preset {
        return from_preset(errs, m, name);
    }
    if let Some(t) = &m.transformer {
        let arch = transformer_arch(errs, t, hinted);
        let name = format!("transformer {}×{}", t.layers, t.hidden_size);
        return (arch.map(ResolvedModel::Transformer), name);
    }
    if let Some(config) = &m.hf_config {
        return match crate::api::hf::arch_from_config(config) {
            Ok(arch) => {
                let name = config
                    .get("_name_or_path")
                    .and_then(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .unwrap_or_else(|| {
                        let t = config
                            .get("model_type")
                            .and_then(|v| v.as_str())
                            .unwrap_or("");
                        format!("{t} {}×{}", arch.layers, arch.hidden)
                    });
                (Some(ResolvedModel::Transformer(arch)), name)
            }
            Err(problems) => {
                for (path, reason) in problems {
                    errs.push(&path, reason);
                }
                (None, String::new())
            }
        };
    }
    if let Some(layers) = &m.layers {
        let Some(shape) = &m.input_shape else {
            errs.push(
                "spec.model.inputShape",
                "required with spec.model.layers (the per-sample input, e.g. [3, 224, 224])",
            );
            return (None, String::new());
        };
        return match crate::api::layers::analyze(layers, shape) {
            Ok(stack) => {
                let name = format!("layers ({} layers)", stack.layer_count);
                (Some(ResolvedModel::Layers(Box::new(stack))), name)
            }
            Err(problems) => {
                for (path, reason) in problems {
                    errs.push(&path, reason);
                }
                (None, String::new())
            }
        };
    }
    if let Some(c) = &m.custom {
        return custom_model(errs, c);
    }
    (None, String::new())
}

const HINT_PATH: &str = "metadata.annotations[vramguard.io/preset-hint]";

/// The dims a spelled-out transformer shares with `preset`, or what differs.
fn hint_mismatches(a: &Arch, p: &presets::Preset) -> Vec<String> {
    let b = &p.arch;
    let dims = [
        ("layers", a.layers, b.layers),
        ("hiddenSize", a.hidden, b.hidden),
        ("attentionHeads", a.heads, b.heads),
        ("kvHeads", a.kv_heads, b.kv_heads),
        ("headDim", a.head_dim, b.head_dim),
        ("intermediateSize", a.intermediate, b.intermediate),
        ("vocabSize", a.vocab, b.vocab),
        ("experts", a.experts, b.experts),
        (
            "sharedIntermediateSize",
            a.shared_intermediate,
            b.shared_intermediate,
        ),
        ("denseLayers", a.dense_layers, b.dense_layers),
        (
            "denseIntermediateSize",
            a.dense_intermediate,
            b.dense_intermediate,
        ),
    ];
    let mut out: Vec<String> = dims
        .iter()
        .filter(|(_, ours, theirs)| ours != theirs)
        .map(|(name, ours, theirs)| format!("{name} {ours} (the preset: {theirs})"))
        .collect();
    if a.mlp != b.mlp {
        out.push(format!("mlp {:?} (the preset: {:?})", a.mlp, b.mlp).to_lowercase());
    }
    if a.kind != b.kind {
        out.push(format!("kind {:?} (the preset: {:?})", a.kind, b.kind).to_lowercase());
    }
    out
}

/// Largest width or count a spelled-out transformer may give.
const MAX_DIM: u64 = 1 << 24;

/// The mixture-of-experts fields of a spelled-out transformer checked; returns the MLP
/// width of its dense blocks (0 without any).
fn mixture_of_experts(errs: &mut Errors, t: &TransformerSpec, path: &str) -> u64 {
    if t.experts == 0 && t.experts_per_token != 0 {
        errs.push(
            &format!("{path}.expertsPerToken"),
            format!("{} needs experts > 0", t.experts_per_token),
        );
    }
    if t.experts > 0 && (t.experts_per_token == 0 || t.experts_per_token > t.experts) {
        errs.push(
            &format!("{path}.expertsPerToken"),
            format!(
                "{} is not allowed; must be between 1 and experts ({})",
                t.experts_per_token, t.experts
            ),
        );
    }
    errs.at_most(&format!("{path}.experts"), t.experts, 1 << 16);
    if t.experts == 0 {
        for (name, v) in [
            ("sharedIntermediateSize", t.shared_intermediate_size),
            ("denseLayers", t.dense_layers),
        ] {
            if v != 0 {
                errs.push(
                    &format!("{path}.{name}"),
                    format!("{v} needs experts > 0 (it describes an MoE model); leave it out for a dense model"),
                );
            }
        }
    }
    errs.at_most(
        &format!("{path}.sharedIntermediateSize"),
        t.shared_intermediate_size,
        MAX_DIM,
    );
    match (t.dense_layers, t.dense_intermediate_size) {
        (0, None) => 0,
        (0, Some(_)) => {
            errs.push(
                &format!("{path}.denseIntermediateSize"),
                "only used with denseLayers > 0",
            );
            0
        }
        (n, d) => {
            if n >= t.layers {
                errs.push(
                    &format!("{path}.denseLayers"),
                    format!(
                        "{n} is not allowed; must be fewer than layers ({}): an MoE model with no routed block is a dense model",
                        t.layers
                    ),
                );
            }
            match d {
                Some(d) => {
                    errs.at_least(&format!("{path}.denseIntermediateSize"), d, 1);
                    errs.at_most(&format!("{path}.denseIntermediateSize"), d, MAX_DIM);
                    d
                }
                None => {
                    errs.push(
                        &format!("{path}.denseIntermediateSize"),
                        format!("missing; {n} dense blocks need their MLP width (DeepSeek's intermediate_size)"),
                    );
                    0
                }
            }
        }
    }
}

/// The attention heads, the key/value heads and the head width of a spelled-out
/// transformer, checked.
fn attention_widths(errs: &mut Errors, t: &TransformerSpec, path: &str) -> (u64, u64, u64) {
    let heads = t.attention_heads;
    let kv_heads = t.kv_heads.unwrap_or(heads);
    errs.at_least(&format!("{path}.kvHeads"), kv_heads, 1);
    if kv_heads > 0 && !heads.is_multiple_of(kv_heads) {
        errs.push(
            &format!("{path}.kvHeads"),
            format!("{kv_heads} does not divide attentionHeads {heads}"),
        );
    }
    let head_dim = match t.head_dim {
        Some(d) => {
            errs.at_least(&format!("{path}.headDim"), d, 1);
            errs.at_most(&format!("{path}.headDim"), d, MAX_DIM);
            d
        }
        None => {
            if heads > 0 && !t.hidden_size.is_multiple_of(heads) {
                errs.push(
                    &format!("{path}.attentionHeads"),
                    format!(
                        "{heads} does not divide hiddenSize {}; set headDim if the model's heads are not hiddenSize / heads wide",
                        t.hidden_size
                    ),
                );
            }
            t.hidden_size.checked_div(heads).unwrap_or(0)
        }
    };
    (heads, kv_heads, head_dim)
}

pub(super) fn transformer_arch(
    errs: &mut Errors,
    t: &TransformerSpec,
    hint: Option<&presets::Preset>,
) -> Option<Arch> {
    let before = errs.0.len();
    let path = "spec.model.transformer";
    let dims = [
        ("layers", t.layers),
        ("hiddenSize", t.hidden_size),
        ("attentionHeads", t.attention_heads),
        ("vocabSize", t.vocab_size),
    ];
    for (name, v) in dims {
        errs.at_least(&format!("{path}.{name}"), v, 1);
        errs.at_most(&format!("{path}.{name}"), v, MAX_DIM);
    }
    let (heads, kv_heads, head_dim) = attention_widths(errs, t, path);
    let intermediate = match t.intermediate_size {
        Some(i) => {
            errs.at_least(&format!("{path}.intermediateSize"), i, 1);
            errs.at_most(&format!("{path}.intermediateSize"), i, MAX_DIM);
            i
        }
        None => t.hidden_size.saturating_mul(4),
    };
    let dense_intermediate = mixture_of_experts(errs, t, path);
    errs.at_most(&format!("{path}.maxPositions"), t.max_positions, MAX_DIM);
    let decoder_layers = match (t.kind, t.decoder_layers) {
        (TransformerKind::EncoderDecoder, d) => {
            let d = d.unwrap_or(t.layers);
            errs.at_least(&format!("{path}.decoderLayers"), d, 1);
            errs.at_most(&format!("{path}.decoderLayers"), d, MAX_DIM);
            d
        }
        (_, Some(_)) => {
            errs.push(
                &format!("{path}.decoderLayers"),
                "only used with kind: encoder-decoder",
            );
            0
        }
        (_, None) => 0,
    };
    if errs.0.len() != before {
        return None;
    }
    let mlp = match t.mlp {
        MlpKind::Gated => Mlp::Gated,
        MlpKind::Standard => Mlp::Standard,
    };
    let norm = match t.norm {
        Some(NormKind::Layernorm) => Norm::LayerNorm,
        Some(NormKind::Rmsnorm) => Norm::RmsNorm,
        None if mlp == Mlp::Gated => Norm::RmsNorm,
        None => Norm::LayerNorm,
    };
    let mut arch = Arch {
        kind: match t.kind {
            TransformerKind::Decoder => Kind::Decoder,
            TransformerKind::Encoder => Kind::Encoder,
            TransformerKind::EncoderDecoder => Kind::EncoderDecoder,
        },
        layers: t.layers,
        decoder_layers,
        hidden: t.hidden_size,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab: t.vocab_size,
        mlp,
        // The contract does not say the activation function: one op.
        act: Act::Fused,
        tied: t.tied_embeddings,
        experts: t.experts,
        experts_per_token: t.experts_per_token,
        norm,
        qkv_bias: t.bias,
        linear_bias: t.bias,
        max_positions: t.max_positions,
        type_vocab: 0,
        parallel_block: t.parallel_block.unwrap_or(false),
        post_norms: t.post_norms.unwrap_or(false),
        attention_softcap: t.attention_softcap.unwrap_or(false),
        final_softcap: t.final_logit_softcap.unwrap_or(false),
        shared_intermediate: t.shared_intermediate_size,
        dense_layers: t.dense_layers,
        dense_intermediate,
    };
    if let Some(p) = hint {
        let differ = hint_mismatches(&arch, p);
        if !differ.is_empty() {
            errs.push(
                HINT_PATH,
                format!(
                    "names {} but spec.model.transformer differs: {}",
                    p.name,
                    differ.join(", ")
                ),
            );
            return None;
        }
        // What the dims cannot say comes from the preset unless spelled out.
        let b = &p.arch;
        if t.norm.is_none() {
            arch.norm = b.norm;
        }
        arch.parallel_block = t.parallel_block.unwrap_or(b.parallel_block);
        arch.post_norms = t.post_norms.unwrap_or(b.post_norms);
        arch.attention_softcap = t.attention_softcap.unwrap_or(b.attention_softcap);
        arch.final_softcap = t.final_logit_softcap.unwrap_or(b.final_softcap);
    }
    Some(arch)
}
