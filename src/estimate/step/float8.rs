//! torchao float8 training (`training.float8`): the fp8 casts one
//! `Float8Linear` makes of its operands for its three matmuls, and the
//! bytes FSDP2 gathers of a block whose weights it all-gathers in float8.
//!
//! Read from torchao/float8/float8_linear.py (pytorch/ao commit 7ca1bfb),
//! `Float8Linear.forward` and `matmul_with_hp_or_float8_args`, with the
//! recipes of config.py (commit c6c388b, `Float8LinearConfig.from_recipe_name`).
//! Scaling is dynamic in every recipe: no amax history or scale buffers are
//! registered (the delayed-scaling buffers are gone), so a linear's scales
//! are made with its casts: one fp32 per tensor under tensorwise scaling,
//! one per row (4 bytes per token, or per output row of the weight) under
//! rowwise. FSDP's `precompute_float8_dynamic_scale_for_fsdp` keeps one fp32
//! per weight: nothing the step model counts.

use crate::api::{Float8Recipe, TrainingSpec};

/// One linear's shape on this rank: tokens through it, per-token widths of
/// its input and output, and the bytes per element of the high-precision
/// weight its function is given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Linear {
    pub(super) tokens: f64,
    pub(super) input: f64,
    pub(super) output: f64,
    pub(super) weight_bytes: f64,
}

/// Bytes live at once while one float8 linear runs: `(forward, backward)`,
/// beyond what the same linear in high precision holds. `elem`: bytes per
/// activation element; `saved`: bytes per weight element of the fp8 weight
/// kept from forward (`bounds::float8_weight_saved`), which is not made
/// again; `all_gather`: the weight arrives as FSDP2's float8 gather.
///
/// - forward: the input cast to e4m3 (1 byte per element, with rowwise
///   scales 4 bytes per token) and the weight's fp8 copy (one byte per
///   element) beside the `_scaled_mm` output the plain linear makes too.
/// - backward, tensorwise: `grad_output` cast twice (for the input's and the
///   weight's gradient: separate calls, both held until the function
///   returns), the input cast again for the weight's gradient, and the
///   weight's copy made again where forward did not keep it.
/// - backward, rowwise: as tensorwise, each cast with its row scales, the
///   weight always cast again (axiswise along the other dim), and the
///   workaround against saving the fp8 weight under FSDP
///   (pytorch/pytorch#141881): `grad_output * 0`, a high-precision plane
///   of the output's size, and `weight_hp_t + zero`, a high-precision copy
///   of the weight, before the cast.
/// - backward, rowwise-with-gw-hp: `grad_output` cast once (rowwise) and the
///   weight once (tensorwise); the weight's gradient is computed from the
///   high-precision input and gradient (`ScalingType.DISABLED`): no casts.
pub(super) fn transients(
    recipe: Float8Recipe,
    l: Linear,
    elem: f64,
    saved: f64,
    all_gather: bool,
) -> (f64, f64) {
    let n = l.tokens;
    let matrix = l.input * l.output;
    let input_fp8 = n * l.input;
    let grad_fp8 = n * l.output;
    let row_scales = |rows: f64| {
        if recipe == Float8Recipe::Tensorwise {
            0.0
        } else {
            4.0 * rows
        }
    };
    // The weight's fp8 copy made in a pass: none when it arrives in float8,
    // and under tensorwise in backward only where forward did not keep it.
    let weight_forward = if all_gather {
        0.0
    } else if recipe == Float8Recipe::Tensorwise {
        matrix * (1.0 - saved)
    } else {
        matrix + row_scales(l.output)
    };
    let forward = input_fp8 + row_scales(n) + weight_forward;
    let backward = match recipe {
        Float8Recipe::Tensorwise => 2.0 * grad_fp8 + input_fp8 + weight_forward,
        Float8Recipe::Rowwise => {
            2.0 * grad_fp8
                + input_fp8
                + row_scales(2.0 * n + l.input)
                + grad_fp8 * elem
                + matrix * (l.weight_bytes + 1.0)
                + row_scales(l.output)
        }
        Float8Recipe::RowwiseWithGwHp => grad_fp8 + row_scales(n) + matrix,
    };
    (forward, backward)
}

/// Bytes per element of a block's gathered linears under ZeRO-3 / FSDP:
/// `elem`, the compute dtype FSDP's mixed precision gathers in; with
/// FSDP2's float8 all-gather one byte, the fp8 `_data` that
/// `WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather` casts on each
/// shard and `fsdp_post_all_gather` wraps as the unsharded weight
/// (torchao/float8/fsdp_utils.py, pytorch/ao commit 11ce634), plus the
/// shard's own fp8 cast (one byte per element over `dp` ranks), alive until
/// the gather is done.
pub(super) fn gathered_bytes(t: &TrainingSpec, elem: f64, dp: f64) -> f64 {
    if t.float8.is_some() && t.float8_all_gather {
        1.0 + 1.0 / dp.max(1.0)
    } else {
        elem
    }
}
