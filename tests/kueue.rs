//! The Kueue AdmissionCheck controller against the in-memory API server,
//! through kube's client over HTTP, with Kueue's own CRDs (v0.17.0, vendored
//! under tests/data/kueue/): every AdmissionCheck and Workload the controller
//! wrote is checked against the CRDs' `v1beta1` schema.
//!
//! The test plays Kueue's part: it creates the AdmissionChecks, the
//! ResourceFlavors and the Workloads (pod sets copied from the examples'
//! Jobs, owned by them), and reserves quota by writing `status.admission`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use vramguard::api::{parse, structural};
use vramguard::apiserver::ApiServer;
use vramguard::inventory::{Snapshot, Source, Static};
use vramguard::kueue::{self, controller};

const NS: &str = "ml-training";
const GIB: u64 = 1 << 30;

fn repo(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn yaml(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo(path)).unwrap();
    parse::documents(&text).unwrap()
}

/// The `v1beta1` schema of a vendored Kueue CRD.
fn schema(file: &str) -> Value {
    let crd = yaml(&format!("tests/data/kueue/{file}")).remove(0);
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == kueue::VERSION)
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .unwrap()
}

/// `obj` as the API server would store it, or the schema's complaints.
fn valid(obj: &Value, schema: &Value) {
    let errs = structural::check(obj, schema, "");
    assert!(errs.is_empty(), "against Kueue's CRD: {errs:?}\n{obj:#}");
}

/// An inventory the test changes under the controller.
struct Switch(Mutex<Snapshot>);

impl Source for Switch {
    fn snapshot(&self) -> Snapshot {
        self.0.lock().unwrap().clone()
    }
}

