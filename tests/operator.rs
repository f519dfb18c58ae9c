//! The operator against the in-memory test API server over HTTP, with kube's
//! real client: the controller, its watches, its status writes with
//! resourceVersion preconditions, the Lease, finalizers and garbage
//! collection are the code paths a cluster exercises. The test plays the
//! parts a cluster's other controllers play: it moves Job status and makes
//! the failed pods with their termination messages and logs.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use support::apiserver::ApiServer;
use support::fixtures::{self, GIB, gpu_node};
use tower::ServiceExt;
use vramguard::api::{MemoryProfile, Phase, TrainingJob};
use vramguard::inventory::{Source, reflect};
use vramguard::operator::{self, Config, FINALIZER, LeaseConfig};
use vramguard::webhook::{self, AppState};

const NS: &str = "ml";

const TEMPLATE: &str = r#"
template:
  spec:
    containers:
      - name: trainer
        image: ghcr.io/example/trainer:1.0
        args: ["--micro-batch", "$(VRAMGUARD_MICRO_BATCH_SIZE)"]
"#;

/// A LoRA fine-tune of an 8B model at sequence length 2048. Per GPU on an
/// H100 (`vramguard estimate`): micro-batch 1 with full checkpointing 49 GiB,
/// 1 without 61.5 GiB, 2 without 77.9 GiB.
fn lora_8b(micro: u64, checkpointing: &str, policy: &str) -> String {
    format!(
        "model: {{preset: llama-3.1-8b}}
training: {{mode: lora, lora: {{rank: 16}}, microBatchSize: {micro}, globalBatchSize: 32, sequenceLength: 2048,
           precision: bf16-mixed, optimizer: adamw, attention: flash, gradientCheckpointing: {checkpointing}}}
fitPolicy: {policy}
{TEMPLATE}"
    )
}

fn training_job(name: &str, spec_yaml: &str) -> TrainingJob {
    fixtures::training_job(NS, name, spec_yaml)
}

fn fast_lease(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        renew_every: Duration::from_millis(200),
        retry_every: Duration::from_millis(200),
        ..LeaseConfig::new("vramguard-system", "vramguard-operator", identity)
    }
}

/// One operator replica; stopping it is a graceful shutdown.
struct Replica {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    fn start(server: &ApiServer, identity: &str) -> Replica {
        let client = server.client();
        let (source, driver) = reflect::start(client.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let config = Config {
            instance: Some(identity.into()),
            // Longer than any test: waiting jobs must start on events.
            wait_requeue: Duration::from_secs(600),
            error_requeue: Duration::from_millis(200),
            ..Config::default()
        };
        let lease = fast_lease(identity);
        let task = tokio::spawn(async move {
            let run = operator::run(client, Arc::new(source), config, lease, async move {
                let _ = stopped.await;
            });
            tokio::select! {
                r = run => r.expect("operator"),
                _ = driver => {},
            }
        });
        Replica {
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }

    /// Gone without a word: no Lease release, no graceful end.
    fn crash(self) {
        self.task.abort();
    }
}

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn tj_of(server: &ApiServer, name: &str) -> Option<TrainingJob> {
    server.get::<TrainingJob>(Some(NS), name)
}

async fn wait_phase(server: &ApiServer, name: &str, want: Phase) -> TrainingJob {
    eventually(&format!("{name} to be {want:?}"), || async {
        let tj = tj_of(server, name)?;
        (tj.status.as_ref()?.phase == Some(want)).then_some(tj)
    })
    .await
}

async fn wait_job(server: &ApiServer, name: &str) -> Job {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(j) = server.get::<Job>(Some(NS), name) {
            return j;
        }
        if tokio::time::Instant::now() > deadline {
            let statuses: Vec<_> = server
                .objects::<TrainingJob>()
                .into_iter()
                .map(|t| (t.name_any(), t.status))
                .collect();
            panic!("timed out waiting for Job {name}; TrainingJobs: {statuses:#?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn env_of(job: &Job, name: &str) -> Option<String> {
    job.spec.as_ref()?.template.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

/// Move a Job's status the way the Job controller would.
fn set_job_status(server: &ApiServer, name: &str, status: Value) {
    let mut job = server.get::<Job>(Some(NS), name).expect("the Job exists");
    job.status = Some(serde_json::from_value(status).expect("a JobStatus"));
    server.put(&job);
}

fn job_failed(server: &ApiServer, name: &str) {
    set_job_status(
        server,
        name,
        json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}),
    );
}

fn job_complete(server: &ApiServer, name: &str) {
    set_job_status(
        server,
        name,
        json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}),
    );
}

/// A failed pod of an attempt, with its container's termination state.
fn failed_pod(server: &ApiServer, tj: &str, attempt: u32, reason: &str, exit: i32, message: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{tj}-{attempt}-abcde"),
            "namespace": NS,
            "labels": {"vramguard.io/training-job": tj, "vramguard.io/attempt": attempt.to_string()},
        },
        "spec": {"containers": [{"name": "trainer", "image": "x"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{
                "name": "trainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit, "reason": reason, "message": message}},
            }],
        },
    }))
    .expect("a Pod");
    server.put(&pod);
}

