//! Admission through a real API server (`tests/cluster/cluster.sh`): the chart installed by
//! helm, its ValidatingWebhookConfiguration calling a `vramguard serve` on loopback, and every
//! `examples/*.yaml` TrainingJob created through the API server.
//!
//! The chart's webhook configuration (its rules, `matchConditions`, failure policy, timeout)
//! is used as installed, except `clientConfig`: the test patches it to the loopback URL of
//! the `vramguard serve` it starts and that server's CA, since no pod runs the chart's
//! Deployment here (no kubelet, no image).
//!
//! What each example must get is asked of the webhook itself, over TLS with the review the
//! API server would send; the test checks the API server returns the same: a denial as a
//! 403 carrying our message, an admission with our warnings intact.

#[path = "support/cluster.rs"]
mod cluster;

use std::path::PathBuf;

use axum::http::Method;
use cluster::{Answer, JSON};
use kube::Client;
use serde_json::{Value, json};

const TEST: &str = "e2e_admission";
const NS: &str = "e2e-admission";

fn example_jobs() -> Vec<(String, Value)> {
    let dir = cluster::root().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut jobs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("an example");
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for d in docs {
            if d.get("kind").and_then(Value::as_str) == Some("TrainingJob") {
                let name = f.file_name().unwrap().to_string_lossy().into_owned();
                jobs.push((name, d));
            }
        }
    }
    // The reviews of examples/admission/ hold TrainingJobs too (one adjusted to fit, one
    // over JAX's memory fraction...): their objects, all but the one the schema refuses first.
    let dir = cluster::root().join("examples/admission");
    let mut reviews: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/admission/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    reviews.sort();
    for f in reviews {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let review: Value =
            serde_json::from_str(&std::fs::read_to_string(&f).expect("a review")).expect("JSON");
        let request = &review["request"];
        if request["operation"] == "CREATE"
            && request["kind"]["kind"] == "TrainingJob"
            && !name.contains("invalid")
        {
            let mut job = request["object"].clone();
            job["metadata"] = json!({"name": job["metadata"]["name"]});
            jobs.push((format!("admission/{name}"), job));
        }
    }
    jobs
}

/// The webhook's own answer to a CREATE review of `job`.
async fn ask_webhook(webhook: &Client, job: &Value) -> Value {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-4000-8000-000000000001",
            "kind": {"group": "vramguard.io", "version": "v1alpha1", "kind": "TrainingJob"},
            "resource": {"group": "vramguard.io", "version": "v1alpha1", "resource": "trainingjobs"},
            "name": job["metadata"]["name"],
            "namespace": NS,
            "operation": "CREATE",
            "userInfo": {"username": "e2e"},
            "object": job,
            "dryRun": false,
        }
    });
    let req = axum::http::Request::post("/validate")
        .header("content-type", JSON)
        .body(serde_json::to_vec(&review).unwrap())
        .unwrap();
    let text = webhook
        .request_text(req)
        .await
        .expect("the webhook answers");
    let answer: Value = serde_json::from_str(&text).expect("an AdmissionReview");
    answer["response"].clone()
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

fn trainingjobs(ns: &str) -> String {
    format!("/apis/vramguard.io/v1alpha1/namespaces/{ns}/trainingjobs")
}

