//! The bodies of the fuzz targets, one function per door vramguard reads
//! outside input through. Each runs the input down the same path the program
//! does and checks what must hold for any input: no panic, and the answers
//! keep their promises (a reviewed uid comes back, a denial fits the API
//! server's limits). `tests/fuzz_corpus.rs` runs the same bodies over the
//! committed corpus and the crashes found so far, so a plain `cargo test`
//! replays them without libFuzzer.

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::body::Body;
use http_body_util::BodyExt;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tower::ServiceExt;

use vramguard::agent::simulated::Simulated;
use vramguard::agent::{Assignments, ProbeOptions, Prober, pod_resources};
use vramguard::api::{self, GpuNode, MemoryProfile, parse};
use vramguard::cli::estimate::reports_from_text;
use vramguard::estimate::{self, GpuProduct, gpus};
use vramguard::inventory::{self, Snapshot, Source, Static};
use vramguard::operator::{fingerprint, learn, oom};
use vramguard::plan::{self, GpuView};
use vramguard::webhook::decide::{self, MAX_MESSAGE, MAX_WARNING};
use vramguard::webhook::review::{Object, Review};
use vramguard::webhook::{AppState, router};

/// The example cluster every placement and review is judged against.
const CLUSTER: &str = include_str!("../../examples/cluster.yaml");
/// A review of a job that fits: the fixed job the inventory target places.
const FITTING_REVIEW: &[u8] = include_bytes!("../../examples/admission/create-fits.json");

static NODES: LazyLock<Vec<GpuNode>> = LazyLock::new(|| {
    parse::documents(CLUSTER)
        .expect("examples/cluster.yaml is YAML")
        .into_iter()
        .map(|d| parse::gpu_node(d).expect("examples/cluster.yaml holds GpuNodes"))
        .collect()
});

/// The moment the example cluster was probed: nothing in it is stale then.
static NOW: LazyLock<Timestamp> = LazyLock::new(|| {
    NODES
        .iter()
        .filter_map(|n| n.status.as_ref()?.probe_time.as_ref().map(|t| t.0))
        .max()
        .unwrap_or(Timestamp::UNIX_EPOCH)
});

fn gpu(name: &str) -> &'static GpuProduct {
    gpus::find(name).expect("the catalog has the GPU the fuzz targets use")
}

/// A large and a small GPU, so both the fitting and the shrinking paths run.
static TARGETS: LazyLock<[&'static GpuProduct; 2]> =
    LazyLock::new(|| [gpu("h100-80gb"), gpu("t4")]);

/// Parse → validate → estimate → plan (and placement on the example cluster)
/// for every document of a YAML or JSON text, as `vramguard estimate` runs it.
pub fn job_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(reports) = reports_from_text(text, &*TARGETS) else {
        return;
    };
    for report in reports.into_iter().flatten() {
        for v in &report.verdicts {
            assert!(
                v.verdict.fits || v.plan.as_ref().is_none_or(|p| p.verdict.fits),
                "a plan the search returns fits: {:?}",
                v.plan
            );
        }
        if let Some(job) = &report.job {
            let _ = plan::place(job, &NODES, &[], &[], *NOW);
        }
    }
}

/// A spec's `training` block picked by one byte, so the model readers meet
/// each recipe: full training, LoRA, QLoRA, inference, pipeline stages.
fn training(selector: u8) -> Value {
    match selector % 5 {
        0 => json!({"microBatchSize": 2, "sequenceLength": 1024}),
        1 => json!({"mode": "lora", "microBatchSize": 4, "gradientCheckpointing": "full"}),
        2 => json!({"mode": "qlora", "attention": "eager", "loss": "chunked"}),
        3 => json!({"mode": "inference", "precision": "bf16"}),
        _ => json!({"microBatchSize": 8, "precision": "fp32", "optimizer": "sgd-momentum"}),
    }
}

