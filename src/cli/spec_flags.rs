//! A TrainingJob from command-line flags: `--model llama-3.1-8b --mode qlora
//! --micro-batch-size 2 ...`. Each flag is one field of the contract, named after it
//! (kebab-case; a field whose name another flag or `estimate` already has is prefixed
//! with its parent: `--parallelism-gpus`, `--fit-policy-mode`, `--lora-rank`). The flags
//! only write a document (`apiVersion`, `kind`, `metadata`, `spec`): it is read by the same
//! parser and validator as a YAML TrainingJob, so a bad value is refused with the field's
//! path, as in a file. With `-f`, the flags override the fields of every document.

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches};
use serde_json::{Map, Value};

use crate::api::parse::API_VERSION;

/// How a flag's text becomes a JSON value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Float,
    Bool,
    StrList,
    IntList,
}

/// One flag: its long name, aliases, the field it sets (a path from the document's
/// root), and how its value is read.
struct Flag {
    long: &'static str,
    aliases: &'static [&'static str],
    path: &'static str,
    kind: Kind,
    help: &'static str,
}

const fn flag(
    long: &'static str,
    aliases: &'static [&'static str],
    path: &'static str,
    kind: Kind,
    help: &'static str,
) -> Flag {
    Flag {
        long,
        aliases,
        path,
        kind,
        help,
    }
}

use Kind::*;

