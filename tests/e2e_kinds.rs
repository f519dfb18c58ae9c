//! The jobs teams already submit, through a real API server (`tests/cluster/cluster.sh`):
//! batch/v1 Jobs, JobSets, Kubeflow TrainJobs and PyTorchJobs created through kube's client,
//! judged by the chart's workload webhooks (rules, `namespaceSelector` on
//! `vramguard.io/enforcement`, `matchConditions`) calling a `vramguard serve` on loopback.
//!
//! As the chart runs it: the webhook reads the GPU inventory from the cluster (the GpuNodes
//! of `examples/cluster.yaml`, published here with a fresh `probeTime`) with the release's
//! ServiceAccount token, and records Audit verdicts as Events through it. Only `clientConfig`
//! of the three workload webhooks is replaced (no pod runs the chart's Deployment here).
//!
//! In namespaces labelled Deny, Warn and Audit: a Job that does not fit is refused (403 with
//! the webhook's message), allowed with the verdict as warnings, or allowed silently with a
//! `WouldDeny` Event on it; a Job that fits is created in every mode; a GPU Job vramguard
//! cannot read is allowed with the warning that says why; a Job without GPUs never reaches
//! the webhook. JobSet, TrainJob and PyTorchJob (their CRDs made here, schemaless, as the
//! projects name them) each get one denial and one admission.

#[path = "support/cluster.rs"]
mod cluster;

use axum::http::Method;
use cluster::{Answer, JSON};
use kube::Client;
use serde_json::{Value, json};

const TEST: &str = "e2e_kinds";
const DENY: &str = "e2e-kinds-deny";
const WARN: &str = "e2e-kinds-warn";
const AUDIT: &str = "e2e-kinds-audit";
const ANNOTATION: &str = "vramguard.io/training";

/// group, version, kind, plural of the kinds the chart's workload webhooks judge, besides Job.
const CRDS: [(&str, &str, &str, &str); 3] = [
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    ("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs"),
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
];

fn example(file: &str) -> Value {
    let path = cluster::root().join("examples").join(file);
    let text = std::fs::read_to_string(&path).expect("an example");
    let mut docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    docs.remove(0)
}

/// The TRL Job of the examples (Llama 3.1 8B under accelerate on 8 H100s): 8 per device with
/// accumulation 2 does not fit as written.
fn trl_job() -> Value {
    example("job-trl-sft-llama-3.1-8b.yaml")
}

/// `obj` with the annotation asking for a 70B full fine-tune: nothing its knobs allow fits.
fn too_big(mut obj: Value, name: &str) -> Value {
    obj["metadata"]["name"] = json!(name);
    obj["metadata"]["annotations"][ANNOTATION] =
        json!("model: {preset: llama-3.1-70b}\ntraining: {mode: full}\n");
    obj
}

fn collection(obj: &Value, ns: &str) -> String {
    let api_version = obj["apiVersion"].as_str().expect("an apiVersion");
    let kind = obj["kind"].as_str().expect("a kind");
    let plural = format!("{}s", kind.to_ascii_lowercase());
    match api_version.split_once('/') {
        Some(_) => format!("/apis/{api_version}/namespaces/{ns}/{plural}"),
        None => format!("/api/{api_version}/namespaces/{ns}/{plural}"),
    }
}

async fn get(client: &Client, path: &str) -> Option<Value> {
    let a = cluster::send(client, Method::GET, path, JSON, &Value::Null).await;
    (a.status == 200).then_some(a.body)
}

/// Creates `obj` in `ns` through the API server.
async fn create(client: &Client, ns: &str, mut obj: Value) -> Answer {
    obj["metadata"]["namespace"] = json!(ns);
    let path = collection(&obj, ns);
    cluster::send(client, Method::POST, &path, JSON, &obj).await
}

/// `create`, expected to be admitted: 201, and the object's uid.
async fn admitted(client: &Client, ns: &str, what: &str, obj: Value) -> (String, Vec<String>) {
    let got = create(client, ns, obj).await;
    assert_eq!(got.status, 201, "{what} in {ns}: {}", got.body);
    let uid = got.body["metadata"]["uid"]
        .as_str()
        .expect("a uid")
        .to_string();
    eprintln!("{what} in {ns}: 201, warnings {:?}", got.warnings);
    (uid, got.warnings)
}

