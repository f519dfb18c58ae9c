//! Table tests of parsing and validation: every bad spec is rejected with
//! errors that name the field path and the reason, all problems at once, and
//! nothing a user can write makes the parser or validator panic.

use vramguard::api::parse::{self, ParseError, documents, training_job};
use vramguard::api::{FieldError, ResolvedModel, ValidatedJob, validate_job};

/// A TrainingJob document around `spec` (the spec's YAML, indented by 2).
fn job(spec: &str) -> String {
    let mut text = String::from(
        "apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: t\nspec:\n",
    );
    for line in spec.lines() {
        text.push_str("  ");
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Parse one document and validate it; the field errors of whichever step failed.
fn check(text: &str) -> Result<ValidatedJob, Vec<FieldError>> {
    let docs = documents(text).unwrap_or_else(|e| panic!("not YAML: {e}\n{text}"));
    assert_eq!(docs.len(), 1, "expected one document:\n{text}");
    let doc = docs
        .into_iter()
        .next()
        .expect("one document, checked above");
    match training_job(doc) {
        Ok(tj) => validate_job(&tj).map_err(|e| e.0),
        Err(ParseError::Fields(errs)) => Err(errs),
        Err(other) => panic!("expected field errors, got {other:?}\n{text}"),
    }
}

fn errors(text: &str) -> Vec<FieldError> {
    match check(text) {
        Ok(_) => panic!("expected this spec to be rejected:\n{text}"),
        Err(errs) => {
            assert!(!errs.is_empty(), "rejected without a reason:\n{text}");
            errs
        }
    }
}

fn paths(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.path.as_str()).collect()
}

const BASE: &str = "\
model:
  preset: llama-3.1-8b
training:
  mode: lora
  microBatchSize: 2
  sequenceLength: 1024
parallelism:
  gpus: 1
";

#[test]
fn the_base_spec_is_valid() {
    let job = check(&job(BASE)).expect("the base spec validates");
    assert_eq!(job.model_name, "llama-3.1-8b");
    assert_eq!(job.data_parallel, 1);
    assert_eq!(job.gradient_accumulation_steps, 1);
}

/// (case, spec, the only error's path, words its reason must contain).
const CASES: &[(&str, &str, &str, &[&str])] = &[
    (
        "zero microBatchSize",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 0}",
        "spec.training.microBatchSize",
        &["0 is out of range", "use a value 1 or more"],
    ),
    (
        "negative sequenceLength",
        "model: {preset: gpt2}\ntraining: {sequenceLength: -5}",
        "spec.training.sequenceLength",
        &["-5 is out of range", "use a value 1 or more"],
    ),
    (
        "fractional microBatchSize",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 1.5}",
        "spec.training.microBatchSize",
        &["1.5"],
    ),
    (
        "microBatchSize beyond u64",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 18446744073709551616}",
        "spec.training.microBatchSize",
        &["is too large", "largest whole number"],
    ),
    (
        "microBatchSize above the maximum",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 16777217}",
        "spec.training.microBatchSize",
        &["16777217 is too large", "maximum is 16777216"],
    ),
    (
        "attentionHeads not dividing hiddenSize",
        "model:\n  transformer: {layers: 2, hiddenSize: 100, attentionHeads: 3, vocabSize: 1000}",
        "spec.model.transformer.attentionHeads",
        &["3 does not divide hiddenSize 100", "headDim"],
    ),
    (
        "kvHeads not dividing attentionHeads",
        "model:\n  transformer: {layers: 2, hiddenSize: 512, attentionHeads: 8, kvHeads: 3, vocabSize: 1000}",
        "spec.model.transformer.kvHeads",
        &["3 does not divide attentionHeads 8"],
    ),
    (
        "zero layers",
        "model:\n  transformer: {layers: 0, hiddenSize: 512, attentionHeads: 8, vocabSize: 1000}",
        "spec.model.transformer.layers",
        &["0 is out of range", "use a value 1 or more"],
    ),
    (
        "hiddenSize above the maximum",
        "model:\n  transformer: {layers: 2, hiddenSize: 16777217, attentionHeads: 1, vocabSize: 1000}",
        "spec.model.transformer.hiddenSize",
        &["16777217 is too large", "maximum is 16777216"],
    ),
    (
        "parameter count overflowing 64 bits",
        "model:\n  transformer: {layers: 16777216, hiddenSize: 16777216, attentionHeads: 128, \
         intermediateSize: 16777216, vocabSize: 16777216}",
        "spec.model",
        &["overflows"],
    ),
    (
        "parameter count above the maximum",
        "model:\n  transformer: {layers: 4096, hiddenSize: 1048576, attentionHeads: 8192, vocabSize: 1000}",
        "spec.model",
        &["parameters", "maximum is 1e15"],
    ),
    (
        "gpus not a multiple of tp × pp × cp",
        "model: {preset: llama-3.1-8b}\nparallelism: {gpus: 6, tensorParallel: 4}",
        "spec.parallelism.gpus",
        &["6 is not a multiple of", "= 4"],
    ),
    (
        "tensorParallel not dividing the heads",
        "model: {preset: gpt2}\nparallelism: {gpus: 5, tensorParallel: 5}",
        "spec.parallelism.tensorParallel",
        &["5 does not divide the model's 12 attention heads"],
    ),
    (
        "globalBatchSize not divisible",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 3, globalBatchSize: 10}\nparallelism: {gpus: 2}",
        "spec.training.globalBatchSize",
        &["10 is not divisible", "3 × 2 = 6"],
    ),
    (
        "globalBatchSize below one step",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 4, globalBatchSize: 2}",
        "spec.training.globalBatchSize",
        &["2 is not divisible", "= 4"],
    ),
    (
        "LoRA rank 0",
        "model: {preset: gpt2}\ntraining:\n  mode: lora\n  lora: {rank: 0}",
        "spec.training.lora.rank",
        &["0 is out of range", "use a value 1 or more"],
    ),
    (
        "unknown LoRA target",
        "model: {preset: gpt2}\ntraining:\n  mode: lora\n  lora: {targetModules: [q_proj, attn]}",
        "spec.training.lora.targetModules[1]",
        &["unknown module \"attn\"", "q_proj"],
    ),
    (
        "LoRA settings without a LoRA mode",
        "model: {preset: gpt2}\ntraining:\n  mode: full\n  lora: {rank: 8}",
        "spec.training.lora",
        &["only used with mode: lora or qlora"],
    ),
    (
        "unknown precision",
        "model: {preset: gpt2}\ntraining: {precision: fp8}",
        "spec.training.precision",
        &[
            "fp8",
            "fp32",
            "tf32",
            "fp16-mixed",
            "bf16-mixed",
            "fp16",
            "bf16",
        ],
    ),
    (
        "unknown optimizer",
        "model: {preset: gpt2}\ntraining: {optimizer: lion}",
        "spec.training.optimizer",
        &["lion", "adamw", "paged-adamw-8bit"],
    ),
    (
        "unknown field in training",
        "model: {preset: gpt2}\ntraining: {foo: 1}",
        "spec.training.foo",
        &["unknown field", "known fields here", "microBatchSize"],
    ),
    (
        "unknown field in the transformer",
        "model:\n  transformer: {layers: 2, hiddenSize: 512, attentionHeads: 8, vocabSize: 1000, hidden: 3}",
        "spec.model.transformer.hidden",
        &["unknown field", "did you mean hiddenSize?"],
    ),
    (
        "missing required transformer dimension",
        "model:\n  transformer: {layers: 2, hiddenSize: 512, attentionHeads: 8}",
        "spec.model.transformer.vocabSize",
        &["missing; this field is required"],
    ),
    (
        "no model source",
        "model: {}",
        "spec.model",
        &[
            "no model given",
            "preset, transformer, hfConfig, layers, custom",
        ],
    ),
    (
        "two model sources",
        "model:\n  preset: gpt2\n  custom: {parameters: 1e9, activationBytesPerSample: 0}",
        "spec.model",
        &[
            "several model sources given (preset, custom)",
            "exactly one",
        ],
    ),
    (
        "unknown preset",
        "model: {preset: llama-9-1t}",
        "spec.model.preset",
        &["unknown preset \"llama-9-1t\"", "llama-3.1-8b", "gpt2"],
    ),
    (
        "custom.parameters 1e30",
        "model:\n  custom: {parameters: 1e30, activationBytesPerSample: 0}",
        "spec.model.custom.parameters",
        &["1e30 is too large", "maximum is 1e15"],
    ),
    (
        "lora.alpha 1e30",
        "model: {preset: gpt2}\ntraining: {mode: lora, lora: {rank: 8, alpha: 1e30}}",
        "spec.training.lora.alpha",
        &["is too large", "maximum is 65504"],
    ),
    (
        "custom.parameters 0",
        "model:\n  custom: {parameters: 0, activationBytesPerSample: 0}",
        "spec.model.custom.parameters",
        &["0 is not allowed", "minimum is 1"],
    ),
    (
        "negative custom.activationBytesPerSample",
        "model:\n  custom: {parameters: 1e9, activationBytesPerSample: -1}",
        "spec.model.custom.activationBytesPerSample",
        &["-1 is not allowed", "minimum is 0"],
    ),
    (
        "custom.parameters .nan",
        "model:\n  custom: {parameters: .nan, activationBytesPerSample: 0}",
        "spec.model.custom.parameters",
        &["\".nan\" is not a number"],
    ),
    (
        "custom.parameters .inf",
        "model:\n  custom: {parameters: .inf, activationBytesPerSample: 0}",
        "spec.model.custom.parameters",
        &["\".inf\" is not a number"],
    ),
    (
        "trainableParameters -.inf",
        "model: {preset: gpt2}\ntraining: {mode: lora, trainableParameters: -.inf}",
        "spec.training.trainableParameters",
        &["\"-.inf\" is not a number"],
    ),
    (
        "safetyMargin .nan",
        "model: {preset: gpt2}\nfitPolicy: {safetyMargin: .nan}",
        "spec.fitPolicy.safetyMargin",
        &["\".nan\" is not a number"],
    ),
    (
        "LoRA alpha .inf",
        "model: {preset: gpt2}\ntraining:\n  mode: lora\n  lora: {alpha: .inf}",
        "spec.training.lora.alpha",
        &["\".inf\" is not a number"],
    ),
    (
        "a float literal that overflows to infinity",
        "model:\n  custom: {parameters: 1e999, activationBytesPerSample: 0}",
        "spec.model.custom.parameters",
        &["is not a number"],
    ),
    (
        "microBatchSize .nan",
        "model: {preset: gpt2}\ntraining: {microBatchSize: .nan}",
        "spec.training.microBatchSize",
        &["\".nan\" is not a whole number"],
    ),
    (
        "microBatchSize as a word",
        "model: {preset: gpt2}\ntraining: {microBatchSize: eight}",
        "spec.training.microBatchSize",
        &["\"eight\" is not a whole number"],
    ),
    (
        "quoted microBatchSize",
        "model: {preset: gpt2}\ntraining: {microBatchSize: \"8\"}",
        "spec.training.microBatchSize",
        &["\"8\" is text", "without quotes"],
    ),
    (
        "training as a number",
        "model: {preset: gpt2}\ntraining: 5",
        "spec.training",
        &["5 is not a map of fields"],
    ),
    (
        "trainableParameters above the model size",
        "model: {preset: gpt2}\ntraining: {mode: lora, trainableParameters: 1e12}",
        "spec.training.trainableParameters",
        &["1000000000000 exceeds the model's", "parameters"],
    ),
    (
        "trainableParameters in inference",
        "model: {preset: gpt2}\ntraining: {mode: inference, trainableParameters: 10}",
        "spec.training.trainableParameters",
        &["mode: inference"],
    ),
    (
        "qlora with quantization none",
        "model: {preset: gpt2}\ntraining: {mode: qlora, quantization: none}",
        "spec.training.quantization",
        &["none contradicts mode: qlora", "nf4"],
    ),
    (
        "full with nf4",
        "model: {preset: gpt2}\ntraining: {mode: full, quantization: nf4}",
        "spec.training.quantization",
        &["nf4 base weights cannot be trained in mode: full", "lora"],
    ),
    (
        "sequenceParallel without tensor parallelism",
        "model: {preset: gpt2}\nparallelism: {sequenceParallel: true}",
        "spec.parallelism.sequenceParallel",
        &["tensorParallel ≥ 2"],
    ),
    (
        "virtualStages without the interleaved schedule",
        "model: {preset: gpt2}\nparallelism: {gpus: 2, pipelineParallel: 2, virtualStages: 2}",
        "spec.parallelism.virtualStages",
        &["interleaved-1f1b"],
    ),
    (
        "virtualStages under 1f1b",
        "model: {preset: gpt2}\nparallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: 1f1b, virtualStages: 2}",
        "spec.parallelism.virtualStages",
        &[
            "interleaved-zero-bubble",
            "zbv-zero-bubble",
            "looped-bfs",
            "dualpipev",
        ],
    ),
    (
        "unknown pipeline schedule",
        "model: {preset: gpt2}\nparallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: zb-h2}",
        "spec.parallelism.pipelineSchedule",
        &[
            "zb-h2",
            "gpipe",
            "1f1b",
            "interleaved-1f1b",
            "looped-bfs",
            "interleaved-zero-bubble",
            "zbv-zero-bubble",
            "dualpipev",
        ],
    ),
    (
        "the V schedule with one virtual stage",
        "model: {preset: gpt2}\nparallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: zbv-zero-bubble}",
        "spec.parallelism.virtualStages",
        &[
            "is 1",
            "zbv-zero-bubble",
            "exactly 2 virtual stages",
            "must be 2",
        ],
    ),
    (
        "DualPipeV with four virtual stages",
        "model: {preset: gpt2}\nparallelism: {gpus: 2, pipelineParallel: 2, pipelineSchedule: dualpipev, virtualStages: 4}",
        "spec.parallelism.virtualStages",
        &["is 4", "dualpipev", "must be 2"],
    ),
    (
        "DualPipeV with fewer micro-batches than stages",
        "model: {preset: gpt2}\ntraining: {globalBatchSize: 6}\nparallelism: {gpus: 4, pipelineParallel: 4, pipelineSchedule: dualpipev, virtualStages: 2}",
        "spec.training.globalBatchSize",
        &[
            "gives 6 micro-batches",
            "dualpipev",
            "2 × pipelineParallel = 8",
        ],
    ),
    (
        "interleaved zero bubble with micro-batches not a multiple of its rounds",
        "model: {preset: gpt2}\ntraining: {globalBatchSize: 9}\nparallelism: {gpus: 4, pipelineParallel: 4, pipelineSchedule: interleaved-zero-bubble, virtualStages: 2}",
        "spec.training.globalBatchSize",
        &[
            "gives 9 micro-batches",
            "2 rounds",
            "multiple of pipelineParallel = 4",
        ],
    ),
    (
        "more pipeline stages than layers",
        "model: {preset: gpt2}\nparallelism: {gpus: 16, pipelineParallel: 16}",
        "spec.parallelism.pipelineParallel",
        &["exceed the model's 12 layers"],
    ),
    (
        "contextParallel not dividing sequenceLength",
        "model: {preset: gpt2}\ntraining: {sequenceLength: 1001}\nparallelism: {gpus: 2, contextParallel: 2}",
        "spec.parallelism.contextParallel",
        &["2 does not divide sequenceLength 1001"],
    ),
    (
        "DeepSpeed optimizer offload without ZeRO",
        "model: {preset: gpt2}\nparallelism: {strategy: deepspeed, offload: optimizer}",
        "spec.parallelism.offload",
        &["zeroStage ≥ 1"],
    ),
    (
        "zeroStage 4",
        "model: {preset: gpt2}\nparallelism: {zeroStage: 4}",
        "spec.parallelism.zeroStage",
        &["4 is out of range", "use a value from 0 to 3"],
    ),
    (
        "zeroStage beyond u8",
        "model: {preset: gpt2}\nparallelism: {zeroStage: 300}",
        "spec.parallelism.zeroStage",
        &["300"],
    ),
    (
        "model parallelism of a custom model",
        "model:\n  custom: {parameters: 1e9, activationBytesPerSample: 1e6}\nparallelism: {gpus: 2, tensorParallel: 2}",
        "spec.parallelism",
        &["need a transformer model"],
    ),
    (
        "minMicroBatchSize above microBatchSize",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 2}\nfitPolicy: {minMicroBatchSize: 4}",
        "spec.fitPolicy.minMicroBatchSize",
        &["4 is above spec.training.microBatchSize 2"],
    ),
    (
        "safetyMargin 1.5",
        "model: {preset: gpt2}\nfitPolicy: {safetyMargin: 1.5}",
        "spec.fitPolicy.safetyMargin",
        &["1.5 is out of range", "from 0 to 1"],
    ),
    (
        "negative safetyMargin",
        "model: {preset: gpt2}\nfitPolicy: {safetyMargin: -0.1}",
        "spec.fitPolicy.safetyMargin",
        &["-0.1 is out of range", "from 0 to 1"],
    ),
    (
        "unknown fit mode",
        "model: {preset: gpt2}\nfitPolicy: {mode: reject}",
        "spec.fitPolicy.mode",
        &["reject", "Reject", "Adjust"],
    ),
    (
        "numLabels without a classification head",
        "model: {preset: bert-base, numLabels: 3}",
        "spec.model.numLabels",
        &["only used with head: classification"],
    ),
];

