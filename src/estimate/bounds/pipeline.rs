//! What a pipeline stage keeps of a micro-batch whose backward the schedule
//! splits into an input pass and a weight pass.

use super::{Ends, Mechanism};

/// Bytes one micro-batch holds on a stage between its input backward (I)
/// and its weight backward (W), under the zero-bubble schedules
/// (`interleaved-zero-bubble`, `zbv-zero-bubble`; `pipeline::in_flight`
/// counts how many at once).
///
/// `saved`: what forward saved for the micro-batch (the block model's set);
/// `linear_inputs`: of that, the inputs of the linears, which the weight
/// gradients read; `output_grads`: the gradients of the linears' outputs.
///
/// `stage_backward_input` (torch/distributed/pipelining/_backward.py, torch
/// 2.15.0, git d0f2af8b) registers a pre-hook on each autograd node where a
/// parameter's branch meets the path from the output to the stage's input
/// (a linear's matmul), runs `autograd.grad(..., retain_graph=True)` for the
/// input's gradient, and keeps those nodes and the gradients the hooks
/// caught (each linear's output gradient) in `param_groups`, which the stage
/// stores until W (`backward_state`, stage.py). A node holds the nodes
/// below it through its edges, and `retain_graph=True` frees no saved
/// tensor, so the whole forward graph under the linears stays, with every
/// tensor it saved; `stage_backward_weight` drops it. Checked in the
/// reference environment (`benches/reference/split_backward_check.py`, two
/// pre-norm MLP blocks on the CPU): 16 saved tensors alive after forward,
/// the same 16 after I (the norms' statistics and the GELU's input among
/// them), 1 after W (the stage's input, held by the caller).
///
/// - point and high: the whole saved set plus the output gradients
///   (PyTorch's runtime, as above).
/// - low: the linears' inputs plus the output gradients: a runtime that
///   frees the rest of the graph after I, as the zero-bubble paper's
///   schedule assumes (arXiv 2401.10241, section 2: W needs the layer's
///   input and its output gradient).
///
/// Narrowed by the schedule: the others run whole backwards (nothing is
/// split).
pub fn split_backward_held(ends: &Ends, saved: f64, linear_inputs: f64, output_grads: f64) -> f64 {
    ends.pick(
        Mechanism::SplitBackward,
        saved.min(linear_inputs) + output_grads,
        saved + output_grads,
        saved + output_grads,
    )
}