/// Today's PyTorch message: 78.12 GiB in use + 2 GiB more = 80.12 GiB needed.
const TORCH_OOM: &str = "Traceback (most recent call last):\n  File \"train.py\", line 88, in <module>\n[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.";

fn condition<'a>(
    tj: &'a TrainingJob,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    tj.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

fn event_reasons(server: &ApiServer) -> Vec<String> {
    server
        .objects::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admits_creates_the_job_and_follows_it_to_success() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 8, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&training_job("train", &lora_8b(1, "full", "{}")));

    let job = wait_job(&server, "train-0").await;
    let tj = wait_phase(&server, "train", Phase::Admitted).await;
    let status = tj.status.clone().unwrap();
    assert!(tj.finalizers().iter().any(|f| f == FINALIZER));
    let placement = status.placement.clone().unwrap();
    assert_eq!(placement.node, "gpu-a");
    assert_eq!(placement.gpus.len(), 1);
    assert!(placement.reserved_bytes_per_gpu > 20 * GIB, "{placement:?}");
    assert_eq!(status.job_name.as_deref(), Some("train-0"));
    assert_eq!(status.model.as_deref(), Some("llama-3.1-8b"));
    let placed = condition(&tj, "Placed").unwrap();
    assert_eq!(placed.status, "True");
    assert!(placed.message.contains("gpu-a"), "{}", placed.message);

    // The Job: owned, labelled, the plan in env, GPU limit, pinned to the node.
    assert_eq!(job.owner_references()[0].uid, tj.uid().unwrap());
    assert_eq!(job.labels()["vramguard.io/training-job"], "train");
    assert_eq!(
        env_of(&job, "VRAMGUARD_MICRO_BATCH_SIZE").as_deref(),
        Some("1")
    );
    assert_eq!(
        env_of(&job, "VRAMGUARD_GRAD_ACCUM_STEPS").as_deref(),
        Some("32")
    );
    assert_eq!(
        env_of(&job, "VRAMGUARD_PRECISION").as_deref(),
        Some("bf16-mixed")
    );
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.suspend, None);
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let c = &pod.containers[0];
    assert_eq!(
        c.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );
    assert_eq!(
        c.resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"].0,
        "1"
    );
    let affinity = serde_json::to_value(&pod.affinity).unwrap();
    assert_eq!(
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["values"],
        json!(["gpu-a"])
    );
    // The user's spec is never rewritten.
    assert_eq!(tj.spec.training.micro_batch_size, 1);

    set_job_status(&server, "train-0", json!({"active": 1, "ready": 1}));
    let tj = wait_phase(&server, "train", Phase::Running).await;
    assert_eq!(condition(&tj, "Running").unwrap().status, "True");
    job_complete(&server, "train-0");
    let tj = wait_phase(&server, "train", Phase::Succeeded).await;
    assert_eq!(condition(&tj, "Complete").unwrap().status, "True");
    let reasons = event_reasons(&server);
    for r in ["Placed", "JobCreated", "Running", "Succeeded"] {
        assert!(
            reasons.iter().any(|x| x == r),
            "no {r} event in {reasons:?}"
        );
    }
    replica.stop().await;
}

