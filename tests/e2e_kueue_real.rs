//! The Kueue AdmissionCheck controller with Kueue itself: the Kueue manager v0.17.0
//! (`sigs.k8s.io/kueue/cmd/kueue`, built from tests/cluster/kueue/go.mod and started by
//! `tests/cluster/cluster.sh kueue-up`) runs on the real control plane with its CRDs, their
//! conversion webhook and its Job webhook. The test writes only what a platform team and a
//! researcher write: a ResourceFlavor with GFD's product label, a ClusterQueue that lists
//! the `vram-fit` check, a LocalQueue and batch/v1 Jobs labelled with the queue. Kueue
//! suspends the Jobs, creates their Workloads, reserves quota and assigns the flavor;
//! vramguard judges; Kueue admits (and starts) the Job that fits and deactivates the one
//! that cannot.
//!
//! Kueue resets a Rejected check to Pending as it deactivates the Workload, so the verdict is
//! read where it stays: vramguard's Event on the Workload (`kubectl describe workload`), and
//! the check's state only where it is stable (Ready on the admitted Workload).

#[path = "support/cluster.rs"]
mod cluster;

use std::time::Duration;

use axum::http::Method;
use cluster::JSON;
use kube::Client;
use serde_json::{Value, json};
use vramguard::api::parse;
use vramguard::kueue;

const TEST: &str = "e2e_kueue_real";
const NS: &str = "e2e-kueue-real";
const V1BETA1: &str = "/apis/kueue.x-k8s.io/v1beta1";
const V1BETA2: &str = "/apis/kueue.x-k8s.io/v1beta2";

/// Creates the object at `collection`, or finds it there from an earlier run.
async fn create(client: &Client, collection: &str, body: &Value) {
    let a = cluster::send(client, Method::POST, collection, JSON, body).await;
    assert!(
        a.status == 201 || a.status == 409,
        "POST {collection}: {} {}",
        a.status,
        a.body
    );
}

/// Whether `cluster.sh kueue-up` started Kueue and it is ready: its health probe
/// (`$VRAMGUARD_KUEUE_PORT` + 1 on loopback, as `cluster.sh` sets it) answers `/readyz` and
/// its Job webhook is registered.
async fn kueue_running(client: &Client) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port: u16 = std::env::var("VRAMGUARD_KUEUE_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16543)
        + 1;
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(5), probe).await {
        Ok(Ok(a)) if a.starts_with("HTTP/1.0 200") || a.starts_with("HTTP/1.1 200") => {}
        Ok(Ok(a)) => {
            return Err(format!(
                "Kueue's /readyz on 127.0.0.1:{port}: {}",
                a.lines().next().unwrap_or("")
            ));
        }
        Ok(Err(e)) => return Err(format!("Kueue's /readyz on 127.0.0.1:{port}: {e}")),
        Err(_) => {
            return Err(format!(
                "Kueue's /readyz on 127.0.0.1:{port}: no answer in 5 s"
            ));
        }
    }
    let path =
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vramguard-test-kueue";
    let a = cluster::send(client, Method::GET, path, JSON, &Value::Null).await;
    if a.status != 200 {
        return Err(format!("GET {path}: {}", a.status));
    }
    Ok(())
}

/// The annotated Job of the examples (a LoRA of Llama 3.1 8B on one GPU), named `name`,
/// queued to `queue`, with `training` as its annotation when given.
fn job(name: &str, queue: &str, training: Option<&str>) -> Value {
    let text = std::fs::read_to_string(
        cluster::root().join("examples/job-annotated-llama-3.1-8b-lora.yaml"),
    )
    .unwrap();
    let mut job = parse::documents(&text).unwrap().remove(0);
    job["metadata"]["name"] = json!(name);
    job["metadata"]["namespace"] = json!(NS);
    job["metadata"]["labels"] = json!({"kueue.x-k8s.io/queue-name": queue});
    if let Some(t) = training {
        job["metadata"]["annotations"]["vramguard.io/training"] = json!(t);
    }
    job
}

