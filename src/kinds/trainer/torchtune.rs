//! torchtune's `tune run <recipe> --config <config> key=value ...`.

use super::*;

/// torchtune's model directories and the catalog's spelling of their names.
const TORCHTUNE_MODELS: &[(&str, &str)] = &[
    ("llama3_3", "llama-3.3-"),
    ("llama3_2", "llama-3.2-"),
    ("llama3_1", "llama-3.1-"),
    ("llama3", "llama-3-"),
    ("llama2", "llama-2-"),
    ("qwen2_5", "qwen2.5-"),
    ("mistral", "mistral-"),
    ("gemma", "gemma-"),
    ("gemma2", "gemma-2-"),
];

/// `tune run [--nproc_per_node N ...] <recipe> --config <dir>/<size>_<method>[_single_device] key=value ...`
pub(super) fn torchtune(w: &[String]) -> Parsed {
    match tt(w) {
        Ok(f) => Parsed::Found(Box::new(f)),
        Err(e) => Parsed::Unreadable(e),
    }
}

fn tt(w: &[String]) -> Result<FromCommand, String> {
    let (launcher, recipe, config, overrides) = tt_args(w)?;
    let config = config.ok_or_else(|| format!("tune run {recipe} without --config"))?;
    if !recipe.contains("finetune") {
        return Err(format!(
            "tune run {recipe}: only the finetune recipes are read"
        ));
    }
    if config.ends_with(".yaml") || config.ends_with(".yml") {
        return Err(format!(
            "--config {config}: a config file of the job's own, which vramguard cannot read"
        ));
    }
    let (dir, file) = config.split_once('/').ok_or_else(|| {
        format!("--config {config}: not one of torchtune's <model>/<config> names")
    })?;
    let (size, method) = file
        .split_once('_')
        .ok_or_else(|| format!("--config {config}: not <size>_<method>"))?;
    let preset = TORCHTUNE_MODELS
        .iter()
        .find(|(d, _)| *d == dir)
        .and_then(|(_, prefix)| presets::find(&format!("{prefix}{}", size.to_ascii_lowercase())))
        .map(|p| p.name)
        .ok_or_else(|| {
            format!("--config {config}: {dir} {size} is not a model in vramguard's catalog")
        })?;
    let mut sources = vec![src(
        "model.preset",
        format!("--config {config} (catalog {preset})"),
    )];
    let mut t = TrainingSpec {
        stack: Some(Stack::Torchtune),
        ..TrainingSpec::default()
    };
    sources.push(src(
        "training.stack",
        format!("torchtune (tune run {recipe})"),
    ));
    t.mode = if method.starts_with("qlora") {
        TrainingMode::Qlora
    } else if method.starts_with("lora") || method.starts_with("dora") {
        TrainingMode::Lora
    } else if method.starts_with("full") {
        TrainingMode::Full
    } else {
        return Err(format!(
            "--config {config}: {method} is not a full, lora or qlora config"
        ));
    };
    sources.push(src(
        "training.mode",
        format!("{method} in --config {config}"),
    ));
    let accumulation = tt_step(&overrides, &mut t, &mut sources)?;
    tt_model(&overrides, &mut t, &mut sources)?;
    let distributed = recipe.contains("distributed");
    let world = launcher
        .get("nproc_per_node")
        .and_then(|v| v.parse::<u64>().ok())
        .map(|n| {
            n * launcher
                .get("nnodes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
        });
    if distributed {
        sources.push(src(
            "parallelism.strategy",
            format!("fsdp, full sharding ({recipe})"),
        ));
    }
    Ok(FromCommand {
        trainer: Trainer::Torchtune,
        preset,
        training: t,
        strategy: if distributed {
            Strategy::Fsdp
        } else {
            Strategy::Ddp
        },
        sharding: distributed.then_some(Sharding::FullShard),
        accumulation,
        launcher_world: world,
        sources,
    })
}

/// torchrun's options (before the recipe), the recipe, `--config` and the `key=value`
/// overrides.
#[allow(clippy::type_complexity)]
fn tt_args(
    w: &[String],
) -> Result<
    (
        BTreeMap<String, String>,
        String,
        Option<String>,
        BTreeMap<String, String>,
    ),
    String,
> {
    // torchrun's options come before the recipe.
    let mut i = 0;
    let mut launcher: BTreeMap<String, String> = BTreeMap::new();
    while i < w.len() && w[i].starts_with('-') {
        let key = w[i].trim_start_matches('-').replace('-', "_");
        if let Some((k, v)) = key.split_once('=') {
            launcher.insert(k.to_string(), v.to_string());
            i += 1;
        } else if launcher_flag(Launcher::Torchrun, &w[i]) {
            i += 1;
        } else {
            launcher.insert(key, w.get(i + 1).cloned().unwrap_or_default());
            i += 2;
        }
    }
    let recipe = w.get(i).ok_or("tune run without a recipe")?.clone();
    let rest = &w[i + 1..];
    let mut config: Option<String> = None;
    let mut overrides: BTreeMap<String, String> = BTreeMap::new();
    let mut j = 0;
    while j < rest.len() {
        let a = &rest[j];
        if a == "--config" || a == "-c" {
            config = rest.get(j + 1).cloned();
            j += 2;
            continue;
        }
        if let Some(c) = a.strip_prefix("--config=") {
            config = Some(c.to_string());
        } else if let Some((k, v)) = a.split_once('=') {
            overrides.insert(k.to_string(), v.to_string());
        }
        j += 1;
    }
    Ok((launcher, recipe, config, overrides))
}

/// The step's knobs from the overrides (batch, accumulation, precision, checkpointing,
/// offloading, the optimizer in backward), else what torchtune's configs set; returns the
/// accumulation steps.
fn tt_step(
    overrides: &BTreeMap<String, String>,
    t: &mut TrainingSpec,
    sources: &mut Vec<Source>,
) -> Result<u64, String> {
    let get = |k: &str| overrides.get(k).map(String::as_str);
    // What torchtune's shipped configs set (batch_size 2, bf16 weights and
    // optimizer, activation checkpointing on), unless overridden.
    t.micro_batch_size = match get("batch_size") {
        Some(v) => {
            let n = number("batch_size=", v)?;
            sources.push(src("training.microBatchSize", format!("batch_size={n}")));
            n
        }
        None => {
            sources.push(src("training.microBatchSize", "2, torchtune's configs"));
            2
        }
    };
    let accumulation = match get("gradient_accumulation_steps") {
        Some(v) => {
            let n = number("gradient_accumulation_steps=", v)?;
            sources.push(src(
                "training.globalBatchSize",
                format!("gradient_accumulation_steps={n} x batch_size x GPUs"),
            ));
            n
        }
        None => 1,
    };
    t.precision = match get("dtype").unwrap_or("bf16") {
        "bf16" => Precision::Bf16,
        "fp32" => Precision::Fp32,
        v => return Err(format!("dtype={v}: torchtune trains in bf16 or fp32")),
    };
    sources.push(src(
        "training.precision",
        match get("dtype") {
            Some(v) => format!("dtype={v}"),
            None => "bf16 (pure), torchtune's configs".to_string(),
        },
    ));
    let bool_of = |k: &str, v: &str| match v {
        "True" | "true" => Ok(true),
        "False" | "false" => Ok(false),
        _ => Err(format!("{k}={v}: not True or False")),
    };
    let ckpt = match get("enable_activation_checkpointing") {
        Some(v) => bool_of("enable_activation_checkpointing", v)?,
        None => true,
    };
    t.gradient_checkpointing = if ckpt {
        Checkpointing::Full
    } else {
        Checkpointing::None
    };
    sources.push(src(
        "training.gradientCheckpointing",
        match get("enable_activation_checkpointing") {
            Some(v) => format!("enable_activation_checkpointing={v}"),
            None => "full, torchtune's configs".to_string(),
        },
    ));
    if let Some(v) = get("enable_activation_offloading") {
        t.activation_offloading = bool_of("enable_activation_offloading", v)?;
        sources.push(src(
            "training.activationOffloading",
            format!("enable_activation_offloading={v}"),
        ));
    }
    if let Some(v) = get("optimizer_in_bwd") {
        t.optimizer_in_backward = bool_of("optimizer_in_bwd", v)?;
        sources.push(src(
            "training.optimizerInBackward",
            format!("optimizer_in_bwd={v}"),
        ));
    }
    Ok(accumulation)
}

/// The sequence length, the optimizer and the adapters from the overrides.
fn tt_model(
    overrides: &BTreeMap<String, String>,
    t: &mut TrainingSpec,
    sources: &mut Vec<Source>,
) -> Result<(), String> {
    let get = |k: &str| overrides.get(k).map(String::as_str);
    if let Some(v) = get("tokenizer.max_seq_len") {
        t.sequence_length = Some(number("tokenizer.max_seq_len=", v)?);
        sources.push(src(
            "training.sequenceLength",
            format!("tokenizer.max_seq_len={v}"),
        ));
    } else {
        sources.push(src(
            "training.sequenceLength",
            "the config leaves it to the data (vramguard's default: 2048, or the model's learned position table where shorter)".to_string(),
        ));
    }
    if let Some(v) = get("optimizer._component_") {
        t.optimizer = match v.rsplit('.').next().unwrap_or(v) {
            "AdamW" | "Adam" => Optimizer::Adamw,
            "AdamW8bit" | "Adam8bit" => Optimizer::Adamw8bit,
            "PagedAdamW8bit" => Optimizer::PagedAdamw8bit,
            "AdamW4bit" | "Adam4bit" => Optimizer::Adamw4bit,
            "PagedAdamW" => Optimizer::PagedAdamw,
            "SGD" => Optimizer::SgdMomentum,
            _ => {
                return Err(format!(
                    "optimizer._component_={v}: an optimizer vramguard does not model"
                ));
            }
        };
        sources.push(src(
            "training.optimizer",
            format!("optimizer._component_={v}"),
        ));
    }
    if matches!(t.mode, TrainingMode::Lora | TrainingMode::Qlora) {
        let mut lora = LoraSpec::default();
        if let Some(v) = get("model.lora_rank") {
            lora.rank = number("model.lora_rank=", v)?;
        }
        if let Some(v) = get("model.lora_alpha") {
            lora.alpha = number("model.lora_alpha=", v)? as f64;
        }
        sources.push(src(
            "training.lora",
            format!(
                "rank {}, alpha {} (model.lora_rank/model.lora_alpha, else vramguard's default)",
                lora.rank, lora.alpha
            ),
        ));
        t.lora = Some(lora);
    }
    Ok(())
}
