//! Trainer-stack profiles, PEFT families and checkpointing policies: each
//! mechanism pinned by what it changes in the step's phases, and the interval
//! a job that names no stack carries.

use vramguard::api::{TrainingJob, TrainingJobSpec, ValidatedJob, validate, validate_job};
use vramguard::estimate::{self, Component, Estimate, StepPhase, gpus};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn job(yaml: &str) -> ValidatedJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).expect("spec parses");
    validate(&spec).unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn est(yaml: &str) -> Estimate {
    estimate::estimate(&job(yaml), gpus::find("h100-80gb").unwrap()).expect("estimates")
}

fn phase(e: &Estimate, p: StepPhase, c: Component) -> f64 {
    e.phases
        .iter()
        .find(|x| x.phase == p)
        .unwrap_or_else(|| panic!("no phase {p:?}"))
        .get(c)
}

fn with_stack(base: &str, stack: &str) -> String {
    base.replace("training: {", &format!("training: {{stack: {stack}, "))
}

const LORA: &str = "model: {preset: llama-3-8b}
training: {mode: lora, microBatchSize: 2, sequenceLength: 2048, precision: bf16}
";

#[test]
fn the_trainer_frees_logits_before_backward_litgpt_keeps_them() {
    let hf = est(&with_stack(LORA, "hf-trainer"));
    let lit = est(&with_stack(LORA, "litgpt"));
    let custom = est(&with_stack(LORA, "custom"));
    let logits = 2.0 * 2048.0 * 128256.0 * 2.0;
    assert_eq!(
        phase(&hf, StepPhase::BackwardLastBlock, Component::Logits),
        0.0
    );
    assert_eq!(
        phase(&lit, StepPhase::BackwardLastBlock, Component::Logits),
        logits
    );
    assert_eq!(
        phase(&custom, StepPhase::BackwardLastBlock, Component::Logits),
        logits
    );
    for s in [
        "torchtune",
        "torchtitan",
        "lightning",
        "megatron",
        "unsloth",
    ] {
        let e = est(&with_stack(LORA, s));
        assert_eq!(
            phase(&e, StepPhase::BackwardLastBlock, Component::Logits),
            0.0,
            "{s}"
        );
    }
}

#[test]
fn no_global_batch_means_no_accumulation_except_where_the_stack_defaults_to_it() {
    let full = "model: {preset: llama-3.2-1b}
training: {mode: full, microBatchSize: 1, sequenceLength: 1024}
";
    let custom = est(&with_stack(full, "custom"));
    assert_eq!(
        phase(&custom, StepPhase::ForwardEnd, Component::Gradients),
        0.0
    );
    let lit = est(&with_stack(full, "litgpt"));
    assert!(phase(&lit, StepPhase::ForwardEnd, Component::Gradients) > 0.0);
    // A global batch the micro-batch fills says there is no accumulation, whatever the stack.
    let one = full.replace(
        "microBatchSize: 1,",
        "microBatchSize: 1, globalBatchSize: 1,",
    );
    let lit1 = est(&with_stack(&one, "litgpt"));
    assert_eq!(
        phase(&lit1, StepPhase::ForwardEnd, Component::Gradients),
        0.0
    );
    let four = full.replace(
        "microBatchSize: 1,",
        "microBatchSize: 1, globalBatchSize: 4,",
    );
    let custom4 = est(&with_stack(&four, "custom"));
    assert!(phase(&custom4, StepPhase::ForwardEnd, Component::Gradients) > 0.0);
}

#[test]
fn foreach_adamw_holds_one_state_more_at_the_step_fused_does_not() {
    let full = "model: {preset: llama-3.2-1b}
training: {mode: full, microBatchSize: 1, sequenceLength: 1024, precision: bf16-mixed}
";
    let custom = est(&with_stack(full, "custom"));
    let tune = est(&with_stack(full, "torchtune"));
    let params = custom.status.breakdown.weights as f64 / 4.0;
    let foreach = phase(&custom, StepPhase::OptimizerStep, Component::Temporaries);
    assert!((foreach / (4.0 * params) - 1.0).abs() < 0.01, "{foreach}");
    assert_eq!(
        phase(&tune, StepPhase::OptimizerStep, Component::Temporaries),
        0.0
    );
    // The job's own choice overrides the stack's.
    let fused = full.replace("precision:", "optimizerImplementation: fused, precision:");
    let custom_fused = est(&with_stack(&fused, "custom"));
    assert_eq!(
        phase(
            &custom_fused,
            StepPhase::OptimizerStep,
            Component::Temporaries
        ),
        0.0
    );
}