/// Jobs that need most of an 80 GB GPU, written to run as they are.
/// A TrainingJob name may be 253 characters; a label value at most 63. The Job's name
/// and labels are shortened with a hash (the API server refuses the Job otherwise),
/// the full name rides in an annotation, and an OOM of the attempt is still found.
#[tokio::test]
async fn a_250_character_name_runs_and_its_oom_is_still_found() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    let name = format!("ft-{}", "x".repeat(246));
    assert_eq!(name.len(), 249);
    server.put(&training_job(
        &name,
        &lora_8b(
            2,
            "none",
            "{mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}",
        ),
    ));
    let job_name = vramguard::operator::render::job_name(&name, 0);
    let job0 = wait_job(&server, &job_name).await;
    assert!(job_name.len() <= 63, "{job_name}");
    let template = &job0.spec.as_ref().unwrap().template;
    let metas = [&job0.metadata, template.metadata.as_ref().unwrap()];
    for meta in metas {
        for (k, v) in meta.labels.iter().flatten() {
            assert!(v.len() <= 63, "label {k}={v} is longer than 63");
        }
        assert_eq!(
            meta.annotations.as_ref().unwrap()["vramguard.io/training-job"],
            name
        );
    }
    // The pod as the Job controller makes it: the template's labels and annotations.
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("{job_name}-abcde"), "namespace": NS},
        "spec": {"containers": [{"name": "trainer", "image": "x"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{
                "name": "trainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": TORCH_OOM}},
            }],
        },
    }))
    .expect("a Pod");
    pod.metadata.labels = template.metadata.as_ref().unwrap().labels.clone();
    pod.metadata.annotations = template.metadata.as_ref().unwrap().annotations.clone();
    server.put(&pod);
    job_failed(&server, &job_name);
    wait_job(&server, &vramguard::operator::render::job_name(&name, 1)).await;
    let status = tj_of(&server, &name).unwrap().status.unwrap();
    assert_eq!(
        status.oom_retries, 1,
        "the OOM was found through the shortened label"
    );
    replica.stop().await;
}

