//! The CRD's CEL rules (`x-kubernetes-validations`), evaluated client-side,
//! agree with the Rust validator the CLI and webhook use: the API server
//! rejects what `vramguard estimate` rejects for these cross-field rules, even
//! when the webhook is down.

use kube::core::cel::{validate_cel, validate_cel_update};
use vramguard::api::{TrainingJob, parse, validate};

fn job(spec_yaml: &str) -> TrainingJob {
    let text = format!(
        "apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: t, namespace: default}}\nspec:\n{spec_yaml}"
    );
    // Read as the API server's decoder would, past our schema check: the cases hold
    // values the schema refuses, to set the CEL rules against the Rust validator.
    let doc = parse::documents(&text).unwrap().remove(0);
    serde_json::from_value(doc).unwrap()
}

/// (name, spec, valid?)
const CASES: &[(&str, &str, bool)] = &[
    ("preset", "  model: {preset: gpt2}\n", true),
    ("no model", "  model: {}\n", false),
    (
        "two models",
        "  model: {preset: gpt2, custom: {parameters: 1.0e9, activationBytesPerSample: 1.0e6}}\n",
        false,
    ),
    (
        "kv heads divide",
        "  model: {transformer: {layers: 2, hiddenSize: 64, attentionHeads: 8, kvHeads: 2, vocabSize: 100}}\n",
        true,
    ),
    (
        "kv heads do not divide",
        "  model: {transformer: {layers: 2, hiddenSize: 64, attentionHeads: 8, kvHeads: 3, vocabSize: 100}}\n",
        false,
    ),
    (
        "heads do not divide hidden",
        "  model: {transformer: {layers: 2, hiddenSize: 65, attentionHeads: 8, vocabSize: 100}}\n",
        false,
    ),
    (
        "headDim set",
        "  model: {transformer: {layers: 2, hiddenSize: 65, attentionHeads: 8, headDim: 8, vocabSize: 100}}\n",
        true,
    ),
    (
        "experts without per-token",
        "  model: {transformer: {layers: 2, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, experts: 8}}\n",
        false,
    ),
    (
        "experts with per-token",
        "  model: {transformer: {layers: 2, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, experts: 8, expertsPerToken: 2}}\n",
        true,
    ),
    (
        "shared experts and a dense block",
        "  model: {transformer: {layers: 4, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, experts: 8, expertsPerToken: 2, sharedIntermediateSize: 128, denseLayers: 1, denseIntermediateSize: 512}}\n",
        true,
    ),
    (
        "shared experts in a dense model",
        "  model: {transformer: {layers: 4, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, sharedIntermediateSize: 128}}\n",
        false,
    ),
    (
        "dense blocks in a dense model",
        "  model: {transformer: {layers: 4, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, denseLayers: 1, denseIntermediateSize: 512}}\n",
        false,
    ),
    (
        "dense blocks without their width",
        "  model: {transformer: {layers: 4, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, experts: 8, expertsPerToken: 2, denseLayers: 1}}\n",
        false,
    ),
    (
        "every block dense",
        "  model: {transformer: {layers: 4, hiddenSize: 64, attentionHeads: 8, vocabSize: 100, experts: 8, expertsPerToken: 2, denseLayers: 4, denseIntermediateSize: 512}}\n",
        false,
    ),
    (
        "gpus not a multiple",
        "  model: {preset: gpt2}\n  parallelism: {gpus: 6, tensorParallel: 4}\n",
        false,
    ),
    (
        "gpus a multiple",
        "  model: {preset: gpt2}\n  parallelism: {gpus: 8, tensorParallel: 4}\n",
        true,
    ),
    (
        "sequence parallel without tp",
        "  model: {preset: gpt2}\n  parallelism: {sequenceParallel: true}\n",
        false,
    ),
    (
        "virtual stages without interleaving",
        "  model: {preset: gpt2}\n  parallelism: {gpus: 2, pipelineParallel: 2, virtualStages: 2}\n",
        false,
    ),
    (
        "virtual stages under the zero-bubble schedule",
        "  model: {preset: gpt2}\n  parallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: interleaved-zero-bubble, virtualStages: 2}\n",
        true,
    ),
    (
        "the V schedule with two virtual stages",
        "  model: {preset: gpt2}\n  parallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: zbv-zero-bubble, virtualStages: 2}\n",
        true,
    ),
    (
        "the V schedule with one virtual stage",
        "  model: {preset: gpt2}\n  parallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: dualpipev}\n",
        false,
    ),
    (
        "the V schedule without pipeline stages",
        "  model: {preset: gpt2}\n  parallelism: {pipelineSchedule: dualpipev}\n",
        true,
    ),
    (
        "DeepSpeed optimizer offload without zero",
        "  model: {preset: gpt2}\n  parallelism: {strategy: deepspeed, offload: optimizer}\n",
        false,
    ),
    (
        "torchao's optimizer offload under ddp",
        "  model: {preset: gpt2}\n  parallelism: {offload: optimizer, offloadGradients: true}\n",
        true,
    ),
    (
        "offloaded gradients without torchao's offload",
        "  model: {preset: gpt2}\n  parallelism: {offloadGradients: true}\n",
        false,
    ),
    (
        "global batch not a multiple",
        "  model: {preset: gpt2}\n  training: {microBatchSize: 3, globalBatchSize: 10}\n",
        false,
    ),
    (
        "qlora with none",
        "  model: {preset: gpt2}\n  training: {mode: qlora, quantization: none}\n",
        false,
    ),
    (
        "full with nf4",
        "  model: {preset: gpt2}\n  training: {mode: full, quantization: nf4}\n",
        false,
    ),
    (
        "lora block in full mode",
        "  model: {preset: gpt2}\n  training: {mode: full, lora: {rank: 8}}\n",
        false,
    ),
    (
        "lora rank 0",
        "  model: {preset: gpt2}\n  training: {mode: lora, lora: {rank: 0}}\n",
        false,
    ),
    (
        "fp32 cast of bf16 weights",
        "  model: {preset: gpt2}\n  training: {precision: bf16, weightsLoad: fp32-cast}\n",
        true,
    ),
    (
        "fp32 cast of fp16 weights",
        "  model: {preset: gpt2}\n  training: {precision: fp16, weightsLoad: fp32-cast}\n",
        true,
    ),
    (
        "fp32 cast under mixed precision",
        "  model: {preset: gpt2}\n  training: {precision: bf16-mixed, weightsLoad: fp32-cast}\n",
        false,
    ),
    (
        "fp32 cast under the default precision",
        "  model: {preset: gpt2}\n  training: {weightsLoad: fp32-cast}\n",
        false,
    ),
    (
        "float8 tensorwise under the default precision",
        "  model: {preset: gpt2}\n  training: {float8: tensorwise}\n",
        true,
    ),
    (
        "float8 rowwise under pure bf16",
        "  model: {preset: gpt2}\n  training: {precision: bf16, float8: rowwise}\n",
        true,
    ),
    (
        "float8 under fp32",
        "  model: {preset: gpt2}\n  training: {precision: fp32, float8: tensorwise}\n",
        false,
    ),
    (
        "float8 under pure fp16",
        "  model: {preset: gpt2}\n  training: {precision: fp16, float8: rowwise-with-gw-hp}\n",
        false,
    ),
    (
        "float8 with a quantized base",
        "  model: {preset: gpt2}\n  training: {mode: qlora, quantization: nf4, float8: tensorwise}\n",
        false,
    ),
    (
        "float8 all-gather with tensorwise under FSDP",
        "  model: {preset: gpt2}\n  training: {float8: tensorwise, float8AllGather: true}\n  parallelism: {gpus: 2, strategy: fsdp}\n",
        true,
    ),
    (
        "float8 all-gather with rowwise",
        "  model: {preset: gpt2}\n  training: {float8: rowwise, float8AllGather: true}\n  parallelism: {gpus: 2, strategy: fsdp}\n",
        false,
    ),
    (
        "float8 all-gather without float8",
        "  model: {preset: gpt2}\n  training: {float8AllGather: true}\n",
        false,
    ),
    (
        "float8 all-gather off without float8",
        "  model: {preset: gpt2}\n  training: {float8AllGather: false}\n",
        true,
    ),
    (
        "dtype load under mixed precision",
        "  model: {preset: gpt2}\n  training: {precision: fp16-mixed, weightsLoad: dtype}\n",
        true,
    ),
    (
        "safety margin 1.5",
        "  model: {preset: gpt2}\n  fitPolicy: {safetyMargin: 1.5}\n",
        false,
    ),
];