#[test]
fn each_mistake_gets_one_error_naming_path_and_reason() {
    let mut failures = Vec::new();
    for (case, spec, path, words) in CASES {
        let text = job(spec);
        let errs = match check(&text) {
            Ok(_) => {
                failures.push(format!("{case}: accepted"));
                continue;
            }
            Err(errs) => errs,
        };
        if paths(&errs) != [*path] {
            failures.push(format!(
                "{case}: expected one error at {path}, got {:?}",
                errs.iter().map(|e| e.to_string()).collect::<Vec<_>>()
            ));
            continue;
        }
        let shown = errs[0].to_string();
        assert!(shown.starts_with(&format!("{path}: ")), "{case}: {shown}");
        for w in *words {
            if !errs[0].reason.contains(w) {
                failures.push(format!("{case}: reason lacks {w:?}: {shown}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn an_unknown_layer_kind_names_every_valid_kind() {
    let errs = errors(&job(
        "model:\n  layers: [{flatten: {}}, {dense: {in: 784, out: 10}}, {linear: {in: 784, out: 10}}]\n  inputShape: [28, 28]",
    ));
    assert_eq!(paths(&errs), ["spec.model.layers[1]"], "{errs:?}");
    assert_eq!(
        errs[0].reason,
        "unknown layer kind \"dense\"; valid kinds: linear, conv1d, conv2d, batchnorm, \
         layernorm, groupnorm, relu, relu6, leakyRelu, gelu, silu, sigmoid, tanh, softmax, \
         maxpool, avgpool, adaptiveAvgPool, dropout, flatten, embedding, residual, concat, \
         gate, aux, attention, tokens, classToken, positionEmbedding, selectToken"
    );
    // Every kind it names is one a layer may be.
    let kinds = errs[0]
        .reason
        .split("valid kinds: ")
        .nth(1)
        .expect("the list");
    for kind in kinds.split(", ") {
        let body = match kind {
            "linear" => "{in: 784, out: 10}",
            _ => "{}",
        };
        let spec = format!(
            "model:\n  layers: [{{flatten: {{}}}}, {{{kind}: {body}}}]\n  inputShape: [28, 28]"
        );
        if let Err(errs) = check(&job(&spec)) {
            assert!(
                errs.iter()
                    .all(|e| !e.reason.starts_with("unknown layer kind")),
                "{kind}: {errs:?}"
            );
        }
    }
}

#[test]
fn all_problems_are_reported_at_once() {
    let spec = "\
model: {preset: gpt2}
training:
  mode: lora
  lora: {rank: 0}
parallelism: {sequenceParallel: true}
fitPolicy: {safetyMargin: 1.5}
";
    let errs = errors(&job(spec));
    let mut got = paths(&errs);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            "spec.fitPolicy.safetyMargin",
            "spec.parallelism.sequenceParallel",
            "spec.training.lora.rank",
        ],
        "{errs:?}"
    );
}

#[test]
fn a_bad_transformer_reports_every_dimension() {
    // microBatchSize 0 is one error, not also one on fitPolicy.minMicroBatchSize (default 1).
    let spec = "\
model:
  transformer: {layers: 0, hiddenSize: 100, attentionHeads: 3, kvHeads: 2, vocabSize: 0}
training: {microBatchSize: 0}
";
    let errs = errors(&job(spec));
    let mut got = paths(&errs);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            "spec.model.transformer.attentionHeads",
            "spec.model.transformer.kvHeads",
            "spec.model.transformer.layers",
            "spec.model.transformer.vocabSize",
            "spec.training.microBatchSize",
        ],
        "{errs:?}"
    );
}

#[test]
fn wrong_api_version_and_kind_are_both_named() {
    let text = "apiVersion: v1\nkind: Pod\nspec:\n  model: {preset: gpt2}\n";
    let errs = errors(text);
    assert_eq!(paths(&errs), ["apiVersion", "kind"], "{errs:?}");
    assert!(errs[0].reason.contains("vramguard.io/v1alpha1"), "{errs:?}");
    assert!(errs[1].reason.contains("TrainingJob"), "{errs:?}");
}

#[test]
fn missing_envelope_fields_and_unknown_top_level_keys() {
    let errs = errors("spec:\n  model: {preset: gpt2}\nspecs: {}\n");
    assert_eq!(paths(&errs), ["apiVersion", "kind", "specs"], "{errs:?}");
    assert!(errs.iter().all(|e| !e.reason.is_empty()));

    let errs = errors("apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\n");
    assert_eq!(paths(&errs), ["spec"], "{errs:?}");
    assert!(errs[0].reason.contains("missing"), "{errs:?}");
}

#[test]
fn a_document_that_is_not_an_object_is_rejected() {
    for text in ["42", "[1, 2]", "just a string", "null"] {
        let docs = match documents(text) {
            Ok(d) => d,
            Err(ParseError::Empty) if text == "null" => continue,
            Err(e) => panic!("{text}: {e}"),
        };
        for doc in docs {
            match training_job(doc) {
                Err(ParseError::Fields(errs)) => {
                    assert_eq!(paths(&errs), ["."], "{text}: {errs:?}");
                    assert!(errs[0].reason.contains("TrainingJob"), "{errs:?}");
                }
                other => panic!("{text}: expected a field error, got {other:?}"),
            }
        }
    }
}

#[test]
fn bad_metadata_is_named() {
    let text = "apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: [1]\nspec:\n  model: {preset: gpt2}\n";
    let errs = errors(text);
    assert_eq!(paths(&errs), ["metadata.name"], "{errs:?}");
}

#[test]
fn a_duplicate_key_names_the_key_and_line_without_library_advice() {
    let text = "apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nspec:\n  model: {preset: gpt2}\n  model: {preset: gpt2-xl}\n";
    let e = documents(text).expect_err("a duplicate key").to_string();
    assert!(
        e.contains("\"model\" appears twice in one map (line 5"),
        "{e}"
    );
    assert!(!e.contains("Policy"), "{e}");
}

#[test]
fn the_reader_limits_say_which_limit_and_do_not_call_valid_yaml_invalid() {
    let many = "a: 1\n---\n".repeat(1_025);
    let e = documents(&many).expect_err("over the document limit");
    assert!(matches!(e, ParseError::TooLarge(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "too large: vramguard reads at most 1 024 documents per file; split the file"
    );
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let e = documents(&deep)
        .expect_err("over the depth limit")
        .to_string();
    assert!(
        e.starts_with("too large: vramguard reads at most 64 levels of nesting"),
        "{e}"
    );
    assert!(!e.contains("not valid YAML"), "{e}");
}

#[test]
fn documents_splits_and_rejects() {
    let two = format!("{}---\n{}", job(BASE), job("model: {preset: gpt2}"));
    assert_eq!(documents(&two).expect("two documents").len(), 2);
    assert_eq!(documents(""), Err(ParseError::Empty));
    assert_eq!(documents("# only a comment\n"), Err(ParseError::Empty));
    assert!(matches!(
        documents("spec: {model: [unclosed\n"),
        Err(ParseError::Syntax(_))
    ));
    assert!(matches!(
        documents("a: b\n  c: d\n: :\n"),
        Err(ParseError::Syntax(_))
    ));
}

#[test]
fn the_document_name_is_found() {
    let docs = documents(&job(BASE)).expect("valid YAML");
    assert_eq!(parse::document_name(&docs[0]).as_deref(), Some("t"));
}

#[test]
fn defaults_resolve() {
    let job = check(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: qlora, microBatchSize: 4, globalBatchSize: 64}\nparallelism: {gpus: 8, tensorParallel: 2}",
    ))
    .expect("valid");
    assert_eq!(job.quantization, vramguard::api::Quantization::Nf4);
    assert_eq!(job.lora.as_ref().map(|l| l.rank), Some(8));
    assert_eq!(job.data_parallel, 4);
    assert_eq!(job.gradient_accumulation_steps, 4);
    assert_eq!(job.gpus_per_node, 8);
}

/// Odd but well-formed inputs must give errors or a job, never a panic.
#[test]
fn odd_inputs_never_panic() {
    let specs = [
        "model:\n  transformer: {layers: 16777216, hiddenSize: 16777216, attentionHeads: 16777216, kvHeads: 1, headDim: 16777216, intermediateSize: 16777216, vocabSize: 16777216, experts: 65536, expertsPerToken: 65536, maxPositions: 16777216}",
        "model:\n  transformer: {kind: encoder-decoder, layers: 16777216, decoderLayers: 16777216, hiddenSize: 16777216, attentionHeads: 1, vocabSize: 16777216}",
        "model:\n  transformer: {layers: 1, hiddenSize: 1, attentionHeads: 1, vocabSize: 1}",
        "model: {preset: gpt2}\nparallelism: {gpus: 1048576, tensorParallel: 18446744073709551615, pipelineParallel: 18446744073709551615}",
        "model: {preset: gpt2}\ntraining: {microBatchSize: 16777216, globalBatchSize: 18446744073709551615}\nparallelism: {gpus: 1048576}",
        "model: {preset: gpt2}\ntraining: {dataOnGpuBytes: 18446744073709551615}",
        "model: {preset: gpt2}\nparallelism: {gpus: 0, tensorParallel: 0, pipelineParallel: 0, contextParallel: 0, virtualStages: 0}",
        "model: {preset: gpt2}\nparallelism: {gpus: 3, gpusPerNode: 0}",
        "model:\n  custom: {parameters: 1e15, activationBytesPerSample: 1e18}\ntraining: {microBatchSize: 16777216}",
        "model: {preset: gpt2, inputShape: []}",
        "model: {preset: gpt2, head: classification, numLabels: 0}",
    ];
    for spec in specs {
        let text = job(spec);
        if let Ok(job) = check(&text) {
            for gpu in vramguard::estimate::gpus::GPUS {
                // Ok or a TooLarge error: both are answers.
                let _ = vramguard::estimate::estimate(&job, gpu);
            }
        }
    }
}

/// The helper itself must notice a valid spec where an error was expected.
#[test]
#[should_panic(expected = "expected this spec to be rejected")]
fn errors_panics_on_a_valid_spec() {
    errors(&job(BASE));
}

/// A TrainingJob with the preset-hint annotation around `spec`.
fn hinted(hint: &str, spec: &str) -> String {
    job(spec).replacen(
        "  name: t\n",
        &format!("  name: t\n  annotations:\n    vramguard.io/preset-hint: {hint}\n"),
        1,
    )
}

const PHI_DIMS: &str = "\
model:
  transformer: {layers: 24, hiddenSize: 2048, attentionHeads: 32, intermediateSize: 8192, vocabSize: 51200, mlp: standard}
training: {mode: lora, microBatchSize: 1, sequenceLength: 1024}
";

fn arch_of(job: &ValidatedJob) -> vramguard::estimate::arch::Arch {
    match &job.model {
        ResolvedModel::Transformer(a) => *a,
        other => panic!("expected a transformer, got {other:?}"),
    }
}

#[test]
fn a_preset_hint_supplies_what_dims_cannot_say() {
    let plain = check(&job(PHI_DIMS)).expect("valid");
    assert!(!arch_of(&plain).parallel_block);
    let hinted_job = check(&hinted("phi-1.5", PHI_DIMS)).expect("valid");
    assert!(
        arch_of(&hinted_job).parallel_block,
        "phi-1.5 is a parallel block"
    );
    // What the spec spells out wins over the preset.
    let spelled = PHI_DIMS.replace("mlp: standard}", "mlp: standard, parallelBlock: false}");
    let job = check(&hinted("phi-1.5", &spelled)).expect("valid");
    assert!(!arch_of(&job).parallel_block);
    // Gemma 2's soft-capping and post norms come with its name.
    let gemma = "\
model:
  transformer: {layers: 26, hiddenSize: 2304, attentionHeads: 8, kvHeads: 4, headDim: 256, intermediateSize: 9216, vocabSize: 256000, mlp: gated}
training: {mode: lora, microBatchSize: 1, sequenceLength: 512}
";
    let a = arch_of(&check(&hinted("google/gemma-2-2b", gemma)).expect("valid"));
    assert!(a.post_norms && a.attention_softcap && a.final_softcap);
}

#[test]
fn a_preset_hint_that_does_not_match_is_an_error() {
    let errs = errors(&hinted("llama-2-7b", PHI_DIMS));
    assert_eq!(
        paths(&errs),
        ["metadata.annotations[vramguard.io/preset-hint]"]
    );
    assert!(
        errs[0]
            .reason
            .contains("hiddenSize 2048 (the preset: 4096)"),
        "{}",
        errs[0].reason
    );
    let errs = errors(&hinted("phi-9", PHI_DIMS));
    assert!(
        errs[0].reason.contains("unknown preset \"phi-9\""),
        "{}",
        errs[0].reason
    );
    let errs = errors(&hinted("phi-2", "model: {preset: gpt2}"));
    assert!(
        errs[0].reason.contains("only with spec.model.transformer"),
        "{}",
        errs[0].reason
    );
    // The hint naming the preset the spec uses is redundant, not wrong.
    check(&hinted("gpt2", "model: {preset: gpt2}")).expect("valid");
}

/// The module names users copy from a model's own code map to the
/// projections they stand for: GPT-2's fused `c_attn` is q, k and v, its
/// `c_proj` both the attention output and the MLP's second linear; BERT's
/// `dense` is three linears; and the estimate counts what they map to.
#[test]
fn a_models_own_lora_target_names_map_to_its_projections() {
    let targets = |model: &str, names: &str| {
        check(&job(&format!(
            "model: {{preset: {model}}}\ntraining: {{mode: lora, lora: {{targetModules: [{names}]}}}}"
        )))
        .expect("valid")
        .lora
        .expect("lora")
        .target_modules
    };
    assert_eq!(
        targets("gpt2", "c_attn, c_proj, c_fc"),
        [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "down_proj",
            "up_proj"
        ]
    );
    assert_eq!(
        targets("falcon-7b", "query_key_value, dense"),
        ["q_proj", "k_proj", "v_proj", "o_proj"]
    );
    assert_eq!(
        targets("bert-base", "dense"),
        ["o_proj", "up_proj", "down_proj"]
    );
    // Naming a projection twice, once by each name, counts it once.
    assert_eq!(
        targets("llama-3.1-8b", "q_proj, qkv_proj"),
        ["q_proj", "k_proj", "v_proj"]
    );
    // The fused name and the three names give the same trainable count.
    let trainable = |names: &str| {
        let j = check(&job(&format!(
            "model: {{preset: gpt2}}\ntraining: {{mode: lora, lora: {{targetModules: [{names}]}}}}"
        )))
        .expect("valid");
        let l = j.lora.as_ref().expect("lora");
        vramguard::estimate::params::lora(&arch_of(&j), l.rank, &l.target_modules)
            .expect("fits u64")
    };
    assert_eq!(trainable("c_attn"), trainable("q_proj, k_proj, v_proj"));
    assert!(trainable("c_attn") > trainable("q_proj"));
    // An unknown name says which names are known, the models' own included.
    let errs = errors(&job(
        "model: {preset: gpt2}\ntraining: {mode: lora, lora: {targetModules: [attn]}}",
    ));
    assert_eq!(paths(&errs), ["spec.training.lora.targetModules[0]"]);
    assert!(errs[0].reason.contains("c_attn") && errs[0].reason.contains("q_proj"));
}

#[test]
fn modules_to_save_takes_the_embedding_and_head_by_either_name() {
    let j = check(&job(
        "model: {preset: gpt2}\ntraining: {mode: lora, lora: {modulesToSave: [wte, lm_head, embed_tokens]}}",
    ))
    .expect("valid");
    assert_eq!(
        j.lora.expect("lora").modules_to_save,
        ["embed_tokens", "lm_head"]
    );
    let errs = errors(&job(
        "model: {preset: gpt2}\ntraining: {mode: lora, lora: {modulesToSave: [score]}}",
    ));
    assert_eq!(paths(&errs), ["spec.training.lora.modulesToSave[0]"]);
    assert!(errs[0].reason.contains("embed_tokens") && errs[0].reason.contains("wte"));
}

#[test]
fn generation_is_for_inference_and_its_cache_must_hold_the_tokens() {
    let errs = errors(&job(
        "model: {preset: gpt2}\ntraining: {mode: full, generation: {newTokens: 10}}",
    ));
    assert_eq!(paths(&errs), ["spec.training.generation"]);
    let errs = errors(&job(
        "model: {preset: llama-3.2-1b}\ntraining: {mode: inference, sequenceLength: 1000, generation: {newTokens: 100, cacheLength: 1024}}",
    ));
    assert_eq!(paths(&errs), ["spec.training.generation.cacheLength"]);
    assert!(errs[0].reason.contains("1100"), "{}", errs[0].reason);
    assert!(
        check(&job(
            "model: {preset: llama-3.2-1b}\ntraining: {mode: inference, sequenceLength: 1000, generation: {newTokens: 100}}",
        ))
        .is_ok()
    );
    // GPT-2 embeds 1 024 positions: a prompt and its new tokens must fit them.
    let errs = errors(&job(
        "model: {preset: gpt2}\ntraining: {mode: inference, sequenceLength: 1000, generation: {newTokens: 100}}",
    ));
    assert_eq!(paths(&errs), ["spec.training.generation.newTokens"]);
    assert!(
        errs[0].reason.contains("at most 24 new tokens"),
        "{}",
        errs[0].reason
    );
}

#[test]
fn an_fp32_cast_is_declared_only_with_16_bit_weights() {
    for precision in ["bf16", "fp16"] {
        for load in ["fp32-cast", "dtype"] {
            let spec = format!(
                "model: {{preset: llama-3.1-8b}}\ntraining: {{mode: lora, precision: {precision}, weightsLoad: {load}}}"
            );
            assert!(check(&job(&spec)).is_ok(), "{spec}");
        }
    }
    for precision in ["bf16-mixed", "fp16-mixed", "fp32", "tf32"] {
        let spec = format!(
            "model: {{preset: llama-3.1-8b}}\ntraining: {{mode: lora, precision: {precision}, weightsLoad: fp32-cast}}"
        );
        let errs = errors(&job(&spec));
        assert_eq!(paths(&errs), ["spec.training.weightsLoad"], "{spec}");
        let reason = &errs[0].reason;
        for words in [
            "only used with precision bf16 or fp16",
            &format!("precision {precision} trains fp32 weights"),
            "set weightsLoad dtype or leave it out",
        ] {
            assert!(reason.contains(words), "{spec}: {reason}");
        }
        // `dtype` is what every job does unless it says otherwise.
        let spec = spec.replace("fp32-cast", "dtype");
        assert!(check(&job(&spec)).is_ok(), "{spec}");
    }
    // The default precision is bf16-mixed.
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, weightsLoad: fp32-cast}",
    ));
    assert_eq!(paths(&errs), ["spec.training.weightsLoad"]);
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, precision: bf16, weightsLoad: fp32}",
    ));
    assert_eq!(paths(&errs), ["spec.training.weightsLoad"]);
    assert!(errs[0].reason.contains("fp32-cast"), "{}", errs[0].reason);
}

