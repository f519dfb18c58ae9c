//! `kubectl-vramguard` (the kubectl plugin) against the in-memory API server over HTTP,
//! through a kubeconfig as kubectl would hand it: `explain`, `why`, `nodes`, and `estimate`
//! offline.

mod support;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use support::apiserver::ApiServer;
use support::fixtures::{self, gpu_node};
use vramguard::api::{Phase, TrainingJob, TrainingJobStatus};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-vramguard");

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Run the plugin with `args` against `server` (a kubeconfig in a temp file).
async fn plugin(server: &ApiServer, args: &[&str]) -> Out {
    // One directory per call: tests run at once and may ask the same thing of
    // different servers.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "vramguard-kubectl-test-{}-{call}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {}\n\
             users:\n- name: t\n  user: {{}}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: t\n    namespace: ml\n\
             current-context: t\n",
            server.url
        ),
    )
    .expect("write kubeconfig");
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("VRAMGUARD_GPU")
        .output()
        .await
        .expect("the plugin runs");
    let _ = std::fs::remove_dir_all(&dir);
    let run = Out {
        code: out.status.code().expect("exits"),
        stdout: String::from_utf8(out.stdout).expect("UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8"),
    };
    assert!(!run.stderr.contains("panicked"), "{args:?}: {}", run.stderr);
    run
}

const SPEC: &str = "model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 4, sequenceLength: 4096, precision: bf16}
parallelism: {gpus: 1}";

fn event(job: &str, reason: &str, note: &str, secs: i64) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{job}.{secs}")),
            namespace: Some("ml".into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(
            Timestamp::from_second(1_800_000_000 + secs).expect("a time"),
        )),
        regarding: Some(ObjectReference {
            api_version: Some("vramguard.io/v1alpha1".into()),
            kind: Some("TrainingJob".into()),
            name: Some(job.into()),
            namespace: Some("ml".into()),
            ..Default::default()
        }),
        reason: Some(reason.into()),
        note: Some(note.into()),
        type_: Some("Warning".into()),
        reporting_controller: Some("vramguard.io/operator".into()),
        reporting_instance: Some("test".into()),
        ..Default::default()
    }
}

