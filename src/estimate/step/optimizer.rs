//! Gradients and optimizer states per trainable parameter, under the job's
//! optimizer, ZeRO stage and offload.

use super::Recipe;
use crate::api::{Offload, Optimizer, OptimizerImplementation, Strategy, ValidatedJob};
use crate::estimate::stacks::Profile;

/// Optimizer bytes per trainable parameter: (allocated, paged, step temporaries).
pub(super) fn optimizer_bytes(
    job: &ValidatedJob,
    profile: &Profile,
    r: &Recipe,
    hidden: f64,
) -> (f64, f64, f64) {
    let strategy = job.spec().parallelism.strategy;
    // DeepSpeed and Megatron step their own fused optimizers whatever the loop.
    let foreach = matches!(strategy, Strategy::Ddp | Strategy::Fsdp)
        && profile.optimizer == OptimizerImplementation::Foreach;
    let s = r.state;
    match job.spec().training.optimizer {
        // Two moments; the foreach implementation materialises one
        // moment-sized temporary (`_foreach_sqrt` of the second moments) over
        // the whole group (torch/optim/adamw.py, `_multi_tensor_adamw`); the
        // fused kernel and the for-loop one tensor's worth at most.
        Optimizer::Adam | Optimizer::Adamw => {
            (r.master + 2.0 * s, 0.0, if foreach { s } else { 0.0 })
        }
        // Same states in CUDA managed memory.
        Optimizer::PagedAdamw => (r.master, 2.0 * s, 0.0),
        // Two 8-bit states plus an fp32 absmax per 2048-element block each.
        Optimizer::Adamw8bit => (r.master + 2.0 + 8.0 / 2048.0, 0.0, 0.0),
        Optimizer::PagedAdamw8bit => (r.master, 2.0 + 8.0 / 2048.0, 0.0),
        // torchao's `AdamW4bit`: each moment packs two 4-bit codes per byte
        // with an fp32 scale per 128-value block (torchao/optim/subclass_4bit.py,
        // `OptimState4bit.zeros`; tensors under 4096 values keep fp32 moments,
        // `_AdamBase._new_buffer`, a share the biases and norms make small).
        // The step dequantizes one parameter's moments to fp32 at a time:
        // two fp32 copies of the largest tensor (`step_temp_largest`).
        Optimizer::Adamw4bit => (r.master + 2.0 * (0.5 + 4.0 / 128.0), 0.0, 0.0),
        Optimizer::Sgd => (r.master, 0.0, 0.0),
        Optimizer::SgdMomentum => (r.master + s, 0.0, 0.0),
        // Factored second moment: a row and a column vector per matrix
        // (≈ 2/hidden of the matrix), no first moment by default.
        Optimizer::Adafactor => (r.master + 4.0 * 2.0 / hidden.max(1.0), 0.0, 0.0),
    }
}

/// the largest single gradient's bytes; `None`: they stay as without offload.
///
/// - DeepSpeed ZeRO-Offload moves each gradient partition to the host's fp32
///   buffer as its bucket is reduced (deepspeed/runtime/zero/stage_1_and_2.py,
///   `async_accumulate_grad_in_cpu_via_gpu` with a parameter-sized GPU
///   staging buffer; stage3.py `partition_grads`): the buckets are counted as
///   communication buffers, and one gradient being staged plus the next remain.
/// - FSDP offloading parameters (FSDP1 `CPUOffload(offload_params=True)`,
///   FSDP2 `CPUOffloadPolicy`) copies the sharded gradients to the host after
///   the reduce-scatter, whose buffers are counted as communication.
/// - torchao's `CPUOffloadOptimizer(offload_gradients=True)` copies each
///   gradient to the host from its post-accumulate hook and frees it
///   (torchao/optim/cpu_offload.py): the one being copied and the next.
///   Without `offload_gradients` the gradients stay on the GPU.
pub(super) fn offloaded_gradients(job: &ValidatedJob, largest_grad: f64) -> Option<f64> {
    let p = &job.spec().parallelism;
    match (p.offload, p.strategy) {
        (Offload::None, _) => None,
        (_, Strategy::Deepspeed) => Some(2.0 * largest_grad),
        (Offload::OptimizerAndParameters, Strategy::Fsdp) => Some(0.0),
        (Offload::Optimizer, Strategy::Ddp) if p.offload_gradients => Some(2.0 * largest_grad),
        _ => None,
    }
}

/// Gradients and optimizer states of `trainable` parameters under the job's
/// ZeRO stage and offload: (grads, optimizer, paged optimizer, optimizer temporaries).
pub(super) fn sharded_states(
    job: &ValidatedJob,
    profile: &Profile,
    r: &Recipe,
    trainable: f64,
    hidden: f64,
) -> (f64, f64, f64, f64) {
    let p = &job.spec().parallelism;
    let dp = job.data_parallel.max(1) as f64;
    let mut grads = trainable * r.grad;
    if p.zero() >= 2 {
        grads /= dp;
    }
    if let Some(g) = offloaded_gradients(job, grads) {
        grads = grads.min(g);
    }
    if matches!(
        p.offload,
        Offload::Optimizer | Offload::OptimizerAndParameters
    ) {
        return (grads, 0.0, 0.0, 0.0);
    }
    let (oa, op, ot) = optimizer_bytes(job, profile, r, hidden);
    let div = if p.zero() >= 1 { dp } else { 1.0 };
    (
        grads,
        trainable * oa / div,
        trainable * op / div,
        trainable * ot / div,
    )
}
