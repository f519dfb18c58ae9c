//! Quantization as the spec and the model's config say it: the method, its bits and
//! its group size, and what the two may disagree on.

use super::*;

/// The YAML spelling of a quantization.
pub fn quantization_name(q: Quantization) -> &'static str {
    match q {
        Quantization::None => "none",
        Quantization::Int8 => "int8",
        Quantization::Nf4 => "nf4",
        Quantization::Nf4Double => "nf4-double",
        Quantization::Gptq => "gptq",
        Quantization::Awq => "awq",
    }
}

/// What a model config's `quantization_config` says: the method when it is
/// one the estimator knows (gptq, awq), with its `bits` and `group_size`.
/// bitsandbytes configs are left to `training.quantization`, which says the
/// same thing.
pub(super) type ConfigQuantization = (Quantization, Option<u64>, Option<i64>);

pub(super) fn hf_quantization(
    config: &serde_json::Map<String, serde_json::Value>,
    errs: &mut Errors,
) -> Option<ConfigQuantization> {
    const PATH: &str = "spec.model.hfConfig.quantization_config";
    let qc = config.get("quantization_config")?;
    let Some(qc) = qc.as_object() else {
        errs.push(
            PATH,
            "must be an object (the checkpoint's quantization_config)",
        );
        return None;
    };
    let method = match qc.get("quant_method").and_then(|m| m.as_str()) {
        Some("gptq") => Quantization::Gptq,
        Some("awq") => Quantization::Awq,
        _ => return None,
    };
    let bits = match qc.get("bits") {
        None => None,
        Some(b) => match b.as_u64() {
            Some(b) => Some(b),
            None => {
                errs.push(
                    &format!("{PATH}.bits"),
                    format!("{b} is not a whole number of bits; use 2, 3, 4 or 8"),
                );
                None
            }
        },
    };
    let group = match qc.get("group_size") {
        None => None,
        Some(g) => match g.as_i64() {
            Some(g) => Some(g),
            None => {
                errs.push(
                    &format!("{PATH}.group_size"),
                    format!(
                        "{g} is not a whole number; use -1 or a group of input rows such as 128"
                    ),
                );
                None
            }
        },
    };
    Some((method, bits, group))
}

/// The bits and group size of a gptq or awq checkpoint: the spec's fields,
/// else its config's, else 4 bits in groups of 128 (the GPTQ and AWQ
/// defaults: optimum's `GPTQConfig`, AutoAWQ's `quant_config`).
pub(super) fn quantization_format(
    t: &crate::api::TrainingSpec,
    q: Quantization,
    config: Option<ConfigQuantization>,
    errs: &mut Errors,
) -> (u8, Option<u64>) {
    let config = config.filter(|(m, _, _)| *m == q);
    if !q.is_prequantized() {
        for (field, set) in [
            (
                "spec.training.quantizationBits",
                t.quantization_bits.is_some(),
            ),
            (
                "spec.training.quantizationGroupSize",
                t.quantization_group_size.is_some(),
            ),
        ] {
            if set {
                errs.push(
                    field,
                    format!(
                        "describes a gptq or awq checkpoint, but quantization is {}; remove it or set quantization: gptq or awq",
                        quantization_name(q)
                    ),
                );
            }
        }
        return (4, None);
    }
    let bits = t
        .quantization_bits
        .map(u64::from)
        .or(config.and_then(|(_, b, _)| b))
        .unwrap_or(4);
    let allowed: &[u64] = if q == Quantization::Awq {
        &[4]
    } else {
        &[2, 3, 4, 8]
    };
    if !allowed.contains(&bits) {
        errs.push(
            "spec.training.quantizationBits",
            format!(
                "{bits} bits is not a {} format; use {}",
                quantization_name(q),
                allowed
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    let group = t
        .quantization_group_size
        .or(config.and_then(|(_, _, g)| g))
        .unwrap_or(128);
    let group = match group {
        -1 => None,
        g if (1..=MAX_QUANTIZATION_GROUP).contains(&g) => Some(g as u64),
        g => {
            errs.push(
                "spec.training.quantizationGroupSize",
                format!(
                    "{g} is not a group size; use -1 (one group per row) or 1 to {MAX_QUANTIZATION_GROUP} input rows (128 is usual)"
                ),
            );
            Some(128)
        }
    };
    (bits.min(8) as u8, group)
}

/// The largest quantization group a checkpoint is checked against.
const MAX_QUANTIZATION_GROUP: i64 = 1 << 20;

/// The quantization the job runs with, its bits and group size: as written, or as the
/// model's config says for a pre-quantized checkpoint.
pub(super) fn resolved_quantization(
    errs: &mut Errors,
    spec: &TrainingJobSpec,
) -> (Quantization, u8, Option<u64>) {
    let t = &spec.training;
    // A pre-quantized checkpoint says so in its config.
    let from_config = spec
        .model
        .hf_config
        .as_ref()
        .and_then(|c| hf_quantization(c, errs));
    if let (TrainingMode::Full, None, Some((q, _, _))) = (t.mode, t.quantization, from_config) {
        errs.push(
            "spec.training.mode",
            format!(
                "full fine-tuning cannot train the {} checkpoint model.hfConfig describes (its quantization_config); use mode: lora, qlora or adapter, or the config of the unquantized model",
                quantization_name(q)
            ),
        );
    }
    // (Reported above for full fine-tuning; not again at `quantization`.)
    let written = t.quantization.or(from_config
        .map(|(q, _, _)| q)
        .filter(|_| t.mode != TrainingMode::Full));
    let quantization = match (t.mode, written) {
        (TrainingMode::Qlora, None) => Quantization::Nf4,
        (TrainingMode::Qlora, Some(Quantization::None)) => {
            errs.push(
                "spec.training.quantization",
                "none contradicts mode: qlora (quantized base weights); use nf4, nf4-double, gptq or awq, or mode: lora",
            );
            Quantization::None
        }
        (TrainingMode::Full, Some(q)) if q != Quantization::None => {
            errs.push(
                "spec.training.quantization",
                format!(
                    "{} base weights cannot be trained in mode: full; use mode: lora, qlora or adapter",
                    quantization_name(q)
                ),
            );
            q
        }
        (_, q) => q.unwrap_or(Quantization::None),
    };
    let (quantization_bits, quantization_group) =
        quantization_format(t, quantization, from_config, errs);
    (quantization, quantization_bits, quantization_group)
}
