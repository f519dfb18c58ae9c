//! Mechanisms of what the caching allocator keeps reserved before the
//! first optimizer step: the per-expert loop's transient gradients and the
//! freed blocks of an fp32 build cast to 16 bits, where the job declares one.

use super::{End, Ends, Facts, Mechanism};
use crate::api::{Framework, Precision, Quantization, Strategy, ValidatedJob, WeightsLoad};

/// Whether an MoE block's fused 3-D experts run Transformers' per-expert
/// loop, whose backward makes a full-size gradient of each 3-D weight once
/// per expert.
///
/// From 5.0 Transformers keeps a block's experts in one 3-D parameter per
/// projection (`MixtralExperts.gate_up_proj`: experts × 2·intermediate ×
/// hidden, `down_proj`). Its eager forward loops over the experts hit and
/// multiplies by `self.gate_up_proj[expert_idx]` and
/// `self.down_proj[expert_idx]` (models/mixtral/modeling_mixtral.py,
/// transformers 5.24.0). `select`'s derivative is `select_backward`
/// (tools/autograd/derivatives.yaml), which makes zeros of the whole 3-D
/// size and copies the expert's gradient into its slice
/// (aten/src/ATen/native/TensorShape.cpp). Autograd's input buffer sums the
/// experts' gradients of the weight in place into the first when it holds
/// its last reference (torch/csrc/autograd/input_buffer.cpp, `accumulate`,
/// `can_accumulate_inplace`): that first tensor becomes `.grad`, and every
/// later expert's full-size tensor is a transient freed once it is added,
/// one of each projection alive at a time. Checked in the reference
/// environment (torch 2.15.0, CPU, profiler): eight experts' selects of one
/// 3-D parameter run eight `select_backward` and seven `add_` in backward.
/// (Under a Python dispatch mode autograd adds out of place, so the
/// meta-device tracker sees two transients of each at once.)
///
/// The loop is the `eager` experts implementation. Transformers 5 defaults
/// to `grouped_mm` (modeling_utils.py, `get_correct_experts_implementation`),
/// whose backward makes one gradient per projection (`torch._grouped_mm`, or
/// `_grouped_mm_fallback_bwd`'s `zeros_like(weight)` once, integrations/moe.py);
/// `experts_implementation="eager"` picks the loop (the ground-truth harness
/// routes through the same loop, `benches/reference/sweep.py`, `even_routing`).
/// Before 5 each expert is its own linear (`MixtralBlockSparseTop2MLP`) and
/// its gradient its own size.
///
/// - low and point: `grouped_mm`, no transient.
/// - high: the loop, on a model with experts that runs Transformers' modules
///   (`own_modules` false) unless the release is known to be before 5.
pub fn expert_loop(ends: &Ends, facts: &Facts, experts: u64, own_modules: bool) -> bool {
    let fused = facts.runtime.transformers.is_none_or(|t| t >= (5, 0));
    experts > 1 && !own_modules && fused && ends.of(Mechanism::ExpertLoop) == End::High
}

/// Bytes per byte of 16-bit weights that the caching allocator keeps
/// reserved because the job declares its model built at fp32 on the device
/// and cast to its 16-bit dtype there (`training.weightsLoad: fp32-cast`).
///
/// `model.to(torch.bfloat16)` (or `.half()`) casts parameter by parameter
/// (`nn.Module._apply`): each 16-bit copy is allocated while its fp32
/// original lives, then the original is freed into the cache. The fp32
/// segments stay reserved (the allocator releases cached segments only when
/// a `cudaMalloc` fails, c10/cuda/CUDACachingAllocator.cpp), and a freed
/// block serves a later tensor only when it fits. A model built on the GPU
/// in the default dtype and cast there takes this path: `from_config` under
/// `torch.device("cuda")`, or `from_pretrained(..., device_map="cuda")`
/// without a dtype (fp32 until Transformers 5 made `"auto"` the default),
/// followed by a cast; the ground-truth harness builds its pure 16-bit
/// runs so (`benches/reference/sweep.py`, `build` and `prepare`). Loading in
/// the 16-bit dtype, or casting before moving to the GPU, does not, and is
/// what a job that does not say is taken to do: nothing at any end.
///
/// The declaration says the blocks are freed; how many of them the step's
/// gradients, states and activations take again depends on their sizes and
/// order. On the 38 reserved and device rows of the ground truth that ran
/// this way, the measured bytes lie between 2.3 below and 0.6 above the
/// point without the build, per byte of 16-bit weights, and as little as 0.5
/// above its low end: a whole byte at every end would lift seven rows' low
/// ends past their measurement, so:
///
/// - low and point: every freed block is taken again, nothing.
/// - high: the fp32 build's bytes beyond the 16-bit weights (one byte per
///   16-bit byte) reused by nothing.
///
/// Only for a plain-PyTorch job of pure 16-bit precision with unquantized
/// weights under strategy ddp at ZeRO stage 0 and without expandable
/// segments (whose freed pages any size reuses); otherwise nothing.
pub fn fp32_build(ends: &Ends, job: &ValidatedJob) -> f64 {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let applies = t.weights_load == Some(WeightsLoad::Fp32Cast)
        && matches!(t.precision, Precision::Bf16 | Precision::Fp16)
        && t.framework == Framework::Pytorch
        && job.quantization == Quantization::None
        && p.strategy == Strategy::Ddp
        && p.zero() == 0
        && !job.allocator_conf.expandable_segments;
    if applies {
        ends.pick(Mechanism::Fp32Build, 0.0, 0.0, 1.0)
    } else {
        0.0
    }
}
