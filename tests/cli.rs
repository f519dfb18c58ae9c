//! The real `vramguard` binary on temporary files: exit codes (0 fits, 1 does
//! not fit, 2 bad input), output formats, and no panic whatever the input.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_vramguard");

/// A file under the system temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &[u8]) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "vramguard-cli-test-{}-{n}.yaml",
            std::process::id()
        ));
        std::fs::write(&path, contents).expect("the temp dir is writable");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Exit code, stdout and stderr of one run.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn finish(out: Output, args: &[&str]) -> Run {
    let run = Run {
        code: out.status.code().expect("the binary exits, not killed"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "vramguard {args:?} panicked:\n{}",
        run.stderr
    );
    run
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    // The flags' env fallbacks must not leak in from the test environment.
    for var in [
        "VRAMGUARD_FILE",
        "VRAMGUARD_GPU",
        "VRAMGUARD_GPUS",
        "VRAMGUARD_OUTPUT",
        "VRAMGUARD_COLOR",
        "VRAMGUARD_ERROR_FORMAT",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// `vramguard estimate -f <file with contents> <extra...>`.
fn estimate(contents: &[u8], extra: &[&str]) -> Run {
    let file = TempFile::new(contents);
    let path = file.0.to_str().expect("temp paths are UTF-8").to_string();
    let mut args = vec!["estimate", "-f", path.as_str()];
    args.extend_from_slice(extra);
    let out = command(&args).output().expect("the binary runs");
    finish(out, &args)
}

fn job(name: &str, spec: &str) -> String {
    let mut text = format!(
        "apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: {name}\nspec:\n"
    );
    for line in spec.lines() {
        text.push_str("  ");
        text.push_str(line);
        text.push('\n');
    }
    text
}

fn small() -> String {
    job(
        "small",
        "model: {preset: gpt2}\ntraining: {mode: full, microBatchSize: 4, sequenceLength: 1024}",
    )
}

fn huge() -> String {
    job(
        "huge",
        "model: {preset: llama-3.1-70b}\ntraining: {mode: full, microBatchSize: 1, sequenceLength: 4096}",
    )
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout))
}

fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .unwrap_or_else(|| panic!("{pointer} missing in {v}"))
        .as_u64()
        .unwrap_or_else(|| panic!("{pointer} is not an unsigned integer in {v}"))
}