async fn create(client: &Client, job: &Value) -> Answer {
    cluster::send(client, Method::POST, &trainingjobs(NS), JSON, job).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_are_judged_by_the_webhook_through_the_api_server() {
    // The chart as a user installs it, with the CA and certificate it generates.
    let Some((client, _helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    let path = cluster::webhook_configuration_path();
    let installed = cluster::send(&client, Method::GET, &path, JSON, &Value::Null).await;
    assert_eq!(installed.status, 200, "{}", installed.body);
    let hook = &installed.body["webhooks"][0];
    assert_eq!(hook["name"], "trainingjobs.vramguard.io");
    assert!(
        hook["clientConfig"]["caBundle"]
            .as_str()
            .is_some_and(|b| !b.is_empty()),
        "tls.mode=generated puts the CA in the webhook configuration: {hook}"
    );

    let scratch = cluster::scratch(TEST);
    let inventory = cluster::root().join("examples/cluster.yaml");
    let (_webhook, port, ca_pem) =
        cluster::start_serve(&scratch, &["--cluster", inventory.to_str().unwrap()], &[]).await;
    cluster::point_webhook_at(&client, port, &ca_pem).await;

    cluster::namespace(&client, NS, json!({})).await;
    let webhook = webhook_client(port, &ca_pem);
    let (mut denied, mut warned) = (0, 0);
    for (file, mut job) in example_jobs() {
        job["metadata"]["namespace"] = json!(NS);
        let name = job["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        // A rerun on the same cluster starts from nothing.
        let one = format!("{}/{name}", trainingjobs(NS));
        cluster::send(&client, Method::DELETE, &one, JSON, &Value::Null).await;
        cluster::eventually(&format!("{name} to be gone"), 30, || async {
            cluster::send(&client, Method::GET, &one, JSON, &Value::Null)
                .await
                .status
                == 404
        })
        .await;

        let expected = ask_webhook(&webhook, &job).await;
        let allowed = expected["allowed"].as_bool().expect("allowed");
        assert!(
            !(allowed && file.starts_with("denied-")),
            "{file}: an example named denied-* must be denied: {expected}"
        );
        let got = create(&client, &job).await;
        if allowed {
            assert_eq!(got.status, 201, "{file}: {}", got.body);
            let want: Vec<String> = expected["warnings"]
                .as_array()
                .map(|w| {
                    w.iter()
                        .map(|s| s.as_str().expect("a warning").to_string())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(
                got.warnings, want,
                "{file}: the API server relays the webhook's warnings"
            );
            if !want.is_empty() {
                warned += 1;
                eprintln!("{file}: warnings {want:?}");
            }
        } else {
            denied += 1;
            let message = expected["status"]["message"].as_str().expect("a message");
            assert_eq!(got.status, 403, "{file}: {}", got.body);
            assert_eq!(
                got.body["message"].as_str(),
                Some(
                    format!(
                        "admission webhook \"trainingjobs.vramguard.io\" denied the request: {message}"
                    )
                    .as_str()
                ),
                "{file}"
            );
            assert!(
                message.contains("GiB"),
                "{file}: the denial names the need: {message}"
            );
        }
    }
    assert!(denied >= 1, "no example was denied");
    assert!(warned >= 1, "no example came back with warnings");

    // spec.model is immutable: the CRD's CEL rule refuses the change before any webhook.
    let first = format!("{}/first-job-gpt2", trainingjobs(NS));
    let change = json!({"spec": {"model": {"preset": "gpt2-medium"}}});
    let got = cluster::send(
        &client,
        Method::PATCH,
        &first,
        "application/merge-patch+json",
        &change,
    )
    .await;
    assert_eq!(got.status, 422, "{}", got.body);
    let message = got.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.model cannot change on a TrainingJob"),
        "the CEL rule's message: {message}"
    );

    // A label only: matchConditions skip the webhook, and the update goes through.
    let label = json!({"metadata": {"labels": {"team": "e2e"}}});
    let got = cluster::send(
        &client,
        Method::PATCH,
        &first,
        "application/merge-patch+json",
        &label,
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.body);

    // The schema: a micro-batch of 0 is below the minimum, an unknown field is refused
    // with strict field validation (kubectl's default).
    let (_, mut bad) = example_jobs()
        .into_iter()
        .find(|(f, _)| f == "first-job-gpt2.yaml")
        .expect("first-job-gpt2.yaml");
    bad["metadata"] = json!({"name": "bad-fields", "namespace": NS});
    bad["spec"]["training"]["microBatchSize"] = json!(0);
    let got = create(&client, &bad).await;
    assert_eq!(got.status, 422, "{}", got.body);
    let message = got.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.training.microBatchSize")
            && message.contains("greater than or equal to 1"),
        "the schema's minimum: {message}"
    );
    bad["spec"]["training"]["microBatchSize"] = json!(8);
    bad["spec"]["training"]["microBatchSzie"] = json!(8);
    let strict = format!("{}?fieldValidation=Strict", trainingjobs(NS));
    let got = cluster::send(&client, Method::POST, &strict, JSON, &bad).await;
    assert_eq!(got.status, 400, "{}", got.body);
    let message = got.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("unknown field \"spec.training.microBatchSzie\""),
        "the schema's unknown field: {message}"
    );

    // Admitted jobs would be run by the next test's operator: none is left behind.
    let all = cluster::send(
        &client,
        Method::DELETE,
        &trainingjobs(NS),
        JSON,
        &Value::Null,
    )
    .await;
    assert_eq!(all.status, 200, "{}", all.body);
}
