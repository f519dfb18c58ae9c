//! Component formulas pinned: for a few configurations computed by hand, the
//! bytes of each component at a phase, and each mechanism's range, so a change
//! to one mechanism shows where it moved.

use vramguard::api::{TrainingJobSpec, ValidatedJob, validate};
use vramguard::estimate::{self, Component, Estimate, StepPhase, gpus};

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

fn job(yaml: &str) -> ValidatedJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).expect("spec parses");
    validate(&spec).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn est_on(yaml: &str, gpu: &str) -> Estimate {
    estimate::estimate(&job(yaml), gpus::find(gpu).unwrap()).expect("estimates")
}

/// How far one mechanism alone moves the per-GPU figure: (below, above) bytes.
fn spread(e: &Estimate, mechanism: &str) -> (f64, f64) {
    e.status
        .spread
        .iter()
        .find(|m| m.mechanism == mechanism)
        .map_or((0.0, 0.0), |m| (m.below_bytes as f64, m.above_bytes as f64))
}

fn at(e: &Estimate, p: StepPhase, c: Component) -> f64 {
    e.phases
        .iter()
        .find(|x| x.phase == p)
        .unwrap_or_else(|| panic!("no phase {p:?}"))
        .get(c)
}

/// GPT-2 small (124,439,808 parameters: 12 blocks of 7,087,872, a 50257 × 768
/// token and a 1024 × 768 position embedding, the final norm; the head is tied).
const GPT2_PARAMS: f64 = 124_439_808.0;

const GPT2_FP32: &str = "model: {preset: gpt2}
training: {stack: custom, microBatchSize: 1, sequenceLength: 1024, precision: fp32, optimizer: adamw, optimizerImplementation: fused, globalBatchSize: 1, batching: packed}
";

#[test]
fn fp32_adamw_weights_gradients_and_states() {
    let e = est_on(GPT2_FP32, "a100-80gb");
    // fp32 weights and gradients: 4 bytes each per parameter.
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::Weights),
        GPT2_PARAMS * 4.0
    );
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::Gradients),
        GPT2_PARAMS * 4.0
    );
    // AdamW: two fp32 moments; the fused kernel adds no step temporary.
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::OptimizerStates),
        GPT2_PARAMS * 8.0
    );
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::Temporaries),
        0.0
    );
}

#[test]
fn fp32_logits_at_the_end_of_forward() {
    let e = est_on(GPT2_FP32, "a100-80gb");
    // 1024 tokens × 50257: the fp32 head output and the fp32 log-softmax.
    assert_eq!(
        at(&e, StepPhase::ForwardEnd, Component::Logits),
        1024.0 * 50257.0 * (4.0 + 4.0)
    );
    // Backward start: the logits the loop holds (4) plus the log-softmax's
    // saved output, incoming and outgoing gradients (12).
    assert_eq!(
        at(&e, StepPhase::BackwardStart, Component::Logits),
        1024.0 * 50257.0 * (4.0 + 12.0)
    );
}

#[test]
fn inputs_are_ids_and_labels() {
    let e = est_on(GPT2_FP32, "a100-80gb");
    // int64 input ids and labels: 16 bytes per token (packed: no mask).
    assert_eq!(
        at(&e, StepPhase::ForwardEnd, Component::Inputs),
        1024.0 * 16.0
    );
}

#[test]
fn workspaces_and_context_by_architecture() {
    let ampere = est_on(GPT2_FP32, "a100-80gb");
    let hopper = est_on(GPT2_FP32, "h100-80gb");
    // cuBLAS: 4096 KiB × 2 + 16 KiB × 8 below sm90, 32 MiB from sm90 on.
    assert_eq!(
        ampere.status.breakdown.workspaces,
        (4096 * 1024 * 2 + 16 * 1024 * 8) as u64
    );
    assert_eq!(hopper.status.breakdown.workspaces, 32 * 1024 * 1024);
    assert_eq!(ampere.status.breakdown.cuda_context, 512 * 1024 * 1024);
    // One GPU: no NCCL communicator.
    assert_eq!(ampere.status.breakdown.communication, 0);
}