fn big(name: &str) -> TrainingJob {
    training_job(name, &lora_8b(2, "full", "{mode: Reject}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_when_full_and_starts_when_capacity_frees() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&big("first"));
    wait_job(&server, "first-0").await;
    let tj = wait_phase(&server, "first", Phase::Admitted).await;
    let reserved = tj.status.unwrap().placement.unwrap().reserved_bytes_per_gpu;
    assert!(
        reserved > 40 * GIB,
        "the test needs a job over half the GPU: {reserved}"
    );

    server.put(&big("second"));
    let waiting = eventually("second to wait", || async {
        let tj = tj_of(&server, "second")?;
        let c = condition(&tj, "Placed")?.clone();
        (c.reason == "WaitingForCapacity").then_some(tj)
    })
    .await;
    assert_eq!(waiting.status.as_ref().unwrap().phase, Some(Phase::Pending));
    assert!(server.get::<Job>(Some(NS), "second-0").is_none());

    // The first finishes: its reservation goes and the second starts, on
    // that event (the periodic re-check is 10 minutes away).
    job_complete(&server, "first-0");
    wait_job(&server, "second-0").await;
    wait_phase(&server, "second", Phase::Admitted).await;
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_oom_is_learnt_and_retried_smaller_then_succeeds() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&training_job(
        "ft",
        &lora_8b(
            2,
            "none",
            "{mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}",
        ),
    ));
    let job0 = wait_job(&server, "ft-0").await;
    let micro0: u64 = env_of(&job0, "VRAMGUARD_MICRO_BATCH_SIZE")
        .unwrap()
        .parse()
        .unwrap();

    failed_pod(&server, "ft", 0, "Error", 1, TORCH_OOM);
    job_failed(&server, "ft-0");

    let job1 = wait_job(&server, "ft-1").await;
    let tj = tj_of(&server, "ft").unwrap();
    let status = tj.status.clone().unwrap();
    assert_eq!(status.oom_retries, 1);
    let oom = status.last_oom.clone().unwrap();
    assert_eq!(oom.kind, "GpuOutOfMemory");
    assert_eq!(oom.framework.as_deref(), Some("PyTorch"));
    assert_eq!(oom.rank, Some(0));
    assert_eq!(oom.tried_bytes, Some(2 * GIB));
    assert!(oom.observed_bytes.unwrap() > 80 * GIB);
    let learned = status.learned.clone().unwrap();
    assert!(learned.scale > 1.0, "{learned:?}");
    assert_eq!(
        condition(&tj, "OutOfMemory").unwrap().reason,
        "GpuOutOfMemory"
    );

    // Smaller: the micro-batch or checkpointing changed, the batch kept.
    let micro1: u64 = env_of(&job1, "VRAMGUARD_MICRO_BATCH_SIZE")
        .unwrap()
        .parse()
        .unwrap();
    let accum1: u64 = env_of(&job1, "VRAMGUARD_GRAD_ACCUM_STEPS")
        .unwrap()
        .parse()
        .unwrap();
    let ckpt1 = env_of(&job1, "VRAMGUARD_GRADIENT_CHECKPOINTING").unwrap();
    assert!(
        micro1 < micro0 || ckpt1 != env_of(&job0, "VRAMGUARD_GRADIENT_CHECKPOINTING").unwrap(),
        "micro {micro0} -> {micro1}, checkpointing {ckpt1}"
    );
    assert_eq!(micro1 * accum1, 32);
    assert_eq!(env_of(&job1, "VRAMGUARD_ATTEMPT").as_deref(), Some("1"));
    // The failed attempt's Job is replaced.
    eventually("the failed Job to go", || async {
        server.get::<Job>(Some(NS), "ft-0").is_none().then_some(())
    })
    .await;

    // What was learnt is kept for the next job of the same shape.
    let profile = eventually("the MemoryProfile", || async {
        server
            .objects::<MemoryProfile>()
            .into_iter()
            .find(|p| p.status.as_ref().is_some_and(|s| s.observation_count == 1))
    })
    .await;
    assert_eq!(Some(profile.name_any()), learned.profile);
    assert!(profile.status.unwrap().ratio > 1.0);
    assert_eq!(profile.spec.model, "llama-3.1-8b");

    job_complete(&server, "ft-1");
    wait_phase(&server, "ft", Phase::Succeeded).await;

    // A new job of the same shape starts from the learnt ratio.
    server.put(&training_job(
        "ft-again",
        &lora_8b(
            2,
            "none",
            "{mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}",
        ),
    ));
    let again = wait_job(&server, "ft-again-0").await;
    let tj = tj_of(&server, "ft-again").unwrap();
    let l = tj
        .status
        .unwrap()
        .learned
        .expect("the profile's scale is applied");
    assert!(l.scale > 1.0);
    let micro: u64 = env_of(&again, "VRAMGUARD_MICRO_BATCH_SIZE")
        .unwrap()
        .parse()
        .unwrap();
    let ckpt = env_of(&again, "VRAMGUARD_GRADIENT_CHECKPOINTING").unwrap();
    assert!(micro < micro0 || ckpt != "none");

    // The webhook reads the same profile: the plan that died, written as a
    // job of its own, fits by the plain estimate (it was admitted) and is
    // denied once raised by what the OOM proved.
    let (source, driver) = reflect::start(server.client());
    let driver = tokio::spawn(driver);
    eventually("the webhook's inventory to hold the profile", || async {
        (!source.snapshot().profiles.is_empty()).then_some(())
    })
    .await;
    let router = webhook::router(Arc::new(AppState::new(Arc::new(source))));
    let ckpt0 = env_of(&job0, "VRAMGUARD_GRADIENT_CHECKPOINTING").unwrap();
    let mut object = serde_json::to_value(training_job(
        "ft-third",
        &lora_8b(micro0, &ckpt0, "{mode: Reject}"),
    ))
    .unwrap();
    object["apiVersion"] = json!("vramguard.io/v1alpha1");
    object["kind"] = json!("TrainingJob");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "vramguard.io", "version": "v1alpha1", "kind": "TrainingJob"},
            "resource": {"group": "vramguard.io", "version": "v1alpha1", "resource": "trainingjobs"},
            "name": "ft-third",
            "namespace": NS,
            "operation": "CREATE",
            "userInfo": {"username": "researcher"},
            "object": object,
            "oldObject": null,
            "dryRun": false,
        }
    });
    let response = router
        .oneshot(
            axum::http::Request::post("/validate")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(review.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], json!(false), "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    let raised = format!("raised ×{:.2}", l.scale);
    assert!(message.contains(&raised), "{raised}: {message}");
    driver.abort();
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_found_only_in_the_log_tail_and_retries_run_out() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&training_job(
        "tiny",
        &lora_8b(
            2,
            "none",
            "{mode: Adjust, allow: [microBatchSize, gradientCheckpointing], maxOomRetries: 1}",
        ),
    ));
    wait_job(&server, "tiny-0").await;
    // The termination message holds only the end of a long traceback.
    let tail = "  File \"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py\", line 1736, in _call_impl\n    return forward_call(*args, **kwargs)\n";
    failed_pod(&server, "tiny", 0, "Error", 1, tail);
    server.set_log(
        NS,
        "tiny-0-abcde",
        &format!("step 10 loss 2.1\n{TORCH_OOM}\n{tail}"),
    );
    job_failed(&server, "tiny-0");
    wait_job(&server, "tiny-1").await;
    assert_eq!(
        tj_of(&server, "tiny").unwrap().status.unwrap().oom_retries,
        1
    );

    failed_pod(&server, "tiny", 1, "Error", 1, TORCH_OOM);
    job_failed(&server, "tiny-1");
    let tj = wait_phase(&server, "tiny", Phase::Failed).await;
    let failed = condition(&tj, "Failed").unwrap();
    assert_eq!(failed.reason, "OutOfMemoryRetriesExhausted");
    assert!(failed.message.contains("GiB"), "{}", failed.message);
    assert!(server.get::<Job>(Some(NS), "tiny-2").is_none());
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_oom_is_not_a_gpu_oom() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&training_job("host", &lora_8b(1, "full", "{}")));
    wait_job(&server, "host-0").await;
    failed_pod(&server, "host", 0, "OOMKilled", 137, "");
    job_failed(&server, "host-0");
    let tj = wait_phase(&server, "host", Phase::Failed).await;
    let status = tj.status.clone().unwrap();
    assert_eq!(status.oom_retries, 0);
    assert_eq!(status.last_oom.unwrap().kind, "HostOutOfMemory");
    let c = condition(&tj, "OutOfMemory").unwrap();
    assert_eq!(c.reason, "HostOutOfMemory");
    assert!(c.message.contains("host RAM"), "{}", c.message);
    assert!(server.get::<Job>(Some(NS), "host-1").is_none());
    assert!(server.objects::<MemoryProfile>().is_empty());
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_reconcile_creates_no_second_job_and_loses_no_status() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 8, 79));
    let first = Replica::start(&server, "op-a");
    server.put(&training_job("train", &lora_8b(1, "full", "{}")));
    wait_job(&server, "train-0").await;
    let before = wait_phase(&server, "train", Phase::Admitted).await;
    first.crash();

    // The decision was recorded but the Job is lost (as if the crash came
    // between the status write and the create): the next leader makes
    // exactly the recorded Job.
    assert!(server.delete::<Job>(Some(NS), "train-0"));
    let second = Replica::start(&server, "op-b");
    let job = wait_job(&server, "train-0").await;
    assert_eq!(
        env_of(&job, "VRAMGUARD_MICRO_BATCH_SIZE").as_deref(),
        Some("1")
    );
    // A graceful stop lets the reconcile in flight finish.
    second.stop().await;
    let seen = server.requests().len();
    let third = Replica::start(&server, "op-c");
    // The third replica leads and reads the recorded attempt's Job (the read its step of
    // the admitted job starts with); stopped, its reconcile has ended.
    let job_path = format!("/apis/batch/v1/namespaces/{NS}/jobs/train-0");
    eventually("op-c to reconcile train", || async {
        server.requests()[seen..]
            .iter()
            .any(|r| r.method == axum::http::Method::GET && r.path == job_path)
            .then_some(())
    })
    .await;
    third.stop().await;
    let jobs: Vec<Job> = server.objects::<Job>();
    assert_eq!(
        jobs.len(),
        1,
        "{:?}",
        jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
    );
    let after = tj_of(&server, "train").unwrap();
    let (b, a) = (before.status.unwrap(), after.status.unwrap());
    assert_eq!(a.placement, b.placement);
    assert_eq!(a.plan, b.plan);
    assert_eq!(a.job_name, b.job_name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 8, 79));
    let a = Replica::start(&server, "op-a");
    let lease = || server.get::<Lease>(Some("vramguard-system"), "vramguard-operator");
    let holder = || lease().and_then(|l| l.spec?.holder_identity);
    eventually("a leader", || async { holder() }).await;
    let b = Replica::start(&server, "op-b");
    // Renewals by the holder until a whole lease duration after the second replica
    // started: had the first stopped renewing, the second would have taken over.
    let renewed = || lease().and_then(|l| l.spec?.renew_time).map(|t| t.0);
    let b_started = renewed().expect("a renewal time");
    let duration = fast_lease("op-a").lease_duration;
    eventually("renewals for a lease duration", || async {
        let span_ms = renewed()?.as_millisecond() - b_started.as_millisecond();
        (span_ms > duration.as_millis() as i64).then_some(())
    })
    .await;
    assert_eq!(
        holder().as_deref(),
        Some("op-a"),
        "the first holder keeps renewing"
    );
    server.put(&training_job("one", &lora_8b(1, "full", "{}")));
    wait_job(&server, "one-0").await;

    // The leader crashes without releasing: the other takes over once the
    // lease expires, and only then acts.
    a.crash();
    eventually("op-b to lead", || async {
        (holder().as_deref() == Some("op-b")).then_some(())
    })
    .await;
    server.put(&training_job("two", &lora_8b(1, "full", "{}")));
    wait_job(&server, "two-0").await;
    assert_eq!(server.objects::<Job>().len(), 2);
    let lease = server
        .get::<Lease>(Some("vramguard-system"), "vramguard-operator")
        .unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));
    b.stop().await;
    // A graceful stop gives the Lease up.
    assert_eq!(holder(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_releases_the_reservation() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&big("first"));
    wait_job(&server, "first-0").await;
    server.put(&big("second"));
    eventually("second to wait", || async {
        let tj = tj_of(&server, "second")?;
        (condition(&tj, "Placed")?.reason == "WaitingForCapacity").then_some(())
    })
    .await;
    // kubectl delete: the finalizer holds the object until the operator
    // has released the reservation.
    assert!(server.delete::<TrainingJob>(Some(NS), "first"));
    eventually("first to go", || async {
        tj_of(&server, "first").is_none().then_some(())
    })
    .await;
    eventually("the first Job to be collected", || async {
        server
            .get::<Job>(Some(NS), "first-0")
            .is_none()
            .then_some(())
    })
    .await;
    wait_job(&server, "second-0").await;
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_queues_multi_node_gets_an_indexed_job_bad_specs_are_rejected() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 8, 79));
    server.put(&gpu_node("gpu-b", 8, 79));
    server.put(&gpu_node("gpu-c", 8, 79));
    let replica = Replica::start(&server, "op-a");

    let mut queued = training_job("queued", &lora_8b(1, "full", "{}"));
    queued.metadata.labels = Some(
        [(
            "kueue.x-k8s.io/queue-name".to_string(),
            "team-a".to_string(),
        )]
        .into(),
    );
    server.put(&queued);
    let job = wait_job(&server, "queued-0").await;
    assert_eq!(job.labels()["kueue.x-k8s.io/queue-name"], "team-a");
    assert_eq!(job.spec.as_ref().unwrap().suspend, Some(true));
    let tj = eventually("Queued", || async {
        let tj = tj_of(&server, "queued")?;
        condition(&tj, "Queued").is_some().then_some(tj)
    })
    .await;
    assert_eq!(tj.status.unwrap().phase, Some(Phase::Admitted));

    let multi = format!(
        "model: {{preset: llama-3.1-8b}}
training: {{mode: full, microBatchSize: 1, sequenceLength: 2048, precision: bf16-mixed, optimizer: adamw, attention: flash}}
parallelism: {{gpus: 16, gpusPerNode: 8, strategy: fsdp, zeroStage: 3}}
{TEMPLATE}"
    );
    server.put(&training_job("wide", &multi));
    let job = wait_job(&server, "wide-0").await;
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    assert_eq!(spec.completions, Some(2));
    assert_eq!(
        env_of(&job, "MASTER_ADDR").as_deref(),
        Some("wide-0-0.wide-0")
    );
    assert_eq!(env_of(&job, "WORLD_SIZE").as_deref(), Some("16"));
    assert_eq!(env_of(&job, "NPROC_PER_NODE").as_deref(), Some("8"));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.subdomain.as_deref(), Some("wide-0"));
    assert_eq!(
        pod.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["nvidia.com/gpu"]
            .0,
        "8"
    );
    let svc = eventually("the headless Service", || async {
        server.get::<Service>(Some(NS), "wide-0")
    })
    .await;
    assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    let placement = tj_of(&server, "wide")
        .unwrap()
        .status
        .unwrap()
        .placement
        .unwrap();
    assert_eq!(placement.devices.len(), 2);

    let bad = format!(
        "model: {{transformer: {{layers: 2, hiddenSize: 64, attentionHeads: 6, kvHeads: 4, vocabSize: 100}}}}
training: {{microBatchSize: 1, sequenceLength: 16}}
{TEMPLATE}"
    );
    server.put(&training_job("bad", &bad));
    let tj = wait_phase(&server, "bad", Phase::Rejected).await;
    let c = condition(&tj, "Validated").unwrap();
    assert_eq!(c.reason, "InvalidSpec");
    assert!(c.message.contains("kvHeads"), "{}", c.message);

    let huge = "model: {preset: llama-3.1-405b}
