//! `training.float8` and `training.float8AllGather`: torchao's float8
//! training, where the job's precision, weights and sharding take it.

use super::{Errors, yaml_name};
use crate::api::{
    Float8Recipe, FsdpVersion, ParallelismSpec, Precision, Quantization, Strategy, TrainingMode,
    TrainingSpec,
};

const FIELD: &str = "spec.training.float8";
const ALL_GATHER: &str = "spec.training.float8AllGather";

/// torchao's `Float8Linear` casts the operands of each linear's matmuls
/// from their high-precision dtype to float8 and computes in `_scaled_mm`.
/// Its recipes are made for 16-bit training: under autocast the input is
/// cast to the autocast dtype first (`Float8Linear.forward`), torchtitan
/// trains bf16 under FSDP2's mixed precision, and its fp16 handling is a
/// clamp of the scale (`amax_to_scale`, torchao/float8/float8_utils.py);
/// an fp32 or tf32 job with float8 linears is no recipe anyone runs.
/// Quantized bases keep no `nn.Linear` to swap, and inference runs no
/// backward for the training recipe to shape.
pub(super) fn float8(
    errs: &mut Errors,
    t: &TrainingSpec,
    p: &ParallelismSpec,
    quantization: Quantization,
) {
    if let Some(recipe) = t.float8 {
        let name = yaml_name(&recipe);
        if !matches!(
            t.precision,
            Precision::Bf16Mixed | Precision::Fp16Mixed | Precision::Bf16
        ) {
            errs.push(
                FIELD,
                format!(
                    "{name} is only used with precision bf16-mixed, fp16-mixed or bf16: torchao's Float8Linear casts a 16-bit recipe's matmul operands to float8, and precision {} is not one; set one of those precisions or leave float8 out",
                    yaml_name(&t.precision)
                ),
            );
        }
        if quantization != Quantization::None {
            errs.push(
                FIELD,
                format!(
                    "{name} cannot be used with quantized base weights (quantization {}): Float8Linear replaces unquantized nn.Linear modules; leave float8 out or set quantization none",
                    yaml_name(&quantization)
                ),
            );
        }
        if t.mode == TrainingMode::Inference {
            errs.push(
                FIELD,
                format!(
                    "{name} is a training recipe and mode inference runs no backward; leave float8 out (valid modes: full, lora, adapter)"
                ),
            );
        }
        if p.strategy == Strategy::Megatron {
            errs.push(
                FIELD,
                format!(
                    "{name} is torchao's Float8Linear, which strategy megatron does not use (its fp8 is Transformer Engine's); valid strategies: ddp, fsdp, deepspeed"
                ),
            );
        }
    }
    if t.float8_all_gather {
        all_gather(errs, t.float8, p);
    }
}

/// FSDP2's float8 all-gather: torchao's `WeightWithDynamicFloat8CastTensor`
/// implements `fsdp_pre_all_gather` (torchao/float8/fsdp_utils.py), an
/// extension of `fully_shard` only, and `Float8LinearConfig` refuses it
/// beside any scaling but tensorwise (config.py, `__post_init__`).
fn all_gather(errs: &mut Errors, recipe: Option<Float8Recipe>, p: &ParallelismSpec) {
    match recipe {
        Some(Float8Recipe::Tensorwise) => {}
        Some(other) => errs.push(
            ALL_GATHER,
            format!(
                "true needs float8 tensorwise: torchao's float8 all-gather takes tensorwise scaling only, and float8 is {}; set float8 tensorwise or float8AllGather false",
                yaml_name(&other)
            ),
        ),
        None => errs.push(
            ALL_GATHER,
            "true needs float8 tensorwise, and float8 is not set; set float8 tensorwise or float8AllGather false",
        ),
    }
    let full_shard = p.strategy == Strategy::Fsdp && p.zero() == 3;
    if !full_shard {
        errs.push(
            ALL_GATHER,
            format!(
                "true is FSDP2's all-gather of sharded weights: it needs strategy fsdp with full sharding (zeroStage 3), and the job runs strategy {} at zeroStage {}; set float8AllGather false or shard fully",
                yaml_name(&p.strategy),
                p.zero()
            ),
        );
    } else if p.fsdp_version == Some(FsdpVersion::V1) {
        errs.push(
            ALL_GATHER,
            "true needs FSDP2 (fully_shard), and fsdpVersion is 1, which has no float8 all-gather; set fsdpVersion 2 or float8AllGather false",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::api::test_job as job;
    use crate::api::{Precision, Settings};

    #[test]
    fn a_plan_that_leaves_float8s_precisions_or_sharding_is_refused() {
        let j = job("
model: {preset: llama-3.1-8b}
training: {float8: tensorwise, float8AllGather: true}
parallelism: {gpus: 8, strategy: fsdp}
");
        let written = Settings::of(&j);
        let with = |s: &Settings| match j.with_settings(s) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.into_iter().map(|f| (f.path, f.reason)).collect(),
        };
        for precision in [Precision::Bf16, Precision::Fp16Mixed] {
            assert!(
                with(&Settings {
                    precision,
                    ..written
                })
                .is_empty()
            );
        }
        let p = with(&Settings {
            precision: Precision::Fp32,
            ..written
        });
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "spec.training.float8");
        assert!(p[0].1.contains("precision fp32 is not one"), "{p:?}");
        // Sharding only gradients and states leaves no weights to gather.
        let p = with(&Settings {
            zero_stage: 2,
            ..written
        });
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "spec.training.float8AllGather");
        assert!(p[0].1.contains("zeroStage 2"), "{p:?}");
    }
}