#[test]
fn lora_bf16_weights_and_adapter_states() {
    // Llama-3-8B: 8,030,261,248 parameters; LoRA rank 16 on q and v of 32 blocks:
    // q: 4096×16 + 16×4096, v: 4096×16 + 16×1024 → (131072 + 81920) × 32 = 6,815,744.
    let e = est_on(
        "model: {preset: llama-3-8b}
training: {stack: hf-trainer, mode: lora, lora: {rank: 16, targetModules: [q_proj, v_proj]}, microBatchSize: 1, sequenceLength: 512, precision: bf16, optimizerImplementation: fused, batching: packed}
",
        "h100-80gb",
    );
    let adapters = 6_815_744.0;
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::Weights),
        (8_030_261_248.0 + adapters) * 2.0
    );
    // Pure bf16: 2-byte gradients and states.
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::Gradients),
        adapters * 2.0
    );
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::OptimizerStates),
        adapters * 4.0
    );
}

#[test]
fn each_mechanism_moves_the_range_where_it_acts() {
    // An unpinned job: a wide range, the point inside it.
    let open = est_on(
        "model: {preset: llama-3-8b}
training: {mode: lora, microBatchSize: 2, sequenceLength: 2048}
parallelism: {gpus: 2}
",
        "h100-80gb",
    );
    let s = &open.status;
    let (lo, hi) = (s.lower.unwrap(), s.upper.unwrap());
    assert!(lo.per_gpu_bytes < s.per_gpu_bytes && s.per_gpu_bytes < hi.per_gpu_bytes);
    assert!(lo.peak_allocated_bytes <= s.peak_allocated_bytes);
    assert!(hi.peak_allocated_bytes >= s.peak_allocated_bytes);
    let names: Vec<&str> = s.spread.iter().map(|m| m.mechanism.as_str()).collect();
    for m in [
        "cudaContext",
        "ncclBuffers",
        "allocatorFragmentation",
        "logitsCopies",
        "savedActivations",
    ] {
        assert!(names.contains(&m), "{m} missing from {names:?}");
    }
    // The eager-loading context: 1.5 GiB at the high end with no runtime known (measured on
    // an H200: 1 984 MiB, above it), above the 758 MiB Hopper context measured after a step.
    let ctx = s
        .spread
        .iter()
        .find(|m| m.mechanism == "cudaContext")
        .unwrap();
    assert_eq!(ctx.above_bytes as f64, 1.5 * GIB - 758.0 * MIB);
    // Widest first.
    for w in s.spread.windows(2) {
        assert!(w[0].above_bytes + w[0].below_bytes >= w[1].above_bytes + w[1].below_bytes);
    }
}

