//! A plan's changes said in the job's own knobs: the flags of its trainer's
//! command line, or the fields of its `vramguard.io/training` annotation.
//! vramguard never rewrites these kinds; the user changes the knob.

use super::trainer::Trainer;
use crate::api::{Checkpointing, Loss, Optimizer, Precision};
use crate::plan::Settings;

/// Whose knobs a job has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knobs {
    Trainer(Trainer),
    /// The `vramguard.io/training` annotation's fields.
    Annotation,
}

fn yaml<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Every change from `from` to `to`, in `knobs`' words, one string per knob
/// (micro-batch and accumulation joined: "`a` with `b`").
pub fn phrase(knobs: Knobs, from: &Settings, to: &Settings) -> Vec<String> {
    let mut out = Vec::new();
    let micro = from.micro_batch_size != to.micro_batch_size;
    let accum = from.gradient_accumulation_steps != to.gradient_accumulation_steps;
    if micro || accum {
        let (m, a) = (
            (from.micro_batch_size, to.micro_batch_size),
            (
                from.gradient_accumulation_steps,
                to.gradient_accumulation_steps,
            ),
        );
        out.push(match knobs {
            Knobs::Trainer(Trainer::HfTrainer) => format!(
                "`--per_device_train_batch_size {} → {}` with `--gradient_accumulation_steps {} → {}`",
                m.0, m.1, a.0, a.1
            ),
            Knobs::Trainer(Trainer::Torchtune) => format!(
                "`batch_size={} → {}` with `gradient_accumulation_steps={} → {}`",
                m.0, m.1, a.0, a.1
            ),
            Knobs::Trainer(Trainer::LitGpt) => format!(
                "`--train.micro_batch_size {} → {}` (`--train.global_batch_size` kept: accumulation {} → {})",
                m.0, m.1, a.0, a.1
            ),
            Knobs::Annotation => format!(
                "`training.microBatchSize {} → {}` with gradient accumulation {} → {} in the trainer",
                m.0, m.1, a.0, a.1
            ),
        });
    }
    if from.gradient_checkpointing != to.gradient_checkpointing {
        let on = to.gradient_checkpointing != Checkpointing::None;
        out.push(match knobs {
            Knobs::Trainer(Trainer::HfTrainer) if on => "`--gradient_checkpointing`".to_string(),
            Knobs::Trainer(Trainer::Torchtune) => format!(
                "`enable_activation_checkpointing={}`",
                if on { "True" } else { "False" }
            ),
            _ => format!(
                "`training.gradientCheckpointing {} → {}`",
                yaml(&from.gradient_checkpointing),
                yaml(&to.gradient_checkpointing)
            ),
        });
    }
    if from.precision != to.precision {
        out.push(match (knobs, to.precision) {
            (Knobs::Trainer(Trainer::HfTrainer), Precision::Bf16Mixed) => "`--bf16`".to_string(),
            (Knobs::Trainer(Trainer::HfTrainer), Precision::Fp16Mixed) => "`--fp16`".to_string(),
            (Knobs::Trainer(Trainer::Torchtune), Precision::Bf16) => "`dtype=bf16`".to_string(),
            (Knobs::Trainer(Trainer::LitGpt), p) => format!(
                "`--precision {}`",
                match p {
                    Precision::Bf16 => "bf16-true",
                    Precision::Bf16Mixed => "bf16-mixed",
                    Precision::Fp16 => "16-true",
                    Precision::Fp16Mixed => "16-mixed",
                    _ => "32-true",
                }
            ),
            _ => format!(
                "`training.precision {} → {}`",
                yaml(&from.precision),
                yaml(&to.precision)
            ),
        });
    }
    if from.optimizer != to.optimizer {
        let hf = match to.optimizer {
            Optimizer::Adamw8bit => Some("adamw_bnb_8bit"),
            Optimizer::PagedAdamw8bit => Some("paged_adamw_8bit"),
            Optimizer::Adamw4bit => Some("adamw_torch_4bit"),
            Optimizer::PagedAdamw => Some("paged_adamw_32bit"),
            Optimizer::Adafactor => Some("adafactor"),
            _ => None,
        };
        out.push(match (knobs, hf) {
            (Knobs::Trainer(Trainer::HfTrainer), Some(name)) => format!("`--optim {name}`"),
            (Knobs::Trainer(Trainer::Torchtune), _)
                if to.optimizer == Optimizer::PagedAdamw8bit =>
            {
                "`optimizer._component_=bitsandbytes.optim.PagedAdamW8bit`".to_string()
            }
            _ => format!(
                "`training.optimizer {} → {}`",
                yaml(&from.optimizer),
                yaml(&to.optimizer)
            ),
        });
    }
    if from.zero_stage != to.zero_stage {
        out.push(match (knobs, to.zero_stage) {
            (Knobs::Trainer(Trainer::HfTrainer), 3) => "`--fsdp full_shard`".to_string(),
            (Knobs::Trainer(Trainer::HfTrainer), 2) => "`--fsdp shard_grad_op`".to_string(),
            _ => format!(
                "`parallelism.zeroStage {} → {}`",
                from.zero_stage, to.zero_stage
            ),
        });
    }
    if from.loss != to.loss {
        out.push(match (knobs, to.loss) {
            (Knobs::Trainer(Trainer::HfTrainer), Loss::Chunked) => {
                "`--use_liger_kernel` (chunked cross-entropy)".to_string()
            }
            (Knobs::Trainer(Trainer::Torchtune), Loss::Chunked) => {
                "`loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss`".to_string()
            }
            _ => format!("`training.loss {} → {}`", yaml(&from.loss), yaml(&to.loss)),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(micro: u64, accum: u64) -> Settings {
        Settings {
            micro_batch_size: micro,
            gradient_accumulation_steps: accum,
            precision: Precision::Bf16Mixed,
            gradient_checkpointing: Checkpointing::None,
            optimizer: Optimizer::Adamw,
            zero_stage: 0,
            loss: Loss::Standard,
        }
    }

    #[test]
    fn a_smaller_micro_batch_is_said_in_each_trainers_flags() {
        let (a, b) = (settings(4, 8), settings(2, 16));
        assert_eq!(
            phrase(Knobs::Trainer(Trainer::HfTrainer), &a, &b),
            ["`--per_device_train_batch_size 4 → 2` with `--gradient_accumulation_steps 8 → 16`"]
        );
        assert_eq!(
            phrase(Knobs::Trainer(Trainer::Torchtune), &a, &b),
            ["`batch_size=4 → 2` with `gradient_accumulation_steps=8 → 16`"]
        );
        assert!(
            phrase(Knobs::Trainer(Trainer::LitGpt), &a, &b)[0]
                .starts_with("`--train.micro_batch_size 4 → 2`")
        );
        assert!(
            phrase(Knobs::Annotation, &a, &b)[0].starts_with("`training.microBatchSize 4 → 2`")
        );
        let mut c = b;
        c.gradient_checkpointing = Checkpointing::Selective;
        assert_eq!(
            phrase(Knobs::Trainer(Trainer::HfTrainer), &a, &c)[1],
            "`--gradient_checkpointing`"
        );
        assert!(phrase(Knobs::Trainer(Trainer::HfTrainer), &a, &a).is_empty());
    }
}
