//! `spec.training.float8`: torchao's float8 training recipes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// tensorwise | rowwise | rowwise-with-gw-hp.
//
// torchao's `Float8LinearRecipeName` (torchao/float8/config.py, pytorch/ao
// commit c6c388b): the recipe `convert_to_float8_training` swaps the model's
// `nn.Linear` modules to `Float8Linear` with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Float8Recipe {
    // One dynamic scale per tensor (torchao's default `Float8LinearConfig()`):
    // the only recipe FSDP2's float8 all-gather takes.
    Tensorwise,
    // One scale per row of every operand of the three matmuls.
    Rowwise,
    // Rowwise for the output and the input's gradient; the weight's
    // gradient in high precision (`rowwise_with_gw_hp`).
    RowwiseWithGwHp,
}

impl Float8Recipe {
    /// The weight is cast outside `matmul_with_hp_or_float8_args` and that
    /// fp8 copy is what the function saves (tensorwise scaling everywhere).
    pub fn casts_weight_outside(self) -> bool {
        self == Float8Recipe::Tensorwise
    }
}
