//! The slowdown model the shrink search minimises: one multiplicative factor
//! per change, all constants in this file with where they come from. Pure
//! arithmetic; nothing here looks at memory.
//!
//! A factor is the step time of the changed job over the step time of the job
//! as written (1.10 = 10 % slower). Factors of independent changes multiply.
//! The numbers are rough, published orders of magnitude; they only have to
//! rank the candidate plans the way an ML engineer would.

use crate::api::{Checkpointing, Loss, Optimizer, Precision};

/// Tokens per micro-batch at which a GPU runs a transformer step at half its
/// best throughput, in the saturation model `tokens / (tokens + this)`.
// source: estimate. The GEMMs of a step are (tokens × hidden) · (hidden × hidden); cuBLAS on an
// A100/H100 needs a few hundred rows to come near peak for hidden 4096, and the fixed per-micro-
// batch costs (kernel launches, ~hundreds per layer at ~5 µs) are ~1 % of a 4k-token micro-batch
// of an 8B model. 512 makes a 4096-token micro-batch run at 89 % of a 32k-token one and a
// 512-token one at 53 %: accumulation is nearly free for LLM-sized micro-batches and costly for
// small models with short samples (BERT at 128 tokens), which is what practitioners report.
pub const HALF_EFFICIENCY_TOKENS: f64 = 512.0;

/// Selective activation recomputation (attention core only): +3 % step time.
// source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
// Models" (arXiv:2205.05198): selective recomputation removes over 90 % of the overhead of full
// recomputation (abstract); their per-layer timings (Table 4) put it at a few percent, about 4 %
// with sequence parallelism.
pub const SELECTIVE_CHECKPOINTING: f64 = 1.03;

/// Full activation checkpointing (recompute every block's forward): +33 %.
// source: a training step is forward + backward ≈ 1 + 2 = 3 forward passes (Kaplan et al. 2020,
// "Scaling Laws for Neural Language Models", C ≈ 6N per token: 2N forward, 4N backward);
// recomputation adds one forward: 4/3 ≈ 1.33. Korthikanti et al. 2022 (Table 4) measure a
// per-layer overhead of the same order for full recomputation in Megatron-LM.
pub const FULL_CHECKPOINTING: f64 = 1.33;

/// ZeRO stage 1 (optimizer states sharded): +1 %.
// source: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models" (arXiv:1910.02054) §7 (communication analysis): stages 1 and 2 move the same 2Ψ
// elements per step as DDP's all-reduce (reduce-scatter + all-gather); the +1 % is our estimate
// of the sharded step's extra launches and lost overlap.
pub const ZERO_1: f64 = 1.01;

/// ZeRO stage 2 (+ gradients sharded): +2 %.
// source: ZeRO paper §7 (same 2Ψ communication volume as DDP); +2 % is our estimate of the
// bucketed reduce-scatter's lost overlap.
pub const ZERO_2: f64 = 1.02;

/// ZeRO stage 3 / FSDP full shard (+ parameters sharded): +10 %.
// source: ZeRO paper §7: stage 3 moves 3Ψ per step, 1.5× DDP's volume (parameters are
// all-gathered again in forward and backward); +10 % is our estimate for nodes where most of
// that overlaps with compute (NVLink within a node, InfiniBand between nodes).
pub const ZERO_3: f64 = 1.10;

/// 8-bit optimizer states (bitsandbytes block-wise quantization): +1 %.
// source: Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"
// (arXiv:2110.02861): 8-bit Adam matches 32-bit Adam's accuracy at a step time as fast or
// faster; the +1 % is a penalty for a numerics change the user did not ask for.
pub const EIGHT_BIT_OPTIMIZER: f64 = 1.01;

/// fp32/tf32 → 16-bit mixed precision: a speed-up in practice (tensor cores), but a numerics
/// change; counted as a +1 % penalty so that it is chosen only when it is needed.
// source: Micikevicius et al. 2018, "Mixed Precision Training" (arXiv:1710.03740): same accuracy
// with fp16 + loss scaling and an fp32 master copy; bf16 needs no loss scaling (Kalamkar et al.
// 2019, arXiv:1905.12322). The penalty is our policy, not a measurement.
pub const MIXED_PRECISION: f64 = 1.01;

/// Chunked (fused) cross-entropy instead of materialised fp32 logits: +1 %.
// source: Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models"
// (arXiv:2411.09009) and Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024,
// arXiv:2410.10989) report throughput on par with the standard loss; +1 % is a penalty for the
// change of implementation.
pub const CHUNKED_LOSS: f64 = 1.01;

/// Throughput fraction of a micro-batch of `tokens` tokens.
pub fn micro_batch_efficiency(tokens: f64) -> f64 {
    let tokens = tokens.max(1.0);
    tokens / (tokens + HALF_EFFICIENCY_TOKENS)
}

/// Slowdown of running micro-batches of `new_micro` instead of `old_micro`
/// samples of `sequence_length` tokens (with accumulation making up the rest).
pub fn micro_batch_slowdown(old_micro: u64, new_micro: u64, sequence_length: u64) -> f64 {
    let seq = sequence_length as f64;
    micro_batch_efficiency(old_micro as f64 * seq) / micro_batch_efficiency(new_micro as f64 * seq)
}

/// Step time of a checkpointing mode relative to none.
pub fn checkpointing(c: Checkpointing) -> f64 {
    match c {
        Checkpointing::None => 1.0,
        // Op-level selective recomputes the matmuls it did not save: half of
        // a block's matmuls, between Megatron's selective and full.
        Checkpointing::Selective | Checkpointing::OpSelective => SELECTIVE_CHECKPOINTING,
        Checkpointing::Full => FULL_CHECKPOINTING,
    }
}

/// Step time of a ZeRO stage relative to DDP.
pub fn zero_stage(stage: u8) -> f64 {
    match stage {
        0 => 1.0,
        1 => ZERO_1,
        2 => ZERO_2,
        _ => ZERO_3,
    }
}

/// Step time of an optimizer relative to the 32-bit one it replaces.
pub fn optimizer(o: Optimizer) -> f64 {
    match o {
        Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit | Optimizer::Adamw4bit => {
            EIGHT_BIT_OPTIMIZER
        }
        _ => 1.0,
    }
}

/// Step time of a precision relative to fp32 (the penalty of a 16-bit recipe).
pub fn precision(p: Precision) -> f64 {
    match p {
        Precision::Fp32 | Precision::Tf32 => 1.0,
        _ => MIXED_PRECISION,
    }
}

/// Step time of a loss implementation relative to the standard one.
pub fn loss(l: Loss) -> f64 {
    match l {
        Loss::Standard => 1.0,
        Loss::Chunked => CHUNKED_LOSS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_micro_batches_are_slower() {
        assert_eq!(micro_batch_slowdown(8, 8, 4096), 1.0);
        let s = micro_batch_slowdown(8, 1, 4096);
        assert!(s > 1.0 && s < 1.15, "{s}");
        // Short samples lose much more.
        assert!(micro_batch_slowdown(32, 1, 128) > 2.0);
    }

    #[test]
    fn factors_are_ordered() {
        assert!(checkpointing(Checkpointing::Full) > checkpointing(Checkpointing::Selective));
        assert!(zero_stage(3) > zero_stage(2) && zero_stage(2) > zero_stage(1));
        assert!(zero_stage(1) > zero_stage(0));
        assert_eq!(precision(Precision::Bf16Mixed), MIXED_PRECISION);
        assert_eq!(optimizer(Optimizer::Adamw), 1.0);
        assert_eq!(loss(Loss::Chunked), CHUNKED_LOSS);
    }
}
