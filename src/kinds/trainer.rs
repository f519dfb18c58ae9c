//! What a trainer's own command line says about the job: Transformers' and
//! TRL's scripts under `accelerate launch`, `torchrun` or `python`
//! (`--model_name_or_path`, `--per_device_train_batch_size`, ...), torchtune's
//! `tune run <recipe> --config <config> key=value ...` and LitGPT's
//! `litgpt finetune_* <model> --train.micro_batch_size ...`. Each field read
//! is recorded with where it came from; what the command does not say is
//! the trainer's documented default, or vramguard's, and recorded as such.

use std::collections::BTreeMap;

use super::shell::basename;
use crate::api::{
    Attention, Checkpointing, LoraSpec, Optimizer, Precision, Quantization, Sharding, Stack,
    Strategy, TrainingMode, TrainingSpec,
};
use crate::estimate::presets;

/// Which trainer's command line a job was read from (and so which knobs
/// advice is phrased in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trainer {
    /// Transformers' `Trainer` / TRL scripts (`--per_device_train_batch_size`).
    HfTrainer,
    /// torchtune's `tune run` (`batch_size=`).
    Torchtune,
    /// LitGPT's `litgpt finetune_*` (`--train.micro_batch_size`).
    LitGpt,
}

impl Trainer {
    pub fn name(self) -> &'static str {
        match self {
            Trainer::HfTrainer => "Transformers/TRL",
            Trainer::Torchtune => "torchtune",
            Trainer::LitGpt => "LitGPT",
        }
    }
}

/// One field of the estimate and where its value came from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Source {
    /// The TrainingJob field, e.g. `training.microBatchSize`.
    pub field: String,
    /// Where: `--per_device_train_batch_size 4`, `TrainingArguments' default`, ...
    pub from: String,
}

/// What a command line says.
#[derive(Clone, Debug, PartialEq)]
pub struct FromCommand {
    pub trainer: Trainer,
    /// The catalog model.
    pub preset: &'static str,
    pub training: TrainingSpec,
    pub strategy: Strategy,
    pub sharding: Option<Sharding>,
    /// Gradient accumulation steps as the command says.
    pub accumulation: u64,
    /// Processes the launcher starts (per node × nodes), when it says.
    pub launcher_world: Option<u64>,
    pub sources: Vec<Source>,
}

/// The outcome of reading one simple command.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    Found(Box<FromCommand>),
    /// A trainer's command that does not say enough, or says it in a way
    /// vramguard cannot read: why.
    Unreadable(String),
    /// Not a trainer's command vramguard knows.
    NotTrainer,
}

/// The catalog model a Hugging Face repository id, a local path or a
/// catalog name names: as written, then its last path component, then without
/// an instruction-tuning suffix (`-Instruct`, `-chat`, `-hf`: same shapes).
pub fn catalog_model(written: &str) -> Option<&'static str> {
    let trimmed = written.trim_end_matches('/');
    let mut tries: Vec<String> = vec![trimmed.to_string()];
    let parts: Vec<&str> = trimmed.split('/').filter(|s| !s.is_empty()).collect();
    if parts.len() >= 2 {
        tries.push(parts[parts.len() - 2..].join("/"));
    }
    if let Some(last) = parts.last() {
        tries.push(last.to_string());
    }
    let mut more = Vec::new();
    for t in &tries {
        for suffix in ["-Instruct", "-instruct", "-chat", "-Chat", "-hf", "-it"] {
            if let Some(base) = t.strip_suffix(suffix) {
                more.push(base.to_string());
                // "Llama-2-7b-chat-hf" → "Llama-2-7b"
                for s2 in ["-chat", "-Chat", "-Instruct"] {
                    if let Some(b2) = base.strip_suffix(s2) {
                        more.push(b2.to_string());
                    }
                }
            }
        }
    }
    tries.extend(more);
    tries.iter().find_map(|t| presets::find(t)).map(|p| p.name)
}