/// `create`, expected to be refused by the Deny webhook: its message.
async fn denied(client: &Client, what: &str, obj: Value) -> String {
    let got = create(client, DENY, obj).await;
    assert_eq!(got.status, 403, "{what}: {}", got.body);
    let message = got.body["message"].as_str().expect("a message");
    let prefix = "admission webhook \"deny.workloads.vramguard.io\" denied the request: ";
    let ours = message
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{what}: not our webhook's denial: {message}"));
    assert!(
        ours.contains("GiB"),
        "{what}: the denial names the need: {ours}"
    );
    eprintln!("{what}: 403 {ours}");
    ours.to_string()
}

/// The Event vramguard recorded on the object with `uid` in `ns`.
async fn event_on(client: &Client, ns: &str, uid: &str) -> Value {
    cluster::event_regarding(client, ns, uid, None).await
}

/// Reviews the webhook answered so far (`vramguard_reviews_total`, every label).
async fn reviews(webhook: &Client) -> u64 {
    let req = axum::http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let text = webhook
        .request_text(req)
        .await
        .expect("the webhook's metrics");
    text.lines()
        .filter(|l| l.starts_with("vramguard_reviews_total{"))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .expect("a count")
        })
        .sum()
}

/// A kube client for the webhook's own HTTPS endpoint, trusting its CA.
fn webhook_client(port: u16, ca_pem: &str) -> Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().expect("a URL"));
    config.root_cert = Some(
        CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .map(|c| c.expect("a PEM certificate").to_vec())
            .collect(),
    );
    Client::try_from(config).expect("a client")
}

/// Minimal CRDs of JobSet, TrainJob and PyTorchJob (any spec kept), created or replaced,
/// served once Established.
async fn install_crds(client: &Client) {
    for (group, version, kind, plural) in CRDS {
        let name = format!("{plural}.{group}");
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {
                    "kind": kind,
                    "listKind": format!("{kind}List"),
                    "plural": plural,
                    "singular": kind.to_ascii_lowercase(),
                },
                "versions": [{
                    "name": version,
                    "served": true,
                    "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                    }},
                    "subresources": {"status": {}},
                }],
            }
        });
        cluster::apply_crd(client, crd).await;
        let list = format!("/apis/{group}/{version}/namespaces/{DENY}/{plural}");
        cluster::eventually(&format!("{plural} served"), 60, || async {
            get(client, &list).await.is_some()
        })
        .await;
    }
}

