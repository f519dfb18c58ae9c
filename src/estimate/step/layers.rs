//! Stages of models without a transformer's shape: a custom model given by
//! its counts, and an MLP/CNN given as a layer list.

use super::optimizer::sharded_states;
use super::quant::quantized_bytes;
use super::{MIB, Stage, precision_bytes, recipe};
use crate::api::layers::LayerStack;
use crate::api::{Attention, Checkpointing, TrainingMode, ValidatedJob};
use crate::estimate::GIB;
use crate::estimate::bounds::{self, Ends};
use crate::estimate::caching::Churn;
use crate::estimate::stacks::Profile;

pub(super) fn custom_stage(
    job: &ValidatedJob,
    profile: &Profile,
    parameters: f64,
    act_per_sample: f64,
) -> Stage {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let (elem, mixed) = precision_bytes(t.precision);
    let r = recipe(job);
    let dp = job.data_parallel.max(1) as f64;
    let zero = p.zero();
    let b = t.micro_batch_size as f64;
    let inference = t.mode == TrainingMode::Inference;
    let trainable = match t.mode {
        TrainingMode::Inference => 0.0,
        TrainingMode::Full => t.trainable_parameters.unwrap_or(parameters),
        // Without a shape the adapter size must be given; 1 % is the usual LoRA order.
        _ => t.trainable_parameters.unwrap_or(parameters * 0.01),
    };
    let qb = quantized_bytes(job, 4096.0).unwrap_or(r.weight);
    let mut weights = parameters * qb;
    if t.mode != TrainingMode::Full {
        weights += trainable * r.weight;
    }
    let mut weight_transient = if mixed && zero < 3 && !inference {
        parameters * elem
    } else {
        0.0
    };
    if zero == 3 && !inference {
        weights /= dp;
        weight_transient = 0.0;
    }
    let (grads, optimizer, optimizer_paged, optimizer_temp) =
        sharded_states(job, profile, &r, trainable, 4096.0);
    let activations = act_per_sample * b;
    Stage {
        weights,
        weight_transient,
        casts: 0.0,
        frozen_unsharded: 0.0,
        frozen_from_start: false,
        grads,
        grads_live_in_backward: 0.0,
        grads_after_blocks: 0.0,
        tail_temp: 0.0,
        optimizer,
        optimizer_paged,
        optimizer_temp,
        activations: if inference { 0.0 } else { activations },
        layer_activations: activations * 0.1,
        logits_forward: 0.0,
        logits_backward: 0.0,
        logits_kept: 0.0,
        loop_output: 0.0,
        temp_head: 0.0,
        inputs: t.data_on_gpu_bytes as f64,
        batch: 0.0,
        temp_forward: 0.0,
        temp_backward: 0.0,
        comm: if dp > 1.0 && zero == 0 && !inference {
            grads
        } else {
            0.0
        },
        kv_cache: if inference { activations } else { 0.0 },
        kv_decode: 0.0,
        decode_logits: 0.0,
        decode_temp: 0.0,
        large_tensors: (parameters * 4.0 / (64.0 * MIB)).min(1e6),
        own_segment_tensors: (parameters * 4.0 / (64.0 * MIB)).min(1e6),
        largest_tensor: (parameters / 100.0 * elem).min(4.0 * GIB),
        churn: Churn {
            blocks: 1.0,
            saved: if inference { 0.0 } else { activations },
            ..Churn::default()
        },
    }
}