/// Read a TrainingJob built around `model`, validate, estimate and fit it;
/// the same steps the webhook takes for one GPU.
fn judge_model(model: Value, selector: u8) {
    let mut spec = json!({
        "model": model,
        "training": training(selector),
        "fitPolicy": {"mode": "Adjust", "allow": ["microBatchSize", "gradientCheckpointing", "precision"]},
    });
    if selector % 7 == 6 {
        spec["parallelism"] = json!({"gpus": 4, "pipelineParallel": 2, "tensorParallel": 2});
    }
    let doc = json!({
        "apiVersion": parse::API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": "fuzz"},
        "spec": spec,
    });
    let Ok(tj) = parse::training_job(doc) else {
        return;
    };
    let Ok(job) = api::validate_job(&tj) else {
        return;
    };
    for g in TARGETS.iter() {
        if estimate::estimate(&job, g).is_err() {
            continue;
        }
        if let Ok(s) = plan::shrink(&job, g, GpuView::empty(g.usable_bytes())) {
            assert!(s.plan.is_none_or(|p| p.verdict.fits));
        }
    }
}

/// The first byte picks the recipe; the rest is JSON.
fn split(data: &[u8]) -> Option<(u8, Value)> {
    let (&selector, rest) = data.split_first()?;
    let value = serde_json::from_slice(rest).ok()?;
    Some((selector, value))
}

/// A Hugging Face `config.json` as `spec.model.hfConfig`.
pub fn hf_config(data: &[u8]) {
    if let Some((selector, config)) = split(data) {
        judge_model(json!({ "hfConfig": config }), selector);
    }
}

/// A `layers` list (or `{layers, inputShape, head, numLabels}`) as `spec.model`.
pub fn layers(data: &[u8]) {
    let Some((selector, value)) = split(data) else {
        return;
    };
    let model = match value {
        Value::Object(map) => Value::Object(map),
        other => json!({ "layers": other }),
    };
    judge_model(model, selector);
}

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime starts")
});

static ROUTER: LazyLock<Router> = LazyLock::new(|| {
    let now = NOW.as_second();
    router(Arc::new(AppState::new(Arc::new(Static::new(
        NODES.clone(),
        now,
    )))))
});

/// The uid of a review, the only part of it the answer must repeat.
#[derive(serde::Deserialize)]
struct Sent {
    request: SentRequest,
}

#[derive(serde::Deserialize)]
struct SentRequest {
    uid: String,
}

/// An AdmissionReview body posted to `/validate`: every review that reads is
/// answered 200 with its own uid and messages within the API server's
/// limits; anything else is a 4xx.
pub fn admission(data: &[u8]) {
    let request = axum::http::Request::post("/validate")
        .header("content-type", "application/json")
        .body(Body::from(data.to_vec()))
        .expect("a request with a fixed method and path builds");
    let (status, body) = RUNTIME.block_on(async {
        let response = ROUTER
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("an in-memory body reads")
            .to_bytes();
        (status, body)
    });
    assert!(
        status.is_success() || status.is_client_error(),
        "status {status}"
    );
    let answer: Value = serde_json::from_slice(&body).expect("the answer is JSON");
    let response = &answer["response"];
    if status.is_success() {
        // Read only the uid, as the server does: the rest may hold what a
        // `Value` refuses (a lone surrogate escape) in parts the server skips.
        let sent: Sent = serde_json::from_slice(data).expect("a 200 was given a request uid");
        assert_eq!(
            response["uid"], sent.request.uid,
            "the answer carries the request's uid"
        );
    } else {
        assert_eq!(response["allowed"], false);
    }
    let message = response["status"]["message"].as_str().unwrap_or("");
    if status.is_success() {
        assert!(message.len() <= MAX_MESSAGE, "message of {}", message.len());
    }
    for w in response["warnings"].as_array().into_iter().flatten() {
        assert!(w.as_str().unwrap_or("").len() <= MAX_WARNING);
    }
}

