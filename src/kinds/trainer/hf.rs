//! Transformers' and TRL's scripts: their flags read into the job.

use super::*;

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
pub(super) fn hf_script(w: &[String], launch: &Launch) -> Parsed {
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
    t.precision = hf_precision(o, launch, &mut sources)?;
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
        t.sequence_length = Some(number(v.0, v.1)?);
        sources.push(src("training.sequenceLength", format!("{} {}", v.0, v.1)));
    } else {
        sources.push(src(
            "training.sequenceLength",
            "not on the command line (vramguard's default: 2048, or the model's learned position table where shorter)".to_string(),
        ));
    }
    if let Some(v) = value("optim") {
        t.optimizer = hf_optimizer(v)
            .ok_or_else(|| format!("--optim {v}: an optimizer vramguard does not model"))?;
        sources.push(src("training.optimizer", format!("--optim {v}")));
    }
    if let Some(v) = value("attn_implementation") {
        t.attention = hf_attention(v)?;
        sources.push(src(
            "training.attention",
            format!("--attn_implementation {v}"),
        ));
    }
    hf_peft(o, &mut t, &mut sources)?;
    let (strategy, sharding) = hf_strategy(value("fsdp"), launch, &mut sources)?;
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

/// The precision of `--bf16`/`--fp16`, else accelerate's `--mixed_precision`, else fp32.
fn hf_precision(
    o: &BTreeMap<String, Option<String>>,
    launch: &Launch,
    sources: &mut Vec<Source>,
) -> Result<Precision, String> {
    let bf16 = truthy(o, "bf16")?;
    let fp16 = truthy(o, "fp16")?;
    Ok(if bf16 {
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
    })
}

/// `--attn_implementation`.
fn hf_attention(v: &str) -> Result<Attention, String> {
    Ok(match v {
        "flash_attention_2" | "flash_attention_3" => Attention::Flash,
        "sdpa" => Attention::Sdpa,
        "eager" => Attention::Eager,
        _ => {
            return Err(format!(
                "--attn_implementation {v}: not eager, sdpa or flash_attention_2"
            ));
        }
    })
}

/// `--use_peft` and `--load_in_4bit`: LoRA or QLoRA with TRL's defaults unless
/// `--lora_r`/`--lora_alpha` say otherwise.
fn hf_peft(
    o: &BTreeMap<String, Option<String>>,
    t: &mut TrainingSpec,
    sources: &mut Vec<Source>,
) -> Result<(), String> {
    let value = |k: &str| o.get(k).and_then(|v| v.as_deref());
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
    Ok(())
}

/// `--fsdp full_shard|shard_grad_op`, else accelerate's `--use_fsdp`, else DDP.
fn hf_strategy(
    fsdp: Option<&str>,
    launch: &Launch,
    sources: &mut Vec<Source>,
) -> Result<(Strategy, Option<Sharding>), String> {
    let (strategy, sharding) = match fsdp {
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
    Ok((strategy, sharding))
}