fn inventory(h100_free_gib: Option<u64>) -> Snapshot {
    let mut nodes = vramguard::cli::serve::read_cluster(&repo("examples/cluster.yaml")).unwrap();
    if let Some(free) = h100_free_gib {
        for n in &mut nodes {
            if n.metadata.name.as_deref() != Some("gpu-h100-a") {
                continue;
            }
            for g in &mut n.status.as_mut().unwrap().gpus {
                g.free_bytes = free * GIB;
                g.largest_free_block_bytes = Some(free * GIB);
                g.used_bytes = g.total_bytes - free * GIB;
            }
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    Static::new(nodes, now).snapshot()
}

fn example(name: &str) -> Value {
    yaml(&format!("examples/{name}")).remove(0)
}

/// The TRL Job of the examples at `micro` per device and `accumulation`.
fn trl_job(name: &str, micro: u64, accumulation: u64) -> Value {
    let mut job = example("job-trl-sft-llama-3.1-8b.yaml");
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
    job
}

struct Kueue {
    _server: ApiServer,
    client: kube::Client,
    wl: Api<DynamicObject>,
    ac: Api<DynamicObject>,
    rf: Api<DynamicObject>,
    jobs: Api<DynamicObject>,
    wl_schema: Value,
}

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn value(o: DynamicObject) -> Value {
    serde_json::to_value(o).unwrap()
}

impl Kueue {
    async fn job(&self, job: &Value) -> Value {
        value(
            self.jobs
                .create(&PostParams::default(), &dynamic(job.clone()))
                .await
                .unwrap(),
        )
    }

    /// Kueue's Workload for `job` (created first) listing `checks` as Pending.
    async fn workload(&self, job: &Value, checks: &[&str]) -> String {
        let job = self.job(job).await;
        let name = format!("job-{}", job["metadata"]["name"].as_str().unwrap());
        let mut template = job["spec"]["template"].clone();
        // Kueue copies the pod template, not the Job's annotations.
        template["metadata"] = json!({});
        let wl = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": NS,
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job",
                    "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "queueName": "team-a",
                "podSets": [{"name": "main", "count": job["spec"].get("parallelism").cloned().unwrap_or(json!(1)), "template": template}],
            },
        });
        valid(&wl, &self.wl_schema);
        self.wl
            .create(&PostParams::default(), &dynamic(wl))
            .await
            .unwrap();
        let stamp = "2026-11-22T12:00:00Z";
        let states: Vec<Value> = checks
            .iter()
            .map(|c| json!({"name": c, "state": "Pending", "lastTransitionTime": stamp, "message": ""}))
            .collect();
        self.status(&name, json!({"admissionChecks": states})).await;
        name
    }

    /// Kueue reserves quota: `flavor` for the GPUs of pod set `main`.
    async fn reserve(&self, name: &str, flavor: &str) {
        self.status(
            name,
            json!({
                "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                                "message": "Quota reserved in ClusterQueue team-a",
                                "lastTransitionTime": "2026-11-22T12:00:01Z"}],
                "admission": {"clusterQueue": "team-a", "podSetAssignments": [{
                    "name": "main", "count": 1,
                    "flavors": {"cpu": "default", "nvidia.com/gpu": flavor},
                    "resourceUsage": {"cpu": "8", "nvidia.com/gpu": "8"},
                }]},
            }),
        )
        .await;
    }

    async fn status(&self, name: &str, status: Value) {
        self.wl
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
            .unwrap();
    }

    async fn get(&self, name: &str) -> Value {
        value(self.wl.get(name).await.unwrap())
    }

    /// The state and message of check `check` once it leaves Pending.
    async fn decided(&self, name: &str, check: &str) -> (String, String, Value) {
        for _ in 0..200 {
            let wl = self.get(name).await;
            let c = wl["status"]["admissionChecks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == check)
                .unwrap()
                .clone();
            if c["state"] != "Pending" {
                valid(&wl, &self.wl_schema);
                return (
                    c["state"].as_str().unwrap().to_string(),
                    c["message"].as_str().unwrap().to_string(),
                    wl,
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{name}: {check} still Pending: {:#}", self.get(name).await);
    }

    /// The Event of `reason` vramguard recorded on Workload `name`, once it is there.
    async fn event(&self, name: &str, reason: &str) -> Value {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), NS);
        for _ in 0..200 {
            let found = events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|e| serde_json::to_value(e).unwrap())
                .find(|e| e["regarding"]["name"] == name && e["reason"] == reason);
            if let Some(e) = found {
                assert_eq!(e["regarding"]["kind"], "Workload", "{e}");
                assert_eq!(e["reportingController"], "vramguard-kueue", "{e}");
                return e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{name}: no Event {reason}");
    }
}

async fn start(source: Arc<dyn Source>) -> (Kueue, tokio::sync::oneshot::Sender<()>) {
    let server = ApiServer::start().await;
    let client = server.client();
    let wl = Api::namespaced_with(client.clone(), NS, &controller::workloads());
    let ac = Api::all_with(client.clone(), &controller::admission_checks());
    let rf = Api::all_with(client.clone(), &controller::resource_flavors());
    let jobs = Api::namespaced_with(
        client.clone(),
        NS,
        &kube::api::ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&()),
    );
    let k = Kueue {
        _server: server,
        client: client.clone(),
        wl,
        ac,
        rf,
        jobs,
        wl_schema: schema("kueue.x-k8s.io_workloads.yaml"),
    };
    // Kueue's objects: two checks (one of another controller), two GPU flavors.
    let ac_schema = schema("kueue.x-k8s.io_admissionchecks.yaml");
    for (name, controller) in [
        ("vram-fit", kueue::CONTROLLER_NAME),
        ("capacity", "kueue.x-k8s.io/provisioning-request"),
    ] {
        let ac = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
                        "metadata": {"name": name}, "spec": {"controllerName": controller}});
        valid(&ac, &ac_schema);
        k.ac.create(&PostParams::default(), &dynamic(ac))
            .await
            .unwrap();
    }
    let rf_schema = schema("kueue.x-k8s.io_resourceflavors.yaml");
    for (name, product) in [
        ("h100", "NVIDIA-H100-80GB-HBM3"),
        ("a100-40gb", "NVIDIA-A100-SXM4-40GB"),
    ] {
        let rf = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
                        "metadata": {"name": name},
                        "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}}});
        valid(&rf, &rf_schema);
        k.rf.create(&PostParams::default(), &dynamic(rf))
            .await
            .unwrap();
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let config = controller::Config {
        retry_after: 30,
        wait_requeue: Duration::from_millis(100),
        ..controller::Config::default()
    };
    tokio::spawn(controller::run_controller(
        client,
        source,
        config,
        async move {
            let _ = stop_rx.await;
        },
    ));
    (k, stop_tx)
}

/// The two numbers after `->`/`→` in an advice, e.g. micro-batch and accumulation.
fn advice(m: &str) -> (u64, u64) {
    let nums: Vec<u64> = m
        .split(" → ")
        .skip(1)
        .take(2)
        .map(|s| s.split('`').next().unwrap().trim().parse().unwrap())
        .collect();
    (nums[0], nums[1])
}

#[tokio::test]
async fn workloads_are_ready_rejected_or_not_judged_on_their_flavors_product() {
    let source = Arc::new(Switch(Mutex::new(inventory(None))));
    let (k, stop) = start(source.clone()).await;

    // Our AdmissionCheck is marked Active (Kueue admits through active checks only); the
    // other controller's is left alone.
    let ac_schema = schema("kueue.x-k8s.io_admissionchecks.yaml");
    let mut active = Value::Null;
    for _ in 0..200 {
        active = value(k.ac.get("vram-fit").await.unwrap());
        if active["status"]["conditions"][0]["status"] == "True" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        active["status"]["conditions"][0]["type"], "Active",
        "{active}"
    );
    assert_eq!(active["status"]["conditions"][0]["status"], "True");
    valid(&active, &ac_schema);
    let other = value(k.ac.get("capacity").await.unwrap());
    assert!(
        other
            .get("status")
            .is_none_or(|s| s.get("conditions").is_none()),
        "{other}"
    );

    // Before quota is reserved nothing is judged: a workload created after it, with its
    // quota reserved, is decided while it stays Pending (the controller sees them in order,
    // and skipping one needs no API call where deciding the other needs several).
    let big = k
        .workload(&trl_job("sft-big", 8, 2), &["vram-fit", "capacity"])
        .await;
    let mut after = example("job-annotated-llama-3.1-8b-lora.yaml");
    after["metadata"]["name"] = json!("reserved-after");
    let after = k.workload(&after, &["vram-fit"]).await;
    k.reserve(&after, "h100").await;
    let (state, m, _) = k.decided(&after, "vram-fit").await;
    assert_eq!(state, "Ready", "{m}");
    let wl = k.get(&big).await;
    assert_eq!(
        wl["status"]["admissionChecks"][0]["state"], "Pending",
        "{wl}"
    );

    // On the H100 flavor: runs out of memory as written; rejected with the numbers and
    // the change in the script's own flags. The other controller's check is untouched.
    k.reserve(&big, "h100").await;
    let (state, m, wl) = k.decided(&big, "vram-fit").await;
    assert_eq!(state, "Rejected", "{m}");
    assert!(m.contains("would run out of GPU memory as written"), "{m}");
    assert!(m.contains("NVIDIA H100 80GB HBM3"), "{m}");
    assert!(m.contains(" GiB per GPU"), "{m}");
    assert!(m.contains("`--per_device_train_batch_size 8 → "), "{m}");
    assert!(m.contains("`--gradient_accumulation_steps 2 → "), "{m}");
    // The verdict kept as an Event on the Workload, for after Kueue resets the check.
    let e = k.event(&big, "VramRejected").await;
    assert_eq!(e["type"], "Warning", "{e}");
    let note = e["note"].as_str().unwrap();
    assert!(note.contains("`--per_device_train_batch_size 8 → "), "{e}");
    let other = &wl["status"]["admissionChecks"][1];
    assert_eq!(other["name"], "capacity");
    assert_eq!(other["state"], "Pending");
    let (micro, accumulation) = advice(&m);
    assert_eq!(micro * accumulation, 16, "{m}");

    // As the advice says: Ready on the H100 flavor.
    let fixed = k
        .workload(&trl_job("sft-fixed", micro, accumulation), &["vram-fit"])
        .await;
    k.reserve(&fixed, "h100").await;
    let (state, m, wl) = k.decided(&fixed, "vram-fit").await;
    assert_eq!(state, "Ready", "{m}");
    assert!(m.contains("fits NVIDIA-H100-80GB-HBM3 as written"), "{m}");
    assert!(
        wl["status"]["admissionChecks"][0]
            .get("requeueAfterSeconds")
            .is_none()
    );

    // The same job on the A100 40GB flavor (4 GPUs a node, 40 GB each): rejected.
    let small = k
        .workload(&trl_job("sft-a100", micro, accumulation), &["vram-fit"])
        .await;
    k.reserve(&small, "a100-40gb").await;
    let (state, m, _) = k.decided(&small, "vram-fit").await;
    assert_eq!(state, "Rejected", "{m}");
    assert!(m.contains("A100-SXM4-40GB"), "{m}");

    // The model and recipe from the owner Job's annotation (Kueue does not copy it).
    let annotated = k
        .workload(
            &example("job-annotated-llama-3.1-8b-lora.yaml"),
            &["vram-fit"],
        )
        .await;
    k.reserve(&annotated, "h100").await;
    let (state, m, _) = k.decided(&annotated, "vram-fit").await;
    assert_eq!(state, "Ready", "{m}");
    assert!(
        m.starts_with("vramguard: fits "),
        "judged, not skipped: {m}"
    );

    // A malformed annotation is rejected, the field named.
    let mut bad = example("job-annotated-llama-3.1-8b-lora.yaml");
    bad["metadata"]["name"] = json!("lora-bad");
    bad["metadata"]["annotations"]["vramguard.io/training"] =
        json!("model: {preset: llama-3.1-8b}\ntraining: {mode: lora, microBatchSize: many}\n");
    let bad = k.workload(&bad, &["vram-fit"]).await;
    k.reserve(&bad, "h100").await;
    let (state, m, _) = k.decided(&bad, "vram-fit").await;
    assert_eq!(state, "Rejected", "{m}");
    assert!(
        m.contains("metadata.annotations[vramguard.io/training].training.microBatchSize"),
        "{m}"
    );

    // Neither annotation nor trainer command: not judged, Ready, and why.
    let mut plain = example("job-annotated-llama-3.1-8b-lora.yaml");
    plain["metadata"]["name"] = json!("plain");
    plain["metadata"]["annotations"] = json!({});
    let plain = k.workload(&plain, &["vram-fit"]).await;
    k.reserve(&plain, "h100").await;
    let (state, m, _) = k.decided(&plain, "vram-fit").await;
    assert_eq!(state, "Ready", "{m}");
    assert!(
        m.starts_with("vramguard did not judge this workload"),
        "{m}"
    );

    let _ = stop.send(());
    let _ = &k.client;
}

#[tokio::test]
async fn a_workload_that_fits_its_product_but_not_now_is_retried() {
    // The H100s hold other work: 6 GiB free on each.
    let source = Arc::new(Switch(Mutex::new(inventory(Some(6)))));
    let (k, stop) = start(source.clone()).await;
    let name = k
        .workload(
            &example("job-annotated-llama-3.1-8b-lora.yaml"),
            &["vram-fit"],
        )
        .await;
    k.reserve(&name, "h100").await;
    let (state, m, wl) = k.decided(&name, "vram-fit").await;
    assert_eq!(state, "Retry", "{m}");
    assert!(
        m.contains("fits NVIDIA H100 80GB HBM3 as written, but not now"),
        "{m}"
    );
    assert_eq!(
        wl["status"]["admissionChecks"][0]["requeueAfterSeconds"],
        30
    );
    let e = k.event(&name, "VramRetry").await;
    assert_eq!(e["type"], "Warning", "{e}");
    assert_eq!(e["note"], m, "{e}");

    // Kueue requeues it (the check Pending again); the GPUs are free now: Ready.
    *source.0.lock().unwrap() = inventory(None);
    let checks = json!([{"name": "vram-fit", "state": "Pending", "retryCount": 1,
                         "lastTransitionTime": "2026-11-22T12:05:00Z", "message": ""}]);
    k.status(&name, json!({"admissionChecks": checks})).await;
    let (state, m, _) = k.decided(&name, "vram-fit").await;
    assert_eq!(state, "Ready", "{m}");
    let e = k.event(&name, "VramFit").await;
    assert_eq!(e["type"], "Normal", "{e}");
    assert_eq!(e["note"], m, "{e}");
    let _ = stop.send(());
}

#[test]
fn the_vendored_crds_serve_the_version_read() {
    for file in [
        "kueue.x-k8s.io_workloads.yaml",
        "kueue.x-k8s.io_admissionchecks.yaml",
        "kueue.x-k8s.io_resourceflavors.yaml",
    ] {
        let crd = yaml(&format!("tests/data/kueue/{file}")).remove(0);
        assert_eq!(crd["spec"]["group"], kueue::GROUP);
        let v = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == kueue::VERSION)
            .unwrap_or_else(|| panic!("{file} serves no {}", kueue::VERSION));
        assert_eq!(v["served"], true, "{file}");
    }
    let wl = schema("kueue.x-k8s.io_workloads.yaml");
    let states = &wl["properties"]["status"]["properties"]["admissionChecks"]["items"]["properties"]
        ["state"]["enum"];
    let states: BTreeMap<&str, ()> = states
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s.as_str().unwrap(), ()))
        .collect();
    for s in ["Pending", "Ready", "Retry", "Rejected"] {
        assert!(states.contains_key(s), "{states:?}");
    }
}