#[test]
fn float8_is_taken_with_a_16_bit_recipe_on_unquantized_weights() {
    let spec =
        |training: &str| format!("model: {{preset: llama-3.1-8b}}\ntraining: {{{training}}}");
    for precision in ["bf16-mixed", "fp16-mixed", "bf16"] {
        for recipe in ["tensorwise", "rowwise", "rowwise-with-gw-hp"] {
            let s = spec(&format!("precision: {precision}, float8: {recipe}"));
            assert!(check(&job(&s)).is_ok(), "{s}");
        }
    }
    // The default precision is bf16-mixed.
    assert!(check(&job(&spec("float8: tensorwise"))).is_ok());
    for precision in ["fp32", "tf32", "fp16"] {
        let s = spec(&format!("precision: {precision}, float8: rowwise"));
        let errs = errors(&job(&s));
        assert_eq!(paths(&errs), ["spec.training.float8"], "{s}");
        let reason = &errs[0].reason;
        for words in [
            "only used with precision bf16-mixed, fp16-mixed or bf16",
            &format!("precision {precision} is not one"),
            "leave float8 out",
        ] {
            assert!(reason.contains(words), "{s}: {reason}");
        }
    }
    let s = spec("mode: qlora, quantization: nf4, lora: {rank: 8}, float8: tensorwise");
    let errs = errors(&job(&s));
    assert_eq!(paths(&errs), ["spec.training.float8"], "{s}");
    assert!(
        errs[0]
            .reason
            .contains("quantized base weights (quantization nf4)"),
        "{}",
        errs[0].reason
    );
    let errs = errors(&job(&spec("mode: inference, float8: tensorwise")));
    assert_eq!(paths(&errs), ["spec.training.float8"]);
    assert!(
        errs[0].reason.contains("training recipe"),
        "{}",
        errs[0].reason
    );
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {float8: tensorwise}\nparallelism: {gpus: 8, strategy: megatron, tensorParallel: 8}",
    ));
    assert_eq!(paths(&errs), ["spec.training.float8"]);
    assert!(
        errs[0].reason.contains("strategy megatron"),
        "{}",
        errs[0].reason
    );
    let errs = errors(&job(&spec("float8: columnwise")));
    assert_eq!(paths(&errs), ["spec.training.float8"]);
    assert!(
        errs[0]
            .reason
            .contains("tensorwise | rowwise | rowwise-with-gw-hp"),
        "{}",
        errs[0].reason
    );
}

