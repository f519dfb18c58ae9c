//! Hostile documents through the whole path a TrainingJob takes (parse →
//! validate → estimate → plan, as `vramguard estimate` and the webhook run
//! it): alias bombs, deep nesting, huge strings and lists, huge layer counts
//! and dimensions, numbers at the edges of u64 and f64. Each gets an answer
//! (an error naming the field, or an estimate) and never a panic; the YAML
//! reader's budgets and the validator's limits keep time and memory per
//! document bounded.

use vramguard::cli::estimate::reports_from_text;
use vramguard::estimate::gpus;

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

/// The error `text` gets, whether the file or its one document is refused.
fn error_of(text: &str) -> String {
    let h100 = gpus::find("h100-80gb").expect("in the catalog");
    match reports_from_text(text, &[h100]) {
        Err(file) => file,
        Ok(docs) => match docs.into_iter().next() {
            Some(Err(doc)) => doc.message,
            Some(Ok(report)) => panic!(
                "accepted, {} bytes per GPU:\n{}",
                report.estimate.per_gpu_bytes,
                &text[..text.len().min(600)]
            ),
            None => panic!("no document"),
        },
    }
}

/// `text` is refused with an error holding every one of `needles`, and the
/// error stays short enough to read whatever the input's size.
fn refused(text: &str, needles: &[&str]) {
    let e = error_of(text);
    for n in needles {
        assert!(e.contains(n), "{n:?} not in the error:\n{e}");
    }
    assert!(e.len() <= 4096, "an error of {} bytes", e.len());
}

/// `n` levels of aliases, each a list of ten of the one below: 10^n leaves.
fn alias_bomb(levels: usize) -> String {
    let mut text = String::from(
        "apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: t\n  annotations:\n",
    );
    text.push_str("    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..levels {
        let below = format!("*l{}", i - 1);
        text.push_str(&format!(
            "    l{i}: &l{i} [{}]\n",
            [below.as_str(); 10].join(", ")
        ));
    }
    text.push_str("spec:\n  model: {preset: gpt2}\n");
    text
}

#[test]
fn an_alias_bomb_is_refused_by_the_yaml_budget() {
    // 10^9 leaves if expanded: the reader stops long before.
    let text = alias_bomb(9);
    let e = error_of(&text);
    assert!(e.contains("too large: vramguard reads at most"), "{e}");
}

