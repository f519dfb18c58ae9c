//! The agent and the operator against a real API server and Job controller
//! (`tests/cluster/cluster.sh`), each with its own ServiceAccount from the chart:
//!
//! - the agent (`--simulate`) publishes its node's `GpuNode` by server-side apply with the
//!   agent's token and RBAC;
//! - `vramguard serve` (webhook and operator) runs with the controller's token: it places a
//!   TrainingJob and creates its Job; kube-controller-manager's Job controller creates the
//!   Pod;
//! - a small kubelet of this test binds each Pod to the node and ends it: the first attempt
//!   dies with PyTorch's CUDA out-of-memory message in its termination message, the next
//!   succeeds; the operator retries smaller and records a `MemoryProfile`.
//!
//! No scheduler runs: the test kubelet binds the Pods itself (`pods/binding`).

#[path = "support/cluster.rs"]
mod cluster;

use std::time::Duration;

use axum::http::Method;
use cluster::{JSON, RELEASE, RELEASE_NS};
use kube::Client;
use serde_json::{Value, json};

const TEST: &str = "e2e_operator";
const NS: &str = "e2e-operator";
const NODE: &str = "gpu-e2e-a";

/// PyTorch's message: 78.12 GiB in use + 2 GiB tried, with little reserved slack.
const TORCH_OOM: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.";

const GPUS: &str = "driverVersion: 570.124.06
cudaVersion: \"12.8\"
gpus:
  - product: h100-80gb
    count: 2
";

const JOB: &str = "apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata: {name: ft}
spec:
  model: {preset: llama-3.1-8b}
  training: {mode: lora, microBatchSize: 4, globalBatchSize: 32, sequenceLength: 2048, attention: flash}
  fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}
  template:
    spec:
      containers: [{name: trainer, image: trainer:1}]
";

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn get(client: &Client, path: impl AsRef<str>) -> Option<Value> {
    let path = path.as_ref();
    let a = cluster::send(client, Method::GET, path, JSON, &Value::Null).await;
    match a.status {
        200 => Some(a.body),
        404 => None,
        s => panic!("GET {path}: {s} {}", a.body),
    }
}

/// The node, Ready, with two GPUs, as a kubelet registers it.
async fn register_node(client: &Client) {
    let path = format!("/api/v1/nodes/{NODE}");
    if get(client, &path).await.is_some() {
        cluster::send(client, Method::DELETE, &path, JSON, &Value::Null).await;
        cluster::eventually("the old node to go", 30, || async {
            get(client, &path).await.is_none()
        })
        .await;
    }
    let resources = json!({"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "2"});
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE,
                                              "nvidia.com/gpu.present": "true"}},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [ready_condition()],
        }
    });
    let a = cluster::send(client, Method::POST, "/api/v1/nodes", JSON, &node).await;
    assert_eq!(a.status, 201, "{}", a.body);
}

fn ready_condition() -> Value {
    json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
           "message": "the e2e test's kubelet", "lastHeartbeatTime": now(),
           "lastTransitionTime": now()})
}