/// Read one simple command.
pub fn parse(words: &[String]) -> Parsed {
    // Leading `VAR=value`, `env`, `exec`, `time`.
    let mut i = 0;
    while i < words.len()
        && (matches!(words[i].as_str(), "env" | "exec" | "time" | "nohup")
            || (words[i].contains('=') && !words[i].starts_with('-')))
    {
        i += 1;
    }
    let w = &words[i..];
    let Some(prog) = w.first().map(|p| basename(p)) else {
        return Parsed::NotTrainer;
    };
    match prog {
        "accelerate" if w.get(1).map(String::as_str) == Some("launch") => {
            launched(&w[2..], Launcher::Accelerate)
        }
        "torchrun" => launched(&w[1..], Launcher::Torchrun),
        p if p.starts_with("python") => {
            // python [-u] -m torch.distributed.run|launch ... | python script.py ...
            let mut j = 1;
            while j < w.len() && matches!(w[j].as_str(), "-u" | "-O" | "-B") {
                j += 1;
            }
            match (
                w.get(j).map(String::as_str),
                w.get(j + 1).map(String::as_str),
            ) {
                (Some("-m"), Some("torch.distributed.run" | "torch.distributed.launch")) => {
                    launched(&w[j + 2..], Launcher::Torchrun)
                }
                (Some("-m"), Some("accelerate.commands.launch")) => {
                    launched(&w[j + 2..], Launcher::Accelerate)
                }
                (Some("-m"), Some(_)) => hf_script(&w[j + 2..], &Launch::default()),
                (Some(_), _) => hf_script(&w[j + 1..], &Launch::default()),
                _ => Parsed::NotTrainer,
            }
        }
        "trl"
            if matches!(
                w.get(1).map(String::as_str),
                Some("sft" | "dpo" | "kto" | "orpo")
            ) =>
        {
            hf_script(&w[2..], &Launch::default())
        }
        "tune" if w.get(1).map(String::as_str) == Some("run") => torchtune(&w[2..]),
        "litgpt" => litgpt(&w[1..]),
        _ => Parsed::NotTrainer,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Launcher {
    Accelerate,
    Torchrun,
}

/// What the launcher's own options say.
#[derive(Default)]
struct Launch {
    /// `--mixed_precision` of accelerate.
    mixed_precision: Option<String>,
    fsdp: bool,
    deepspeed: bool,
    world: Option<u64>,
}

/// Options of a launcher that take no value.
fn launcher_flag(l: Launcher, opt: &str) -> bool {
    let opt = opt.trim_start_matches('-').replace('-', "_");
    match l {
        Launcher::Accelerate => matches!(
            opt.as_str(),
            "multi_gpu"
                | "use_fsdp"
                | "use_deepspeed"
                | "use_megatron_lm"
                | "cpu"
                | "debug"
                | "no_python"
                | "quiet"
                | "q"
                | "same_network"
                | "tpu"
                | "use_xpu"
                | "enable_cpu_affinity"
                | "dynamo_use_fullgraph"
                | "dynamo_use_dynamic"
        ),
        Launcher::Torchrun => matches!(
            opt.as_str(),
            "standalone" | "no_python" | "run_path" | "tee_all"
        ),
    }
}

/// `<launcher options> script.py <script args>`.
fn launched(w: &[String], l: Launcher) -> Parsed {
    let mut opts: BTreeMap<String, String> = BTreeMap::new();
    let mut i = 0;
    let mut module = false;
    while i < w.len() {
        let a = &w[i];
        if a == "-m" || a == "--module" {
            module = true;
            i += 1;
            continue;
        }
        if !a.starts_with('-') {
            break;
        }
        let key = a.trim_start_matches('-').replace('-', "_");
        if let Some((k, v)) = key.split_once('=') {
            opts.insert(k.to_string(), v.to_string());
            i += 1;
        } else if launcher_flag(l, a) {
            opts.insert(key, "true".to_string());
            i += 1;
        } else {
            opts.insert(key, w.get(i + 1).cloned().unwrap_or_default());
            i += 2;
        }
    }
    let _ = module;
    if i >= w.len() {
        return Parsed::NotTrainer;
    }
    let num = |k: &str| opts.get(k).and_then(|v| v.parse::<u64>().ok());
    let world = match l {
        Launcher::Accelerate => num("num_processes"),
        Launcher::Torchrun => num("nproc_per_node").map(|n| n * num("nnodes").unwrap_or(1)),
    };
    let launch = Launch {
        mixed_precision: opts.get("mixed_precision").cloned(),
        fsdp: opts.contains_key("use_fsdp"),
        deepspeed: opts.contains_key("use_deepspeed"),
        world,
    };
    // The script (or module) and its arguments.
    hf_script(&w[i + 1..], &launch)
}

/// `--key value`, `--key=value` and bare `--flag` options of a script (the
/// way `HfArgumentParser` reads them); positional words are skipped.
fn options(w: &[String]) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < w.len() {
        let a = &w[i];
        i += 1;
        let Some(key) = a.strip_prefix("--") else {
            continue;
        };
        if let Some((k, v)) = key.split_once('=') {
            out.insert(k.to_string(), Some(v.to_string()));
        } else if let Some(v) = w.get(i).filter(|v| !v.starts_with("--")) {
            // A list option (`--lora_target_modules q_proj v_proj`) keeps its first word.
            out.insert(key.to_string(), Some(v.clone()));
            i += 1;
        } else {
            out.insert(key.to_string(), None);
        }
    }
    out
}

/// A boolean option: absent false, bare true, else its value.
fn truthy(opts: &BTreeMap<String, Option<String>>, key: &str) -> Result<bool, String> {
    match opts.get(key) {
        None => Ok(false),
        Some(None) => Ok(true),
        Some(Some(v)) => match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(format!("--{key} {v}: not true or false")),
        },
    }
}