#[test]
fn float8_all_gather_needs_tensorwise_under_fsdp2_full_sharding() {
    let spec = |training: &str, parallelism: &str| {
        format!(
            "model: {{preset: llama-3.1-8b}}\ntraining: {{{training}}}\nparallelism: {{gpus: 8, {parallelism}}}"
        )
    };
    let fsdp2 = "strategy: fsdp, fsdpVersion: \"2\"";
    let ok = spec("float8: tensorwise, float8AllGather: true", fsdp2);
    assert!(check(&job(&ok)).is_ok(), "{ok}");
    // FSDP's default sharding is full; a stack's FSDP version is not refused.
    let ok = spec(
        "float8: tensorwise, float8AllGather: true",
        "strategy: fsdp",
    );
    assert!(check(&job(&ok)).is_ok(), "{ok}");
    let gather = "spec.training.float8AllGather";
    for (training, parallelism, words) in [
        (
            "float8: rowwise, float8AllGather: true",
            fsdp2,
            "float8 is rowwise",
        ),
        (
            "float8: rowwise-with-gw-hp, float8AllGather: true",
            fsdp2,
            "float8 is rowwise-with-gw-hp",
        ),
        ("float8AllGather: true", fsdp2, "float8 is not set"),
        (
            "float8: tensorwise, float8AllGather: true",
            "strategy: ddp",
            "strategy ddp at zeroStage 0",
        ),
        (
            "float8: tensorwise, float8AllGather: true",
            "strategy: fsdp, sharding: shard-grad-op",
            "strategy fsdp at zeroStage 2",
        ),
        (
            "float8: tensorwise, float8AllGather: true",
            "strategy: fsdp, fsdpVersion: \"1\"",
            "fsdpVersion is 1",
        ),
    ] {
        let s = spec(training, parallelism);
        let errs = errors(&job(&s));
        assert_eq!(paths(&errs), [gather], "{s}");
        assert!(errs[0].reason.contains(words), "{s}: {}", errs[0].reason);
    }
    // Off, it asks nothing.
    let off = spec("float8AllGather: false", "strategy: ddp");
    assert!(check(&job(&off)).is_ok(), "{off}");
}