/// The Workload Kueue made for the Job `name` (found by its owner reference), as v1beta1.
async fn workload_of(client: &Client, name: &str) -> Value {
    cluster::until_some(&format!("the Workload of Job {name}"), 60, || async {
        let list = cluster::get_ok(client, &format!("{V1BETA1}/namespaces/{NS}/workloads")).await;
        list["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|w| {
                    w["metadata"]["ownerReferences"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|o| o["kind"] == "Job" && o["name"] == name)
                })
                .cloned()
        })
    })
    .await
}

/// The state and message of check `vram-fit` on the Workload `wl`.
fn vram_fit(wl: &Value) -> (String, String) {
    let check = wl["status"]["admissionChecks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "vram-fit")
        .unwrap_or_else(|| panic!("no check vram-fit: {wl}"));
    (
        check["state"].as_str().unwrap_or("").to_string(),
        check["message"].as_str().unwrap_or("").to_string(),
    )
}

/// The Event of `reason` vramguard recorded on the Workload `wl` (as `kubectl describe
/// workload` lists it), checked to be of `type_` and by vramguard's controller.
async fn verdict_event(client: &Client, wl: &Value, reason: &str, type_: &str) -> Value {
    let uid = wl["metadata"]["uid"].as_str().expect("a uid");
    let e = cluster::event_regarding(client, NS, uid, Some(reason)).await;
    assert_eq!(e["type"], type_, "{e}");
    assert_eq!(e["reportingController"], "vramguard-kueue", "{e}");
    assert_eq!(e["regarding"]["kind"], "Workload", "{e}");
    assert_eq!(e["regarding"]["name"], wl["metadata"]["name"], "{e}");
    // Judged once: a Workload Kueue deactivated is not judged again when its check is reset.
    assert!(e["series"].is_null(), "published once: {e}");
    e
}

fn condition(obj: &Value, kind: &str) -> Option<String> {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_the_job_that_fits_and_deactivates_the_one_that_cannot() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let Some(client) = cluster::connect(TEST).await else {
        return;
    };
    if let Err(why) = kueue_running(&client).await {
        let _: Option<()> = cluster::absent(
            TEST,
            &format!("{why}; this test needs Kueue too: `tests/cluster/cluster.sh kueue-up`"),
        );
        return;
    }
    cluster::namespace(&client, NS, json!({})).await;
    let suffix = std::process::id();

    // The platform team's setup: one flavor per GPU product (GFD's label), a queue whose
    // admission waits for vram-fit. The ClusterQueue is written as v1beta1 (as the README
    // shows it); Kueue stores it as v1beta2 through its conversion webhook.
    create(
        &client,
        &format!("{V1BETA2}/resourceflavors"),
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "e2e-h100"},
                "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}),
    )
    .await;
    create(
        &client,
        &format!("{V1BETA2}/admissionchecks"),
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
                "metadata": {"name": "vram-fit"},
                "spec": {"controllerName": kueue::CONTROLLER_NAME}}),
    )
    .await;
    let cq = format!("e2e-gpus-{suffix}");
    create(
        &client,
        &format!("{V1BETA1}/clusterqueues"),
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
                "metadata": {"name": cq},
                "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                         "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                                             "flavors": [{"name": "e2e-h100", "resources": [
                                                 {"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}],
                         "admissionChecks": ["vram-fit"]}}),
    )
    .await;
    let lq = format!("team-{suffix}");
    create(
        &client,
        &format!("{V1BETA2}/namespaces/{NS}/localqueues"),
        &json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": lq, "namespace": NS},
                "spec": {"clusterQueue": cq}}),
    )
    .await;
    // Kueue read the ClusterQueue back through its conversion webhook, admission check
    // included.
    let stored = cluster::get_ok(&client, &format!("{V1BETA2}/clusterqueues/{cq}")).await;
    assert_eq!(
        stored["spec"]["admissionChecksStrategy"]["admissionChecks"][0]["name"], "vram-fit",
        "{stored}"
    );

    // vramguard's controller, as `vramguard serve --kueue-admission-check` runs it.
    let controller = cluster::KueueController::start(&client);

    // Kueue holds the ClusterQueue inactive until its check is Active, which vramguard marks.
    cluster::eventually(&format!("ClusterQueue {cq} Active"), 60, || async {
        let c = cluster::get_ok(&client, &format!("{V1BETA2}/clusterqueues/{cq}")).await;
        condition(&c, "Active").as_deref() == Some("True")
    })
    .await;

    // The researcher's Jobs, written without `suspend`: Kueue's webhook suspends them.
    let jobs = format!("/apis/batch/v1/namespaces/{NS}/jobs");
    let fits = format!("lora-8b-{suffix}");
    let too_big = format!("full-70b-{suffix}");
    let full_70b = "model: {preset: llama-3.1-70b}\n\
                    training: {mode: full, microBatchSize: 1, sequenceLength: 2048, precision: bf16-mixed}\n";
    for body in [job(&fits, &lq, None), job(&too_big, &lq, Some(full_70b))] {
        let a = cluster::send(&client, Method::POST, &jobs, JSON, &body).await;
        assert_eq!(a.status, 201, "POST {jobs}: {}", a.body);
        assert_eq!(
            a.body["spec"]["suspend"], true,
            "Kueue's webhook: {}",
            a.body
        );
    }

    // The LoRA fits an H100: Ready, then Kueue admits the Workload and starts the Job; the
    // check stays Ready once admitted, and the verdict is an Event on the Workload.
    let wl = workload_of(&client, &fits).await;
    let path = format!(
        "{V1BETA1}/namespaces/{NS}/workloads/{}",
        wl["metadata"]["name"].as_str().unwrap()
    );
    cluster::eventually(&format!("Job {fits} unsuspended"), 90, || async {
        let j = cluster::get_ok(&client, &format!("{jobs}/{fits}")).await;
        j["spec"]["suspend"] == false
    })
    .await;
    let wl = cluster::get_ok(&client, &path).await;
    assert_eq!(condition(&wl, "Admitted").as_deref(), Some("True"), "{wl}");
    let (state, message) = vram_fit(&wl);
    assert_eq!(state, "Ready", "{message}\n{wl}");
    assert_eq!(
        wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"], "e2e-h100",
        "{wl}"
    );
    let e = verdict_event(&client, &wl, "VramFit", "Normal").await;
    assert_eq!(e["note"], message, "{e}");
    // Kueue put the flavor's node labels on the pods it lets run.
    let j = cluster::get_ok(&client, &format!("{jobs}/{fits}")).await;
    assert_eq!(
        j["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3",
        "{j}"
    );

    // A full fine-tune of a 70B model cannot fit one 80 GB GPU: Rejected with the numbers;
    // Kueue deactivates the Workload, resets the check to Pending, and the Job stays
    // suspended. What vramguard said stays in its Event on the Workload.
    let wl = workload_of(&client, &too_big).await;
    let path = format!(
        "{V1BETA1}/namespaces/{NS}/workloads/{}",
        wl["metadata"]["name"].as_str().unwrap()
    );
    cluster::eventually(&format!("{path} deactivated"), 90, || async {
        let wl = cluster::get_ok(&client, &path).await;
        wl["spec"]["active"] == false
    })
    .await;
    let wl = cluster::get_ok(&client, &path).await;
    assert_ne!(condition(&wl, "Admitted").as_deref(), Some("True"), "{wl}");
    let (state, message) = vram_fit(&wl);
    assert_ne!(state, "Ready", "{message}\n{wl}");
    let e = verdict_event(&client, &wl, "VramRejected", "Warning").await;
    let note = e["note"].as_str().unwrap_or("");
    assert!(note.contains(" GiB per GPU"), "{e}");
    assert!(note.contains("vramguard.io/training"), "{e}");
    let j = cluster::get_ok(&client, &format!("{jobs}/{too_big}")).await;
    assert_eq!(j["spec"]["suspend"], true, "{j}");

    controller.stop().await;
}