fn number(flag: &str, v: &str) -> Result<u64, String> {
    v.parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(|| {
        if v.contains('$') {
            format!("{flag} {v}: set from a variable vramguard cannot see")
        } else {
            format!("{flag} {v}: not a whole number of at least 1")
        }
    })
}

fn src(field: &str, from: impl Into<String>) -> Source {
    Source {
        field: field.to_string(),
        from: from.into(),
    }
}

/// Transformers' `--optim` names.
fn hf_optimizer(v: &str) -> Option<Optimizer> {
    Some(match v {
        "adamw_torch"
        | "adamw_torch_fused"
        | "adamw_hf"
        | "adamw_apex_fused"
        | "adamw_torch_xla"
        | "adamw_torch_npu_fused" => Optimizer::Adamw,
        "adafactor" => Optimizer::Adafactor,
        "adamw_bnb_8bit" | "adamw_8bit" | "adamw_torch_8bit" => Optimizer::Adamw8bit,
        "paged_adamw_8bit" => Optimizer::PagedAdamw8bit,
        "adamw_torch_4bit" => Optimizer::Adamw4bit,
        "paged_adamw_32bit" | "paged_adamw" => Optimizer::PagedAdamw,
        "sgd" => Optimizer::Sgd,
        _ => return None,
    })
}

/// A Transformers/TRL training script's arguments.
fn hf_script(w: &[String], launch: &Launch) -> Parsed {
    let o = options(w);
    let Some(model) = o.get("model_name_or_path") else {
        return Parsed::NotTrainer;
    };
    match hf(&o, model.as_deref(), launch) {
        Ok(f) => Parsed::Found(Box::new(f)),
        Err(e) => Parsed::Unreadable(e),
    }
}