/// Every field a flag sets. `--hf-config FILE` and `--set PATH=VALUE` are apart.
const FLAGS: &[Flag] = &[
    flag(
        "name",
        &[],
        "metadata.name",
        Str,
        "metadata.name (default: from the model and mode)",
    ),
    flag(
        "namespace",
        &[],
        "metadata.namespace",
        Str,
        "metadata.namespace",
    ),
    flag(
        "model",
        &["preset"],
        "spec.model.preset",
        Str,
        "spec.model.preset: a catalog model, e.g. llama-3.1-8b",
    ),
    flag("head", &[], "spec.model.head", Str, "spec.model.head"),
    flag(
        "num-labels",
        &[],
        "spec.model.numLabels",
        Int,
        "spec.model.numLabels",
    ),
    flag(
        "input-shape",
        &[],
        "spec.model.inputShape",
        IntList,
        "spec.model.inputShape (comma-separated)",
    ),
    flag(
        "mode",
        &[],
        "spec.training.mode",
        Str,
        "spec.training.mode: full | lora | qlora | adapter | inference",
    ),
    flag(
        "quantization",
        &[],
        "spec.training.quantization",
        Str,
        "spec.training.quantization",
    ),
    flag(
        "quantization-bits",
        &[],
        "spec.training.quantizationBits",
        Int,
        "spec.training.quantizationBits (gptq, awq)",
    ),
    flag(
        "quantization-group-size",
        &[],
        "spec.training.quantizationGroupSize",
        Int,
        "spec.training.quantizationGroupSize (gptq, awq; -1: whole rows)",
    ),
    flag(
        "micro-batch-size",
        &["micro-batch"],
        "spec.training.microBatchSize",
        Int,
        "spec.training.microBatchSize",
    ),
    flag(
        "global-batch-size",
        &[],
        "spec.training.globalBatchSize",
        Int,
        "spec.training.globalBatchSize",
    ),
    flag(
        "sequence-length",
        &["seq"],
        "spec.training.sequenceLength",
        Int,
        "spec.training.sequenceLength",
    ),
    flag(
        "precision",
        &[],
        "spec.training.precision",
        Str,
        "spec.training.precision",
    ),
    flag(
        "optimizer",
        &[],
        "spec.training.optimizer",
        Str,
        "spec.training.optimizer",
    ),
    flag(
        "optimizer-in-backward",
        &[],
        "spec.training.optimizerInBackward",
        Bool,
        "spec.training.optimizerInBackward",
    ),
    flag(
        "optimizer-implementation",
        &[],
        "spec.training.optimizerImplementation",
        Str,
        "spec.training.optimizerImplementation",
    ),
    flag(
        "gradient-checkpointing",
        &[],
        "spec.training.gradientCheckpointing",
        Str,
        "spec.training.gradientCheckpointing",
    ),
    flag(
        "checkpoint-every",
        &[],
        "spec.training.checkpointEvery",
        Int,
        "spec.training.checkpointEvery",
    ),
    flag(
        "activation-offloading",
        &[],
        "spec.training.activationOffloading",
        Bool,
        "spec.training.activationOffloading",
    ),
    flag(
        "attention",
        &[],
        "spec.training.attention",
        Str,
        "spec.training.attention",
    ),
    flag("loss", &[], "spec.training.loss", Str, "spec.training.loss"),
    flag(
        "compile",
        &[],
        "spec.training.compile",
        Bool,
        "spec.training.compile",
    ),
    flag(
        "framework",
        &[],
        "spec.training.framework",
        Str,
        "spec.training.framework",
    ),
    flag(
        "data-on-gpu-bytes",
        &[],
        "spec.training.dataOnGpuBytes",
        Int,
        "spec.training.dataOnGpuBytes",
    ),
    flag(
        "stack",
        &[],
        "spec.training.stack",
        Str,
        "spec.training.stack",
    ),
    flag(
        "batching",
        &[],
        "spec.training.batching",
        Str,
        "spec.training.batching",
    ),
    flag(
        "trainable-parameters",
        &[],
        "spec.training.trainableParameters",
        Float,
        "spec.training.trainableParameters",
    ),
    flag(
        "lora-rank",
        &[],
        "spec.training.lora.rank",
        Int,
        "spec.training.lora.rank",
    ),
    flag(
        "lora-alpha",
        &[],
        "spec.training.lora.alpha",
        Float,
        "spec.training.lora.alpha",
    ),
    flag(
        "lora-dropout",
        &[],
        "spec.training.lora.dropout",
        Float,
        "spec.training.lora.dropout",
    ),
    flag(
        "lora-target-modules",
        &[],
        "spec.training.lora.targetModules",
        StrList,
        "spec.training.lora.targetModules (comma-separated)",
    ),
    flag(
        "lora-variant",
        &[],
        "spec.training.lora.variant",
        Str,
        "spec.training.lora.variant",
    ),
    flag(
        "lora-modules-to-save",
        &[],
        "spec.training.lora.modulesToSave",
        StrList,
        "spec.training.lora.modulesToSave (comma-separated)",
    ),
    flag(
        "target-length",
        &["max-target-length"],
        "spec.training.targetLength",
        Int,
        "spec.training.targetLength (encoder-decoder models)",
    ),
    flag(
        "new-tokens",
        &["max-new-tokens"],
        "spec.training.generation.newTokens",
        Int,
        "spec.training.generation.newTokens",
    ),
    flag(
        "cache-length",
        &[],
        "spec.training.generation.cacheLength",
        Int,
        "spec.training.generation.cacheLength",
    ),
    flag(
        "parallelism-gpus",
        &["num-gpus"],
        "spec.parallelism.gpus",
        Int,
        "spec.parallelism.gpus: GPUs the job runs on (--gpu/--gpus name products)",
    ),
    flag(
        "gpus-per-node",
        &[],
        "spec.parallelism.gpusPerNode",
        Int,
        "spec.parallelism.gpusPerNode",
    ),
    flag(
        "zero-stage",
        &[],
        "spec.parallelism.zeroStage",
        Int,
        "spec.parallelism.zeroStage",
    ),
    flag(
        "strategy",
        &[],
        "spec.parallelism.strategy",
        Str,
        "spec.parallelism.strategy",
    ),
    flag(
        "sharding",
        &[],
        "spec.parallelism.sharding",
        Str,
        "spec.parallelism.sharding",
    ),
    flag(
        "tensor-parallel",
        &[],
        "spec.parallelism.tensorParallel",
        Int,
        "spec.parallelism.tensorParallel",
    ),
    flag(
        "sequence-parallel",
        &[],
        "spec.parallelism.sequenceParallel",
        Bool,
        "spec.parallelism.sequenceParallel",
    ),
    flag(
        "pipeline-parallel",
        &[],
        "spec.parallelism.pipelineParallel",
        Int,
        "spec.parallelism.pipelineParallel",
    ),
    flag(
        "pipeline-schedule",
        &[],
        "spec.parallelism.pipelineSchedule",
        Str,
        "spec.parallelism.pipelineSchedule",
    ),
    flag(
        "virtual-stages",
        &[],
        "spec.parallelism.virtualStages",
        Int,
        "spec.parallelism.virtualStages",
    ),
    flag(
        "context-parallel",
        &[],
        "spec.parallelism.contextParallel",
        Int,
        "spec.parallelism.contextParallel",
    ),
    flag(
        "offload",
        &[],
        "spec.parallelism.offload",
        Str,
        "spec.parallelism.offload",
    ),
    flag(
        "offload-gradients",
        &[],
        "spec.parallelism.offloadGradients",
        Bool,
        "spec.parallelism.offloadGradients",
    ),
    flag(
        "fsdp-version",
        &[],
        "spec.parallelism.fsdpVersion",
        Str,
        "spec.parallelism.fsdpVersion",
    ),
    flag(
        "fit-policy-mode",
        &[],
        "spec.fitPolicy.mode",
        Str,
        "spec.fitPolicy.mode: Reject | Adjust",
    ),
    flag(
        "allow",
        &[],
        "spec.fitPolicy.allow",
        StrList,
        "spec.fitPolicy.allow (comma-separated)",
    ),
    flag(
        "min-micro-batch-size",
        &[],
        "spec.fitPolicy.minMicroBatchSize",
        Int,
        "spec.fitPolicy.minMicroBatchSize",
    ),
    flag(
        "safety-margin",
        &[],
        "spec.fitPolicy.safetyMargin",
        Float,
        "spec.fitPolicy.safetyMargin",
    ),
    flag(
        "max-oom-retries",
        &[],
        "spec.fitPolicy.maxOomRetries",
        Int,
        "spec.fitPolicy.maxOomRetries",
    ),
];