#[test]
fn only_old_fsdp1_keeps_frozen_units_unsharded_through_backward() {
    // A 4-bit 405B model with LoRA on 8 GPUs under FSDP.
    let base = "model: {preset: llama-3.1-405b}
training: {mode: qlora, microBatchSize: 1, sequenceLength: 2048, precision: bf16, gradientCheckpointing: full}
parallelism: {gpus: 8, zeroStage: 3, strategy: fsdp}
";
    let lit = est(&with_stack(base, "litgpt"));
    let tune = est(&with_stack(base, "torchtune"));
    let hf = est(&with_stack(base, "hf-trainer"));
    // LitGPT's FSDP1 wrapping gathers every frozen weight in 16 bit: ~750 GiB.
    assert!(lit.status.peak_allocated_bytes as f64 > 500.0 * GIB);
    for e in [&tune, &hf] {
        let gib = e.status.peak_allocated_bytes as f64 / GIB;
        assert!(gib < 60.0, "{gib:.1} GiB per GPU");
    }
    let v2 = base.replace("strategy: fsdp}", "strategy: fsdp, fsdpVersion: \"2\"}");
    let lit2 = est(&with_stack(&v2, "litgpt"));
    assert!((lit2.status.peak_allocated_bytes as f64 / GIB) < 60.0);
}

#[test]
fn torchtitan_shards_over_context_parallel_too() {
    let base = "model: {preset: llama-3-8b}
training: {mode: full, microBatchSize: 1, sequenceLength: 8192, precision: bf16-mixed}
parallelism: {gpus: 8, zeroStage: 3, strategy: fsdp, contextParallel: 2}
";
    let titan = est(&with_stack(base, "torchtitan"));
    let tune = est(&with_stack(base, "torchtune"));
    let ratio = titan.status.breakdown.optimizer_states as f64
        / tune.status.breakdown.optimizer_states as f64;
    assert!((ratio - 0.5).abs() < 1e-6, "{ratio}");
}

#[test]
fn torchao_nf4_dequantizes_once_and_saves_no_input() {
    let base = "model: {preset: llama-3-8b}
training: {mode: qlora, microBatchSize: 2, sequenceLength: 2048, precision: bf16, lora: {dropout: 0}}
";
    let tune = est(&with_stack(base, "torchtune"));
    let hf = est(&with_stack(base, "hf-trainer"));
    assert!(
        phase(&tune, StepPhase::ForwardEnd, Component::Activations)
            < phase(&hf, StepPhase::ForwardEnd, Component::Activations)
    );
    // One 16-bit copy of the largest matrix (the 128256 × 4096 head) against two.
    let head = 128256.0 * 4096.0 * 2.0;
    let diff = phase(&hf, StepPhase::ForwardEnd, Component::Temporaries)
        - phase(&tune, StepPhase::ForwardEnd, Component::Temporaries);
    assert!((diff / head - 1.0).abs() < 0.01, "{}", diff / head);
}

#[test]
fn a_job_without_a_stack_carries_the_upper_end_over_every_stack() {
    let open = est(LORA);
    let upper = open.status.upper.expect("an upper end");
    let mut max = 0;
    for s in [
        "hf-trainer",
        "torchtune",
        "torchtitan",
        "litgpt",
        "lightning",
        "deepspeed",
        "megatron",
        "unsloth",
        "custom",
    ] {
        let e = est(&with_stack(LORA, s));
        let u = e.status.upper.unwrap();
        assert!(u.per_gpu_bytes >= e.status.per_gpu_bytes);
        max = max.max(u.per_gpu_bytes);
    }
    assert_eq!(upper.per_gpu_bytes, max);
    // The point is the plain PyTorch loop's.
    assert_eq!(
        open.status.per_gpu_bytes,
        est(&with_stack(LORA, "custom")).status.per_gpu_bytes
    );
    assert!(upper.per_gpu_bytes > open.status.per_gpu_bytes);
    // A single-profile stack with every open default pinned leaves no stack
    // behaviour open: what range remains is the mechanisms' own.
    let pinned = est(&with_stack(LORA, "torchtune"));
    assert!(
        pinned
            .status
            .spread
            .iter()
            .all(|m| m.mechanism != "stackBehaviour")
    );
    assert!(
        open.status
            .spread
            .iter()
            .any(|m| m.mechanism == "stackBehaviour")
    );
    assert!(pinned.status.upper.unwrap().per_gpu_bytes >= pinned.status.per_gpu_bytes);
}