#[test]
fn gptq_and_awq_formats_are_checked_and_read_from_the_config() {
    // AWQ has one 4-bit format; GPTQ 2, 3, 4 and 8.
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, quantization: awq, quantizationBits: 3}",
    ));
    assert_eq!(paths(&errs), ["spec.training.quantizationBits"]);
    assert!(errs[0].reason.contains("use 4"), "{}", errs[0].reason);
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, quantization: gptq, quantizationGroupSize: 0}",
    ));
    assert_eq!(paths(&errs), ["spec.training.quantizationGroupSize"]);
    // The format fields describe a pre-quantized checkpoint only.
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: qlora, quantizationBits: 4}",
    ));
    assert_eq!(paths(&errs), ["spec.training.quantizationBits"]);
    assert!(errs[0].reason.contains("nf4"), "{}", errs[0].reason);
    // qlora on a GPTQ checkpoint; -1 groups whole rows.
    let j = check(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {mode: qlora, quantization: gptq, quantizationBits: 8, quantizationGroupSize: -1}",
    ))
    .expect("valid");
    assert_eq!(
        (j.quantization, j.quantization_bits, j.quantization_group),
        (vramguard::api::Quantization::Gptq, 8, None)
    );
    // A config's quantization_config sets all three; a bad one names its field.
    let config = "model: {hfConfig: {model_type: llama, hidden_size: 2048, intermediate_size: 8192, num_hidden_layers: 16, num_attention_heads: 32, num_key_value_heads: 8, vocab_size: 128256, max_position_embeddings: 8192, quantization_config: QC}}\ntraining: {mode: lora}";
    let j = check(&job(
        &config.replace("QC", "{quant_method: awq, bits: 4, group_size: 64}")
    ))
    .expect("valid");
    assert_eq!(
        (j.quantization, j.quantization_bits, j.quantization_group),
        (vramguard::api::Quantization::Awq, 4, Some(64))
    );
    // A quantized checkpoint cannot be fully fine-tuned.
    let errs = errors(&job(&config
        .replace("QC", "{quant_method: gptq}")
        .replace("mode: lora", "mode: full")));
    assert_eq!(paths(&errs), ["spec.training.mode"]);
    assert!(errs[0].reason.contains("gptq"), "{}", errs[0].reason);
    let errs = errors(&job(
        &config.replace("QC", "{quant_method: gptq, bits: four}")
    ));
    assert_eq!(
        paths(&errs),
        ["spec.model.hfConfig.quantization_config.bits"]
    );
}