const HF_CONFIG: &str = "hf-config";
const SET: &str = "set";
const HEADING: &str = "The job as flags (instead of, or over, -f)";

/// The fields the flags set, in the order given.
#[derive(Clone, Debug, Default)]
pub struct SpecFlags {
    /// (document path, value, the flag that set it).
    pub values: Vec<(String, Value, String)>,
    /// `--hf-config FILE`.
    pub hf_config: Option<std::path::PathBuf>,
    /// Problems found reading the flags (a `--set` without `=`).
    pub problems: Vec<String>,
}

impl SpecFlags {
    /// True when no flag sets a field.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.hf_config.is_none()
    }

    /// The flag that set `path` (a `spec.` field path from an error), for messages.
    pub fn flag_for(&self, path: &str) -> Option<&str> {
        self.values
            .iter()
            .filter(|(p, _, _)| {
                path == p
                    || path.starts_with(&format!("{p}."))
                    || p.starts_with(&format!("{path}."))
            })
            .map(|(_, _, f)| f.as_str())
            .next_back()
            .or_else(|| {
                (self.hf_config.is_some() && path.starts_with("spec.model.hfConfig"))
                    .then_some("--hf-config")
            })
    }

    /// The TrainingJob document the flags describe (`-f` not given).
    pub fn document(&self) -> Result<Value, String> {
        let mut doc = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "TrainingJob",
            "metadata": {},
            "spec": {},
        });
        self.apply(&mut doc)?;
        let spec_model = doc.pointer("/spec/model").is_some();
        if !spec_model {
            return Err(
                "no job given: name a TrainingJob file with -f FILE, or the model with \
                 --model NAME (a catalog preset) or --hf-config FILE (a Hugging Face config.json)"
                    .to_string(),
            );
        }
        if doc.pointer("/metadata/name").is_none() {
            let name = default_name(&doc);
            set_path(&mut doc, "metadata.name", Value::String(name))?;
        }
        Ok(doc)
    }

    /// Write every flag's field into `doc` (a document of `-f`, or [`Self::document`]'s).
    pub fn apply(&self, doc: &mut Value) -> Result<(), String> {
        if let Some(problem) = self.problems.first() {
            return Err(problem.clone());
        }
        if let Some(path) = &self.hf_config {
            let config = read_hf_config(path)?;
            // The model is given one way: the config replaces a preset from the file.
            if let Some(Value::Object(model)) = doc.pointer_mut("/spec/model") {
                model.remove("preset");
            }
            set_path(doc, "spec.model.hfConfig", config)?;
        }
        for (path, value, flag) in &self.values {
            if path == "spec.model.preset"
                && let Some(Value::Object(model)) = doc.pointer_mut("/spec/model")
            {
                // --model over a file replaces the file's model, whichever way it is given.
                model.retain(|k, _| {
                    !matches!(k.as_str(), "transformer" | "hfConfig" | "layers" | "custom")
                });
            }
            set_path(doc, path, value.clone()).map_err(|e| format!("{flag}: {e}"))?;
        }
        Ok(())
    }

    /// Name the flag after each `spec.…: reason` line that one of the flags set.
    pub fn annotate(&self, message: &str) -> String {
        message
            .lines()
            .map(|line| {
                let path = line.split(':').next().unwrap_or_default().trim();
                match self.flag_for(path) {
                    Some(f) => format!("{line} (set by {f})"),
                    None => line.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `<model>-<mode>`, as a DNS-1123 name.
fn default_name(doc: &Value) -> String {
    let model = doc
        .pointer("/spec/model/preset")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            doc.pointer("/spec/model/hfConfig")
                .and_then(|c| c.get("_name_or_path").or_else(|| c.get("model_type")))
                .and_then(Value::as_str)
                .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
        })
        .unwrap_or_else(|| "job".to_string());
    let mode = doc
        .pointer("/spec/training/mode")
        .and_then(Value::as_str)
        .unwrap_or("full");
    let mut name = String::new();
    for c in format!("{model}-{mode}").chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            name.push(c);
        } else if !name.ends_with('-') && !name.is_empty() {
            name.push('-');
        }
    }
    name.truncate(63);
    let name = name.trim_end_matches('-').to_string();
    if name.is_empty() {
        "job".to_string()
    } else {
        name
    }
}