#[test]
fn the_fit_uses_the_upper_end() {
    // A job the plain loop fits on an A10G but LitGPT's accumulation and held
    // logits would not: the verdict follows the upper end.
    let yaml = "model: {preset: llama-3.2-1b}
training: {mode: full, microBatchSize: 4, sequenceLength: 2048, precision: bf16}
";
    let j = job(yaml);
    let g = gpus::find("a10g").unwrap();
    let e = estimate::estimate(&j, g).unwrap();
    let u = e.status.upper.unwrap();
    assert!(u.per_gpu_bytes > e.status.per_gpu_bytes);
    let v = vramguard::plan::fit_estimate(
        &e,
        0.0,
        vramguard::plan::GpuView::empty(u.per_gpu_bytes - 1),
    );
    assert!(!v.fits);
    let v =
        vramguard::plan::fit_estimate(&e, 0.0, vramguard::plan::GpuView::empty(u.per_gpu_bytes));
    assert!(v.fits);
}

const ADAPTER: &str = "model: {preset: llama-3-8b}
training: {stack: hf-trainer, mode: adapter, microBatchSize: 2, sequenceLength: 2048, precision: bf16";

fn peft(extra: &str) -> Estimate {
    est(&format!("{ADAPTER}, peft: {{{extra}}}}}\n"))
}

#[test]
fn ia3_vera_and_ln_tuning_train_in_every_block() {
    let top2 = peft("method: llama-adapter, layers: 2");
    let ia3 = peft("method: ia3");
    let vera = peft("method: vera");
    let ln = peft("method: ln-tuning");
    let act = |e: &Estimate| phase(e, StepPhase::ForwardEnd, Component::Activations);
    for (name, e) in [("ia3", &ia3), ("vera", &vera), ("ln", &ln)] {
        assert!(act(e) > 8.0 * act(&top2), "{name}");
    }
    // IA3's vectors: k, v (1024 wide) and down_proj's input (14336) in 32 blocks.
    let grads = |e: &Estimate| phase(e, StepPhase::BackwardEnd, Component::Gradients) / 2.0;
    let trainable_bytes = grads(&ia3);
    assert_eq!(trainable_bytes, 32.0 * (1024.0 + 1024.0 + 14336.0));
    // VeRA's vectors: r = 256 and q (4096) / v (1024) wide.
    assert_eq!(grads(&vera), 32.0 * (256.0 + 4096.0 + 256.0 + 1024.0));
}

#[test]
fn prompt_tuning_tokens_are_positions_everywhere() {
    let few = peft("method: prompt-tuning, virtualTokens: 1");
    let many = peft("method: prompt-tuning, virtualTokens: 2048");
    let act = |e: &Estimate| phase(e, StepPhase::ForwardEnd, Component::Activations);
    let logits = |e: &Estimate| phase(e, StepPhase::ForwardEnd, Component::Logits);
    // 2048 + 2048 positions against 2048 + 1: about twice.
    let r = act(&many) / act(&few);
    assert!((r - 2.0).abs() < 0.01, "{r}");
    let r = logits(&many) / logits(&few);
    assert!((r - 2.0).abs() < 0.01, "{r}");
    assert_eq!(
        phase(&few, StepPhase::BackwardEnd, Component::Gradients) / 2.0,
        4096.0
    );
}

#[test]
fn dora_keeps_two_output_wide_tensors_per_module_more_than_lora() {
    let lora = est(&with_stack(LORA, "hf-trainer"));
    let dora = est(&with_stack(
        &LORA.replace("mode: lora,", "mode: lora, lora: {variant: dora},"),
        "hf-trainer",
    ));
    let act = |e: &Estimate| phase(e, StepPhase::ForwardEnd, Component::Activations);
    // q_proj (4096) and v_proj (1024) outputs, twice each, 2 bytes, 32 blocks, 4096 tokens.
    let expected = 2.0 * 2.0 * (4096.0 + 1024.0) * 32.0 * 4096.0;
    let diff = act(&dora) - act(&lora);
    assert!((diff / expected - 1.0).abs() < 1e-9, "{}", diff / expected);
}

#[test]
fn galore_projects_the_block_matrices_states() {
    let full = "model: {preset: llama-3-8b}
training: {stack: hf-trainer, mode: full, microBatchSize: 1, sequenceLength: 1024, precision: bf16";
    let adam = est(&format!("{full}}}\n"));
    let galore = est(&format!("{full}, peft: {{method: galore, rank: 128}}}}\n"));
    let ratio = galore.status.breakdown.optimizer_states as f64
        / adam.status.breakdown.optimizer_states as f64;
    // Embedding and head (1.05B of 8.03B parameters) keep full states.
    assert!(ratio > 0.13 && ratio < 0.25, "{ratio}");
    assert_eq!(
        galore.status.breakdown.gradients,
        adam.status.breakdown.gradients
    );
}

#[test]
fn checkpointing_policies_order_as_they_save() {
    let base = "model: {preset: llama-3-8b}
training: {stack: torchtitan, mode: full, microBatchSize: 1, sequenceLength: 4096, precision: bf16-mixed";
    let act = |extra: &str| {
        let e = est(&format!("{base}{extra}}}\n"));
        phase(&e, StepPhase::ForwardEnd, Component::Activations)
    };
    let none = act("");
    let full = act(", gradientCheckpointing: full");
    let megatron = act(", gradientCheckpointing: selective");
    let op = act(", gradientCheckpointing: op-selective");
    let every2 = act(", gradientCheckpointing: full, checkpointEvery: 2");
    assert!(
        full < op && op < megatron && megatron < none,
        "{full} {op} {megatron} {none}"
    );
    assert!(((every2 - full) / (none - full) - 0.5).abs() < 0.02);
}

#[test]
fn peft_fields_are_checked_against_the_mode_and_method() {
    let bad = |yaml: &str, field: &str| {
        let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).unwrap();
        let e = validate(&spec).expect_err("invalid");
        assert!(e.to_string().contains(field), "{e}");
    };
    bad(
        "model: {preset: llama-3-8b}\ntraining: {mode: lora, peft: {method: ia3}}\n",
        "spec.training.peft.method",
    );
    bad(
        "model: {preset: llama-3-8b}\ntraining: {mode: adapter, peft: {method: ia3, virtualTokens: 4}}\n",
        "spec.training.peft.virtualTokens",
    );
    bad(
        "model: {preset: llama-3-8b}\ntraining: {mode: adapter, peft: {method: vera, targetModules: [foo]}}\n",
        "spec.training.peft.targetModules[0]",
    );
    bad(
        "model: {preset: llama-3-8b}\ntraining: {gradientCheckpointing: full, checkpointEvery: 0}\n",
        "spec.training.checkpointEvery",
    );
    bad(
        "model: {preset: llama-3-8b}\ntraining: {checkpointEvery: 2}\n",
        "spec.training.checkpointEvery",
    );
    let spec: Result<TrainingJobSpec, _> =
        serde_saphyr::from_str("model: {preset: llama-3-8b}\ntraining: {stack: fairseq}\n");
    assert!(spec.is_err());
}

#[test]
fn vision_presets_take_common_spellings_and_hints() {
    for name in ["resnet50", "ResNet-50", "resnet_50", "RESNET 50"] {
        job(&format!("model: {{preset: {name}}}\n"));
    }
    let tj: TrainingJob = serde_saphyr::from_str(
        "apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata: {name: r, annotations: {vramguard.io/preset-hint: resnet-50}}
spec:
  model: {preset: resnet50}
",
    )
    .unwrap();
    validate_job(&tj).expect("a vision hint on the same preset");
    let tj: TrainingJob = serde_saphyr::from_str(
        "apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata: {name: r, annotations: {vramguard.io/preset-hint: resnet-50}}
spec:
  model: {preset: llama-3-8b}
",
    )
    .unwrap();
    let e = validate_job(&tj).expect_err("a vision hint on a language model");
    assert!(e.to_string().contains("preset-hint"), "{e}");
}