fn hf(
    o: &BTreeMap<String, Option<String>>,
    model: Option<&str>,
    launch: &Launch,
) -> Result<FromCommand, String> {
    let model = model.ok_or("--model_name_or_path without a value")?;
    if model.contains('$') {
        return Err(format!(
            "--model_name_or_path {model}: set from a variable vramguard cannot see"
        ));
    }
    let preset = catalog_model(model).ok_or_else(|| {
        format!("--model_name_or_path {model}: not a model in vramguard's catalog")
    })?;
    if launch.deepspeed || o.contains_key("deepspeed") {
        return Err(
            "--deepspeed: the ZeRO stage is in the DeepSpeed config file, not on the command line"
                .to_string(),
        );
    }
    let mut sources = vec![src(
        "model.preset",
        format!("--model_name_or_path {model} (catalog {preset})"),
    )];
    let mut t = TrainingSpec {
        stack: Some(Stack::HfTrainer),
        ..TrainingSpec::default()
    };
    sources.push(src(
        "training.stack",
        "Transformers' Trainer (the script's flags)",
    ));
    let value = |k: &str| o.get(k).and_then(|v| v.as_deref());
    t.micro_batch_size = match value("per_device_train_batch_size") {
        Some(v) => {
            let n = number("--per_device_train_batch_size", v)?;
            sources.push(src(
                "training.microBatchSize",
                format!("--per_device_train_batch_size {n}"),
            ));
            n
        }
        None => {
            sources.push(src(
                "training.microBatchSize",
                "8, TrainingArguments' default",
            ));
            8
        }
    };
    let accumulation = match value("gradient_accumulation_steps") {
        Some(v) => {
            let n = number("--gradient_accumulation_steps", v)?;
            sources.push(src(
                "training.globalBatchSize",
                format!("--gradient_accumulation_steps {n} x micro-batch x GPUs"),
            ));
            n
        }
        None => 1,
    };
    let bf16 = truthy(o, "bf16")?;
    let fp16 = truthy(o, "fp16")?;
    t.precision = if bf16 {
        sources.push(src("training.precision", "bf16-mixed, --bf16"));
        Precision::Bf16Mixed
    } else if fp16 {
        sources.push(src("training.precision", "fp16-mixed, --fp16"));
        Precision::Fp16Mixed
    } else {
        match launch.mixed_precision.as_deref() {
            Some("bf16") => {
                sources.push(src(
                    "training.precision",
                    "bf16-mixed, accelerate --mixed_precision bf16",
                ));
                Precision::Bf16Mixed
            }
            Some("fp16") => {
                sources.push(src(
                    "training.precision",
                    "fp16-mixed, accelerate --mixed_precision fp16",
                ));
                Precision::Fp16Mixed
            }
            _ => {
                sources.push(src(
                    "training.precision",
                    "fp32: neither --bf16 nor --fp16 (TrainingArguments' default)",
                ));
                Precision::Fp32
            }
        }
    };
    if truthy(o, "gradient_checkpointing")? {
        t.gradient_checkpointing = Checkpointing::Full;
        sources.push(src(
            "training.gradientCheckpointing",
            "full, --gradient_checkpointing",
        ));
    }
    if let Some(v) = value("max_seq_length")
        .map(|v| ("--max_seq_length", v))
        .or(value("max_length").map(|v| ("--max_length", v)))
        .or(value("block_size").map(|v| ("--block_size", v)))
    {
        t.sequence_length = number(v.0, v.1)?;
        sources.push(src("training.sequenceLength", format!("{} {}", v.0, v.1)));
    } else {
        sources.push(src(
            "training.sequenceLength",
            format!(
                "{}: not on the command line (vramguard's default)",
                t.sequence_length
            ),
        ));
    }
    if let Some(v) = value("optim") {
        t.optimizer = hf_optimizer(v)
            .ok_or_else(|| format!("--optim {v}: an optimizer vramguard does not model"))?;
        sources.push(src("training.optimizer", format!("--optim {v}")));
    }
    if let Some(v) = value("attn_implementation") {
        t.attention = match v {
            "flash_attention_2" | "flash_attention_3" => Attention::Flash,
            "sdpa" => Attention::Sdpa,
            "eager" => Attention::Eager,
            _ => {
                return Err(format!(
                    "--attn_implementation {v}: not eager, sdpa or flash_attention_2"
                ));
            }
        };
        sources.push(src(
            "training.attention",
            format!("--attn_implementation {v}"),
        ));
    }
    let four_bit = truthy(o, "load_in_4bit")?;
    if truthy(o, "use_peft")? || four_bit {
        t.mode = if four_bit {
            TrainingMode::Qlora
        } else {
            TrainingMode::Lora
        };
        // TRL's ModelConfig defaults: r 16, alpha 32.
        let rank = match value("lora_r") {
            Some(v) => number("--lora_r", v)?,
            None => 16,
        };
        let alpha = match value("lora_alpha") {
            Some(v) => number("--lora_alpha", v)? as f64,
            None => 32.0,
        };
        t.lora = Some(LoraSpec {
            rank,
            alpha,
            ..LoraSpec::default()
        });
        sources.push(src(
            "training.mode",
            if four_bit {
                "qlora, --use_peft --load_in_4bit"
            } else {
                "lora, --use_peft"
            },
        ));
        sources.push(src(
            "training.lora",
            format!(
                "rank {rank} ({}), alpha {alpha} ({})",
                if value("lora_r").is_some() {
                    "--lora_r"
                } else {
                    "TRL's default"
                },
                if value("lora_alpha").is_some() {
                    "--lora_alpha"
                } else {
                    "TRL's default"
                }
            ),
        ));
    }
    let (strategy, sharding) = match value("fsdp") {
        Some(v) if v.contains("full_shard") => (Strategy::Fsdp, Some(Sharding::FullShard)),
        Some(v) if v.contains("shard_grad_op") => (Strategy::Fsdp, Some(Sharding::ShardGradOp)),
        Some(v) => return Err(format!("--fsdp {v}: not full_shard or shard_grad_op")),
        None if launch.fsdp => (Strategy::Fsdp, None),
        None => (Strategy::Ddp, None),
    };
    if strategy == Strategy::Fsdp {
        sources.push(src(
            "parallelism.strategy",
            if launch.fsdp {
                "fsdp, accelerate --use_fsdp"
            } else {
                "fsdp, --fsdp"
            },
        ));
    }
    Ok(FromCommand {
        trainer: Trainer::HfTrainer,
        preset,
        training: t,
        strategy,
        sharding,
        accumulation,
        launcher_world: launch.world,
        sources,
    })
}

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
fn torchtune(w: &[String]) -> Parsed {
    match tt(w) {
        Ok(f) => Parsed::Found(Box::new(f)),
        Err(e) => Parsed::Unreadable(e),
    }
}

