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
//! - a multi-node TrainingJob (2 nodes x 2 GPUs): the operator creates an Indexed Job and
//!   its headless Service with the rendezvous variables, the Job controller makes one pod per
//!   completion index (hostname `<job>-<index>` under the Service), the test kubelet binds
//!   them to two different nodes and the job succeeds;
//! - leader election on the real Lease between two `vramguard serve` processes: the first
//!   leads and creates the Job of a first TrainingJob; killed (SIGKILL, no hand-over), the
//!   other takes the Lease once it expires and reconciles: a second TrainingJob gets its Job,
//!   the first one's deletion is finished (its finalizer removed).
//!
//! No scheduler runs: the test kubelet binds the Pods itself (`pods/binding`), to a node the
//! pod's required node affinity allows and no other pod of the same Job holds.

#[path = "support/cluster.rs"]
mod cluster;

use std::path::Path;
use std::time::Duration;

use axum::http::Method;
use cluster::{JSON, RELEASE, RELEASE_NS};
use kube::Client;
use serde_json::{Value, json};

const TEST: &str = "e2e_operator";
const NS: &str = "e2e-operator";
const NODE: &str = "gpu-e2e-a";

/// The tests of this file share the cluster's GPUs, the release and the Lease: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
async fn register_node(client: &Client, node: &str) {
    let path = format!("/api/v1/nodes/{node}");
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
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node,
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

/// The node a pod goes to: one its required node affinity names, of `nodes`, that no other
/// pod of the same Job is bound to (the operator's anti-affinity); None while none is free.
fn node_for(pod: &Value, pods: &[Value], nodes: &[&str]) -> Option<String> {
    let terms = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let allowed: Vec<&str> = terms
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["matchExpressions"].as_array().into_iter().flatten())
        .filter(|e| e["key"] == "kubernetes.io/hostname" && e["operator"] == "In")
        .flat_map(|e| e["values"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let job = &pod["metadata"]["labels"]["batch.kubernetes.io/job-name"];
    let taken: Vec<&str> = pods
        .iter()
        .filter(|p| &p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job)
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    nodes
        .iter()
        .find(|n| allowed.contains(n) && !taken.contains(n))
        .map(|n| n.to_string())
}

/// What the test kubelet does, every 200 ms, for `nodes` and namespace `ns`: heartbeats the
/// nodes, binds the pods of the TrainingJobs' Jobs ([`node_for`]), and ends them: with
/// `oom_first`, attempt 0 by GPU OOM and later ones with success; else all with success.
async fn kubelet(client: Client, ns: &'static str, nodes: Vec<&'static str>, oom_first: bool) {
    let mut beat = tokio::time::Instant::now();
    loop {
        if beat.elapsed() > Duration::from_secs(5) {
            let patch = json!({"status": {"conditions": [ready_condition()]}});
            for node in &nodes {
                cluster::send(
                    &client,
                    Method::PATCH,
                    &format!("/api/v1/nodes/{node}/status"),
                    "application/strategic-merge-patch+json",
                    &patch,
                )
                .await;
            }
            beat = tokio::time::Instant::now();
        }
        let pods = get(
            &client,
            &format!("/api/v1/namespaces/{ns}/pods?labelSelector=vramguard.io%2Fattempt"),
        )
        .await
        .expect("the pod list");
        let pods = pods["items"].as_array().cloned().unwrap_or_default();
        for pod in &pods {
            let name = pod["metadata"]["name"].as_str().expect("a name");
            let base = format!("/api/v1/namespaces/{ns}/pods/{name}");
            if pod["spec"]["nodeName"].is_null() {
                let Some(node) = node_for(pod, &pods, &nodes) else {
                    continue;
                };
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                                     "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                cluster::send(
                    &client,
                    Method::POST,
                    &format!("{base}/binding"),
                    JSON,
                    &binding,
                )
                .await;
                // The next pod sees this one bound in the next round's list.
                break;
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
            let (phase, exit, message) = if oom_first && attempt == "0" {
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

/// What the cluster shows of the jobs, for a failure message.
async fn state(client: &Client) -> String {
    let list = |v: Option<Value>, f: &dyn Fn(&Value) -> String| {
        v.map(|l| {
            l["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(f)
                .collect::<Vec<_>>()
                .join("\n  ")
        })
        .unwrap_or_default()
    };
    let tjs = get(client, "/apis/vramguard.io/v1alpha1/trainingjobs").await;
    let gpunodes = get(client, "/apis/vramguard.io/v1alpha1/gpunodes").await;
    let pods = get(client, "/api/v1/pods?labelSelector=vramguard.io%2Fattempt").await;
    let lease = get(
        client,
        format!("/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/vramguard-operator"),
    )
    .await;
    format!(
        "TrainingJobs:\n  {}\nGpuNodes:\n  {}\npods:\n  {}\nLease: {}",
        list(tjs, &|t| format!(
            "{}/{}: {}",
            t["metadata"]["namespace"], t["metadata"]["name"], t["status"]
        )),
        list(gpunodes, &|g| format!(
            "{}: {} {}",
            g["metadata"]["name"], g["spec"], g["status"]["gpuCount"]
        )),
        list(pods, &|p| format!(
            "{} {} {}",
            p["metadata"]["name"], p["spec"]["nodeName"], p["status"]["phase"]
        )),
        lease.map(|l| l["spec"].clone()).unwrap_or_default(),
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

/// The agent (`--simulate`, two H100s) for `node`, with the agent's token: the chart's
/// agent RBAC and nothing else; returns once its GpuNode is published.
async fn start_agent(client: &Client, scratch: &Path, node: &str) -> cluster::Process {
    let agent_config = scratch.join(format!("agent-{node}.kubeconfig"));
    cluster::service_account_kubeconfig(client, &format!("{RELEASE}-agent"), &agent_config).await;
    let gpus = scratch.join("gpus.yaml");
    std::fs::write(&gpus, GPUS).expect("gpus.yaml");
    let agent = std::process::Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args(["agent", "--simulate"])
        .arg(&gpus)
        .args([
            "--node-name",
            node,
            "--interval-secs",
            "2",
            "--listen",
            &format!("127.0.0.1:{}", cluster::free_port()),
            "--pod-resources-socket",
        ])
        .arg(scratch.join("no-kubelet.sock"))
        .env("KUBECONFIG", &agent_config)
        .stderr(std::fs::File::create(scratch.join(format!("agent-{node}.log"))).expect("a log"))
        .spawn()
        .expect("the agent starts");
    let agent = cluster::Process(agent);
    let gpunode = format!("/apis/vramguard.io/v1alpha1/gpunodes/{node}");
    cluster::eventually("the agent's GpuNode", 60, || async {
        get(client, &gpunode)
            .await
            .is_some_and(|g| g["status"]["gpuCount"] == 2)
    })
    .await;
    agent
}

/// What earlier tests and runs left that would change this test's decisions goes:
/// TrainingJobs (placed on these nodes they would hold their GPUs; those an earlier
/// operator holds by its finalizer go once this one runs), MemoryProfiles (what an earlier run
/// learnt raises estimates), the GpuNodes of nodes other than `nodes` (agents no longer
/// running), and the operator's Lease (held by a process an earlier test killed: no operator
/// runs now).
async fn fresh(client: &Client, nodes: &[&str]) {
    let all = get(client, "/apis/vramguard.io/v1alpha1/trainingjobs")
        .await
        .expect("the TrainingJob list");
    for tj in all["items"].as_array().into_iter().flatten() {
        let (ns, name) = (&tj["metadata"]["namespace"], &tj["metadata"]["name"]);
        let path = format!(
            "/apis/vramguard.io/v1alpha1/namespaces/{}/trainingjobs/{}",
            ns.as_str().unwrap_or_default(),
            name.as_str().unwrap_or_default()
        );
        cluster::send(client, Method::DELETE, &path, JSON, &Value::Null).await;
    }
    let profiles = "/apis/vramguard.io/v1alpha1/memoryprofiles";
    let a = cluster::send(client, Method::DELETE, profiles, JSON, &Value::Null).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let gpunodes = get(client, "/apis/vramguard.io/v1alpha1/gpunodes")
        .await
        .expect("the GpuNode list");
    for g in gpunodes["items"].as_array().into_iter().flatten() {
        let name = g["metadata"]["name"].as_str().unwrap_or_default();
        if !nodes.contains(&name) {
            let path = format!("/apis/vramguard.io/v1alpha1/gpunodes/{name}");
            cluster::send(client, Method::DELETE, &path, JSON, &Value::Null).await;
        }
    }
    cluster::send(client, Method::DELETE, &lease_path(), JSON, &Value::Null).await;
}

fn lease_path() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/vramguard-operator")
}

/// Webhook and operator (`vramguard serve`) as `identity`, with the controller's token.
async fn start_operator(
    client: &Client,
    scratch: &Path,
    identity: &str,
) -> (cluster::Process, u16, String) {
    let dir = scratch.join(identity);
    std::fs::create_dir_all(&dir).expect("a directory");
    let operator_config = dir.join("operator.kubeconfig");
    cluster::service_account_kubeconfig(client, RELEASE, &operator_config).await;
    cluster::start_serve(
        &dir,
        &["--lease-namespace", RELEASE_NS, "--identity", identity],
        &[("KUBECONFIG", &operator_config)],
    )
    .await
}

/// A fresh namespace `ns`: what an earlier run left goes with the old one, once the operator
/// (running now) has let go of its TrainingJobs' finalizers.
async fn fresh_namespace(client: &Client, ns: &str) {
    let ns_path = format!("/api/v1/namespaces/{ns}");
    if get(client, &ns_path).await.is_some() {
        cluster::send(client, Method::DELETE, &ns_path, JSON, &Value::Null).await;
        cluster::eventually("the old namespace to go", 120, || async {
            get(client, &ns_path).await.is_none()
        })
        .await;
    }
    cluster::namespace(client, ns, json!({})).await;
}

/// Creates TrainingJob `yaml` (renamed `name`) in `ns`, retried until the webhook answers
/// (once its inventory has synced).
async fn submit(client: &Client, ns: &str, name: &str, yaml: &str) {
    let mut tj: Value = serde_saphyr::from_str(yaml).expect("the TrainingJob");
    tj["metadata"] = json!({"name": name, "namespace": ns});
    let tjs = format!("/apis/vramguard.io/v1alpha1/namespaces/{ns}/trainingjobs");
    until(
        client,
        &format!("TrainingJob {name} to be admitted"),
        60,
        || async {
            let a = cluster::send(client, Method::POST, &tjs, JSON, &tj).await;
            (a.status == 201).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_placed_run_by_the_job_controller_and_retried_smaller_after_a_gpu_oom() {
    let _serial = SERIAL.lock().await;
    let Some((client, _helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    let scratch = cluster::scratch(TEST);

    register_node(&client, NODE).await;
    let kubelet = tokio::spawn(kubelet(client.clone(), NS, vec![NODE], true));
    let _agent = start_agent(&client, &scratch, NODE).await;
    fresh(&client, &[NODE]).await;
    let (_serve, port, ca_pem) = start_operator(&client, &scratch, "e2e-operator-a").await;
    cluster::point_webhook_at(&client, port, &ca_pem).await;
    fresh_namespace(&client, NS).await;
    submit(&client, NS, "ft", JOB).await;
    let tjs = format!("/apis/vramguard.io/v1alpha1/namespaces/{NS}/trainingjobs");

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

const MULTI_NS: &str = "e2e-operator-multi";
const WIDE: &str = "apiVersion: vramguard.io/v1alpha1
kind: TrainingJob
metadata: {name: wide}
spec:
  model: {preset: llama-3.1-8b}
  training: {mode: lora, microBatchSize: 2, globalBatchSize: 32, sequenceLength: 2048, attention: flash}
  parallelism: {gpus: 4, gpusPerNode: 2}
  fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}
  template:
    spec:
      containers: [{name: trainer, image: trainer:1}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_node_job_gets_an_indexed_job_its_service_and_one_pod_per_node() {
    let _serial = SERIAL.lock().await;
    let Some((client, _helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    let scratch = cluster::scratch("e2e_operator_multi_node");
    let nodes = ["gpu-e2e-b", "gpu-e2e-c"];
    for node in nodes {
        register_node(&client, node).await;
    }
    let kubelet = tokio::spawn(kubelet(client.clone(), MULTI_NS, nodes.to_vec(), false));
    let _agents = [
        start_agent(&client, &scratch, nodes[0]).await,
        start_agent(&client, &scratch, nodes[1]).await,
    ];
    fresh(&client, &nodes).await;
    let (_serve, port, ca_pem) = start_operator(&client, &scratch, "e2e-operator-multi").await;
    cluster::point_webhook_at(&client, port, &ca_pem).await;
    fresh_namespace(&client, MULTI_NS).await;
    submit(&client, MULTI_NS, "wide", WIDE).await;

    let job = until(&client, "Job wide-0 from the operator", 60, || {
        get(
            &client,
            format!("/apis/batch/v1/namespaces/{MULTI_NS}/jobs/wide-0"),
        )
    })
    .await;
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed", "{spec}");
    assert_eq!(spec["completions"], 2, "{spec}");
    assert_eq!(spec["parallelism"], 2, "{spec}");
    for (var, want) in [
        ("MASTER_ADDR", "wide-0-0.wide-0"),
        ("MASTER_PORT", "29500"),
        ("WORLD_SIZE", "4"),
        ("NNODES", "2"),
        ("NPROC_PER_NODE", "2"),
    ] {
        assert_eq!(env_of(&job, var).as_deref(), Some(want), "{var}: {spec}");
    }
    let pod_spec = &spec["template"]["spec"];
    assert_eq!(pod_spec["subdomain"], "wide-0", "{pod_spec}");
    assert_eq!(
        pod_spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2",
        "{pod_spec}"
    );
    let svc = until(&client, "the headless Service wide-0", 30, || {
        get(
            &client,
            format!("/api/v1/namespaces/{MULTI_NS}/services/wide-0"),
        )
    })
    .await;
    assert_eq!(svc["spec"]["clusterIP"], "None", "{svc}");
    assert_eq!(svc["spec"]["ports"][0]["port"], 29500, "{svc}");

    // The Job controller: one pod per completion index, each named for its index under the
    // Service, bound by the test kubelet to its own node.
    let pods_path = format!(
        "/api/v1/namespaces/{MULTI_NS}/pods?labelSelector=batch.kubernetes.io%2Fjob-name%3Dwide-0"
    );
    let pods = until(&client, "two pods of wide-0 bound to nodes", 60, || async {
        let list = get(&client, &pods_path).await?;
        let pods = list["items"].as_array()?.clone();
        (pods.len() == 2 && pods.iter().all(|p| p["spec"]["nodeName"].is_string())).then_some(pods)
    })
    .await;
    let mut seen = Vec::new();
    for pod in &pods {
        let index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .expect("a completion index")
            .to_string();
        assert_eq!(pod["spec"]["hostname"], format!("wide-0-{index}"), "{pod}");
        assert_eq!(pod["spec"]["subdomain"], "wide-0", "{pod}");
        // NODE_RANK is the pod's own index, read from the annotation by the kubelet.
        let rank = pod["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "NODE_RANK")
            .expect("NODE_RANK")["valueFrom"]["fieldRef"]["fieldPath"]
            .clone();
        assert_eq!(
            rank,
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        seen.push((index, pod["spec"]["nodeName"].as_str().unwrap().to_string()));
    }
    seen.sort();
    assert_eq!(
        seen.iter().map(|(i, _)| i.as_str()).collect::<Vec<_>>(),
        ["0", "1"]
    );
    assert_ne!(seen[0].1, seen[1].1, "one pod per node: {seen:?}");

    let tj_path = format!("/apis/vramguard.io/v1alpha1/namespaces/{MULTI_NS}/trainingjobs/wide");
    let status = until(&client, "wide to succeed", 60, || async {
        let status = get(&client, &tj_path).await.expect("wide")["status"].clone();
        (status["phase"] == "Succeeded").then_some(status)
    })
    .await;
    let mut placed: Vec<String> = status["placement"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["node"].as_str().unwrap_or_default().to_string())
        .collect();
    placed.sort();
    let mut bound: Vec<String> = seen.into_iter().map(|(_, n)| n).collect();
    bound.sort();
    assert_eq!(
        placed, bound,
        "the pods run where the operator placed them: {status}"
    );
    kubelet.abort();
}

const LEADER_NS: &str = "e2e-operator-leader";

/// Who holds the operator's Lease, and how often it changed hands.
async fn lease(client: &Client) -> (Option<String>, i64) {
    let lease = get(client, lease_path()).await.unwrap_or_default();
    let spec = &lease["spec"];
    (
        spec["holderIdentity"].as_str().map(str::to_string),
        spec["leaseTransitions"].as_i64().unwrap_or(0),
    )
}

/// The replica that published `reason` about TrainingJob `name` (events.k8s.io/v1).
async fn reported_by(client: &Client, name: &str, reason: &str) -> Option<String> {
    let events = get(
        client,
        format!("/apis/events.k8s.io/v1/namespaces/{LEADER_NS}/events"),
    )
    .await?;
    events["items"]
        .as_array()?
        .iter()
        .find(|e| e["regarding"]["name"] == name && e["reason"] == reason)
        .and_then(|e| e["reportingInstance"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leader_is_killed_the_other_operator_takes_the_lease_and_reconciles() {
    let _serial = SERIAL.lock().await;
    let Some((client, _helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    let scratch = cluster::scratch("e2e_operator_leader");
    let node = "gpu-e2e-l";
    register_node(&client, node).await;
    let _agent = start_agent(&client, &scratch, node).await;
    fresh(&client, &[node]).await;

    let (mut a, _, _) = start_operator(&client, &scratch, "e2e-leader-a").await;
    until(&client, "e2e-leader-a to hold the Lease", 30, || async {
        (lease(&client).await.0.as_deref() == Some("e2e-leader-a")).then_some(())
    })
    .await;
    let (_b, port, ca_pem) = start_operator(&client, &scratch, "e2e-leader-b").await;
    cluster::point_webhook_at(&client, port, &ca_pem).await;
    fresh_namespace(&client, LEADER_NS).await;

    let jobs = format!("/apis/batch/v1/namespaces/{LEADER_NS}/jobs");
    submit(&client, LEADER_NS, "one", JOB).await;
    until(&client, "Job one-0", 60, || {
        get(&client, format!("{jobs}/one-0"))
    })
    .await;
    let created = until(&client, "the JobCreated event of one", 30, || {
        reported_by(&client, "one", "JobCreated")
    })
    .await;
    assert_eq!(created, "e2e-leader-a", "the leader created the Job");
    let (holder, transitions) = lease(&client).await;
    assert_eq!(
        holder.as_deref(),
        Some("e2e-leader-a"),
        "the follower waits while the leader renews"
    );

    // SIGKILL: no hand-over; the Lease runs out (15 s) and the follower takes it.
    a.0.kill().expect("kill the leader");
    a.0.wait().expect("the leader exits");
    let killed = std::time::Instant::now();
    until(&client, "e2e-leader-b to take the Lease", 40, || async {
        (lease(&client).await.0.as_deref() == Some("e2e-leader-b")).then_some(())
    })
    .await;
    eprintln!(
        "e2e-leader-b took the Lease {:.1} s after the leader was killed",
        killed.elapsed().as_secs_f64()
    );
    assert!(
        lease(&client).await.1 > transitions,
        "the Lease records the change of holder"
    );

    // The new leader reconciles: a new job gets its Job, the first job's deletion finishes.
    submit(&client, LEADER_NS, "two", JOB).await;
    until(&client, "Job two-0 from the new leader", 60, || {
        get(&client, format!("{jobs}/two-0"))
    })
    .await;
    let created = until(&client, "the JobCreated event of two", 30, || {
        reported_by(&client, "two", "JobCreated")
    })
    .await;
    assert_eq!(created, "e2e-leader-b");
    let one = format!("/apis/vramguard.io/v1alpha1/namespaces/{LEADER_NS}/trainingjobs/one");
    cluster::send(&client, Method::DELETE, &one, JSON, &Value::Null).await;
    until(
        &client,
        "one's finalizer to be removed by the new leader",
        30,
        || async { get(&client, &one).await.is_none().then_some(()) },
    )
    .await;
}