/// What the test kubelet does, every 200 ms: heartbeats the node, binds the pods of the
/// TrainingJob's Jobs to it, and ends them: attempt 0 by GPU OOM, later ones with success.
async fn kubelet(client: Client) {
    let mut beat = tokio::time::Instant::now();
    loop {
        if beat.elapsed() > Duration::from_secs(5) {
            let patch = json!({"status": {"conditions": [ready_condition()]}});
            cluster::send(
                &client,
                Method::PATCH,
                &format!("/api/v1/nodes/{NODE}/status"),
                "application/strategic-merge-patch+json",
                &patch,
            )
            .await;
            beat = tokio::time::Instant::now();
        }
        let pods = get(
            &client,
            &format!("/api/v1/namespaces/{NS}/pods?labelSelector=vramguard.io%2Fattempt"),
        )
        .await
        .expect("the pod list");
        for pod in pods["items"].as_array().into_iter().flatten() {
            let name = pod["metadata"]["name"].as_str().expect("a name");
            let base = format!("/api/v1/namespaces/{NS}/pods/{name}");
            if pod["spec"]["nodeName"].is_null() {
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                                     "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
                cluster::send(
                    &client,
                    Method::POST,
                    &format!("{base}/binding"),
                    JSON,
                    &binding,
                )
                .await;
                continue;
            }
            let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
            if phase != "Pending" {
                continue;
            }
            let attempt = pod["metadata"]["labels"]["vramguard.io/attempt"]
                .as_str()
                .unwrap_or("0");
            let container = pod["spec"]["containers"][0]["name"].clone();
            let image = pod["spec"]["containers"][0]["image"].clone();
            let (phase, exit, message) = if attempt == "0" {
                ("Failed", 1, TORCH_OOM)
            } else {
                ("Succeeded", 0, "done")
            };
            let status = json!({"status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": container, "image": image, "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": exit, "reason": if exit == 0 { "Completed" } else { "Error" },
                                             "message": message,
                                             "startedAt": now(), "finishedAt": now()}}
                }]
            }});
            let a = cluster::send(
                &client,
                Method::PATCH,
                &format!("{base}/status"),
                "application/merge-patch+json",
                &status,
            )
            .await;
            // A conflict with the Job controller's own write is retried next round.
            if a.status != 200 {
                eprintln!("test kubelet: ending pod {name}: {} {}", a.status, a.body);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the cluster shows of the job, for a failure message.
async fn state(client: &Client) -> String {
    let tj = get(
        client,
        format!("/apis/vramguard.io/v1alpha1/namespaces/{NS}/trainingjobs/ft"),
    )
    .await;
    let gpunode = get(
        client,
        format!("/apis/vramguard.io/v1alpha1/gpunodes/{NODE}"),
    )
    .await;
    let node = get(client, format!("/api/v1/nodes/{NODE}")).await;
    let pods = get(client, format!("/api/v1/namespaces/{NS}/pods")).await;
    format!(
        "TrainingJob status: {}\nGpuNode spec: {}\nNode taints: {}\npods: {}",
        tj.map(|t| t["status"].clone()).unwrap_or_default(),
        gpunode.map(|g| g["spec"].clone()).unwrap_or_default(),
        node.map(|n| n["spec"]["taints"].clone())
            .unwrap_or_default(),
        pods.map(|p| p["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| format!(
                "{} {} {}",
                p["metadata"]["name"], p["spec"]["nodeName"], p["status"]["phase"]
            ))
            .collect::<Vec<_>>()
            .join(", "))
            .unwrap_or_default(),
    )
}

