//! The parameter-efficient part of validation: LoRA's target modules under the names
//! models give them, the modules kept in full, and the methods' cross-field checks.

use super::*;

/// LoRA projections we know how to size.
pub const LORA_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
];

/// The module names models give their projections, as users copy them into
/// PEFT's `target_modules`, with the projections they stand for. A fused
/// projection (GPT-2's `c_attn`, GPT-NeoX's and Falcon's `query_key_value`,
/// Baichuan's `W_pack`, Phi-3's `qkv_proj` and `gate_up_proj`) gets one
/// adapter pair over the fused output; it is counted as one pair per
/// projection it fuses, which adds `rank × hidden` per extra projection
/// (one more `lora_A`) and keeps the adapter's input once per projection:
/// the safe side, a fraction of a percent of the adapter.
pub const LORA_TARGET_ALIASES: &[(&str, &[&str])] = &[
    ("c_attn", &["q_proj", "k_proj", "v_proj"]),
    ("query_key_value", &["q_proj", "k_proj", "v_proj"]),
    ("W_pack", &["q_proj", "k_proj", "v_proj"]),
    ("qkv_proj", &["q_proj", "k_proj", "v_proj"]),
    ("Wqkv", &["q_proj", "k_proj", "v_proj"]),
    ("query", &["q_proj"]),
    ("key", &["k_proj"]),
    ("value", &["v_proj"]),
    ("q", &["q_proj"]),
    ("k", &["k_proj"]),
    ("v", &["v_proj"]),
    ("o", &["o_proj"]),
    ("out_proj", &["o_proj"]),
    ("dense", &["o_proj"]),
    // GPT-2 names its attention output and its second MLP linear `c_proj`:
    // PEFT matches both.
    ("c_proj", &["o_proj", "down_proj"]),
    ("c_fc", &["up_proj"]),
    ("fc1", &["up_proj"]),
    ("fc2", &["down_proj"]),
    ("dense_h_to_4h", &["up_proj"]),
    ("dense_4h_to_h", &["down_proj"]),
    ("gate_up_proj", &["gate_proj", "up_proj"]),
    ("wi", &["up_proj"]),
    ("wi_0", &["gate_proj"]),
    ("wi_1", &["up_proj"]),
    ("wo", &["down_proj"]),
    ("w1", &["gate_proj"]),
    ("w3", &["up_proj"]),
    ("w2", &["down_proj"]),
];

/// The projections a LoRA target name stands for in `arch`: one of
/// `LORA_TARGETS`, or a model's own name (`LORA_TARGET_ALIASES`). BERT's
/// `dense` matches its attention output and both MLP linears
/// (`attention.output.dense`, `intermediate.dense`, `output.dense`).
pub fn lora_target_names(name: &str, arch: Option<&Arch>) -> Option<&'static [&'static str]> {
    if let Some(known) = LORA_TARGETS.iter().position(|t| *t == name) {
        return Some(&LORA_TARGETS[known..known + 1]);
    }
    if name == "dense" && arch.is_some_and(|a| a.kind == Kind::Encoder) {
        return Some(&["o_proj", "up_proj", "down_proj"]);
    }
    LORA_TARGET_ALIASES
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(_, names)| *names)
}

/// Names of the embedding and the LM head in models' own code, for PEFT's
/// `modules_to_save`.
pub const SAVED_MODULE_ALIASES: &[(&str, &str)] = &[
    ("wte", "embed_tokens"),
    ("word_embeddings", "embed_tokens"),
    ("embed_in", "embed_tokens"),
    ("tok_embeddings", "embed_tokens"),
    ("embed_out", "lm_head"),
    ("output", "lm_head"),
];

/// `embed_tokens` or `lm_head` for a `modulesToSave` entry, by either name.
pub fn saved_module_name(name: &str) -> Option<&'static str> {
    match name {
        "embed_tokens" => Some("embed_tokens"),
        "lm_head" => Some("lm_head"),
        _ => SAVED_MODULE_ALIASES
            .iter()
            .find(|(a, _)| *a == name)
            .map(|(_, n)| *n),
    }
}

/// The projections inside a transformer block (the LoRA targets but the head).
pub fn block_projections() -> &'static [&'static str] {
    &LORA_TARGETS[..LORA_TARGETS.len() - 1]
}