/// The GpuNodes of `examples/cluster.yaml` as their agents would publish them now: each
/// `probeTime` now, valid for an hour (the test's whole run).
async fn publish_gpu_nodes(client: &Client) -> Vec<String> {
    let path = cluster::root().join("examples/cluster.yaml");
    let text = std::fs::read_to_string(&path).expect("examples/cluster.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("GpuNode documents");
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let now = k8s_openapi::jiff::Timestamp::from_second(now)
        .expect("a time")
        .to_string();
    let mut names = Vec::new();
    for mut node in docs {
        let name = node["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        let one = format!("/apis/vramguard.io/v1alpha1/gpunodes/{name}");
        cluster::send(client, Method::DELETE, &one, JSON, &Value::Null).await;
        cluster::eventually(&format!("the old GpuNode {name} to go"), 30, || async {
            get(client, &one).await.is_none()
        })
        .await;
        node["spec"]["ttlSeconds"] = json!(3600);
        node["status"]["probeTime"] = json!(now);
        let status = node["status"].clone();
        let a = cluster::send(
            client,
            Method::POST,
            "/apis/vramguard.io/v1alpha1/gpunodes",
            JSON,
            &node,
        )
        .await;
        assert_eq!(a.status, 201, "GpuNode {name}: {}", a.body);
        let a = cluster::send(
            client,
            Method::PATCH,
            &format!("{one}/status"),
            "application/merge-patch+json",
            &json!({"status": status}),
        )
        .await;
        assert_eq!(a.status, 200, "GpuNode {name} status: {}", a.body);
        names.push(name);
    }
    names
}

/// A fresh namespace `ns` labelled with its enforcement: what an earlier run left goes with
/// the old one.
async fn fresh_namespace(client: &Client, ns: &str, enforcement: &str) {
    let path = format!("/api/v1/namespaces/{ns}");
    if get(client, &path).await.is_some() {
        cluster::send(client, Method::DELETE, &path, JSON, &Value::Null).await;
        cluster::eventually(&format!("the old namespace {ns} to go"), 120, || async {
            get(client, &path).await.is_none()
        })
        .await;
    }
    cluster::namespace(client, ns, json!({"vramguard.io/enforcement": enforcement})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_is_judged_in_each_enforcement_mode_through_the_api_server() {
    let Some((client, helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    let path = cluster::webhook_configuration_path();
    let installed = get(&client, &path)
        .await
        .expect("the webhook configuration");
    let names: Vec<&str> = installed["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .map(|w| w["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        names,
        [
            "trainingjobs.vramguard.io",
            "deny.workloads.vramguard.io",
            "warn.workloads.vramguard.io",
            "audit.workloads.vramguard.io"
        ],
        "the chart's webhooks"
    );

    install_crds(&client).await;
    for (ns, mode) in [(DENY, "Deny"), (WARN, "Warn"), (AUDIT, "Audit")] {
        fresh_namespace(&client, ns, mode).await;
    }
    let gpu_nodes = publish_gpu_nodes(&client).await;

    // The webhook as the chart runs it: the inventory from the cluster and Audit's Events,
    // with the release's ServiceAccount token; no operator (nothing here for it to run).
    let scratch = cluster::scratch(TEST);
    let token = scratch.join("webhook.kubeconfig");
    cluster::service_account_kubeconfig(&client, cluster::RELEASE, &token).await;
    let (_webhook, port, ca_pem) = cluster::start_serve(
        &scratch,
        &["--no-operator", "--identity", "e2e-kinds"],
        &[("KUBECONFIG", &token)],
    )
    .await;
    let webhook = webhook_client(port, &ca_pem);
    cluster::eventually("the webhook's inventory to sync", 60, || async {
        let req = axum::http::Request::get("/readyz")
            .body(Vec::new())
            .expect("a request");
        webhook.request_text(req).await.is_ok()
    })
    .await;
    cluster::point_webhooks_at(&client, port, &ca_pem).await;

    // A Job that does not fit as written, in each mode.
    let job = trl_job();
    let m = denied(&client, "the TRL Job", job.clone()).await;
    assert!(
        m.starts_with("Job sft-llama-3-1-8b would run out of GPU memory as written"),
        "{m}"
    );
    assert!(m.contains("`--per_device_train_batch_size 8 -> "), "{m}");
    assert!(m.contains("NVIDIA H100 80GB HBM3"), "{m}");
    let (_, w) = admitted(&client, WARN, "the TRL Job", job.clone()).await;
    let w = w.join(" ");
    assert!(
        w.starts_with("vramguard would deny this (enforcement Warn): Job sft-llama-3-1-8b would run out of GPU memory as written"),
        "the verdict in the Warning headers: {w}"
    );
    assert!(w.contains("--per_device_train_batch_size 8 -> "), "{w}");
    let (uid, w) = admitted(&client, AUDIT, "the TRL Job", job.clone()).await;
    assert!(w.is_empty(), "Audit allows silently: {w:?}");
    let event = event_on(&client, AUDIT, &uid).await;
    assert_eq!(event["reason"], "WouldDeny", "{event}");
    assert_eq!(event["type"], "Warning", "{event}");
    assert_eq!(event["reportingController"], "vramguard-webhook", "{event}");
    assert_eq!(event["regarding"]["kind"], "Job", "{event}");
    assert_eq!(event["regarding"]["name"], "sft-llama-3-1-8b", "{event}");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with(
            "vramguard would deny this (enforcement Audit): Job sft-llama-3-1-8b would run out of GPU memory as written"
        ),
        "{note}"
    );

    // A Job that fits: created in every mode, without a word; Audit records that it fits.
    let fits = example("job-annotated-llama-3.1-8b-lora.yaml");
    for ns in [DENY, WARN, AUDIT] {
        let (uid, w) = admitted(&client, ns, "the annotated LoRA Job", fits.clone()).await;
        assert!(w.is_empty(), "{ns}: {w:?}");
        if ns == AUDIT {
            let event = event_on(&client, AUDIT, &uid).await;
            assert_eq!(event["reason"], "Fits", "{event}");
            assert_eq!(event["type"], "Normal", "{event}");
        }
    }

    // A GPU Job whose command says nothing vramguard reads: allowed, with why (recorded, in
    // Audit).
    let mut plain = trl_job();
    plain["metadata"]["name"] = json!("plain-train-py");
    plain["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["python train.py"]);
    for ns in [DENY, WARN] {
        let (_, w) = admitted(
            &client,
            ns,
            "a GPU Job vramguard cannot read",
            plain.clone(),
        )
        .await;
        assert!(
            w.iter().all(|l| !l.ends_with("...")),
            "{ns}: the reason whole, none cut short: {w:?}"
        );
        let w = w.join(" ");
        assert!(
            w.contains("did not judge this Job") && w.contains(ANNOTATION),
            "{ns}: the warning says why: {w}"
        );
    }
    let (uid, w) = admitted(&client, AUDIT, "a GPU Job vramguard cannot read", plain).await;
    assert!(w.is_empty(), "Audit allows silently: {w:?}");
    let event = event_on(&client, AUDIT, &uid).await;
    assert_eq!(event["reason"], "NotJudged", "{event}");
    assert!(
        event["note"]
            .as_str()
            .is_some_and(|n| n.contains("did not judge this Job")),
        "{event}"
    );

    // A Job without GPUs: matchConditions keep it from the webhook.
    let before = reviews(&webhook).await;
    assert!(before >= 9, "the reviews so far are counted: {before}");
    let mut cpu = trl_job();
    cpu["metadata"]["name"] = json!("cpu-only");
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({});
    cpu["spec"]["template"]["spec"]["nodeSelector"] = json!(null);
    for ns in [DENY, WARN, AUDIT] {
        let (_, w) = admitted(&client, ns, "a Job without GPUs", cpu.clone()).await;
        assert!(w.is_empty(), "{ns}: {w:?}");
    }
    assert_eq!(
        reviews(&webhook).await,
        before,
        "a Job without GPUs reached the webhook"
    );

    // JobSet, TrainJob, PyTorchJob: one refused, one created, in Deny.
    let m = denied(
        &client,
        "the torchtune JobSet",
        example("jobset-torchtune-llama-3.1-8b-lora.yaml"),
    )
    .await;
    assert!(m.starts_with("JobSet tune-llama-3-1-8b-lora needs "), "{m}");
    assert!(
        m.ends_with("has 8 GPUs. Read from the torchtune command line: --config llama3_1/8B_lora (catalog llama-3.1-8b); batch_size=4."),
        "{m}"
    );
    admitted(
        &client,
        DENY,
        "the annotated JobSet",
        example("jobset-annotated-qwen2.5-7b-full.yaml"),
    )
    .await;
    let m = denied(
        &client,
        "a 70B full TrainJob",
        too_big(
            example("trainjob-annotated-llama-3.1-70b-qlora.yaml"),
            "full-70b",
        ),
    )
    .await;
    assert!(m.starts_with("TrainJob full-70b needs "), "{m}");
    assert!(m.contains(" usable. Does not fit h100-80gb "), "{m}");
    assert!(
        m.ends_with(". Read from the vramguard.io/training annotation."),
        "{m}"
    );
    admitted(
        &client,
        DENY,
        "the LitGPT TrainJob",
        example("trainjob-litgpt-llama-3.2-1b-lora.yaml"),
    )
    .await;
    let m = denied(
        &client,
        "a 70B full PyTorchJob",
        too_big(
            example("pytorchjob-annotated-mistral-7b-lora.yaml"),
            "full-70b",
        ),
    )
    .await;
    assert!(m.starts_with("PyTorchJob full-70b needs "), "{m}");
    admitted(
        &client,
        DENY,
        "the run_clm PyTorchJob",
        example("pytorchjob-run-clm-gpt2.yaml"),
    )
    .await;

    // Nothing left for the next tests: the webhooks as the chart makes them (not pointing
    // at this test's server, gone with it), the namespaces (and their Jobs), the GpuNodes,
    // the CRDs (and their objects).
    cluster::install_chart(&client, &helm, &[]).await;
    for ns in [DENY, WARN, AUDIT] {
        let path = format!("/api/v1/namespaces/{ns}");
        cluster::send(&client, Method::DELETE, &path, JSON, &Value::Null).await;
    }
    for name in gpu_nodes {
        let one = format!("/apis/vramguard.io/v1alpha1/gpunodes/{name}");
        cluster::send(&client, Method::DELETE, &one, JSON, &Value::Null).await;
    }
    for (group, _, _, plural) in CRDS {
        let path =
            format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}");
        cluster::send(&client, Method::DELETE, &path, JSON, &Value::Null).await;
    }
}
