//! The Kueue AdmissionCheck controller against a real kube-apiserver
//! (`tests/cluster/cluster.sh`) with Kueue's CRDs (v0.17.0, vendored under
//! tests/data/kueue/) applied: the API server enforces their schemas and CEL
//! rules on every write, the controller's status patches included. Kueue
//! itself does not run: the test reserves quota as Kueue does, by writing the
//! Workload's `status.admission`. tests/e2e_kueue_real.rs runs Kueue itself.

#[path = "support/cluster.rs"]
mod cluster;

use std::time::Duration;

use axum::http::Method;
use cluster::JSON;
use kube::Client;
use serde_json::{Value, json};
use vramguard::api::parse;
use vramguard::kueue;

const TEST: &str = "e2e_kueue";
const NS: &str = "e2e-kueue";

fn yaml(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(cluster::root().join(path)).unwrap();
    parse::documents(&text).unwrap()
}

async fn post(client: &Client, path: &str, body: &Value) -> Value {
    let a = cluster::send(client, Method::POST, path, JSON, body).await;
    assert!(
        a.status == 201 || a.status == 200,
        "POST {path}: {} {}",
        a.status,
        a.body
    );
    a.body
}

async fn merge_status(client: &Client, path: &str, status: Value) {
    let a = cluster::send(
        client,
        Method::PATCH,
        &format!("{path}/status"),
        "application/merge-patch+json",
        &json!({"status": status}),
    )
    .await;
    assert_eq!(a.status, 200, "PATCH {path}/status: {}", a.body);
}

/// Kueue's CRDs, applied and established.
async fn kueue_crds(client: &Client) {
    for file in [
        "kueue.x-k8s.io_workloads.yaml",
        "kueue.x-k8s.io_admissionchecks.yaml",
        "kueue.x-k8s.io_resourceflavors.yaml",
    ] {
        let mut crd = yaml(&format!("tests/data/kueue/{file}")).remove(0);
        // Kueue converts v1beta1 <-> v1beta2 (its storage) with its own webhook, which does
        // not run here; without it the API server stores v1beta1 writes as v1beta2 unconverted
        // and prunes v1beta1-only fields (spec.priorityClassSource), which Kueue's CEL rules
        // then miss. Stored as v1beta1, as Kueue up to v0.14 does, the rules see what was written.
        for v in crd["spec"]["versions"].as_array_mut().unwrap() {
            v["storage"] = json!(v["name"] == kueue::VERSION);
        }
        cluster::apply_crd(client, crd).await;
    }
    // Served once discovery has it.
    cluster::eventually("workloads served", 60, || async {
        let a = cluster::send(
            client,
            Method::GET,
            &format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads"),
            JSON,
            &Value::Null,
        )
        .await;
        a.status == 200
    })
    .await;
}

/// The TRL Job of the examples at `micro` and `accumulation`, suspended (as Kueue holds it).
fn trl_job(name: &str, micro: u64, accumulation: u64) -> Value {
    let mut job = yaml("examples/job-trl-sft-llama-3.1-8b.yaml").remove(0);
    let args = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
        .as_str()
        .unwrap()
        .replace(
            "--per_device_train_batch_size 8",
            &format!("--per_device_train_batch_size {micro}"),
        )
        .replace(
            "--gradient_accumulation_steps 2",
            &format!("--gradient_accumulation_steps {accumulation}"),
        );
    job["spec"]["template"]["spec"]["containers"][0]["args"][0] = json!(args);
    job["metadata"]["name"] = json!(name);
    job["metadata"]["namespace"] = json!(NS);
    job["spec"]["suspend"] = json!(true);
    job
}

/// The Job, its Workload listing check `vram-fit` Pending, and quota reserved on `flavor`;
/// returns the Workload's path.
async fn submit(client: &Client, job: &Value, flavor: &str) -> String {
    let job = post(client, &format!("/apis/batch/v1/namespaces/{NS}/jobs"), job).await;
    let name = job["metadata"]["name"].as_str().unwrap();
    let mut template = job["spec"]["template"].clone();
    template["metadata"] = json!({});
    let wl = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": format!("job-{name}"), "namespace": NS, "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": name,
            "uid": job["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 1, "template": template}]},
    });
    let path = format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads/job-{name}");
    post(
        client,
        &format!("/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads"),
        &wl,
    )
    .await;
    let stamp = "2026-11-22T12:00:00Z";
    merge_status(
        client,
        &path,
        json!({
            "admissionChecks": [{"name": "vram-fit", "state": "Pending", "lastTransitionTime": stamp, "message": ""}],
        }),
    )
    .await;
    merge_status(
        client,
        &path,
        json!({
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                            "message": "Quota reserved in ClusterQueue team-a", "lastTransitionTime": stamp}],
            "admission": {"clusterQueue": "team-a", "podSetAssignments": [{
                "name": "main", "count": 1,
                "flavors": {"nvidia.com/gpu": flavor},
                "resourceUsage": {"nvidia.com/gpu": "8"}}]},
        }),
    )
    .await;
    path
}

