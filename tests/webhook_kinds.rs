//! Jobs, JobSets, TrainJobs and PyTorchJobs through the real webhook over TLS,
//! with AdmissionReview JSON as the API server sends it, against the static
//! inventory of `examples/cluster.yaml` (H100 80GB and A100 40GB nodes):
//! deny with the change in the job's own knobs, warn, audit, not judged, and
//! a malformed annotation named by its field.

use std::path::Path;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio_rustls::rustls;
use vramguard::webhook::{Enforcement, Limits};

#[path = "support/tls_webhook.rs"]
mod tls_webhook;
use tls_webhook::{Server, connector, stop};

fn repo(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

async fn start(enforcement: Enforcement) -> Server {
    tls_webhook::start_with(Limits::default(), |state| state.enforcement = enforcement).await
}

async fn request(server: &Server, method: &str, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector(&server.ca_pem).connect(name, tcp).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

/// An AdmissionReview of a CREATE of `object`, as the API server sends it.
fn review(object: &Value, uid: &str) -> Vec<u8> {
    let api_version = object["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.rsplit_once('/').unwrap();
    let kind = object["kind"].as_str().unwrap();
    let resource = format!("{}s", kind.to_ascii_lowercase());
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    }))
    .unwrap()
}

fn example(name: &str) -> Value {
    let text = std::fs::read_to_string(repo("examples").join(name)).unwrap();
    vramguard::api::parse::documents(&text).unwrap().remove(0)
}

async fn judged(server: &Server, path: &str, object: &Value) -> Value {
    let uid = "0f0e0d0c-0000-4000-8000-00000000cafe";
    let (status, body) = request(server, "POST", path, review(object, uid)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], uid);
    v["response"].clone()
}