#[test]
fn runtime_facts_narrow_the_range() {
    let base = "model: {preset: qwen2.5-7b}
training: {stack: hf-trainer, mode: lora, microBatchSize: 2, sequenceLength: 4096, attention: flash, optimizerImplementation: fused";
    let open = est_on(&format!("{base}}}\n"), "h100-80gb");
    let pinned = est_on(
        &format!(
            "{base}, runtime: {{pytorch: '2.4.0', cuda: '12.1', transformers: '4.49.0'}}, batching: packed}}
template:
  spec:
    containers:
    - name: trainer
      image: trainer
      env: [{{name: PYTORCH_CUDA_ALLOC_CONF, value: 'expandable_segments:True'}}]
"
        ),
        "h100-80gb",
    );
    let width = |e: &Estimate| {
        e.status.upper.unwrap().per_gpu_bytes - e.status.lower.unwrap().per_gpu_bytes
    };
    assert!(
        width(&pinned) < width(&open),
        "pinned {} vs open {}",
        width(&pinned),
        width(&open)
    );
    // A release that shifts the logits puts the copy in the point itself.
    let old = est_on(
        &format!("{base}, runtime: {{transformers: '4.44.2'}}}}\n"),
        "h100-80gb",
    );
    assert!(old.status.peak_allocated_bytes > open.status.peak_allocated_bytes);
    // Never zero where the model itself is unsure.
    assert!(width(&pinned) > 0);
}

#[test]
fn a_bad_runtime_version_names_the_field() {
    let spec: TrainingJobSpec =
        serde_saphyr::from_str("model: {preset: gpt2}\ntraining: {runtime: {pytorch: lots}}\n")
            .unwrap();
    let err = validate(&spec).unwrap_err().to_string();
    assert!(err.contains("spec.training.runtime.pytorch"), "{err}");
    assert!(err.contains("MAJOR.MINOR"), "{err}");
}

/// Transformers' `gelu_new` (GPT-2's activation) keeps four tensors of the
/// MLP's width for its own backward where one fused op keeps one: in fp32,
/// 3 × 4 bytes more per intermediate element in every block. LitGPT runs
/// GPT-2 with one GELU op.
#[test]
fn gelu_new_keeps_four_planes_under_transformers_one_under_litgpt() {
    let hf = est_on(GPT2_FP32, "a100-80gb");
    let lit = est_on(
        &GPT2_FP32.replace("stack: custom", "stack: litgpt"),
        "a100-80gb",
    );
    let tokens = 1024.0;
    let extra = 12.0 * tokens * 3072.0 * (4.0 * 4.0 - 4.0);
    assert_eq!(
        at(&hf, StepPhase::ForwardEnd, Component::Activations)
            - at(&lit, StepPhase::ForwardEnd, Component::Activations),
        extra
    );
}

/// PEFT's `modules_to_save` trains a full copy of the head beside the
/// adapters: its weights, gradients and AdamW's two moments at fp32.
/// GPT-2's own name for the head's tied embedding (`wte`) is accepted too.
#[test]
fn modules_to_save_trains_a_full_copy_of_the_head() {
    let lora = "model: {preset: gpt2}
training: {stack: custom, mode: lora, microBatchSize: 1, sequenceLength: 1024, precision: fp32, optimizer: adamw, optimizerImplementation: fused, globalBatchSize: 1, batching: packed, lora: {rank: 8, targetModules: [c_attn]MORE}}
";
    let plain = est_on(&lora.replace("MORE", ""), "a100-80gb");
    let head = est_on(
        &lora.replace("MORE", ", modulesToSave: [lm_head]"),
        "a100-80gb",
    );
    let both = est_on(
        &lora.replace("MORE", ", modulesToSave: [lm_head, wte]"),
        "a100-80gb",
    );
    let matrix = 50257.0 * 768.0;
    let diff = |a: &Estimate, b: &Estimate, c| {
        at(a, StepPhase::OptimizerStep, c) - at(b, StepPhase::OptimizerStep, c)
    };
    assert_eq!(diff(&head, &plain, Component::Weights), matrix * 4.0);
    assert_eq!(diff(&head, &plain, Component::Gradients), matrix * 4.0);
    assert_eq!(
        diff(&head, &plain, Component::OptimizerStates),
        matrix * 8.0
    );
    assert_eq!(diff(&both, &head, Component::Gradients), matrix * 4.0);
}

/// Generation: the KV cache grows from the prompt to prompt + new tokens
/// (Llama-3.1-8B: 32 blocks × 8 K/V heads × 128 × 2 tensors × 2 bytes = 128 KiB
/// per position), or is allocated at its full length before the prompt runs.
#[test]
fn generation_grows_the_kv_cache_past_the_prompt() {
    let spec = "model: {preset: llama-3.1-8b}
training: {mode: inference, microBatchSize: 1, sequenceLength: 1000, precision: bf16GEN}
";
    let per_position = 32.0 * 8.0 * 128.0 * 2.0 * 2.0;
    let grown = est_on(
        &spec.replace("GEN", ", generation: {newTokens: 1048}"),
        "h100-80gb",
    );
    // The prompt's forward is the same as without generation: the cache of
    // its 1000 positions and one block's activations.
    let prompt = est_on(&spec.replace("GEN", ""), "h100-80gb");
    let prefill = |e: &Estimate| at(e, StepPhase::InferenceForward, Component::Activations);
    assert_eq!(prefill(&grown), prefill(&prompt));
    assert_eq!(
        at(&grown, StepPhase::InferenceDecode, Component::Activations),
        2048.0 * per_position
    );
    // The growth copy of one block's K: 2048 positions × 8 × 128 × 2 bytes.
    assert!(at(&grown, StepPhase::InferenceDecode, Component::Temporaries) >= 2048.0 * 2048.0);
    let fixed = est_on(
        &spec.replace("GEN", ", generation: {newTokens: 1048, cacheLength: 4096}"),
        "h100-80gb",
    );
    assert_eq!(
        at(&fixed, StepPhase::InferenceDecode, Component::Activations),
        4096.0 * per_position
    );
    // A static cache is there at full length from the prompt's forward on.
    assert_eq!(
        prefill(&fixed) - prefill(&prompt),
        (4096.0 - 1000.0) * per_position
    );
    // Without generation there is one phase, as before.
    assert!(
        prompt
            .phases
            .iter()
            .all(|p| p.phase != StepPhase::InferenceDecode)
    );
}

/// Llama-3-8B's parts: the blocks' linears, the token embedding and the
/// untied head (128,256 × 4,096 each), and the 65 RMS norms.
const LLAMA3_EMBEDDING: f64 = 128_256.0 * 4096.0;
const LLAMA3_NORMS: f64 = 65.0 * 4096.0;
const LLAMA3_LINEAR: f64 = 8_030_261_248.0 - 2.0 * LLAMA3_EMBEDDING - LLAMA3_NORMS;
/// LoRA rank 16 on q and v of 32 blocks (see `lora_bf16_weights_and_adapter_states`).
const LLAMA3_QV_ADAPTERS: f64 = 6_815_744.0;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn gptq_and_awq_store_packed_codes_with_fp16_scales_per_group() {
    let spec = "model: {preset: llama-3-8b}
training: {stack: hf-trainer, mode: lora, QUANT, lora: {rank: 16, targetModules: [q_proj, v_proj]}, microBatchSize: 1, sequenceLength: 512, precision: bf16, optimizerImplementation: fused, batching: packed}
";
    let weights = |q: &str| {
        let e = est_on(&spec.replace("QUANT", q), "h100-80gb");
        at(&e, StepPhase::OptimizerStep, Component::Weights)
    };
    // The rest (embedding, head, norms, adapters) in bf16.
    let rest = (2.0 * LLAMA3_EMBEDDING + LLAMA3_NORMS + LLAMA3_QV_ADAPTERS) * 2.0;
    // GPTQ 4-bit, groups of 128: half a byte per weight, an fp16 scale and a
    // 4-bit zero per group, an int32 group index per input row.
    let gptq = weights("quantization: gptq");
    let expected = LLAMA3_LINEAR * (0.5 + 2.5 / 128.0 + 4.0 / 4096.0) + rest;
    assert!(close(gptq, expected), "{gptq} != {expected}");
    // AWQ: the same without the group index.
    let awq = weights("quantization: awq");
    let expected = LLAMA3_LINEAR * (0.5 + 2.5 / 128.0) + rest;
    assert!(close(awq, expected), "{awq} != {expected}");
    // 8 bits in groups of 32.
    let g8 = weights("quantization: gptq, quantizationBits: 8, quantizationGroupSize: 32");
    let expected = LLAMA3_LINEAR * (1.0 + 3.0 / 32.0 + 4.0 / 4096.0) + rest;
    assert!(close(g8, expected), "{g8} != {expected}");
    // A model config's quantization_config says the same as the fields.
    let from_config = est_on(
        "model: {hfConfig: {model_type: llama, hidden_size: 4096, intermediate_size: 14336, num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8, vocab_size: 128256, max_position_embeddings: 8192, quantization_config: {quant_method: gptq, bits: 8, group_size: 32}}}
training: {stack: hf-trainer, mode: lora, lora: {rank: 16, targetModules: [q_proj, v_proj]}, microBatchSize: 1, sequenceLength: 512, precision: bf16, optimizerImplementation: fused, batching: packed}
",
        "h100-80gb",
    );
    assert!(close(
        at(&from_config, StepPhase::OptimizerStep, Component::Weights),
        g8
    ));
}

#[test]
fn gptq_keeps_each_blocks_dequantized_weights_for_backward() {
    let spec = "model: {preset: llama-3-8b}
training: {stack: hf-trainer, mode: lora, QUANT, lora: {rank: 16, targetModules: [q_proj, v_proj]}, microBatchSize: 1, sequenceLength: 512, precision: bf16, optimizerImplementation: fused, batching: packedCKPT}
";
    let below = |q: &str, ckpt: &str| {
        let e = est_on(&spec.replace("QUANT", q).replace("CKPT", ckpt), "h100-80gb");
        spread(&e, "dequantizedWeights").0
    };
    // Without checkpointing every block keeps its linears' bf16 weights,
    // which a kernel with its own autograd Function (the low end) does not;
    // as saved tensors they also change what the allocator strands: at
    // most the unmodelled 8 % point share of them, and less where the
    // replayed step strands as much without them (the weight transients
    // are freed blocks either way).
    let blocks = LLAMA3_LINEAR * 2.0;
    let kept = below("quantization: gptq", "");
    assert!(
        kept > 0.99 * blocks && kept < 1.09 * blocks,
        "{kept} vs {blocks}"
    );
    // Checkpointed: only the block being recomputed keeps them, beside the
    // same dequantization transients (GPTQ's unpack, subtract, scale and
    // cast: 6 bytes per element of the largest matrix at bf16; AWQ's
    // backward at one sample: 2 + 2 + 2); AWQ's recomputed block keeps the
    // inputs its Function saves, a tenth of the weights here.
    let temporaries = |q: &str| {
        let e = est_on(
            &spec
                .replace("QUANT", q)
                .replace("CKPT", ", gradientCheckpointing: full"),
            "h100-80gb",
        );
        at(&e, StepPhase::BackwardLastBlock, Component::Temporaries)
    };
    let one = temporaries("quantization: gptq") - temporaries("quantization: awq");
    let block = LLAMA3_LINEAR / 32.0 * 2.0;
    assert!(one > 0.8 * block && one < block, "{one} vs {block}");
    // AWQ's Function keeps the packed weight: nothing below its point.
    assert_eq!(below("quantization: awq", ""), 0.0);
}

#[test]
fn adamw_4bit_keeps_half_a_byte_per_moment_and_a_scale_per_128() {
    let e = est_on(
        &GPT2_FP32.replace("optimizer: adamw,", "optimizer: adamw-4bit,"),
        "a100-80gb",
    );
    assert!(close(
        at(&e, StepPhase::OptimizerStep, Component::OptimizerStates),
        GPT2_PARAMS * 2.0 * (0.5 + 4.0 / 128.0)
    ));
    // One tensor's moments dequantized to fp32: the token embedding's.
    assert_eq!(
        at(&e, StepPhase::OptimizerStep, Component::Temporaries),
        50257.0 * 768.0 * 8.0
    );
}

#[test]
fn torchao_cpu_offload_moves_states_and_optionally_gradients() {
    let spec = "model: {preset: gpt2}
training: {stack: custom, microBatchSize: 1, sequenceLength: 1024, precision: fp32, optimizer: adamw, optimizerImplementation: fused, globalBatchSize: 1, batching: packed}
parallelism: {offload: optimizerGRADS}
";
    let kept = est_on(&spec.replace("GRADS", ""), "a100-80gb");
    assert_eq!(
        at(&kept, StepPhase::OptimizerStep, Component::OptimizerStates),
        0.0
    );
    assert_eq!(
        at(&kept, StepPhase::OptimizerStep, Component::Gradients),
        GPT2_PARAMS * 4.0
    );
    // offload_gradients: the gradient being copied to the host and the next.
    let moved = est_on(
        &spec.replace("GRADS", ", offloadGradients: true"),
        "a100-80gb",
    );
    assert_eq!(
        at(&moved, StepPhase::OptimizerStep, Component::Gradients),
        2.0 * 50257.0 * 768.0 * 4.0
    );
}

#[test]
fn a_shorter_target_shrinks_the_decoder_and_the_logits() {
    let spec = "model: {preset: t5-base}
training: {stack: hf-trainer, microBatchSize: 4, sequenceLength: 512TARGET, precision: bf16-mixed, batching: packed}
";
    let same = est_on(&spec.replace("TARGET", ""), "a100-80gb");
    let short = est_on(&spec.replace("TARGET", ", targetLength: 128"), "a100-80gb");
    let logits = |e: &Estimate| at(e, StepPhase::ForwardEnd, Component::Logits);
    assert!(close(logits(&short) * 4.0, logits(&same)));
    let acts = |e: &Estimate| at(e, StepPhase::ForwardEnd, Component::Activations);
    assert!(acts(&short) < acts(&same));
    // Not less than the encoder's share: half the blocks run the full source.
    assert!(acts(&short) > 0.4 * acts(&same));
}

#[test]
fn torchtitan_keeps_a_pipeline_stage_gathered_between_its_forward_and_backward() {
    // Llama-3-8B over 2 pipeline stages × 4 FSDP ranks: 16 blocks per stage,
    // 218,103,808 linear weights per block.
    let spec = "model: {preset: llama-3-8b}
training: {stack: STACK, microBatchSize: 1, globalBatchSize: 8, sequenceLength: 2048, precision: bf16-mixed, batching: packed}
parallelism: {gpus: 8, strategy: fsdp, pipelineParallel: 2}
";
    let weights = |stack: &str| {
        let e = est_on(&spec.replace("STACK", stack), "h100-80gb");
        at(&e, StepPhase::BackwardStart, Component::Weights)
    };
    let block = LLAMA3_LINEAR / 32.0 * 2.0;
    let titan = weights("torchtitan");
    // torchtune reshards after forward: the block and the next one gathered.
    let tune = weights("torchtune");
    assert!(titan >= 16.0 * block, "{titan}");
    assert!(
        close(titan - tune, 14.0 * block),
        "{} vs {}",
        titan - tune,
        14.0 * block
    );
}

#[test]
fn grouped_query_attention_without_flash_keeps_the_math_kernels_probabilities() {
    // Llama 3.2 1B (32 heads over 8 K/V heads) in fp32 at one sample of 2048
    // tokens: flash takes no fp32, the memory-efficient kernel no grouped
    // heads, so Transformers' `enable_gqa=True` (4.54 on, torch 2.5 on) runs
    // the math kernel, which keeps 32 × 2048 fp32 probabilities per token per
    // block where the memory-efficient kernel keeps a log-sum-exp.
    let spec = "model: {preset: llama-3.2-1b}
training: {stack: hf-trainer, mode: full, microBatchSize: 1, sequenceLength: 2048, precision: fp32, attention: sdpa, optimizerImplementation: fused, batching: packed, runtime: {pytorch: '2.8', transformers: 'TF'}}
";
    let activations = |tf: &str, gpu: &str| {
        at(
            &est_on(&spec.replace("TF", tf), gpu),
            StepPhase::ForwardEnd,
            Component::Activations,
        )
    };
    let repeated = activations("4.53", "h100-80gb");
    let grouped = activations("4.56", "h100-80gb");
    let probabilities = 16.0 * 2048.0 * (32.0 * 2048.0 * 4.0 - 32.0 * 4.0);
    assert!(
        (grouped - repeated - probabilities).abs() < 0.001 * probabilities,
        "{grouped} - {repeated} against {probabilities}"
    );
    // bf16 on an H100 takes flash; on a T4 (sm_75) it cannot and falls back too.
    let bf16 = spec.replace("fp32", "fp16");
    let half = |tf: &str, gpu: &str| {
        at(
            &est_on(&bf16.replace("TF", tf), gpu),
            StepPhase::ForwardEnd,
            Component::Activations,
        )
    };
    assert_eq!(half("4.56", "h100-80gb"), half("4.53", "h100-80gb"));
    assert!(half("4.56", "t4") > half("4.53", "t4") + 16.0 * 2048.0 * 32.0 * 2048.0);
    // Release unknown: the point keeps the memory-efficient kernel, the upper end the math one.
    let unknown = est_on(
        &spec.replace(", runtime: {pytorch: '2.8', transformers: 'TF'}", ""),
        "h100-80gb",
    );
    let above = spread(&unknown, "sdpaMathFallback").1;
    assert!(above > probabilities, "{above} against {probabilities}");
}

#[test]
fn a_compiled_block_keeps_the_partitioners_cut_and_eagers_set_bounds_it() {
    // Llama 3.2 1B (hidden 2048, 32 heads over 8 K/V heads of 64, MLP 8192,
    // 16 blocks) in bf16 at 2 × 1024 tokens with flash-capable SDPA. Eager
    // keeps per token per block: two RMSNorms with their fp32 input and fp32
    // normalised copy and the 16-bit output (2 × 10 h), SDPA's q, repeated k
    // and v, output and log-sum-exp (4 q × 2 + 32 × 4), the MLP's gate, SiLU
    // output, up and product (4 × 2 i). Compiled, the partitioner's cut keeps
    // each norm's input and output and a statistic (2 × (4 h + 8)), q, k and
    // v at their own width, the output and the log-sum-exp
    // (2 (q + 2 kv) + 2 q + 128) and gate, up and product (3 × 2 i).
    let spec = "model: {preset: llama-3.2-1b}
training: {stack: hf-trainer, mode: MODE, microBatchSize: 2, sequenceLength: 1024, precision: bf16, attention: sdpa, optimizerImplementation: fused, batching: packed, compile: COMPILE}
";
    let job = |mode: &str, compile: bool| {
        est_on(
            &spec
                .replace("MODE", mode)
                .replace("COMPILE", &compile.to_string()),
            "h100-80gb",
        )
    };
    let activations = |e: &Estimate| at(e, StepPhase::ForwardEnd, Component::Activations);
    let (h, q, kv, i) = (2048.0, 2048.0, 512.0, 8192.0);
    let eager_block = 2.0 * 10.0 * h + (8.0 * q + 128.0) + 8.0 * i;
    let compiled_block = 2.0 * (4.0 * h + 8.0) + (2.0 * (q + 2.0 * kv) + 2.0 * q + 128.0) + 6.0 * i;
    let expected = 16.0 * 2048.0 * (eager_block - compiled_block);
    let eager = job("full", false);
    let compiled = job("full", true);
    let saved = activations(&eager) - activations(&compiled);
    assert!(
        (saved - expected).abs() < 0.001 * expected,
        "{saved} against {expected}"
    );
    // The upper end keeps eager's set: the mechanism spreads it by the difference.
    let above = spread(&compiled, "compiledActivations").1;
    assert!(above > 0.5 * expected, "{above} against {expected}");
    // Under LoRA the cut was not traced: eager's count stands.
    assert_eq!(
        activations(&job("lora", true)),
        activations(&job("lora", false))
    );
}