/// A job waiting for room, with the status the operator writes.
fn waiting_job() -> TrainingJob {
    let mut tj = fixtures::training_job("ml", "llama-lora", SPEC);
    let job = vramguard::api::validate(&tj.spec).expect("valid");
    let h100 = vramguard::estimate::gpus::find("h100-80gb").expect("in the catalog");
    let report = vramguard::cli::estimate::report(&job, None, &[h100]).expect("estimates");
    tj.status = Some(TrainingJobStatus {
        phase: Some(Phase::Pending),
        model: Some("llama-3.1-8b".into()),
        estimate: Some(report.estimate),
        message: Some("no node has 1 GPU with 70.1 GiB free now; waiting".into()),
        conditions: vec![Condition {
            type_: "Placed".into(),
            status: "False".into(),
            reason: "NoCapacity".into(),
            message: "largest free: 12.0 GiB on node-a GPU 0".into(),
            last_transition_time: Time(Timestamp::from_second(1_800_000_000).expect("a time")),
            observed_generation: None,
        }],
        ..Default::default()
    });
    tj
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_status_estimate_with_its_range() {
    let server = ApiServer::start().await;
    let tj = waiting_job();
    server.put(&tj);
    let run = plugin(&server, &["explain", "trainingjob", "llama-lora"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let e = tj
        .status
        .as_ref()
        .and_then(|s| s.estimate.clone())
        .expect("estimate");
    let per_gpu = format!("{:.2}", e.per_gpu_bytes as f64 / fixtures::GIB as f64);
    let upper = format!(
        "{:.2}",
        e.upper.expect("a range").per_gpu_bytes as f64 / fixtures::GIB as f64
    );
    for needle in [
        "ml/llama-lora",
        "phase Pending",
        "per GPU",
        per_gpu.as_str(),
        upper.as_str(),
        "peak at",
        "waiting",
    ] {
        assert!(run.stdout.contains(needle), "{needle}:\n{}", run.stdout);
    }
    // A job that is not there, and a kind that is not ours, are errors that say so.
    let missing = plugin(&server, &["explain", "trainingjob", "nope"]).await;
    assert_eq!(missing.code, 2);
    assert!(
        missing
            .stderr
            .contains("no TrainingJob \"nope\" in namespace \"ml\""),
        "{}",
        missing.stderr
    );
    let kind = plugin(&server, &["explain", "pod", "llama-lora"]).await;
    assert_eq!(kind.code, 2);
    assert!(
        kind.stderr.contains("explain trainingjob NAME"),
        "{}",
        kind.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_shows_conditions_and_only_this_jobs_events_in_order() {
    let server = ApiServer::start().await;
    server.put(&waiting_job());
    server.put(&event(
        "llama-lora",
        "Waiting",
        "no room: need 70.1 GiB on 1 GPU",
        20,
    ));
    server.put(&event("llama-lora", "Admitted", "fits as written", 10));
    server.put(&event("other-job", "GpuOutOfMemory", "not this one", 15));
    let run = plugin(&server, &["why", "llama-lora"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    for needle in [
        "Pending",
        "Placed = False (NoCapacity)",
        "largest free: 12.0 GiB",
        "Admitted",
        "Waiting",
    ] {
        assert!(out.contains(needle), "{needle}:\n{out}");
    }
    assert!(!out.contains("not this one"), "{out}");
    let (a, w) = (
        out.find("Admitted").expect("a"),
        out.find("Waiting").expect("w"),
    );
    assert!(a < w, "oldest first:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_lists_free_memory_and_largest_block_per_gpu() {
    let server = ApiServer::start().await;
    let empty = plugin(&server, &["nodes"]).await;
    assert_eq!(empty.code, 1, "{}", empty.stderr);
    assert!(empty.stdout.contains("no GpuNode"), "{}", empty.stdout);
    let mut a = gpu_node("node-a", 2, 70);
    if let Some(s) = a.status.as_mut() {
        s.gpus[1].largest_free_block_bytes = Some(30 * fixtures::GIB);
        s.gpus[1].free_bytes = 40 * fixtures::GIB;
    }
    server.put(&a);
    server.put(&gpu_node("node-b", 1, 12));
    let run = plugin(&server, &["nodes"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    assert!(
        lines[1].starts_with("node-a") && lines[1].contains("70.0"),
        "{}",
        run.stdout
    );
    assert!(
        lines[2].contains("40.0") && lines[2].contains("30.0"),
        "{}",
        run.stdout
    );
    assert!(
        lines[3].starts_with("node-b") && lines[3].contains("12.0"),
        "{}",
        run.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimate_runs_offline_without_a_cluster() {
    // No server, no kubeconfig: estimate never connects.
    let out = tokio::process::Command::new(BIN)
        .args([
            "estimate",
            "--model",
            "gpt2",
            "--micro-batch",
            "4",
            "--seq",
            "1024",
            "-o",
            "json",
        ])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("VRAMGUARD_GPU")
        .output()
        .await
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["model"], "gpt2");
    assert_eq!(v["fits"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_answers_are_coloured_only_when_asked() {
    const ESC: &str = "\x1b[";
    let server = ApiServer::start().await;
    server.put(&waiting_job());
    let mut sick = gpu_node("node-a", 2, 70);
    if let Some(s) = sick.status.as_mut() {
        s.gpus[1].healthy = false;
        s.gpus[1].health_message = Some("XID 79".into());
    }
    server.put(&sick);

    // A pipe (the test's) gets no escape codes, with or without NO_COLOR.
    for args in [
        &["explain", "trainingjob", "llama-lora"][..],
        &["why", "llama-lora"],
        &["nodes"],
    ] {
        let run = plugin(&server, args).await;
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(!run.stdout.contains(ESC), "{args:?}:\n{}", run.stdout);
        let never = plugin(&server, &[args, &["--color", "never"]].concat()).await;
        assert_eq!(never.stdout, run.stdout, "{args:?}");
    }

    // Asked for: a waiting job's phase in yellow, a sick GPU in red, a healthy one in green,
    // and the text around the codes unchanged.
    let explain = plugin(
        &server,
        &["explain", "trainingjob", "llama-lora", "--color", "always"],
    )
    .await;
    assert!(
        explain.stdout.contains("\x1b[33mPending\x1b[0m"),
        "{}",
        explain.stdout
    );
    let why = plugin(&server, &["why", "llama-lora", "--color", "always"]).await;
    assert!(
        why.stdout.contains("\x1b[33mPending\x1b[0m"),
        "{}",
        why.stdout
    );
    let nodes = plugin(&server, &["nodes", "--color", "always"]).await;
    assert!(
        nodes.stdout.contains("\x1b[31munhealthy: XID 79\x1b[0m"),
        "{}",
        nodes.stdout
    );
    assert!(
        nodes.stdout.contains("\x1b[32mok\x1b[0m"),
        "{}",
        nodes.stdout
    );
    let plain = plugin(&server, &["nodes"]).await;
    let stripped = nodes
        .stdout
        .replace("\x1b[0m", "")
        .replace("\x1b[1m", "")
        .replace("\x1b[31m", "")
        .replace("\x1b[32m", "")
        .replace("\x1b[33m", "");
    assert_eq!(stripped, plain.stdout);

    // A wrong value names the flag and the valid ones.
    let bad = plugin(&server, &["nodes", "--color", "sometimes"]).await;
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("--color") && bad.stderr.contains("always"),
        "{}",
        bad.stderr
    );
}