#[test]
fn a_small_job_that_fits_exits_0() {
    let run = estimate(small().as_bytes(), &["--gpu", "h100"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("small: gpt2"), "{}", run.stdout);
    assert!(run.stdout.contains("fits with"), "{}", run.stdout);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
}

#[test]
fn a_job_that_does_not_fit_exits_1() {
    let run = estimate(huge().as_bytes(), &["--gpu", "t4"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("short by"), "{}", run.stdout);
}

#[test]
fn one_misfit_among_several_jobs_exits_1() {
    let text = format!("{}---\n{}", small(), huge());
    let run = estimate(text.as_bytes(), &["--gpu", "t4"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
}

#[test]
fn bad_input_exits_2() {
    let garbage: Vec<u8> = {
        // Deterministic pseudo-random bytes, with bytes that are never UTF-8.
        let mut x: u32 = 0x9e37_79b9;
        let mut v: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect();
        v.extend_from_slice(&[0xff, 0xfe, 0xc0, 0x80, 0x00]);
        v
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty file", Vec::new(), "no document"),
        ("only a comment", b"# nothing here\n".to_vec(), "no document"),
        ("binary garbage", garbage, "not UTF-8"),
        (
            "YAML syntax error",
            b"apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\nspec: {model: [unclosed\n"
                .to_vec(),
            "not valid YAML",
        ),
        (
            "not a TrainingJob",
            b"apiVersion: v1\nkind: Pod\n".to_vec(),
            "apiVersion",
        ),
        (
            "invalid spec",
            job("bad", "model: {preset: gpt2}\ntraining: {microBatchSize: 0}").into_bytes(),
            "spec.training.microBatchSize: 0 is out of range; use a value 1 or more",
        ),
        (
            "parameter count overflow",
            job(
                "overflow",
                "model:\n  transformer: {layers: 16777216, hiddenSize: 16777216, attentionHeads: 128, intermediateSize: 16777216, vocabSize: 16777216}",
            )
            .into_bytes(),
            "overflows",
        ),
    ];
    for (case, contents, needle) in cases {
        let run = estimate(&contents, &[]);
        assert_eq!(run.code, 2, "{case}: {}\n{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains(needle),
            "{case}: stderr lacks {needle:?}:\n{}",
            run.stderr
        );
    }
}

#[test]
fn a_bad_second_document_is_named() {
    let bad = job(
        "second",
        "model: {preset: gpt2}\ntraining: {precision: fp8}",
    );
    let text = format!("{}---\n{bad}", small());
    let run = estimate(text.as_bytes(), &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("document 2 (second)"),
        "stderr does not name document 2:\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("spec.training.precision"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("document 1"),
        "the good document is blamed:\n{}",
        run.stderr
    );
    // The good document is still reported.
    assert!(run.stdout.contains("small: gpt2"), "{}", run.stdout);
}

#[test]
fn an_unknown_gpu_exits_2() {
    for flag in ["--gpu", "--gpus"] {
        let run = estimate(small().as_bytes(), &[flag, "h900"]);
        assert_eq!(run.code, 2, "{flag}: {}", run.stderr);
        assert!(
            run.stderr.contains("unknown GPU \"h900\""),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains("h100-80gb"), "{}", run.stderr);
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
}

#[test]
fn an_ambiguous_gpu_lists_what_it_could_mean() {
    let run = estimate(small().as_bytes(), &["--gpu", "a100"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("\"a100\" names more than one GPU, with different memory: a100-80gb, a100-40gb; say which"),
        "{}",
        run.stderr
    );
}

/// A newcomer's spec with three mistakes, one of them a type error: all three are
/// reported, each with its path and what would be valid.
#[test]
fn every_problem_is_reported_at_once_type_errors_included() {
    let text = job(
        "bad",
        "model: {preset: gpt2}\ntraining: {microBatchSize: -2, sequenceLength: lots, gradientCheckpointing: true}\nparallelism: {gpus: 0}",
    );
    let run = estimate(text.as_bytes(), &[]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    for needle in [
        "spec.training.microBatchSize: -2 is out of range; use a value 1 or more",
        "spec.training.sequenceLength: \"lots\" is not a whole number",
        "spec.training.gradientCheckpointing: true is not one of the allowed values; use one of none | selective | op-selective | full (true is written full)",
        "spec.parallelism.gpus: 0 is out of range; use a value 1 or more",
    ] {
        assert!(
            run.stderr.contains(needle),
            "lacks {needle:?}:\n{}",
            run.stderr
        );
    }
}

/// `strategy: fsdp` without a stage is FSDP's default, full sharding: 8 GPUs share
/// the model's states instead of each holding them all.
#[test]
fn fsdp_without_a_stage_is_estimated_fully_sharded() {
    let spec = |extra: &str| {
        job(
            "fsdp",
            &format!(
                "model: {{preset: llama-3.1-8b}}\ntraining: {{mode: full, microBatchSize: 1, sequenceLength: 4096, gradientCheckpointing: full}}\nparallelism: {{gpus: 8, strategy: fsdp{extra}}}"
            ),
        )
    };
    let per_gpu = |text: String| {
        let run = estimate(text.as_bytes(), &["--gpu", "h100", "-o", "json"]);
        assert!(run.code <= 1, "{}", run.stderr);
        u64_at(&json(&run), "/estimate/perGpuBytes")
    };
    let default = per_gpu(spec(""));
    assert_eq!(default, per_gpu(spec(", zeroStage: 3")));
    assert_eq!(default, per_gpu(spec(", sharding: full-shard")));
    assert!(default < per_gpu(spec(", sharding: shard-grad-op")));
    assert!(per_gpu(spec(", sharding: shard-grad-op")) < per_gpu(spec(", sharding: no-shard")));
    assert_eq!(
        per_gpu(spec(", sharding: no-shard")),
        per_gpu(spec(", zeroStage: 0"))
    );
    let run = estimate(spec(", zeroStage: 1, sharding: full-shard").as_bytes(), &[]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr
            .contains("spec.parallelism.zeroStage: 1 contradicts sharding, which means ZeRO 3"),
        "{}",
        run.stderr
    );
}

#[test]
fn bf16_on_a_gpu_without_bf16_is_a_verdict_that_names_fp16() {
    let text = job(
        "bf16",
        "model: {preset: gpt2}\ntraining: {mode: full, microBatchSize: 1, sequenceLength: 512, precision: bf16-mixed}",
    );
    for gpu in ["t4", "v100-32gb"] {
        let run = estimate(text.as_bytes(), &["--gpu", gpu]);
        assert_eq!(run.code, 1, "{gpu}: {}\n{}", run.stdout, run.stderr);
        assert!(
            run.stdout.contains("has no bf16") && run.stdout.contains("precision: fp16-mixed"),
            "{gpu}: {}",
            run.stdout
        );
    }
    let run = estimate(text.as_bytes(), &["--gpu", "a10g"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
}

#[test]
fn a_missing_file_exits_2() {
    let args = ["estimate", "-f", "/nonexistent/vramguard/job.yaml"];
    let run = finish(command(&args).output().expect("runs"), &args);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("/nonexistent/vramguard/job.yaml"));
}

#[test]
fn stdin_is_read_with_dash() {
    let args = ["estimate", "-f", "-", "-o", "json"];
    let mut child = command(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(small().as_bytes())
        .expect("the child reads stdin");
    let run = finish(child.wait_with_output().expect("the child exits"), &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(json(&run)["name"], "small");
}

#[test]
fn json_output_has_integer_byte_counts() {
    let run = estimate(small().as_bytes(), &["-o", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v = json(&run);
    assert!(v.is_object(), "one job gives one object: {v}");
    let allocated = u64_at(&v, "/estimate/peakAllocatedBytes");
    let reserved = u64_at(&v, "/estimate/peakReservedBytes");
    let per_gpu = u64_at(&v, "/estimate/perGpuBytes");
    let largest = u64_at(&v, "/estimate/largestTensorBytes");
    assert!(allocated > 0, "{v}");
    assert!(allocated <= reserved, "{allocated} > {reserved}");
    assert!(reserved <= per_gpu, "{reserved} > {per_gpu}");
    assert!(
        largest > 0 && largest <= allocated,
        "{largest} vs {allocated}"
    );
    let breakdown = v["estimate"]["breakdown"]
        .as_object()
        .expect("breakdown is an object");
    for key in [
        "weights",
        "gradients",
        "optimizerStates",
        "activations",
        "logits",
        "inputs",
        "temporaries",
        "allocatorOverhead",
        "cudaContext",
        "workspaces",
        "communication",
    ] {
        u64_at(&v, &format!("/estimate/breakdown/{key}"));
        assert!(breakdown.contains_key(key), "{key}");
    }
    assert_eq!(
        breakdown.len(),
        11,
        "unexpected breakdown keys: {breakdown:?}"
    );
    // gpt2 full fine-tuning with AdamW: weights, gradients and states are all there.
    assert!(u64_at(&v, "/estimate/breakdown/weights") > 0);
    assert!(u64_at(&v, "/estimate/breakdown/optimizerStates") > 0);
    assert_eq!(v["fits"], true);
    assert_eq!(v["model"], "gpt2");
}

#[test]
fn json_output_of_two_documents_is_an_array_of_two() {
    let text = format!("{}---\n{}", small(), huge());
    let run = estimate(text.as_bytes(), &["-o", "json", "--gpu", "h100-80gb"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let v = json(&run);
    let items = v.as_array().expect("two jobs give an array");
    assert_eq!(items.len(), 2, "{v}");
    assert_eq!(items[0]["name"], "small");
    assert_eq!(items[1]["name"], "huge");
    assert_eq!(items[0]["fits"], true);
    assert_eq!(items[1]["fits"], false);
    for item in items {
        let allocated = u64_at(item, "/estimate/peakAllocatedBytes");
        let reserved = u64_at(item, "/estimate/peakReservedBytes");
        let per_gpu = u64_at(item, "/estimate/perGpuBytes");
        assert!(allocated <= reserved && reserved <= per_gpu, "{item}");
    }
    // The bigger model needs more.
    assert!(
        u64_at(&items[1], "/estimate/perGpuBytes") > u64_at(&items[0], "/estimate/perGpuBytes")
    );
}

#[test]
fn yaml_output_parses_back_and_matches_json() {
    let yaml = estimate(small().as_bytes(), &["-o", "yaml"]);
    assert_eq!(yaml.code, 0, "{}", yaml.stderr);
    let from_yaml: Value = serde_saphyr::from_str(&yaml.stdout)
        .unwrap_or_else(|e| panic!("-o yaml does not parse back ({e}):\n{}", yaml.stdout));
    let from_json = json(&estimate(small().as_bytes(), &["-o", "json"]));
    assert_eq!(from_yaml, from_json);
}

#[test]
fn two_gpus_give_two_verdicts() {
    let run = estimate(
        small().as_bytes(),
        &["--gpus", "a10g,h100-80gb", "-o", "json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v = json(&run);
    let verdicts = v["verdicts"].as_array().expect("verdicts is a list");
    assert_eq!(verdicts.len(), 2, "{v}");
    assert_eq!(verdicts[0]["gpu"], "a10g");
    assert_eq!(verdicts[1]["gpu"], "h100-80gb");
    assert!(
        u64_at(&verdicts[0], "/usableBytes") < u64_at(&verdicts[1], "/usableBytes"),
        "an A10G has less memory than an H100"
    );
    for verdict in verdicts {
        assert!(verdict["verdict"]["fits"].is_boolean(), "{verdict}");
        assert!(verdict["message"].is_string(), "{verdict}");
    }

    let table = estimate(small().as_bytes(), &["--gpus", "a10g,h100-80gb"]);
    assert_eq!(table.code, run.code, "{}", table.stderr);
    assert!(table.stdout.contains("a10g"), "{}", table.stdout);
    assert!(table.stdout.contains("h100-80gb"), "{}", table.stdout);
}

#[test]
fn fits_one_of_several_gpus_exits_0() {
    // 8B LoRA needs more than a T4 but fits an H100.
    let text = job(
        "lora",
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, microBatchSize: 1, sequenceLength: 2048}",
    );
    let run = estimate(text.as_bytes(), &["--gpus", "t4,h100-80gb", "-o", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v = json(&run);
    assert_eq!(v["verdicts"][0]["verdict"]["fits"], false, "{v}");
    assert_eq!(v["verdicts"][1]["verdict"]["fits"], true, "{v}");
}

#[test]
fn crds_subcommand_prints_both_crds() {
    let args = ["crds"];
    let run = finish(command(&args).output().expect("runs"), &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, vramguard::cli::crds::crds_yaml());
    assert!(run.stdout.contains("trainingjobs.vramguard.io"));
    assert!(run.stdout.contains("gpunodes.vramguard.io"));
}

#[test]
fn usage_errors_exit_2_without_panic() {
    for args in [
        &["estimate"][..],
        &["estimate", "-f", "x.yaml", "-o", "xml"],
        &["estimate", "-f", "x.yaml", "--gpu", "t4", "--gpus", "a10g"],
        &["frobnicate"],
    ] {
        let run = finish(command(args).output().expect("runs"), args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
}

/// A full fine-tune of Llama-3.2-3B at micro-batch 1: about 70 GiB per GPU,
/// which an H100 has, but above JAX's default 75 % of it.
fn jax_job(env: &str) -> String {
    job(
        "jax-3b",
        &format!(
            "model: {{preset: llama-3.2-3b}}\ntraining: {{mode: full, microBatchSize: 1, sequenceLength: 2048, precision: bf16-mixed, attention: flash, loss: chunked, framework: jax}}\nfitPolicy: {{mode: Reject}}\ntemplate:\n  spec:\n    containers:\n    - name: trainer\n      image: trainer\n      env: {env}"
        ),
    )
}

#[test]
fn jax_jobs_are_held_to_the_allocator_fraction() {
    // With expandable segments (its first step's fp32 moments of the 128k × 3072 embedding
    // fit no block backward left otherwise, which takes its upper end past the card).
    let pytorch = jax_job("[{name: PYTORCH_CUDA_ALLOC_CONF, value: 'expandable_segments:True'}]")
        .replace("framework: jax", "framework: pytorch");
    let run = estimate(pytorch.as_bytes(), &["--gpu", "h100"]);
    assert_eq!(run.code, 0, "PyTorch has the whole card: {}", run.stdout);

    let run = estimate(jax_job("[]").as_bytes(), &["--gpu", "h100", "-o", "json"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let v = json(&run);
    let verdict = &v["verdicts"][0]["verdict"];
    assert_eq!(verdict["binding"], "allocatorLimit", "{verdict}");
    let limit = u64_at(verdict, "/allocatorLimit/limitBytes");
    let usable = u64_at(&v["verdicts"][0], "/usableBytes");
    assert_eq!(limit, (usable as f64 * 0.75).floor() as u64);
    let reserved = u64_at(&v, "/estimate/peakReservedBytes");
    assert!(
        reserved > limit && reserved < usable,
        "{reserved} vs {limit}"
    );
    let message = v["verdicts"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("XLA_PYTHON_CLIENT_MEM_FRACTION="),
        "{message}"
    );

    // The fraction the message names lets it through.
    let fix = message
        .split("XLA_PYTHON_CLIENT_MEM_FRACTION=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    let env = format!("[{{name: XLA_PYTHON_CLIENT_MEM_FRACTION, value: '{fix}'}}]");
    let run = estimate(jax_job(&env).as_bytes(), &["--gpu", "h100"]);
    assert_eq!(run.code, 0, "with {fix}: {}", run.stdout);
    let run = estimate(
        jax_job("[{name: XLA_PYTHON_CLIENT_ALLOCATOR, value: platform}]").as_bytes(),
        &["--gpu", "h100"],
    );
    assert_eq!(
        run.code, 0,
        "the platform allocator has no cap: {}",
        run.stdout
    );
}

#[test]
fn an_unreadable_allocator_setting_names_the_variable() {
    let run = estimate(
        jax_job("[{name: XLA_PYTHON_CLIENT_MEM_FRACTION, value: 'most'}]").as_bytes(),
        &[],
    );
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("spec.template.spec.containers[0].env[XLA_PYTHON_CLIENT_MEM_FRACTION]"),
        "{}",
        run.stderr
    );
}

#[test]
fn tensorflow_leaves_its_system_reserve() {
    let tf = jax_job("[]").replace("framework: jax", "framework: tensorflow");
    let run = estimate(tf.as_bytes(), &["--gpu", "h100", "-o", "json"]);
    let v = json(&run);
    let verdict = &v["verdicts"][0]["verdict"];
    let limit = u64_at(verdict, "/allocatorLimit/limitBytes");
    let usable = u64_at(&v["verdicts"][0], "/usableBytes");
    assert_eq!(usable - limit, 1800 << 20, "{verdict}");
}

/// The connection bounds of `serve` (the chart's `webhook.idleTimeoutSeconds`
/// and `webhook.maxConnections`) refuse values outside their range by name,
/// before anything binds.
#[test]
fn serve_refuses_connection_bounds_out_of_range() {
    for (flag, value) in [
        ("--max-connections", "0"),
        ("--max-connections", "70000"),
        ("--idle-timeout-secs", "0"),
        ("--idle-timeout-secs", "86400"),
    ] {
        let args = ["serve", "--self-signed", flag, value];
        let mut cmd = command(&args);
        cmd.env_remove("VRAMGUARD_MAX_CONNECTIONS")
            .env_remove("VRAMGUARD_IDLE_TIMEOUT_SECS");
        let run = finish(cmd.output().expect("the binary runs"), &args);
        assert_eq!(run.code, 2, "{flag} {value}: {}", run.stderr);
        assert!(
            run.stderr.contains(flag) && run.stderr.contains("is not in"),
            "{flag} {value}: {}",
            run.stderr
        );
    }
}

fn example(name: &str) -> Vec<u8> {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name),
    )
    .expect("the example exists")
}

/// Each kind, with and without the annotation, is estimated offline, with
/// where each field came from.
#[test]
fn jobs_jobsets_trainjobs_and_pytorchjobs_are_estimated_offline() {
    let rows = [
        (
            "job-trl-sft-llama-3.1-8b.yaml",
            "Job",
            "Transformers/TRL command line",
            8,
        ),
        (
            "job-annotated-llama-3.1-8b-lora.yaml",
            "Job",
            "vramguard.io/training annotation",
            1,
        ),
        (
            "jobset-torchtune-llama-3.1-8b-lora.yaml",
            "JobSet",
            "torchtune command line",
            8,
        ),
        (
            "jobset-annotated-qwen2.5-7b-full.yaml",
            "JobSet",
            "vramguard.io/training annotation",
            16,
        ),
        (
            "trainjob-litgpt-llama-3.2-1b-lora.yaml",
            "TrainJob",
            "LitGPT command line",
            1,
        ),
        (
            "trainjob-annotated-llama-3.1-70b-qlora.yaml",
            "TrainJob",
            "vramguard.io/training annotation",
            1,
        ),
        (
            "pytorchjob-run-clm-gpt2.yaml",
            "PyTorchJob",
            "Transformers/TRL command line",
            4,
        ),
        (
            "pytorchjob-annotated-mistral-7b-lora.yaml",
            "PyTorchJob",
            "vramguard.io/training annotation",
            8,
        ),
    ];
    for (file, kind, origin, gpus) in rows {
        let run = estimate(&example(file), &["-o", "json"]);
        assert!(run.code == 0 || run.code == 1, "{file}: {}", run.stderr);
        let v = json(&run);
        assert_eq!(v["readFrom"]["kind"], kind, "{file}");
        assert!(
            v["readFrom"]["origin"].as_str().unwrap().contains(origin),
            "{file}: {v}"
        );
        assert!(u64_at(&v, "/estimate/perGpuBytes") > 0, "{file}");
        let sources = v["readFrom"]["sources"].as_array().unwrap();
        let gpus_from = sources
            .iter()
            .find(|s| s["field"] == "parallelism.gpus")
            .unwrap_or_else(|| panic!("{file}: {sources:?}"));
        assert!(
            gpus_from["from"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{gpus}: ")),
            "{file}: {gpus_from}"
        );
    }
    // The table names the knobs it read.
    let run = estimate(&example("job-trl-sft-llama-3.1-8b.yaml"), &[]);
    assert!(
        run.stdout.contains("--per_device_train_batch_size 8"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("NVIDIA-H100-80GB-HBM3"),
        "{}",
        run.stdout
    );
    // The same job as a TrainingJob gets the same estimate as its Job.
    let as_tj = job(
        "same",
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, lora: {rank: 16, alpha: 32}, microBatchSize: 4, sequenceLength: 2048, precision: bf16-mixed, gradientCheckpointing: full}\nparallelism: {gpus: 1, gpusPerNode: 1}",
    );
    let a = json(&estimate(as_tj.as_bytes(), &["-o", "json"]));
    let b = json(&estimate(
        &example("job-annotated-llama-3.1-8b-lora.yaml"),
        &["-o", "json"],
    ));
    assert_eq!(a["estimate"], b["estimate"]);
}

#[test]
fn a_job_not_judged_or_with_a_bad_annotation_exits_2_saying_why() {
    let plain = b"apiVersion: batch/v1\nkind: Job\nmetadata: {name: plain}\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          command: [python, train.py]\n          resources: {limits: {nvidia.com/gpu: 1}}\n";
    let run = estimate(plain, &[]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(run.stderr.contains("Job not judged"), "{}", run.stderr);
    assert!(
        run.stderr.contains("vramguard.io/training"),
        "{}",
        run.stderr
    );

    let bad = String::from_utf8(plain.to_vec()).unwrap().replace(
        "metadata: {name: plain}",
        "metadata:\n  name: plain\n  annotations:\n    vramguard.io/training: |\n      model: {preset: gpt2}\n      training: {precision: bf17}\n",
    );
    let run = estimate(bad.as_bytes(), &[]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(
        run.stderr
            .contains("metadata.annotations[vramguard.io/training].training.precision"),
        "{}",
        run.stderr
    );
}

/// `vramguard <args>` with `input` on standard input.
fn run_with_stdin(args: &[&str], input: &[u8]) -> Run {
    let mut child = command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(input)
        .expect("the child reads stdin");
    finish(child.wait_with_output().expect("the child exits"), args)
}

fn run(args: &[&str]) -> Run {
    finish(command(args).output().expect("the binary runs"), args)
}

const QLORA_YAML: &str = "model: {preset: llama-3.1-8b}
training: {mode: qlora, microBatchSize: 2, sequenceLength: 4096, precision: bf16, gradientCheckpointing: full, lora: {rank: 16, targetModules: [q_proj, v_proj]}}
parallelism: {gpus: 1}
fitPolicy: {mode: Adjust, allow: [microBatchSize, loss]}";

const QLORA_FLAGS: &[&str] = &[
    "--model",
    "llama-3.1-8b",
    "--mode",
    "qlora",
    "--micro-batch",
    "2",
    "--seq",
    "4096",
    "--precision",
    "bf16",
    "--gradient-checkpointing",
    "full",
    "--lora-rank",
    "16",
    "--lora-target-modules",
    "q_proj,v_proj",
    "--parallelism-gpus",
    "1",
    "--fit-policy-mode",
    "Adjust",
    "--allow",
    "microBatchSize,loss",
];

/// The flags make the same job as the YAML: the same estimate, verdict and plan.
#[test]
fn flags_estimate_the_same_job_as_yaml() {
    let from_yaml = estimate(
        job("llama-3-1-8b-qlora", QLORA_YAML).as_bytes(),
        &["--gpu", "rtx-4090", "-o", "json"],
    );
    let mut args = vec!["estimate", "--gpu", "rtx-4090", "-o", "json"];
    args.extend_from_slice(QLORA_FLAGS);
    let from_flags = run(&args);
    assert_eq!(from_flags.code, from_yaml.code, "{}", from_flags.stderr);
    let (a, b) = (json(&from_yaml), json(&from_flags));
    assert_eq!(a["estimate"], b["estimate"]);
    assert_eq!(a["verdicts"], b["verdicts"]);
    assert_eq!(b["name"], "llama-3-1-8b-qlora");
    assert_eq!(b["verdicts"][0]["gpu"], "rtx-4090");
}

/// `--print-spec` prints a TrainingJob that, read back with `-f -`, is the same job.
#[test]
fn print_spec_round_trips_through_f() {
    let mut args = vec!["estimate", "--print-spec"];
    args.extend_from_slice(QLORA_FLAGS);
    let printed = run(&args);
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    assert!(
        printed
            .stdout
            .starts_with("apiVersion: vramguard.io/v1alpha1\nkind: TrainingJob\n"),
        "{}",
        printed.stdout
    );
    let back = run_with_stdin(
        &["estimate", "-f", "-", "--gpu", "rtx-4090", "-o", "json"],
        printed.stdout.as_bytes(),
    );
    let mut args = vec!["estimate", "--gpu", "rtx-4090", "-o", "json"];
    args.extend_from_slice(QLORA_FLAGS);
    let direct = run(&args);
    assert_eq!(back.code, direct.code, "{}", back.stderr);
    assert_eq!(json(&back)["estimate"], json(&direct)["estimate"]);
}

/// Bad flag values go through the YAML validator: every problem at once, each naming the
/// field's path and the flag that set it; exit 2, nothing printed.
#[test]
fn bad_flags_name_the_field_and_the_flag() {
    let run = run(&[
        "estimate",
        "--model",
        "llama-3.1-8b",
        "--micro-batch",
        "two",
        "--precision",
        "bf17",
        "--print-spec",
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    for needle in [
        "spec.training.microBatchSize",
        "(set by --micro-batch-size)",
        "spec.training.precision",
        "bf16-mixed",
        "(set by --precision)",
    ] {
        assert!(run.stderr.contains(needle), "{needle}:\n{}", run.stderr);
    }
    // A model the catalog lacks: the same message as in a file.
    let unknown = run_flags_error(&["--model", "llama-9"]);
    assert!(unknown.contains("spec.model.preset"), "{unknown}");
    // A cross-field rule of the validator.
    let cross = run_flags_error(&["--model", "gpt2", "--mode", "full", "--quantization", "nf4"]);
    assert!(cross.contains("spec.training.quantization"), "{cross}");
    // No model at all.
    let none = run_flags_error(&["--micro-batch", "2"]);
    assert!(
        none.contains("-f FILE") && none.contains("--model"),
        "{none}"
    );
}

fn run_flags_error(flags: &[&str]) -> String {
    let mut args = vec!["estimate"];
    args.extend_from_slice(flags);
    let r = run(&args);
    assert_eq!(r.code, 2, "{flags:?}: {}", r.stderr);
    r.stderr
}

/// `--hf-config FILE` estimates any Hugging Face model; the same config under
/// `spec.model.hfConfig` in YAML gives the same numbers; a file that is not a JSON object
/// is refused by name.
#[test]
fn hf_config_file_is_the_model() {
    let config = r#"{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "vocab_size": 151936, "tie_word_embeddings": true, "max_position_embeddings": 32768}"#;
    let file = TempFile::new(config.as_bytes());
    let path = file.0.to_str().expect("UTF-8 path");
    let flags = run(&[
        "estimate",
        "--hf-config",
        path,
        "--mode",
        "full",
        "--seq",
        "1024",
        "-o",
        "json",
    ]);
    assert_eq!(flags.code, 0, "{}", flags.stderr);
    let yaml = estimate(
        job(
            "qwen2-full",
            &format!(
                "model: {{hfConfig: {config}}}\ntraining: {{mode: full, sequenceLength: 1024}}"
            )
            .replace('\n', " ")
            .replacen(" training:", "\ntraining:", 1),
        )
        .as_bytes(),
        &["-o", "json"],
    );
    assert_eq!(yaml.code, 0, "{}", yaml.stderr);
    assert_eq!(json(&flags)["estimate"], json(&yaml)["estimate"]);
    assert_eq!(json(&flags)["name"], "qwen2-full");

    let bad = TempFile::new(b"[1, 2]");
    let err = run_flags_error(&["--hf-config", bad.0.to_str().expect("UTF-8 path")]);
    assert!(
        err.contains("--hf-config") && err.contains("not a JSON object"),
        "{err}"
    );
}

/// With `-f`, a flag overrides that field of the file's job.
#[test]
fn flags_override_the_file() {
    let base = estimate(small().as_bytes(), &["-o", "json"]);
    let bigger = estimate(
        small().as_bytes(),
        &["-o", "json", "--micro-batch-size", "16"],
    );
    assert_eq!(base.code, 0, "{}", base.stderr);
    assert_eq!(bigger.code, 0, "{}", bigger.stderr);
    assert!(
        u64_at(&json(&bigger), "/estimate/perGpuBytes")
            > u64_at(&json(&base), "/estimate/perGpuBytes")
    );
    let printed = estimate(
        small().as_bytes(),
        &["--micro-batch-size", "16", "--print-spec"],
    );
    assert!(
        printed.stdout.contains("microBatchSize: 16"),
        "{}",
        printed.stdout
    );
    assert!(printed.stdout.contains("name: small"), "{}", printed.stdout);
}

/// The job of the `max` tests, as flags: no globalBatchSize, so that `estimate` with a
/// micro-batch flag keeps the accumulation the search kept.
const MAX_JOB: &[&str] = &[
    "--model",
    "llama-3.1-8b",
    "--mode",
    "lora",
    "--precision",
    "bf16",
    "--micro-batch",
    "4",
    "--seq",
    "1024",
    "--allow",
    "microBatchSize,loss,gradientCheckpointing",
];

/// `estimate`'s exit code for MAX_JOB on `gpu` with `extra` flags (later flags win).
fn estimate_code(gpu: &str, extra: &[&str]) -> i32 {
    let mut args = vec!["estimate", "--gpu", gpu];
    args.extend_from_slice(MAX_JOB);
    args.extend_from_slice(extra);
    let r = run(&args);
    assert!(r.code == 0 || r.code == 1, "{args:?}: {}", r.stderr);
    r.code
}

/// `max` answers the boundary: the largest micro-batch n and the longest sequence s fit
/// (estimate exits 0), n+1 and s+1 do not (exit 1), as written and with each change.
#[test]
fn max_answers_the_boundary() {
    let gpu = "a100-40gb";
    let mut args = vec!["max", "--gpu", gpu, "-o", "json"];
    args.extend_from_slice(MAX_JOB);
    let r = run(&args);
    assert!(r.code == 0 || r.code == 1, "{}", r.stderr);
    let v = json(&r);
    let rows = v["rows"].as_array().expect("rows");
    let changes: Vec<&str> = rows
        .iter()
        .map(|r| r["change"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(changes[0], "as written");
    assert!(changes.contains(&"loss: standard → chunked"), "{changes:?}");
    assert!(
        changes.contains(&"gradientCheckpointing: none → full"),
        "{changes:?}"
    );
    assert!(
        !changes.iter().any(|c| c.starts_with("optimizer")),
        "not allowed: {changes:?}"
    );
    let mut checked = 0;
    for row in rows {
        let change = row["change"].as_str().expect("change");
        let flags: Vec<&str> = match change {
            "as written" => vec![],
            "loss: standard → chunked" => vec!["--loss", "chunked"],
            "gradientCheckpointing: none → full" => vec!["--gradient-checkpointing", "full"],
            "gradientCheckpointing: none → selective" => {
                vec!["--gradient-checkpointing", "selective"]
            }
            _ => continue,
        };
        for (key, flag) in [
            ("microBatchSize", "--micro-batch-size"),
            ("sequenceLength", "--seq"),
        ] {
            assert_eq!(row[key]["capped"], false, "{change}: {row}");
            let n = u64_at(&row[key], "/value");
            let (at, above) = (n.to_string(), (n + 1).to_string());
            let mut fits = flags.clone();
            fits.extend([flag, at.as_str()]);
            let mut over = flags.clone();
            over.extend([flag, above.as_str()]);
            assert_eq!(
                estimate_code(gpu, &fits),
                0,
                "{change}: {flag} {n} should fit"
            );
            assert_eq!(
                estimate_code(gpu, &over),
                1,
                "{change}: {flag} {} should not",
                n + 1
            );
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked} boundaries checked");
    // A change buys a larger batch than as written.
    let best = rows
        .iter()
        .filter_map(|r| r["microBatchSize"]["value"].as_u64())
        .max()
        .expect("some micro-batch fits");
    assert!(best > u64_at(&rows[0], "/microBatchSize/value"), "{v}");
}

/// The exit code says whether the job fits as written, and the table names the GPU.
#[test]
fn max_exit_code_and_table() {
    let mut args = vec![
        "max",
        "--gpu",
        "h100-80gb",
        "--model",
        "gpt2",
        "--micro-batch",
        "4",
        "--seq",
        "1024",
    ];
    let fits = run(&args);
    assert_eq!(fits.code, 0, "{}", fits.stderr);
    assert!(
        fits.stdout.contains("on h100-80gb") && fits.stdout.contains("as written"),
        "{}",
        fits.stdout
    );
    args.extend(["--micro-batch", "100000"]);
    let too_big = run(&args);
    assert_eq!(too_big.code, 1, "{}", too_big.stderr);
    let bad = run(&[
        "max",
        "--gpu",
        "h100-80gb",
        "--model",
        "gpt2",
        "--seq",
        "zero",
    ]);
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("spec.training.sequenceLength"),
        "{}",
        bad.stderr
    );
}

/// The attributes of every `name` element of an SVG document, parsed.
fn svg_elements(text: &str, name: &str) -> Vec<std::collections::HashMap<String, String>> {
    use svg::parser::Event;
    svg::read(text)
        .expect("the SVG parses")
        .filter_map(|e| match e {
            Event::Tag(n, t, attrs) if n == name && t != svg::node::element::tag::Type::End => {
                Some(
                    attrs
                        .iter()
                        .map(|(k, v)| (k.clone(), v.to_string()))
                        .collect(),
                )
            }
            Event::Error(e) => panic!("SVG error: {e}"),
            _ => None,
        })
        .collect()
}

/// `-o svg`: one range band per phase of the step (as many as `-o json` lists), stacked
/// component bars in each, the GPU's usable memory as one line at its height, and `--plot`
/// writes the same picture while the table goes to standard output.
#[test]
fn svg_has_a_band_per_phase_and_the_gpu_line() {
    let spec = job(
        "llama-3-1-8b-lora",
        "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, microBatchSize: 2, sequenceLength: 2048}",
    );
    let run = estimate(spec.as_bytes(), &["--gpu", "a100-80gb", "-o", "svg"]);
    // The picture whatever the verdict; the exit code is the verdict's.
    assert!(run.code == 0 || run.code == 1, "{}", run.stderr);
    assert!(
        run.stdout.starts_with("<svg"),
        "{}",
        &run.stdout[..run.stdout.len().min(200)]
    );
    let phases: Vec<String> = json(&estimate(
        spec.as_bytes(),
        &["--gpu", "a100-80gb", "-o", "json"],
    ))["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["phase"].as_str().expect("name").to_string())
        .collect();
    assert!(phases.len() >= 4, "{phases:?}");
    let rects = svg_elements(&run.stdout, "rect");
    let class =
        |r: &std::collections::HashMap<String, String>| r.get("class").cloned().unwrap_or_default();
    let bands: Vec<_> = rects.iter().filter(|r| class(r) == "range").collect();
    assert_eq!(bands.len(), phases.len(), "one band per phase");
    let components: Vec<_> = rects.iter().filter(|r| class(r) == "component").collect();
    assert!(
        components.len() >= 2 * phases.len(),
        "stacked bars: {}",
        components.len()
    );
    for c in ["weights", "activations"] {
        assert!(
            components
                .iter()
                .any(|r| r.get("data-component").map(String::as_str) == Some(c)),
            "{c}"
        );
    }
    let groups = svg_elements(&run.stdout, "g");
    let drawn: Vec<String> = groups
        .iter()
        .filter_map(|g| g.get("data-phase").cloned())
        .collect();
    assert_eq!(drawn, phases, "the phases in step order");
    let lines: Vec<_> = svg_elements(&run.stdout, "line")
        .into_iter()
        .filter(|l| l.get("class").map(String::as_str) == Some("usable"))
        .collect();
    assert_eq!(lines.len(), 1, "one GPU line");
    assert_eq!(lines[0]["y1"], lines[0]["y2"], "horizontal");
    assert!(
        run.stdout.contains("a100-80gb usable"),
        "the line is labelled"
    );

    let file = TempFile::new(b"");
    let path = file.0.to_str().expect("UTF-8").to_string();
    let table = estimate(
        spec.as_bytes(),
        &["--gpu", "a100-80gb", "--plot", path.as_str()],
    );
    assert_eq!(table.code, run.code, "{}", table.stderr);
    assert!(table.stdout.contains("peak allocated"), "{}", table.stdout);
    let written = std::fs::read_to_string(&file.0).expect("--plot wrote the file");
    assert_eq!(written, run.stdout);
    // Two jobs make no one picture.
    let two = format!("{}---\n{}", small(), huge());
    let many = estimate(two.as_bytes(), &["-o", "svg"]);
    assert_eq!(many.code, 2);
    assert!(many.stderr.contains("one job"), "{}", many.stderr);
}

/// `simulate` shows progress on standard error when asked (a terminal, or `--progress
/// always`), and nothing in a pipe by default.
#[test]
fn simulate_progress_only_when_asked_or_on_a_terminal() {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/scenarios/burst.yaml");
    let quiet = run(&["simulate", "-f", scenario, "-o", "json"]);
    assert!(quiet.code == 0 || quiet.code == 1, "{}", quiet.stderr);
    assert!(
        !quiet.stderr.contains('\r') && !quiet.stderr.contains("simulate:"),
        "{}",
        quiet.stderr
    );
    let shown = run(&[
        "simulate",
        "-f",
        scenario,
        "-o",
        "json",
        "--progress",
        "always",
    ]);
    assert_eq!(shown.code, quiet.code, "{}", shown.stderr);
    assert!(
        shown.stderr.contains("\r\x1b[2Ksimulate: "),
        "{:?}",
        shown.stderr
    );
    assert!(
        shown.stderr.contains("jobs submitted"),
        "{:?}",
        shown.stderr
    );
    assert!(
        shown.stderr.ends_with("\r\x1b[2K"),
        "the line is cleared at the end"
    );
    // The report is the same with or without the progress line.
    let (mut a, mut b) = (json(&quiet), json(&shown));
    for v in [&mut a, &mut b] {
        v["summary"]["wallSeconds"] = Value::Null;
    }
    assert_eq!(a["summary"], b["summary"]);
    assert_eq!(a["invariants"], b["invariants"]);
}

#[test]
fn colour_only_when_asked_never_in_a_pipe() {
    let job = example("llama-3.1-8b-lora-h100.yaml");
    // Standard output is a pipe here: auto (the default) writes no escape code.
    for extra in [&[][..], &["--color", "auto"], &["--color", "never"]] {
        let piped = estimate(&job, extra);
        assert_eq!(piped.code, 0, "{}", piped.stderr);
        assert!(
            !piped.stdout.contains('\x1b'),
            "{extra:?}:\n{}",
            piped.stdout
        );
    }
    let coloured = estimate(&job, &["--color", "always"]);
    assert!(
        coloured.stdout.contains("\x1b[32mfits with"),
        "the verdict in green:\n{}",
        coloured.stdout
    );
    // The plain text is the same once the escapes are taken out.
    let plain = estimate(&job, &[]).stdout;
    let stripped = coloured
        .stdout
        .split('\x1b')
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part
            } else {
                part.split_once('m').map_or(part, |(_, rest)| rest)
            }
        })
        .collect::<String>();
    assert_eq!(stripped, plain);
    // JSON never carries colour.
    let json = estimate(&job, &["--color", "always", "-o", "json"]);
    assert!(!json.stdout.contains('\x1b'));
    let max = run(&["max", "--model", "gpt2", "--color", "always"]);
    assert!(max.stdout.contains("\x1b[32mfits\x1b[0m"), "{}", max.stdout);
}

#[test]
fn error_format_json_lists_every_problem() {
    let bad = b"apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata: {name: bad}
spec:
  model: {preset: no-such-model}
  training: {mode: lorax, microBatchSize: 0, sequenceLength: 4096, precision: bf16}
";
    let file = TempFile::new(bad);
    let path = file.0.to_str().expect("temp paths are UTF-8");
    let text = run(&["estimate", "-f", path, "-o", "json"]);
    assert_eq!(text.code, 2);
    let json = run(&[
        "estimate",
        "-f",
        path,
        "-o",
        "json",
        "--error-format",
        "json",
    ]);
    assert_eq!(json.code, 2);
    assert_eq!(json.stdout, text.stdout);
    let v: Value = serde_json::from_str(&json.stderr).expect("one JSON object on stderr");
    let errors = v["errors"].as_array().expect("errors");
    let paths: std::collections::BTreeSet<&str> =
        errors.iter().filter_map(|e| e["path"].as_str()).collect();
    for want in [
        "spec.model.preset",
        "spec.training.mode",
        "spec.training.microBatchSize",
    ] {
        assert!(paths.contains(want), "{want} missing: {}", json.stderr);
    }
    // The same problems as the text lines, one for one.
    let lines: Vec<&str> = text.stderr.lines().collect();
    assert_eq!(lines.len(), errors.len());
    for (line, e) in lines.iter().zip(errors) {
        assert_eq!(line.strip_prefix("error: "), e["message"].as_str());
        assert_eq!(e["document"], "bad");
        assert_eq!(e["source"], path);
    }
    // A flag's problem names the flag; `max` reports the same way.
    let flags = run(&[
        "max",
        "--model",
        "gpt2",
        "--mode",
        "lorax",
        "--error-format",
        "json",
    ]);
    assert_eq!(flags.code, 2);
    let v: Value = serde_json::from_str(&flags.stderr).expect("JSON");
    assert_eq!(v["errors"][0]["path"], "spec.training.mode");
    assert_eq!(v["errors"][0]["flag"], "--mode");
    assert_eq!(v["errors"][0]["source"], "flags");
}
