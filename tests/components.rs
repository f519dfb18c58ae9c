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
    // The eager-loading context: 1.5 GiB at the high end with no runtime known.
    let ctx = s
        .spread
        .iter()
        .find(|m| m.mechanism == "cudaContext")
        .unwrap();
    assert_eq!(ctx.above_bytes as f64, 1.5 * GIB - 576.0 * MIB);
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