fn tt(w: &[String]) -> Result<FromCommand, String> {
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
    // What torchtune's shipped configs set (batch_size 2, bf16 weights and
    // optimizer, activation checkpointing on), unless overridden.
    let get = |k: &str| overrides.get(k).map(String::as_str);
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
    if let Some(v) = get("tokenizer.max_seq_len") {
        t.sequence_length = number("tokenizer.max_seq_len=", v)?;
        sources.push(src(
            "training.sequenceLength",
            format!("tokenizer.max_seq_len={v}"),
        ));
    } else {
        sources.push(src(
            "training.sequenceLength",
            format!(
                "{}: the config leaves it to the data (vramguard's default)",
                t.sequence_length
            ),
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

/// `litgpt finetune_lora|finetune_full|finetune_adapter|finetune [lora|full|adapter] <model> --opt value ...`
fn litgpt(w: &[String]) -> Parsed {
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
    // jsonargparse: `--a.b value` or `--a.b=value`; the checkpoint is the first positional.
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
    t.precision = match opts.get("precision").map(String::as_str) {
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
        t.sequence_length = number("--train.max_seq_length", v)?;
        sources.push(src(
            "training.sequenceLength",
            format!("--train.max_seq_length {v}"),
        ));
    } else {
        sources.push(src(
            "training.sequenceLength",
            format!(
                "{}: not on the command line (vramguard's default)",
                t.sequence_length
            ),
        ));
    }
    if matches!(t.mode, TrainingMode::Lora | TrainingMode::Qlora) {
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
        t.lora = Some(lora);
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