fn message(r: &Value) -> String {
    r["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn warnings(r: &Value) -> Vec<String> {
    r["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The TRL Job of the examples on one H100 node of 8 GPUs, at `micro` per device.
fn trl_job(micro: u64, accumulation: u64) -> Value {
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
    job
}

#[tokio::test]
async fn each_kind_is_judged_and_advice_is_in_its_own_knobs() {
    let server = start(Enforcement::Deny).await;

    // Does not fit as written; fits with a smaller micro-batch: denied, the
    // change said in the script's flags, the effective batch kept.
    let r = judged(&server, "/validate", &trl_job(8, 2)).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(
        m.starts_with("Job sft-llama-3-1-8b would run out of GPU memory as written"),
        "{m}"
    );
    assert!(m.contains("`--per_device_train_batch_size 8 -> "), "{m}");
    assert!(
        m.contains("with `--gradient_accumulation_steps 2 -> "),
        "{m}"
    );
    assert!(
        m.contains("NVIDIA H100 80GB HBM3"),
        "the node selector's product: {m}"
    );
    assert!(m.is_ascii() && m.len() <= 1024, "{m}");
    // The micro-batch times accumulation it proposes is the one written.
    let nums: Vec<u64> = m
        .split("-> ")
        .skip(1)
        .take(2)
        .map(|s| s.split('`').next().unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(nums[0] * nums[1], 8 * 2, "{m}");

    // As the advice says: allowed.
    let fixed = judged(&server, "/validate", &trl_job(nums[0], nums[1])).await;
    assert_eq!(fixed["allowed"], true, "{fixed}");
    assert!(warnings(&fixed).is_empty(), "{fixed}");

    // Each example kind that fits is allowed; a PyTorchJob read from run_clm.py.
    for file in [
        "pytorchjob-run-clm-gpt2.yaml",
        "job-annotated-llama-3.1-8b-lora.yaml",
        "trainjob-litgpt-llama-3.2-1b-lora.yaml",
        "trainjob-annotated-llama-3.1-70b-qlora.yaml",
    ] {
        let r = judged(&server, "/validate", &example(file)).await;
        assert_eq!(r["allowed"], true, "{file}: {r}");
    }

    // A 70B full fine-tune on one GPU: nothing the knobs allow fits.
    let mut huge = example("job-annotated-llama-3.1-8b-lora.yaml");
    huge["metadata"]["annotations"]["vramguard.io/training"] =
        json!("model: {preset: llama-3.1-70b}\ntraining: {mode: full}\n");
    let r = judged(&server, "/validate", &huge).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(m.starts_with("Job lora-llama-3-1-8b needs "), "{m}");
    assert!(m.contains("biggest GPU in this cluster"), "{m}");
    // The advice after the numbers is a sentence of its own.
    assert!(m.contains(" usable. Does not fit "), "{m}");
    // Where it was read, without an empty list after it.
    assert!(
        m.ends_with("Read from the vramguard.io/training annotation."),
        "{m}"
    );

    // A JobSet of 8 A100 80GB GPUs: the cluster has one, in MIG slices.
    let mut jobset = example("jobset-torchtune-llama-3.1-8b-lora.yaml");
    let r = judged(&server, "/validate", &jobset).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(m.starts_with("JobSet tune-llama-3-1-8b-lora needs "), "{m}");
    assert!(
        m.contains("no GPU product here has 8 GPUs. Read from the torchtune command line"),
        "a sentence before where it was read: {m}"
    );
    // Held to a product the cluster does not have at all: not judged, said.
    let pod = "/spec/replicatedJobs/0/template/spec/template/spec";
    jobset.pointer_mut(pod).unwrap()["affinity"] = json!(null);
    jobset.pointer_mut(pod).unwrap()["nodeSelector"] =
        json!({"nvidia.com/gpu.product": "NVIDIA-L40S"});
    let r = judged(&server, "/validate", &jobset).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(
        warnings(&r).iter().any(|w| w.contains("NVIDIA-L40S")),
        "{r}"
    );

    // A GPU job whose command says nothing vramguard reads: allowed, with why.
    let mut plain = trl_job(1, 1);
    plain["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["python train.py"]);
    let r = judged(&server, "/validate", &plain).await;
    assert_eq!(r["allowed"], true, "{r}");
    let w = warnings(&r).join(" ");
    assert!(
        w.contains("did not judge this Job") && w.contains("vramguard.io/training"),
        "{w}"
    );
    // Whole, in as many warnings as it takes: none cut short.
    assert!(
        warnings(&r).iter().all(|l| !l.ends_with("...")),
        "{:?}",
        warnings(&r)
    );

    // A Job asking no GPU: allowed without a word.
    let mut cpu = plain.clone();
    cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({});
    let r = judged(&server, "/validate", &cpu).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(warnings(&r).is_empty(), "{r}");

    // The same Job made by a controller (a JobSet's, a TrainingJob's): judged as its owner.
    let mut owned = trl_job(8, 2);
    owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet", "name": "js", "uid": "1", "controller": true}]);
    let r = judged(&server, "/validate", &owned).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(warnings(&r).is_empty(), "{r}");

    // A malformed annotation: denied, the field named.
    let mut bad = example("pytorchjob-annotated-mistral-7b-lora.yaml");
    bad["metadata"]["annotations"]["vramguard.io/training"] = json!(
        "model: {preset: mistral-7b}\ntraining: {mode: lora, microBatchSize: 0, precison: bf16}\n"
    );
    let r = judged(&server, "/validate", &bad).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(
        m.starts_with("PyTorchJob mistral-7b-lora is invalid"),
        "{m}"
    );
    assert!(
        m.contains("metadata.annotations[vramguard.io/training].training.microBatchSize"),
        "{m}"
    );
    assert!(
        m.contains("metadata.annotations[vramguard.io/training].training.precison"),
        "{m}"
    );
    assert_eq!(r["status"]["reason"], "Invalid");

    // The reviews in examples/admission/, as the API server sends them.
    for (file, allowed) in [
        ("create-pytorchjob-fits.json", true),
        ("create-job-does-not-fit-as-written.json", false),
    ] {
        let body = std::fs::read(repo("examples/admission").join(file)).unwrap();
        let (status, answer) = request(&server, "POST", "/validate", body).await;
        assert_eq!(status, 200);
        let v: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["response"]["allowed"], allowed, "{file}: {v}");
    }

    stop(server).await;
}

#[tokio::test]
async fn warn_and_audit_allow_and_audit_counts_by_namespace() {
    // The server's own default is Warn; the paths say the mode per namespace.
    let server = start(Enforcement::Warn).await;
    let job = trl_job(8, 2);

    let warn = judged(&server, "/validate", &job).await;
    assert_eq!(warn["allowed"], true, "{warn}");
    let w = warnings(&warn);
    assert!(w.len() > 1, "the verdict, cut into warnings: {w:?}");
    assert!(w.iter().all(|l| l.len() <= 120 && l.is_ascii()), "{w:?}");
    let joined = w.join(" ");
    assert!(joined.contains("vramguard would deny this"), "{joined}");
    assert!(
        joined.contains("--per_device_train_batch_size 8 ->"),
        "{joined}"
    );

    let deny = judged(&server, "/validate/deny", &job).await;
    assert_eq!(deny["allowed"], false, "{deny}");
    // The same decision (cached after the first), enforced by each path.
    assert!(
        warnings(&warn).join(" ").contains(&message(&deny)[..60]),
        "{warn}\n{deny}"
    );

    let audit = judged(&server, "/validate/audit", &job).await;
    assert_eq!(audit["allowed"], true, "{audit}");
    assert!(
        audit.get("warnings").is_none() || warnings(&audit).is_empty(),
        "{audit}"
    );
    assert!(
        audit["status"].is_null() || audit["status"]["message"].is_null(),
        "{audit}"
    );

    // Audit of a job that fits, in another namespace.
    let mut other = example("pytorchjob-run-clm-gpt2.yaml");
    other["metadata"]["namespace"] = json!("team-b");
    let ok = judged(&server, "/validate/audit", &other).await;
    assert_eq!(ok["allowed"], true);

    let (status, body) = request(&server, "GET", "/metrics", Vec::new()).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let line = |labels: &str| {
        text.lines()
            .find(|l| l.starts_with("vramguard_workload_verdicts_total{") && l.contains(labels))
            .unwrap_or_else(|| panic!("no {labels} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        line(
            r#"enforcement="Audit",verdict="Denied",reason="FitsAfterChange",namespace="ml-training""#
        ),
        "1"
    );
    assert_eq!(
        line(r#"enforcement="Audit",verdict="Allowed",reason="Fits",namespace="team-b""#),
        "1"
    );
    assert_eq!(
        line(
            r#"enforcement="Warn",verdict="Denied",reason="FitsAfterChange",namespace="ml-training""#
        ),
        "1"
    );
    stop(server).await;
}

/// Audit records each verdict as an Event on the object through kube's events Recorder,
/// off the review's path: with nothing publishing, reviews are still answered and events
/// past the queue are dropped and counted; then the queued ones reach the API server.
/// Deny, Warn and dry runs record nothing.
#[tokio::test]
async fn audit_records_the_verdict_as_an_event_without_waiting_on_it() {
    use vramguard::apiserver::ApiServer;
    use vramguard::webhook::audit::{self, AuditEvents};

    let mut queue = None;
    let server = tls_webhook::start_with(Limits::default(), |state| {
        let (events, q) = AuditEvents::new(&mut state.registry, 4);
        state.audit_events = Some(events);
        queue = Some(q);
    })
    .await;

    // Not recorded: Deny, Warn, and an Audit dry run.
    let denied = trl_job(8, 2);
    assert_eq!(
        judged(&server, "/validate/deny", &denied).await["allowed"],
        false
    );
    assert_eq!(
        judged(&server, "/validate/warn", &denied).await["allowed"],
        true
    );
    let mut dry: Value = serde_json::from_slice(&review(&denied, "dry-1")).unwrap();
    dry["request"]["dryRun"] = json!(true);
    let (status, _) = request(
        &server,
        "POST",
        "/validate/audit",
        serde_json::to_vec(&dry).unwrap(),
    )
    .await;
    assert_eq!(status, 200);

    // A job that fits (its GPUs busy now), then five that would be denied: the queue holds four.
    let fits = example("pytorchjob-run-clm-gpt2.yaml");
    assert_eq!(
        judged(&server, "/validate/audit", &fits).await["allowed"],
        true
    );
    for i in 0..5 {
        let mut job = trl_job(8, 2);
        job["metadata"]["name"] = json!(format!("sft-{i}"));
        let r = judged(&server, "/validate/audit", &job).await;
        assert_eq!(r["allowed"], true, "{r}");
    }
    let metric = |text: &str, result: &str| -> u64 {
        text.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "vramguard_audit_events_total{{result=\"{result}\"}}"
                ))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .unwrap_or(0)
    };
    let (_, body) = request(&server, "GET", "/metrics", Vec::new()).await;
    let text = String::from_utf8(body).unwrap();
    assert_eq!(metric(&text, "Dropped"), 2, "{text}");

    // Publishing: the four queued become Events on their objects.
    let api = ApiServer::start().await;
    let reporter = kube::runtime::events::Reporter {
        controller: "vramguard-webhook".into(),
        instance: Some("test".into()),
    };
    tokio::spawn(audit::run(api.client(), reporter, queue.unwrap()));
    let mut events = Vec::new();
    for _ in 0..200 {
        events = api.objects::<k8s_openapi::api::events::v1::Event>();
        if events.len() >= 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(events.len(), 4, "{events:#?}");
    let on = |name: &str| {
        events
            .iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .unwrap_or_else(|| panic!("no event on {name}: {events:#?}"))
    };
    let ok = on(fits["metadata"]["name"].as_str().unwrap());
    assert_eq!(ok.type_.as_deref(), Some("Normal"));
    assert_eq!(ok.reason.as_deref(), Some("FitsNotNow"));
    assert!(
        ok.note
            .as_deref()
            .unwrap()
            .contains("as written, but not now"),
        "{ok:?}"
    );
    assert_eq!(
        ok.metadata.namespace.as_deref(),
        fits["metadata"]["namespace"].as_str()
    );
    let bad = on("sft-0");
    assert_eq!(bad.type_.as_deref(), Some("Warning"));
    assert_eq!(bad.reason.as_deref(), Some("WouldDeny"));
    let regarding = bad.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Job"));
    assert_eq!(regarding.api_version.as_deref(), Some("batch/v1"));
    assert_eq!(regarding.namespace.as_deref(), Some("ml-training"));
    let note = bad.note.as_deref().unwrap();
    assert!(
        note.starts_with(
            "vramguard would deny this (enforcement Audit): Job sft-0 would run out of GPU memory"
        ),
        "{note}"
    );
    assert!(
        note.contains("--per_device_train_batch_size 8 -> "),
        "{note}"
    );
    assert!(note.len() <= audit::MAX_NOTE, "{note}");
    assert_eq!(
        bad.reporting_controller.as_deref(),
        Some("vramguard-webhook")
    );
    assert!(events.iter().all(|e| {
        let n = e
            .regarding
            .as_ref()
            .and_then(|r| r.name.as_deref())
            .unwrap();
        n != "sft-3" && n != "sft-4" && n != "sft-llama-3-1-8b"
    }));
    let (_, body) = request(&server, "GET", "/metrics", Vec::new()).await;
    let text = String::from_utf8(body).unwrap();
    assert_eq!(metric(&text, "Published"), 4, "{text}");
    stop(server).await;
}

/// Pods asking a MIG slice are judged against that slice's memory, on the slices of that
/// profile the inventory reports (examples/cluster.yaml: an A100 80GB split into 3g.40gb,
/// 2g.20gb and 1g.10gb).
#[tokio::test]
async fn mig_slices_are_judged_against_the_slice() {
    let server = start(Enforcement::Deny).await;
    let on = |profile: &str, annotation: &str| {
        let mut job = example("job-annotated-llama-3.1-8b-lora.yaml");
        job["metadata"]["name"] = json!(format!("mig-{profile}"));
        job["metadata"]["annotations"]["vramguard.io/training"] = json!(annotation);
        job["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"limits": {format!("nvidia.com/mig-{profile}"): 1}});
        job
    };
    let small = "model: {preset: llama-3.2-1b}\ntraining: {mode: lora, microBatchSize: 1, sequenceLength: 1024, gradientCheckpointing: full}\n";
    let lora = "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, microBatchSize: 1, sequenceLength: 1024, gradientCheckpointing: full}\n";
    // A 1B LoRA fits the 40 GB slice ...
    let r = judged(&server, "/validate", &on("3g.40gb", small)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(warnings(&r).is_empty(), "{r}");
    // ... an 8B LoRA not the 10 GB one: denied, with the slice's numbers.
    let r = judged(&server, "/validate", &on("1g.10gb", lora)).await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(m.contains("MIG 1g.10gb"), "{m}");
    assert!(m.contains("GiB"), "{m}");
    // A profile no node has: not judged, and why.
    let r = judged(&server, "/validate", &on("4g.40gb", lora)).await;
    assert_eq!(r["allowed"], true, "{r}");
    let w = warnings(&r).join(" ");
    assert!(
        w.contains("no MIG slice 4g.40gb reports to vramguard"),
        "{w}"
    );
    stop(server).await;
}