/// Waits up to `secs` for `probe` to give a value; on timeout fails with the cluster's state.
async fn until<T, F, Fut>(client: &Client, what: &str, secs: u64, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {secs} s waiting for {what}\n{}",
                state(client).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn env_of(job: &Value, name: &str) -> Option<String> {
    job["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_placed_run_by_the_job_controller_and_retried_smaller_after_a_gpu_oom() {
    let Some(client) = cluster::connect(TEST).await else {
        return;
    };
    let Some(helm) = cluster::helm(TEST) else {
        return;
    };
    cluster::install_chart(&client, &helm, &[]).await;
    let scratch = cluster::scratch(TEST);

    register_node(&client).await;
    let kubelet = tokio::spawn(kubelet(client.clone()));

    // The agent, with the agent's token: the chart's agent RBAC and nothing else.
    let agent_config = scratch.join("agent.kubeconfig");
    cluster::service_account_kubeconfig(&client, &format!("{RELEASE}-agent"), &agent_config).await;
    let gpus = scratch.join("gpus.yaml");
    std::fs::write(&gpus, GPUS).expect("gpus.yaml");
    let agent = std::process::Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args(["agent", "--simulate"])
        .arg(&gpus)
        .args([
            "--node-name",
            NODE,
            "--interval-secs",
            "2",
            "--listen",
            &format!("127.0.0.1:{}", cluster::free_port()),
            "--pod-resources-socket",
        ])
        .arg(scratch.join("no-kubelet.sock"))
        .env("KUBECONFIG", &agent_config)
        .stderr(std::fs::File::create(scratch.join("agent.log")).expect("a log"))
        .spawn()
        .expect("the agent starts");
    let _agent = cluster::Process(agent);
    let gpunode = format!("/apis/vramguard.io/v1alpha1/gpunodes/{NODE}");
    cluster::eventually("the agent's GpuNode", 60, || async {
        get(&client, &gpunode)
            .await
            .is_some_and(|g| g["status"]["gpuCount"] == 2)
    })
    .await;

    // TrainingJobs other tests left (tests/e2e_admission.rs admits the examples) would be
    // placed on this node too and hold its GPUs: they go first (those an earlier operator
    // holds by its finalizer go once this one runs).
    let all = get(&client, "/apis/vramguard.io/v1alpha1/trainingjobs")
        .await
        .expect("the TrainingJob list");
    for tj in all["items"].as_array().into_iter().flatten() {
        let (ns, name) = (&tj["metadata"]["namespace"], &tj["metadata"]["name"]);
        let path = format!(
            "/apis/vramguard.io/v1alpha1/namespaces/{}/trainingjobs/{}",
            ns.as_str().unwrap_or_default(),
            name.as_str().unwrap_or_default()
        );
        cluster::send(&client, Method::DELETE, &path, JSON, &Value::Null).await;
    }

    // What an earlier run learnt raises this run's estimates: the test starts from none.
    let profiles = "/apis/vramguard.io/v1alpha1/memoryprofiles";
    let a = cluster::send(&client, Method::DELETE, profiles, JSON, &Value::Null).await;
    assert_eq!(a.status, 200, "{}", a.body);

    // Webhook and operator, with the controller's token.
    let operator_config = scratch.join("operator.kubeconfig");
    cluster::service_account_kubeconfig(&client, RELEASE, &operator_config).await;
    let (_serve, port, ca_pem) = cluster::start_serve(
        &scratch,
        &[
            "--lease-namespace",
            RELEASE_NS,
            "--identity",
            "e2e-operator-a",
        ],
        &[("KUBECONFIG", &operator_config)],
    )
    .await;
    cluster::point_webhook_at(&client, port, &ca_pem).await;

    // A fresh namespace per run: what an earlier run left goes with the old one, once the
    // operator (running now) has let go of its TrainingJobs' finalizers.
    let ns_path = format!("/api/v1/namespaces/{NS}");
    if get(&client, &ns_path).await.is_some() {
        cluster::send(&client, Method::DELETE, &ns_path, JSON, &Value::Null).await;
        cluster::eventually("the old namespace to go", 120, || async {
            get(&client, &ns_path).await.is_none()
        })
        .await;
    }
    cluster::namespace(&client, NS, json!({})).await;
    let mut tj: Value = serde_saphyr::from_str(JOB).expect("the TrainingJob");
    tj["metadata"]["namespace"] = json!(NS);
    let tjs = format!("/apis/vramguard.io/v1alpha1/namespaces/{NS}/trainingjobs");
    // The webhook answers once its inventory has synced.
    until(&client, "the TrainingJob to be admitted", 60, || async {
        let a = cluster::send(&client, Method::POST, &tjs, JSON, &tj).await;
        (a.status == 201).then_some(())
    })
    .await;

    let jobs = format!("/apis/batch/v1/namespaces/{NS}/jobs");
    let first = until(&client, "Job ft-0 from the operator", 60, || {
        get(&client, format!("{jobs}/ft-0"))
    })
    .await;
    assert_eq!(
        first["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0],
        NODE,
        "placed on the agent's node: {first}"
    );
    let first_batch: u32 = env_of(&first, "VRAMGUARD_MICRO_BATCH_SIZE")
        .expect("the plan's micro-batch")
        .parse()
        .expect("a number");

    // The Job controller makes the pod, the test kubelet fails it with a GPU OOM, the Job
    // fails, and the operator retries with a smaller plan.
    let second = until(&client, "Job ft-1, the retry", 120, || {
        get(&client, format!("{jobs}/ft-1"))
    })
    .await;
    let first_failed = get(&client, &format!("{jobs}/ft-0")).await;
    if let Some(j) = first_failed {
        assert!(
            j["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Failed" && c["status"] == "True"),
            "the Job controller failed ft-0: {}",
            j["status"]
        );
    }
    let second_batch: u32 = env_of(&second, "VRAMGUARD_MICRO_BATCH_SIZE")
        .expect("the retry's micro-batch")
        .parse()
        .expect("a number");
    let checkpointing = env_of(&second, "VRAMGUARD_GRADIENT_CHECKPOINTING");
    assert!(
        second_batch < first_batch
            || checkpointing != env_of(&first, "VRAMGUARD_GRADIENT_CHECKPOINTING"),
        "the retry is smaller: micro-batch {first_batch} -> {second_batch}, checkpointing {checkpointing:?}"
    );

    let tj_path = format!("{tjs}/ft");
    let status = until(&client, "the TrainingJob to succeed", 120, || async {
        let status = get(&client, tj_path.clone()).await.expect("ft")["status"].clone();
        (status["phase"] == "Succeeded").then_some(status)
    })
    .await;
    assert_eq!(status["oomRetries"], 1, "{status}");
    assert_eq!(status["lastOom"]["attempt"], 0, "{status}");

    let profiles = get(&client, "/apis/vramguard.io/v1alpha1/memoryprofiles")
        .await
        .expect("the MemoryProfile list");
    assert!(
        profiles["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| !p["status"].is_null()),
        "a MemoryProfile records what the OOM proved: {profiles}"
    );
    kubelet.abort();
}