/// `peft` names a method that goes with the mode, on a model whose blocks
/// we know, with parameters in range; `checkpointEvery` is at least 1.
pub(super) fn validate_peft(errs: &mut Errors, t: &crate::api::TrainingSpec, transformer: bool) {
    use crate::api::PeftMethod;
    super::checkpoint_every(errs, t);
    let Some(p) = &t.peft else {
        return;
    };
    let path = "spec.training.peft";
    let method_ok = match p.method {
        PeftMethod::Galore => t.mode == TrainingMode::Full,
        _ => t.mode == TrainingMode::Adapter,
    };
    if !method_ok {
        let need = if p.method == PeftMethod::Galore {
            "mode: full"
        } else {
            "mode: adapter"
        };
        errs.push(
            &format!("{path}.method"),
            format!("{:?} needs {need}", p.method).to_lowercase(),
        );
    }
    if !transformer {
        errs.push(
            path,
            "needs a transformer model (preset, transformer or hfConfig); set trainableParameters with mode adapter instead",
        );
    }
    for (name, v, max) in [
        ("virtualTokens", p.virtual_tokens, 1u64 << 20),
        ("rank", p.rank, 1 << 16),
        ("layers", p.layers, 1 << 24),
    ] {
        if let Some(v) = v {
            errs.at_least(&format!("{path}.{name}"), v, 1);
            errs.at_most(&format!("{path}.{name}"), v, max);
        }
    }
    let uses = |field: bool, name: &str, methods: &[PeftMethod]| {
        (field && !methods.contains(&p.method)).then(|| {
            (
                format!("{path}.{name}"),
                format!(
                    "not used by method {:?}; it applies to {}",
                    p.method,
                    methods
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
                .to_lowercase(),
            )
        })
    };
    let misplaced = [
        uses(
            p.virtual_tokens.is_some(),
            "virtualTokens",
            &[PeftMethod::PromptTuning, PeftMethod::PrefixTuning],
        ),
        uses(
            p.rank.is_some(),
            "rank",
            &[PeftMethod::Vera, PeftMethod::Galore],
        ),
        uses(
            p.target_modules.is_some(),
            "targetModules",
            &[PeftMethod::Ia3, PeftMethod::Vera],
        ),
        uses(p.layers.is_some(), "layers", &[PeftMethod::LlamaAdapter]),
    ];
    for (field, reason) in misplaced.into_iter().flatten() {
        errs.push(&field, reason);
    }
    if let Some(targets) = &p.target_modules {
        if targets.is_empty() {
            errs.push(
                &format!("{path}.targetModules"),
                format!(
                    "must name at least one of {}",
                    block_projections().join(", ")
                ),
            );
        }
        for (i, m) in targets.iter().enumerate() {
            if !block_projections().contains(&m.as_str()) {
                errs.push(
                    &format!("{path}.targetModules[{i}]"),
                    format!(
                        "unknown module {m:?}; known: {}",
                        block_projections().join(", ")
                    ),
                );
            }
        }
    }
}

/// LoRA's settings, target modules and saved modules under their canonical names; `None`
/// in a mode without LoRA.
pub(super) fn lora_of(
    errs: &mut Errors,
    t: &TrainingSpec,
    model: Option<&ResolvedModel>,
) -> Option<LoraSpec> {
    match t.mode {
        TrainingMode::Lora | TrainingMode::Qlora => {
            let l = t.lora.clone().unwrap_or_default();
            errs.at_least("spec.training.lora.rank", l.rank, 1);
            errs.at_most("spec.training.lora.rank", l.rank, 1 << 16);
            if !l.alpha.is_finite() || l.alpha <= 0.0 {
                errs.push(
                    "spec.training.lora.alpha",
                    format!("{} is not allowed; must be a positive number", l.alpha),
                );
            } else if l.alpha > MAX_LORA_ALPHA {
                errs.push(
                    "spec.training.lora.alpha",
                    format!(
                        "{} is too large; maximum is {MAX_LORA_ALPHA} (fp16's largest value: the adapter's output scaled by alpha/rank past it is infinite); usual values are 8 to 512, often twice the rank",
                        l.alpha
                    ),
                );
            }
            if !l.dropout.is_finite() || !(0.0..1.0).contains(&l.dropout) {
                errs.push(
                    "spec.training.lora.dropout",
                    format!("{} is not allowed; use a probability in [0, 1)", l.dropout),
                );
            }
            if l.target_modules.is_empty() {
                errs.push(
                    "spec.training.lora.targetModules",
                    format!("must name at least one of {}", LORA_TARGETS.join(", ")),
                );
            }
            let arch = match model {
                Some(ResolvedModel::Transformer(a)) => Some(a),
                _ => None,
            };
            let mut canonical: Vec<String> = Vec::new();
            let mut unknown = 0usize;
            for (i, m) in l.target_modules.iter().enumerate() {
                match lora_target_names(m, arch) {
                    Some(names) => {
                        for n in names {
                            if !canonical.iter().any(|c| c == n) {
                                canonical.push((*n).to_string());
                            }
                        }
                    }
                    // The first few unknown names, each with the known ones; a
                    // list of thousands gets one line for the rest.
                    None if unknown < 8 => {
                        unknown += 1;
                        errs.push(
                            &format!("spec.training.lora.targetModules[{i}]"),
                            format!(
                                "unknown module {m:?}; known: {}, or a model's own name for them (c_attn, query_key_value, W_pack, c_proj, fc1, fc2, dense, ...: the field's description lists them)",
                                LORA_TARGETS.join(", "),
                            ),
                        )
                    }
                    None => unknown += 1,
                }
            }
            if unknown > 8 {
                errs.push(
                    "spec.training.lora.targetModules",
                    format!("{} more unknown modules", unknown - 8),
                );
            }
            let mut saved: Vec<String> = Vec::new();
            for (i, m) in l.modules_to_save.iter().enumerate() {
                match saved_module_name(m) {
                    Some(n) => {
                        if !saved.iter().any(|c| c == n) {
                            saved.push(n.to_string());
                        }
                    }
                    None => errs.push(
                        &format!("spec.training.lora.modulesToSave[{i}]"),
                        format!(
                            "unknown module {m:?}; known: embed_tokens, lm_head, or a model's own name for them ({})",
                            SAVED_MODULE_ALIASES
                                .iter()
                                .map(|(a, _)| *a)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                }
            }
            Some(LoraSpec {
                target_modules: canonical,
                modules_to_save: saved,
                ..l
            })
        }
        _ => {
            if t.lora.is_some() {
                errs.push("spec.training.lora", "only used with mode: lora or qlora");
            }
            None
        }
    }
}