async fn decided(client: &Client, path: &str) -> (String, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let wl = cluster::get_ok(client, path).await;
        let c = &wl["status"]["admissionChecks"][0];
        if c["state"] != "Pending" {
            return (
                c["state"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path}: vram-fit still Pending: {wl}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The one Event vramguard recorded on the Workload at `path`, checked to be of `reason`
/// and `type_`, by the controller, about the Workload.
async fn verdict_event(client: &Client, path: &str, reason: &str, type_: &str) -> Value {
    let wl = cluster::get_ok(client, path).await;
    let uid = wl["metadata"]["uid"].as_str().unwrap();
    let e = cluster::event_regarding(client, NS, uid, Some(reason)).await;
    assert_eq!(e["type"], type_, "{e}");
    assert_eq!(e["reportingController"], "vramguard-kueue", "{e}");
    assert_eq!(e["regarding"]["kind"], "Workload", "{e}");
    assert_eq!(e["regarding"]["name"], wl["metadata"]["name"], "{e}");
    let all = cluster::events_regarding(client, NS, uid).await;
    assert_eq!(all.len(), 1, "one Event per decision: {all:?}");
    assert!(e["series"].is_null(), "published once: {e}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_are_judged_on_a_real_api_server_with_kueues_crds() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let Some(client) = cluster::connect(TEST).await else {
        return;
    };
    // Kueue's own install (`cluster.sh kueue-up`, for tests/e2e_kueue_real.rs) converts its
    // CRDs with its webhook; the copies applied here, without one, would replace them.
    let installed = cluster::send(
        &client,
        Method::GET,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.kueue.x-k8s.io",
        JSON,
        &Value::Null,
    )
    .await;
    if installed.body["spec"]["conversion"]["strategy"] == "Webhook" {
        let _: Option<()> = cluster::absent(
            TEST,
            "Kueue itself is installed on this control plane (`cluster.sh kueue-up`); this \
             test plays Kueue with its CRDs alone: run it before `kueue-up`, or after \
             `tests/cluster/cluster.sh down && tests/cluster/cluster.sh up`",
        );
        return;
    }
    cluster::namespace(&client, NS, json!({})).await;
    kueue_crds(&client).await;
    for (name, ctl) in [
        ("vram-fit", kueue::CONTROLLER_NAME),
        ("capacity", "kueue.x-k8s.io/provisioning-request"),
    ] {
        let a = cluster::send(
            &client,
            Method::POST,
            "/apis/kueue.x-k8s.io/v1beta1/admissionchecks",
            JSON,
            &json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
                    "metadata": {"name": name}, "spec": {"controllerName": ctl}}),
        )
        .await;
        assert!(a.status == 201 || a.status == 409, "{}", a.body);
    }
    let a = cluster::send(
        &client,
        Method::POST,
        "/apis/kueue.x-k8s.io/v1beta1/resourceflavors",
        JSON,
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
                "metadata": {"name": "h100"},
                "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}),
    )
    .await;
    assert!(a.status == 201 || a.status == 409, "{}", a.body);

    let controller = cluster::KueueController::start(&client);

    // Our check is marked Active; the other controller's is not touched.
    cluster::eventually("vram-fit Active", 30, || async {
        let c = cluster::get_ok(
            &client,
            "/apis/kueue.x-k8s.io/v1beta1/admissionchecks/vram-fit",
        )
        .await;
        c["status"]["conditions"][0]["type"] == "Active"
            && c["status"]["conditions"][0]["status"] == "True"
    })
    .await;
    let other = cluster::get_ok(
        &client,
        "/apis/kueue.x-k8s.io/v1beta1/admissionchecks/capacity",
    )
    .await;
    assert!(other["status"].get("conditions").is_none(), "{other}");

    let suffix = std::process::id();
    let big = submit(
        &client,
        &trl_job(&format!("sft-big-{suffix}"), 8, 2),
        "h100",
    )
    .await;
    let (state, m) = decided(&client, &big).await;
    assert_eq!(state, "Rejected", "{m}");
    assert!(m.contains("`--per_device_train_batch_size 8 → "), "{m}");
    // The verdict is an Event on the Workload too, once: what `kubectl describe workload`
    // shows after Kueue has reset the check.
    let e = verdict_event(&client, &big, "VramRejected", "Warning").await;
    let note = e["note"].as_str().unwrap_or("");
    assert!(note.contains("`--per_device_train_batch_size 8 → "), "{e}");
    if m.len() <= 1024 {
        assert_eq!(note, m, "{e}");
    }
    let nums: Vec<u64> = m
        .split(" → ")
        .skip(1)
        .take(2)
        .map(|s| s.split('`').next().unwrap().trim().parse().unwrap())
        .collect();
    let fixed = submit(
        &client,
        &trl_job(&format!("sft-fixed-{suffix}"), nums[0], nums[1]),
        "h100",
    )
    .await;
    let (state, m) = decided(&client, &fixed).await;
    assert_eq!(state, "Ready", "{m}");
    let e = verdict_event(&client, &fixed, "VramFit", "Normal").await;
    assert_eq!(e["note"], m, "{e}");

    controller.stop().await;
}