#[test]
fn deep_nesting_is_refused_by_the_yaml_budget() {
    for depth in [1_000, 100_000] {
        let flow = format!(
            "model:\n  hfConfig: {}{}",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let e = error_of(&job(&flow));
        assert!(e.contains("at most 64 levels of nesting"), "{e}");
        let mut block = job("model:\n  hfConfig:");
        for level in 0..depth.min(5_000) {
            block.push_str(&format!("\n{}k:", " ".repeat(4 + 2 * level)));
        }
        block.push_str(" 1\n");
        let e = error_of(&block);
        assert!(e.contains("at most 64 levels of nesting"), "{e}");
    }
}

#[test]
fn huge_strings_are_named_and_not_echoed_whole() {
    let long = "x".repeat(4 << 20);
    refused(
        &job(&format!(
            "model: {{preset: gpt2}}\ntraining: {{precision: {long}}}"
        )),
        &["spec.training.precision"],
    );
    refused(
        &job(&format!("model: {{preset: {long}}}")),
        &["spec.model.preset"],
    );
    refused(
        &job(&format!(
            "model: {{preset: gpt2}}\ntraining: {{mode: lora, lora: {{targetModules: [{long}]}}}}"
        )),
        &["spec.training.lora.targetModules"],
    );
}

#[test]
fn huge_lists_are_refused_naming_the_field() {
    let many = |item: &str, n: usize| vec![item; n].join(", ");
    refused(
        &job(&format!(
            "model:\n  layers: [{}]\n  inputShape: [16]",
            many("{relu: {}}", 70_000)
        )),
        &["spec.model.layers"],
    );
    refused(
        &job(&format!(
            "model:\n  layers: [{{linear: {{in: 4, out: 4}}}}]\n  inputShape: [{}]",
            many("4", 100_000)
        )),
        &["spec.model.inputShape"],
    );
    refused(
        &job(&format!(
            "model: {{preset: gpt2}}\ntraining: {{mode: lora, lora: {{targetModules: [{}]}}}}",
            many("bogus_proj", 100_000)
        )),
        &["spec.training.lora.targetModules"],
    );
}

#[test]
fn huge_layer_counts_and_dimensions_are_named() {
    let cases: &[(&str, &str)] = &[
        (
            "model:\n  transformer: {layers: 1000000000000, hiddenSize: 4096, attentionHeads: 32, vocabSize: 32000}",
            "spec.model.transformer.layers",
        ),
        (
            "model:\n  transformer: {layers: 32, hiddenSize: 18446744073709551615, attentionHeads: 32, vocabSize: 32000}",
            "spec.model.transformer.hiddenSize",
        ),
        (
            "model:\n  hfConfig: {model_type: llama, num_hidden_layers: 1000000000000, hidden_size: 4096, num_attention_heads: 32, intermediate_size: 11008, vocab_size: 32000}",
            "num_hidden_layers",
        ),
        (
            "model:\n  hfConfig: {model_type: llama, num_hidden_layers: 32, hidden_size: 1.0e308, num_attention_heads: 32, intermediate_size: 11008, vocab_size: 32000}",
            "hidden_size",
        ),
        (
            "model:\n  hfConfig: {model_type: llama, num_hidden_layers: -1, hidden_size: 4096, num_attention_heads: 32, intermediate_size: 11008, vocab_size: 32000}",
            "num_hidden_layers",
        ),
        (
            "model:\n  hfConfig: {model_type: llama, num_hidden_layers: .nan, hidden_size: 4096, num_attention_heads: 32, intermediate_size: 11008, vocab_size: 32000}",
            "num_hidden_layers",
        ),
        (
            "model:\n  layers: [{linear: {in: 16, out: 18446744073709551615}}]\n  inputShape: [16]",
            "spec.model.layers[0].linear.out",
        ),
        (
            "model:\n  layers: [{linear: {in: 16, out: 1.0e308}}]\n  inputShape: [16]",
            "spec.model.layers[0].linear.out",
        ),
    ];
    for (spec, field) in cases {
        refused(&job(spec), &[field]);
    }
}

#[test]
fn numbers_at_the_edges_are_named() {
    let cases: &[(&str, &str)] = &[
        (
            "training: {microBatchSize: 18446744073709551616}",
            "spec.training.microBatchSize",
        ),
        (
            "training: {microBatchSize: 18446744073709551615}",
            "spec.training.microBatchSize",
        ),
        (
            "training: {microBatchSize: -1}",
            "spec.training.microBatchSize",
        ),
        (
            "training: {microBatchSize: 1.5}",
            "spec.training.microBatchSize",
        ),
        (
            "training: {sequenceLength: .inf}",
            "spec.training.sequenceLength",
        ),
        (
            "training: {dataOnGpuBytes: 18446744073709551615}",
            "spec.training.dataOnGpuBytes",
        ),
        (
            "fitPolicy: {safetyMargin: 1.0e308}",
            "spec.fitPolicy.safetyMargin",
        ),
        (
            "fitPolicy: {safetyMargin: -.inf}",
            "spec.fitPolicy.safetyMargin",
        ),
        (
            "fitPolicy: {safetyMargin: .nan}",
            "spec.fitPolicy.safetyMargin",
        ),
        (
            "fitPolicy: {safetyMargin: -0.0000001}",
            "spec.fitPolicy.safetyMargin",
        ),
        (
            "fitPolicy: {maxOomRetries: 4294967296}",
            "spec.fitPolicy.maxOomRetries",
        ),
        (
            "parallelism: {gpus: 18446744073709551615}",
            "spec.parallelism.gpus",
        ),
        (
            "parallelism: {zeroStage: 256}",
            "spec.parallelism.zeroStage",
        ),
    ];
    for (extra, field) in cases {
        refused(&job(&format!("model: {{preset: gpt2}}\n{extra}")), &[field]);
    }
    let custom: &[(&str, &str)] = &[
        (
            "parameters: 1.0e308, activationBytesPerSample: 0",
            "parameters",
        ),
        (
            "parameters: .inf, activationBytesPerSample: 0",
            "parameters",
        ),
        (
            "parameters: -.inf, activationBytesPerSample: 0",
            "parameters",
        ),
        ("parameters: -1, activationBytesPerSample: 0", "parameters"),
        (
            "parameters: 1.0e9, activationBytesPerSample: 1.0e308",
            "activationBytesPerSample",
        ),
        (
            "parameters: 1.0e9, activationBytesPerSample: .nan",
            "activationBytesPerSample",
        ),
    ];
    for (fields, field) in custom {
        refused(
            &job(&format!("model:\n  custom: {{{fields}}}")),
            &[&format!("spec.model.custom.{field}")],
        );
    }
}

/// The largest values the validator lets through still get an answer (an
/// estimate or a "too large" error naming the job), never an overflow.
#[test]
fn the_largest_accepted_values_get_an_answer() {
    let h100 = gpus::find("h100-80gb").expect("in the catalog");
    let specs = [
        "model:\n  layers: [{linear: {in: 16777216, out: 16777216}}, {linear: {in: 16777216, out: 16777216}}]\n  inputShape: [16777216]",
        "model: {preset: gpt2}\ntraining: {globalBatchSize: 18446744073709551615}",
        "model:\n  transformer: {layers: 16777216, hiddenSize: 16777216, attentionHeads: 16777216, vocabSize: 16777216}\ntraining: {microBatchSize: 16777216, sequenceLength: 67108864}",
        "model:\n  custom: {parameters: 1.0e15, activationBytesPerSample: 1.0e18}\ntraining: {microBatchSize: 16777216}\nfitPolicy: {mode: Adjust, allow: [microBatchSize, precision, gradientCheckpointing, optimizer, zeroStage, loss]}",
        "model: {preset: llama-3.1-405b}\ntraining: {microBatchSize: 16777216, sequenceLength: 67108864, globalBatchSize: 16777216}\nparallelism: {gpus: 1048576, gpusPerNode: 8}\nfitPolicy: {mode: Adjust, allow: [microBatchSize, precision, gradientCheckpointing, optimizer, zeroStage, loss]}",
    ];
    for spec in specs {
        let text = job(spec);
        let docs = reports_from_text(&text, &[h100]).expect("one document");
        for d in docs {
            if let Err(e) = d {
                assert!(!e.message.is_empty());
            }
        }
    }
}

/// A simulated node file is the agent's own configuration, yet a typo in
/// `count` must not take the agent's memory with it.
#[test]
fn a_simulated_node_holds_a_bounded_number_of_gpus() {
    use vramguard::agent::simulated::{MAX_GPUS, Simulated};
    let e = Simulated::from_yaml("gpus:\n  - product: h100-80gb\n    count: 4294967295\n")
        .expect_err("four billion GPUs");
    assert!(e.to_string().starts_with("gpus[0].count:"), "{e}");
    let text = format!(
        "gpus:\n  - product: h100-80gb\n    count: {}\n  - product: a100-80gb\n    count: 2\n",
        MAX_GPUS - 1
    );
    let e = Simulated::from_yaml(&text).expect_err("one GPU too many");
    assert!(e.to_string().starts_with("gpus[1].count:"), "{e}");
}
