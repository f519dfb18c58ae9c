//! LitGPT's `litgpt finetune_* <model> --train.micro_batch_size ...`.

use super::*;

/// `litgpt finetune_lora|finetune_full|finetune_adapter|finetune [lora|full|adapter] <model> --opt value ...`
pub(super) fn litgpt(w: &[String]) -> Parsed {
    let Some(sub) = w.first() else {
        return Parsed::NotTrainer;
    };
    let (mode_word, rest) = match sub.as_str() {
        "finetune" => match w.get(1).map(String::as_str) {
            Some(m @ ("lora" | "full" | "adapter" | "adapter_v2")) => (m.to_string(), &w[2..]),
            _ => ("lora".to_string(), &w[1..]),
        },
        s if s.starts_with("finetune_") => (s["finetune_".len()..].to_string(), &w[1..]),
        _ => return Parsed::NotTrainer,
    };
    match lit(&mode_word, rest) {
        Ok(f) => Parsed::Found(Box::new(f)),
        Err(e) => Parsed::Unreadable(e),
    }
}

fn lit(mode_word: &str, w: &[String]) -> Result<FromCommand, String> {
    let (opts, model) = lit_options(w);
    let model = model
        .or_else(|| opts.get("checkpoint_dir").cloned())
        .ok_or("litgpt finetune without a model")?;
    let preset = catalog_model(&model)
        .ok_or_else(|| format!("litgpt model {model}: not a model in vramguard's catalog"))?;
    let mut sources = vec![src("model.preset", format!("{model} (catalog {preset})"))];
    let mut t = TrainingSpec {
        stack: Some(Stack::Litgpt),
        ..TrainingSpec::default()
    };
    sources.push(src(
        "training.stack",
        format!("LitGPT (litgpt finetune_{mode_word})"),
    ));
    t.mode = match mode_word {
        "lora" => TrainingMode::Lora,
        "full" => TrainingMode::Full,
        "adapter" | "adapter_v2" => TrainingMode::Adapter,
        m => return Err(format!("litgpt finetune_{m}: not lora, full or adapter")),
    };
    if let Some(q) = opts.get("quantize") {
        t.quantization = Some(match q.as_str() {
            "bnb.nf4" => Quantization::Nf4,
            "bnb.nf4-dq" => Quantization::Nf4Double,
            "bnb.int8" => Quantization::Int8,
            _ => {
                return Err(format!(
                    "--quantize {q}: not bnb.nf4, bnb.nf4-dq or bnb.int8"
                ));
            }
        });
        if t.mode == TrainingMode::Lora && q.starts_with("bnb.nf4") {
            t.mode = TrainingMode::Qlora;
        }
        sources.push(src("training.quantization", format!("--quantize {q}")));
    }
    sources.push(src("training.mode", format!("finetune_{mode_word}")));
    t.precision = lit_precision(&opts, &mut sources)?;
    if let Some(v) = opts.get("train.micro_batch_size") {
        t.micro_batch_size = number("--train.micro_batch_size", v)?;
        sources.push(src(
            "training.microBatchSize",
            format!("--train.micro_batch_size {v}"),
        ));
    } else {
        sources.push(src("training.microBatchSize", "1, LitGPT's default"));
    }
    let global = opts
        .get("train.global_batch_size")
        .map(|v| number("--train.global_batch_size", v))
        .transpose()?;
    if let Some(v) = opts
        .get("train.max_seq_length")
        .or(opts.get("data.max_seq_length"))
    {
        t.sequence_length = Some(number("--train.max_seq_length", v)?);
        sources.push(src(
            "training.sequenceLength",
            format!("--train.max_seq_length {v}"),
        ));
    } else {
        sources.push(src(
            "training.sequenceLength",
            "not on the command line (vramguard's default: 2048, or the model's learned position table where shorter)".to_string(),
        ));
    }
    if matches!(t.mode, TrainingMode::Lora | TrainingMode::Qlora) {
        t.lora = Some(lit_lora(&opts, &mut sources)?);
    }
    let devices = opts
        .get("devices")
        .map(|v| number("--devices", v))
        .transpose()?;
    let nodes = opts
        .get("num_nodes")
        .map(|v| number("--num_nodes", v))
        .transpose()?
        .unwrap_or(1);
    // LitGPT's accumulation: global / (devices × nodes) / micro, at least 1.
    let accumulation = global
        .map(|g| {
            sources.push(src(
                "training.globalBatchSize",
                format!("--train.global_batch_size {g}"),
            ));
            (g / (devices.unwrap_or(1) * nodes) / t.micro_batch_size).max(1)
        })
        .unwrap_or(0);
    Ok(FromCommand {
        trainer: Trainer::LitGpt,
        preset,
        training: t,
        strategy: if devices.unwrap_or(1) * nodes > 1 {
            Strategy::Fsdp
        } else {
            Strategy::Ddp
        },
        sharding: None,
        // 0: unsaid; the LitGPT profile's own accumulation applies.
        accumulation,
        launcher_world: devices.map(|d| d * nodes),
        sources,
    })
}

/// jsonargparse's options (`--a.b value` or `--a.b=value`) and the first positional, the
/// checkpoint.
fn lit_options(w: &[String]) -> (BTreeMap<String, String>, Option<String>) {
    let mut opts: BTreeMap<String, String> = BTreeMap::new();
    let mut model: Option<String> = None;
    let mut i = 0;
    while i < w.len() {
        let a = &w[i];
        if let Some(k) = a.strip_prefix("--") {
            if let Some((k, v)) = k.split_once('=') {
                opts.insert(k.to_string(), v.to_string());
                i += 1;
            } else {
                opts.insert(k.to_string(), w.get(i + 1).cloned().unwrap_or_default());
                i += 2;
            }
        } else {
            if model.is_none() {
                model = Some(a.clone());
            }
            i += 1;
        }
    }
    (opts, model)
}

/// `--precision`, else LitGPT's default for training.
fn lit_precision(
    opts: &BTreeMap<String, String>,
    sources: &mut Vec<Source>,
) -> Result<Precision, String> {
    let precision = match opts.get("precision").map(String::as_str) {
        None => Precision::Bf16Mixed,
        Some("bf16-true") => Precision::Bf16,
        Some("bf16-mixed") => Precision::Bf16Mixed,
        Some("16-true") => Precision::Fp16,
        Some("16-mixed") => Precision::Fp16Mixed,
        Some("32-true") => Precision::Fp32,
        Some(p) => {
            return Err(format!(
                "--precision {p}: not bf16-true, bf16-mixed, 16-true, 16-mixed or 32-true"
            ));
        }
    };
    sources.push(src(
        "training.precision",
        match opts.get("precision") {
            Some(p) => format!("--precision {p}"),
            None => "bf16-mixed, LitGPT's default for training".to_string(),
        },
    ));
    Ok(precision)
}

/// The LoRA rank and alpha of `--lora_r` and `--lora_alpha`, else vramguard's defaults.
fn lit_lora(
    opts: &BTreeMap<String, String>,
    sources: &mut Vec<Source>,
) -> Result<LoraSpec, String> {
    let mut lora = LoraSpec::default();
    if let Some(v) = opts.get("lora_r") {
        lora.rank = number("--lora_r", v)?;
    }
    if let Some(v) = opts.get("lora_alpha") {
        lora.alpha = number("--lora_alpha", v)? as f64;
    }
    sources.push(src(
        "training.lora",
        format!(
            "rank {}, alpha {} (--lora_r/--lora_alpha, else vramguard's default)",
            lora.rank, lora.alpha
        ),
    ));
    Ok(lora)
}
