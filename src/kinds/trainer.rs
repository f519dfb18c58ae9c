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
use hf::hf_script;
use litgpt::litgpt;
use torchtune::torchtune;

mod hf;
mod litgpt;
mod torchtune;

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
