//! The one quantity of torchao's float8 training that its source leaves to
//! the job's code and its compiler: whether a tensorwise `Float8Linear`
//! keeps the fp8 copy of its weight from forward to backward.

use super::{Ends, Mechanism};
use crate::api::TrainingSpec;

/// Bytes per weight element that a float8 linear of the job keeps for its
/// backward beside what a plain linear keeps, in every block that is not
/// checkpointed (and in the block being recomputed).
///
/// Under tensorwise scaling `Float8Linear.forward` casts the weight to
/// float8 before calling the autograd function (`_cast_weight_to_float8_t`,
/// all operands tensorwise) and `matmul_with_hp_or_float8_args.forward`
/// saves the arguments it is given, `ctx.save_for_backward(input_hp,
/// weight_hp_t)`: the input as a plain linear saves it (so the activation
/// model is unchanged) and the weight's fp8 copy, one byte per element and
/// one fp32 scale (torchao/float8/float8_linear.py, pytorch/ao commit
/// 7ca1bfb). Under FSDP the copy is of the unsharded weight and outlives
/// the reshard after forward (the comment on
/// `force_recompute_fp8_weight_in_bwd`, torchao/float8/config.py, commit
/// c6c388b). The rowwise recipes pass the high-precision weight in, cast it
/// inside the function and keep only that weight (the parameter, or FSDP's
/// unsharded parameter that backward gathers again): nothing extra. With
/// FSDP2's float8 all-gather the gathered weight is itself float8 and the
/// saved tensor is a view of it: nothing extra either.
///
/// - point and high: 1 byte, the copy as torchao keeps it by default.
/// - low: 0: `force_recompute_fp8_weight_in_bwd=True` (torchtitan's
///   `--float8.force_recompute_fp8_weight_in_bwd`) checkpoints the cast and
///   keeps only the scale, and `torch.compile`'s partitioner may recompute
///   the cast from the weight backward has anyway; neither is in the spec.
pub fn float8_weight_saved(ends: &Ends, t: &TrainingSpec) -> f64 {
    match t.float8 {
        Some(recipe) if recipe.casts_weight_outside() && !t.float8_all_gather => {
            ends.pick(Mechanism::Float8Weight, 0.0, 1.0, 1.0)
        }
        _ => 0.0,
    }
}