/// GpuNode and MemoryProfile objects (YAML or JSON documents), read both
/// ways the inventory reads them: a static file through `parse::gpu_node`,
/// and the reflectors' plain deserialisation. The snapshot they make judges
/// a fixed review and places its job.
pub fn inventory(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(docs) = parse::documents(text) else {
        return;
    };
    let mut from_file = Vec::new();
    let mut from_watch = Vec::new();
    let mut profiles = Vec::new();
    for doc in docs {
        if doc.get("kind").and_then(Value::as_str) == Some("MemoryProfile") {
            if let Ok(p) = serde_json::from_value::<MemoryProfile>(doc) {
                profiles.push(p);
            }
            continue;
        }
        if let Ok(n) = serde_json::from_value::<GpuNode>(doc.clone()) {
            from_watch.push(n);
        }
        if let Ok(n) = parse::gpu_node(doc) {
            from_file.push(n);
        }
    }
    let mut ratios = inventory::profile_ratios(&profiles);
    let review: Review<'_, Object> =
        serde_json::from_slice(FITTING_REVIEW).expect("the example review reads");
    let request = review.request.expect("the example review has a request");
    let object = request.object.as_ref().map(|o| Value::Object(o.0.clone()));
    let tj = parse::training_job(object.expect("the example review has an object"))
        .expect("the example job reads");
    let job = api::validate_job(&tj).expect("the example job is valid");
    // Whatever ratio was learnt, apply it to the fixed job too.
    if let Some(r) = ratios.values().next().copied() {
        let name = fingerprint::profile_name(&fingerprint::fingerprint(&tj.spec));
        ratios.insert(name, r);
    }
    let now = NOW.as_second();
    let mut snapshot = Static::new(from_file, now).snapshot();
    snapshot.profiles = Arc::new(ratios);
    let decision = decide::review(request, &snapshot, *NOW);
    assert!(decision.status.message.len() <= MAX_MESSAGE);
    let watched = Snapshot::new(inventory::merge(from_watch, &[]), Some(now), true, None);
    let _ = watched.products();
    let _ = plan::place_scaled(
        &job,
        &watched.nodes,
        &[],
        &[],
        *NOW,
        snapshot.learnt_scale(&tj.spec),
    );
}

/// A simulated node file for the agent, then one probe of it.
pub fn simulation(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(sim) = Simulated::from_yaml(text) else {
        return;
    };
    let options = ProbeOptions {
        block_budget: std::time::Duration::from_millis(50),
        ..ProbeOptions::default()
    };
    let prober = Prober::new(Arc::new(sim), options);
    let _ = prober.probe(&Assignments::default(), *NOW);
}

/// A termination message or log tail as the operator reads it after a
/// failed attempt; the first two bytes pick the container's reason and exit
/// code, and what the OOM proves is learnt as the operator would.
pub fn oom(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let reason = match pick % 4 {
        0 => None,
        1 => Some("OOMKilled"),
        2 => Some("Error"),
        _ => Some("ContainerCannotRun"),
    };
    let exit = [None, Some(1), Some(137), Some(-1)][usize::from(pick / 4 % 4)];
    let _ = oom::classify(reason, exit, &text).message();
    if let Some(o) = oom::parse(&text) {
        let _ = oom::missing_bytes(&o);
        let _ = oom::need_floor_bytes(&o);
        let lesson = learn::learn(&o, None, 40 << 30, Some(80 << 30));
        assert!(lesson.learned.scale.is_finite() && lesson.learned.scale >= 1.0);
    }
}

/// A kubelet pod-resources answer, framed as gRPC sends it.
pub fn pod_resources(data: &[u8]) {
    if let Ok(msg) = pod_resources::unframe(data)
        && let Ok(pods) = pod_resources::decode_list_response(msg)
    {
        let _ = pod_resources::assignments(&pods);
    }
    if let Ok(pods) = pod_resources::decode_list_response(data) {
        let _ = pod_resources::assignments(&pods);
    }
}