#[test]
fn target_length_is_for_encoder_decoder_models() {
    let errs = errors(&job(
        "model: {preset: llama-3.1-8b}\ntraining: {targetLength: 128}",
    ));
    assert_eq!(paths(&errs), ["spec.training.targetLength"]);
    assert!(errs[0].reason.contains("encoder-decoder"));
    assert!(
        check(&job(
            "model: {preset: t5-base}\ntraining: {targetLength: 128}"
        ))
        .is_ok()
    );
}

#[test]
fn offloaded_gradients_need_torchaos_offload_and_no_accumulation() {
    // torchao's CPUOffloadOptimizer needs no ZeRO.
    assert!(
        check(&job(
            "model: {preset: gpt2}\nparallelism: {offload: optimizer}"
        ))
        .is_ok()
    );
    let errs = errors(&job(
        "model: {preset: gpt2}\nparallelism: {offloadGradients: true}",
    ));
    assert_eq!(paths(&errs), ["spec.parallelism.offloadGradients"]);
    let errs = errors(&job(
        "model: {preset: gpt2}\ntraining: {microBatchSize: 2, globalBatchSize: 8}\nparallelism: {offload: optimizer, offloadGradients: true}",
    ));
    assert_eq!(paths(&errs), ["spec.parallelism.offloadGradients"]);
    assert!(errs[0].reason.contains("4 steps"), "{}", errs[0].reason);
    // DeepSpeed still offloads only under ZeRO.
    let errs = errors(&job(
        "model: {preset: gpt2}\nparallelism: {strategy: deepspeed, offload: optimizer}",
    ));
    assert_eq!(paths(&errs), ["spec.parallelism.offload"]);
}