#[test]
fn cel_rules_agree_with_the_rust_validator() {
    let mut disagreements = Vec::new();
    for (name, spec, valid) in CASES {
        let tj = job(spec);
        let rust = validate(&tj.spec).is_ok();
        let cel = validate_cel(&tj);
        // Rules that only CEL-free schema keywords (minimum) catch are checked
        // by the API server's OpenAPI validation, not CEL: count those as CEL-valid.
        let cel_ok = cel.is_ok();
        if rust != *valid {
            disagreements.push(format!(
                "{name}: Rust validator says {rust}, expected {valid}"
            ));
        }
        let schema_only = *name == "lora rank 0";
        if !schema_only && cel_ok != *valid {
            disagreements.push(format!(
                "{name}: CEL says {cel_ok} ({cel:?}), expected {valid}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

#[test]
fn every_example_passes_the_cel_rules() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let is_job = path.extension().is_some_and(|e| e == "yaml")
            && std::fs::read_to_string(&path)
                .unwrap()
                .contains("kind: TrainingJob");
        if !is_job {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in parse::documents(&text).unwrap() {
            let tj = parse::training_job(doc).unwrap();
            if let Err(e) = validate_cel(&tj) {
                panic!("{}: {e:?}", path.display());
            }
        }
    }
}

/// The transition rules hold `spec.model` and `spec.training.mode` as they were, as the
/// webhook does, so they hold while the webhook is down (or `failurePolicy: Ignore`).
#[test]
fn model_and_mode_cannot_change_even_without_the_webhook() {
    let old = job("  model: {preset: gpt2}\n  training: {mode: full, microBatchSize: 4}\n");
    let update = |spec: &str| validate_cel_update(&job(spec), &old).map_err(|e| format!("{e:?}"));
    assert_eq!(
        update("  model: {preset: gpt2}\n  training: {mode: full, microBatchSize: 8}\n"),
        Ok(())
    );
    let other_model = update(
        "  model: {custom: {parameters: 1.0e9, activationBytesPerSample: 1.0e6}}\n  training: {mode: full, microBatchSize: 4}\n",
    )
    .unwrap_err();
    assert!(
        other_model.contains("spec.model cannot change"),
        "{other_model}"
    );
    let other_mode =
        update("  model: {preset: gpt2}\n  training: {mode: lora, microBatchSize: 4}\n")
            .unwrap_err();
    assert!(
        other_mode.contains("spec.training.mode cannot change"),
        "{other_mode}"
    );
    assert!(!other_mode.contains("spec.model"), "{other_mode}");
    // On create there is no old object: the transition rules do not apply.
    assert!(validate_cel(&job("  model: {preset: gpt2}\n")).is_ok());
}
