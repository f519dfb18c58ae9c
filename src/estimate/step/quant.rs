//! Quantized base weights: the bytes they are stored in, and the transient
//! 16-bit copies a quantized linear makes of its weight for one matmul.

use super::super::stacks::QuantLibrary;
use super::precision_bytes;
use crate::api::{Precision, Quantization, ValidatedJob};

/// Bytes live at once while the largest quantized linear (`largest_matrix`
/// elements) dequantizes its weight: `(forward, backward)`, at `b` samples
/// per micro-batch.
pub(super) fn transients(
    job: &ValidatedJob,
    library: QuantLibrary,
    precision: Precision,
    largest_matrix: f64,
    b: f64,
) -> (f64, f64) {
    let (elem, _) = precision_bytes(precision);
    // A 4-bit weight dequantized to fp16 is cast once more to a bf16 or fp32 compute dtype.
    let cast_from_fp16 = if matches!(precision, Precision::Fp16 | Precision::Fp16Mixed) {
        0.0
    } else {
        elem
    };
    let dequant = match job.quantization {
        Quantization::None => 0.0,
        Quantization::Int8 => largest_matrix * elem,
        // bitsandbytes dequantizes a 4-bit weight to the dtype it was
        // quantized from (fp16: Lightning quantizes from fp16, Transformers
        // loads 4-bit models in fp16 by default) and then casts it to the
        // compute dtype; both copies are live at the cast. torchao's NF4
        // dequantizes straight to the input's dtype: one copy.
        Quantization::Nf4 | Quantization::Nf4Double if library == QuantLibrary::Torchao => {
            largest_matrix * elem
        }
        Quantization::Nf4 | Quantization::Nf4Double => largest_matrix * (2.0 + cast_from_fp16),
        // GPTQModel's torch kernel unpacks the codes to int8 (int16 at 8
        // bits), subtracts the zero points (as many again), scales to fp16
        // and casts to the input's dtype (gptqmodel/nn_modules/qlinear,
        // `dequantize_weight`, `_forward`).
        Quantization::Gptq => {
            let code = if job.quantization_bits > 4 { 2.0 } else { 1.0 };
            largest_matrix * (2.0 * code + 2.0 + cast_from_fp16)
        }
        // AutoAWQ dequantizes to fp16 for the forward matmul.
        Quantization::Awq => largest_matrix * 2.0,
    };
    // Backward of AWQ's `WQLinearMMFunction` dequantizes again, casts to the
    // gradient's dtype and repeats the weight once per sample for a batched
    // matmul (`weights.transpose(0, 1).unsqueeze(0).repeat(batch_size, 1, 1)`).
    let dequant_backward = if job.quantization == Quantization::Awq {
        largest_matrix * (2.0 + cast_from_fp16 + 2.0 * b)
    } else {
        dequant
    };
    (dequant, dequant_backward)
}

/// Stored bytes per quantized base-weight element, block constants included.
pub(super) fn quantized_bytes(job: &ValidatedJob, in_features: f64) -> Option<f64> {
    let bits = f64::from(job.quantization_bits);
    let group = job
        .quantization_group
        .map_or(in_features, |g| g as f64)
        .max(1.0);
    match job.quantization {
        Quantization::None => None,
        // LLM.int8: int8 weight + one fp32 scale per output row.
        Quantization::Int8 => Some(1.0 + 4.0 / in_features.max(1.0)),
        // NF4: 4 bits + an fp32 absmax per 64-element block.
        Quantization::Nf4 => Some(0.5 + 4.0 / 64.0),
        // Double quantization: 8-bit absmax per 64 + fp32 per 256 absmax blocks.
        Quantization::Nf4Double => Some(0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0)),
        // GPTQ's `QuantLinear` buffers: `qweight` packs `bits` per weight into
        // int32, `qzeros` `bits` per group and output, `scales` an fp16 per
        // group and output, `g_idx` an int32 per input row (AutoGPTQ
        // auto_gptq/nn_modules/qlinear/qlinear_exllamav2.py, `__init__`;
        // GPTQModel's share the layout). The output width stands in for the
        // input's in `g_idx`'s share.
        Quantization::Gptq => {
            Some(bits / 8.0 + (2.0 + bits / 8.0) / group + 4.0 / in_features.max(1.0))
        }
        // AWQ's `WQLinear_GEMM`: the same packing without `g_idx`
        // (casper-hansen/AutoAWQ awq/modules/linear/gemm.py).
        Quantization::Awq => Some(bits / 8.0 + (2.0 + bits / 8.0) / group),
    }
}