/// An MLP/CNN from a layer list: activations from shape propagation.
pub(super) fn layers_stage(
    job: &ValidatedJob,
    profile: &Profile,
    stack: &LayerStack,
    ends: &Ends,
) -> Stage {
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let (elem, mixed) = precision_bytes(t.precision);
    let r = recipe(job);
    let dp = job.data_parallel.max(1) as f64;
    let zero = p.zero();
    let b = t.micro_batch_size as f64;
    let inference = t.mode == TrainingMode::Inference;
    let params = stack.parameters as f64;
    let matrices = stack.autocast_parameters as f64;
    let others = (params - matrices).max(0.0);
    let trainable = match t.mode {
        TrainingMode::Inference => 0.0,
        TrainingMode::Full => t.trainable_parameters.unwrap_or(params),
        // Validation requires the count for adapter modes on layer lists.
        _ => t.trainable_parameters.unwrap_or(0.0),
    };
    let qb = quantized_bytes(job, 4096.0);
    let mut weights = match qb {
        Some(q) => matrices * q + others * r.weight,
        None => params * r.weight,
    } + stack.buffer_bytes as f64;
    if t.mode != TrainingMode::Full {
        weights += trainable * r.weight;
    }
    let mut weight_transient = if mixed && zero < 3 && !inference && qb.is_none() {
        matrices * elem
    } else {
        0.0
    };
    if zero == 3 && !inference {
        weights /= dp;
        weight_transient = 0.0;
    }
    let (grads, optimizer, optimizer_paged, optimizer_temp) =
        sharded_states(job, profile, &r, trainable, 1024.0);
    let fused = t.attention != Attention::Eager;
    let full = (stack.saved_bytes_per_sample_with(elem, mixed, fused) * b
        + stack.saved_fp32_elems_per_batch as f64 * 4.0)
        * bounds::saved_activations_share(ends);
    let largest_layer = stack.largest_layer_saved_bytes_per_sample(elem, mixed, fused) * b;
    let activations = match t.gradient_checkpointing {
        // Segment checkpointing of n layers keeps O(√n) of them (Chen et al.
        // 2016, "Training Deep Nets with Sublinear Memory Cost").
        Checkpointing::Full => (full / (stack.layer_count.max(1) as f64).sqrt()).max(largest_layer),
        _ => full,
    };
    let largest_act = stack.largest_activation_bytes_per_sample(elem, mixed, fused) * b;
    let out_elems = stack.output_elems_per_sample() as f64 * b;
    let logits_backward = if inference {
        0.0
    } else {
        out_elems * (elem + 8.0)
    };
    Stage {
        weights,
        weight_transient,
        casts: 0.0,
        frozen_unsharded: 0.0,
        frozen_from_start: false,
        grads,
        grads_live_in_backward: 0.0,
        grads_after_blocks: 0.0,
        tail_temp: 0.0,
        optimizer,
        optimizer_paged,
        optimizer_temp,
        activations: if inference { 0.0 } else { activations },
        layer_activations: largest_layer,
        // Classifier output, its fp32 log-softmax and gradient.
        logits_forward: if inference {
            out_elems * elem
        } else {
            out_elems * (elem + 4.0)
        },
        logits_backward,
        // A classifier's output is small: count it, and the largest
        // activation's gradients, in both backward phases.
        logits_kept: logits_backward,
        // A classifier's output is a few KiB: not counted past backward.
        loop_output: 0.0,
        temp_head: 2.0 * largest_act,
        // Images as fp32, labels as int64.
        inputs: stack.input_elems_per_sample as f64 * b * 4.0
            + b * 8.0
            + t.data_on_gpu_bytes as f64,
        batch: stack.input_elems_per_sample as f64 * b * 4.0 + b * 8.0,
        temp_forward: largest_act,
        // The gradients of the largest layer's input and output, plus what
        // its backward kernels hold besides (`bounds::backward_temporaries`).
        temp_backward: bounds::backward_temporaries(ends, largest_act, 0.0, 0.0),
        comm: if dp > 1.0 && zero == 0 && !inference && trainable > 0.0 {
            grads
        } else {
            0.0
        },
        kv_cache: 0.0,
        kv_decode: 0.0,
        decode_logits: 0.0,
        decode_temp: 0.0,
        large_tensors: stack.parameter_tensors as f64,
        own_segment_tensors: stack.parameter_tensors as f64,
        largest_tensor: (stack.largest_param_elems as f64 * r.weight.max(elem)).max(largest_act),
        churn: Churn {
            blocks: 1.0,
            saved: if inference { 0.0 } else { activations },
            temp_forward: largest_act,
            temp_backward: bounds::backward_temporaries(ends, largest_act, 0.0, 0.0),
            ..Churn::default()
        },
    }
}