/// Largest `config.json` read (real ones are a few KiB).
const MAX_HF_CONFIG_BYTES: u64 = 1 << 20;

fn read_hf_config(path: &std::path::Path) -> Result<Value, String> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("--hf-config {shown}: {e}"))?;
    let mut text = String::new();
    file.take(MAX_HF_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("--hf-config {shown}: {e}"))?;
    if text.len() as u64 > MAX_HF_CONFIG_BYTES {
        return Err(format!(
            "--hf-config {shown}: larger than {} KiB; a Hugging Face config.json is a few KiB",
            MAX_HF_CONFIG_BYTES >> 10
        ));
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(format!(
            "--hf-config {shown}: not a JSON object; expected a Hugging Face config.json"
        )),
        Err(e) => Err(format!(
            "--hf-config {shown}: not JSON ({e}); expected a Hugging Face config.json"
        )),
    }
}

/// Set `a.b.c` in `doc`, making the mappings on the way.
fn set_path(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let mut keys = path.split('.').peekable();
    let mut at = doc;
    let mut walked = String::new();
    while let Some(key) = keys.next() {
        if key.is_empty() {
            return Err(format!("{path:?} is not a field path (an empty name)"));
        }
        let Value::Object(map) = at else {
            return Err(format!(
                "{walked} is not a mapping, so {path} cannot be set"
            ));
        };
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(key);
        if keys.peek().is_none() {
            map.insert(key.to_string(), value);
            return Ok(());
        }
        at = map
            .entry(key.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    Ok(())
}

/// A flag's text as the JSON its field reads; a value that is not of the field's type stays
/// a string, so that the validator refuses it with the field's path.
fn value_of(kind: Kind, text: &str) -> Value {
    let text = text.trim();
    let int = |s: &str| {
        let s = s.trim();
        s.parse::<u64>()
            .map(Value::from)
            .or_else(|_| s.parse::<i64>().map(Value::from))
            .unwrap_or_else(|_| Value::String(s.to_string()))
    };
    match kind {
        Str => Value::String(text.to_string()),
        Int => int(text),
        Float => text
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Value::from)
            .unwrap_or_else(|| Value::String(text.to_string())),
        Bool => match text {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            other => Value::String(other.to_string()),
        },
        StrList => Value::Array(list(text).map(|s| Value::String(s.to_string())).collect()),
        IntList => Value::Array(list(text).map(int).collect()),
    }
}

fn list(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// `--set PATH=VALUE`: PATH from the document's root (`spec.` may be left out), VALUE read
/// as YAML.
/// The CRD schema's `type` at a `spec.` path, when it says one.
fn schema_type(path: &str) -> Option<&'static str> {
    let mut at = crate::api::structural::training_job_spec_schema();
    for key in path.strip_prefix("spec.")?.split('.') {
        at = at.get("properties")?.get(key)?;
    }
    at.get("type")?.as_str()
}

fn parse_set(text: &str) -> Result<(String, Value), String> {
    let Some((path, value)) = text.split_once('=') else {
        return Err(format!(
            "--set {text:?}: expected PATH=VALUE, e.g. --set training.runtime.pytorch=2.5"
        ));
    };
    let path = path.trim();
    let path = if path.starts_with("spec.") || path.starts_with("metadata.") {
        path.to_string()
    } else {
        format!("spec.{path}")
    };
    let value = if value.trim().is_empty() || schema_type(&path) == Some("string") {
        // A version such as 2.5 is a string where the contract says so.
        Value::String(value.trim().to_string())
    } else {
        serde_saphyr::from_str::<Value>(value)
            .unwrap_or_else(|_| Value::String(value.trim().to_string()))
    };
    Ok((path, value))
}

impl FromArgMatches for SpecFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut s = SpecFlags::default();
        s.update_from_arg_matches(m)?;
        Ok(s)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        // In the order given on the command line, so that a later flag wins.
        let mut found: Vec<(usize, String, Value, String)> = Vec::new();
        for f in FLAGS {
            if let (Some(values), Some(indices)) =
                (m.get_many::<String>(f.long), m.indices_of(f.long))
            {
                for (v, i) in values.zip(indices) {
                    found.push((
                        i,
                        f.path.to_string(),
                        value_of(f.kind, v),
                        format!("--{}", f.long),
                    ));
                }
            }
        }
        if let (Some(values), Some(indices)) = (m.get_many::<String>(SET), m.indices_of(SET)) {
            for (v, i) in values.zip(indices) {
                match parse_set(v) {
                    Ok((path, value)) => found.push((i, path, value, format!("--set {v}"))),
                    Err(e) => self.problems.push(e),
                }
            }
        }
        found.sort_by_key(|(i, ..)| *i);
        self.values
            .extend(found.into_iter().map(|(_, p, v, f)| (p, v, f)));
        if let Some(path) = m.get_one::<std::path::PathBuf>(HF_CONFIG) {
            self.hf_config = Some(path.clone());
        }
        Ok(())
    }
}

impl Args for SpecFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        cmd = cmd.next_help_heading(HEADING);
        for f in FLAGS {
            let mut arg = Arg::new(f.long)
                .long(f.long)
                .help(f.help)
                .action(ArgAction::Append)
                .value_name(match f.kind {
                    Str => "VALUE",
                    Int => "N",
                    Float => "X",
                    Bool => "true|false",
                    StrList => "A,B,...",
                    IntList => "N,N,...",
                });
            for a in f.aliases {
                arg = arg.visible_alias(*a);
            }
            if f.kind == Bool {
                arg = arg.num_args(0..=1).default_missing_value("true");
            }
            cmd = cmd.arg(arg);
        }
        cmd.arg(
            Arg::new(HF_CONFIG)
                .long(HF_CONFIG)
                .value_name("FILE")
                .value_parser(clap::value_parser!(std::path::PathBuf))
                .help("spec.model.hfConfig: a Hugging Face config.json, for any model"),
        )
        .arg(
            Arg::new(SET)
                .long(SET)
                .value_name("PATH=VALUE")
                .action(ArgAction::Append)
                .help("Any other field, e.g. --set training.runtime.pytorch=2.5 (VALUE is YAML)"),
        )
        .next_help_heading(None::<&str>)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests;