training: {mode: full, microBatchSize: 1, sequenceLength: 4096}
template: {spec: {containers: [{name: t, image: x}]}}";
    server.put(&training_job("huge", huge));
    let tj = wait_phase(&server, "huge", Phase::Rejected).await;
    assert_eq!(condition(&tj, "Placed").unwrap().reason, "DoesNotFit");
    assert!(server.get::<Job>(Some(NS), "huge-0").is_none());
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragmented_oom_first_retries_with_expandable_segments() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let replica = Replica::start(&server, "op-a");
    server.put(&training_job(
        "frag",
        &lora_8b(
            2,
            "none",
            "{mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}",
        ),
    ));
    let job0 = wait_job(&server, "frag-0").await;
    // 6 GiB reserved but unallocated, 2 GiB asked for: the memory was there.
    let fragmented = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.80 GiB memory in use. Of the allocated memory 71.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved by PyTorch but unallocated.";
    failed_pod(&server, "frag", 0, "Error", 1, fragmented);
    job_failed(&server, "frag-0");
    let job1 = wait_job(&server, "frag-1").await;
    assert_eq!(
        env_of(&job1, "PYTORCH_CUDA_ALLOC_CONF").as_deref(),
        Some("expandable_segments:True")
    );
    // Nothing else changes on this retry.
    for var in [
        "VRAMGUARD_MICRO_BATCH_SIZE",
        "VRAMGUARD_GRADIENT_CHECKPOINTING",
    ] {
        assert_eq!(env_of(&job1, var), env_of(&job0, var), "{var}");
    }
    let status = tj_of(&server, "frag").unwrap().status.unwrap();
    let learned = status.learned.unwrap();
    assert!(learned.expandable_segments);
    assert_eq!(learned.scale, 1.0);
    assert!(status.plan.unwrap().expandable_segments);
    replica.stop().await;
}
