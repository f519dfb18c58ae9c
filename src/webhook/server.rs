//! The HTTP side: a router any test can drive with `oneshot`, and `serve`,
//! which binds TLS, reloads certificates and drains in-flight reviews on
//! shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use k8s_openapi::jiff::Timestamp;
use kube::core::Status;
use prometheus_client::registry::Registry;
use tokio::sync::{Semaphore, SemaphorePermit};
use tower_http::timeout::TimeoutLayer;

use super::cache::{self, Cache};
use super::decide::{self, Judgement};
use super::metrics::{Metrics, Reason, ReviewLabels, Verdict};
use super::review::{self, Answer, Job, Object, ReadJob, Review};
use super::workload::{self, Enforcement};
use crate::inventory::Source;
use crate::kinds::Kind;

/// Largest AdmissionReview body accepted (the API server caps objects at 1.5 MiB; reviews
/// carry the object and the old object).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Longest a request may take, body included (the API server's default webhook timeout is
/// 10 s): one deadline for the whole body, however slowly its bytes come.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Reviews judged at once; more wait (within `REQUEST_TIMEOUT`) once their body has arrived.
/// Bodies still arriving do not count, and `/healthz`, `/readyz` and `/metrics` never wait.
pub const MAX_IN_FLIGHT: usize = 64;
/// Bytes of review bodies held at once, over every connection: a body takes its share
/// as its bytes arrive and gives it back with the answer; one that finds none left is
/// answered 503 at once.
pub const BODY_MEMORY_BYTES: usize = 8 * MAX_BODY_BYTES;
/// Of a body over the limit, the first bytes kept to find the review's uid in.
pub const UID_PREFIX_BYTES: usize = 64 * 1024;
/// Longest a client may take over its TLS handshake, and over a request's head: a client
/// that stalls there is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection is kept open with no request in flight, HTTP/1.1 keep-alive and
/// HTTP/2 alike (an HTTP/2 client is sent GOAWAY; a ping does not count as a request).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections open at once (per process); one more is closed as soon as it is accepted.
pub const MAX_CONNECTIONS: usize = 512;

/// Shared state of every handler: the inventory, metrics, and the judgements
/// of specs already reviewed.
pub struct AppState {
    pub inventory: Arc<dyn Source>,
    pub metrics: Metrics,
    pub registry: Registry,
    pub decisions: Cache<Judgement>,
    /// The decisions on Jobs, JobSets, TrainJobs and PyTorchJobs already
    /// judged, before enforcement, keyed as `decisions` is.
    pub workload_decisions: Cache<decide::Decision>,
    /// Reviews answered, for the summary the log gets at info.
    pub totals: Totals,
    /// What `/validate` does with its verdict on a Job, JobSet, TrainJob or
    /// PyTorchJob (`/validate/deny`, `/warn`, `/audit` say it per review).
    pub enforcement: Enforcement,
    /// Where `Audit` verdicts go to be recorded as Events (none: only counted).
    pub audit_events: Option<super::audit::AuditEvents>,
}

/// Counts since start, read by [`log_summaries`].
#[derive(Debug, Default)]
pub struct Totals {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub invalid: AtomicU64,
    /// Reviews answered from the judgement cache.
    pub cached: AtomicU64,
}

impl AppState {
    pub fn new(inventory: Arc<dyn Source>) -> AppState {
        AppState::with_cache(inventory, cache::DEFAULT_CAPACITY)
    }

    /// With a judgement cache of `capacity` entries (0: every review is judged afresh).
    pub fn with_cache(inventory: Arc<dyn Source>, capacity: usize) -> AppState {
        let mut registry = Registry::with_prefix("vramguard");
        let metrics = Metrics::register(&mut registry);
        AppState {
            inventory,
            metrics,
            registry,
            decisions: Cache::new(capacity),
            workload_decisions: Cache::new(capacity),
            totals: Totals::default(),
            enforcement: Enforcement::default(),
            audit_events: None,
        }
    }
}

/// Bounds on requests and connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest body of a review; a larger one is denied with the reason.
    pub body_bytes: usize,
    /// Longest a request may take, the arrival of its body included.
    pub timeout: Duration,
    /// Longest a connection is kept with no request in flight.
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            body_bytes: MAX_BODY_BYTES,
            timeout: REQUEST_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// What `/validate` shares between requests: the limits, the reviews being
/// judged and the body bytes held.
struct Gate {
    limits: Limits,
    judging: Semaphore,
    body_memory: Semaphore,
}

/// The webhook's routes with the default body limit and request timeout.
pub fn router(state: Arc<AppState>) -> Router {
    router_with(state, Limits::default())
}

/// The webhook's routes with the given limits. Only `/validate` counts against
/// the review limit, and only once its body has arrived.
pub fn router_with(state: Arc<AppState>, limits: Limits) -> Router {
    let gate = Arc::new(Gate {
        limits,
        judging: Semaphore::new(MAX_IN_FLIGHT),
        // A body at the limit must always fit.
        body_memory: Semaphore::new(BODY_MEMORY_BYTES.max(limits.body_bytes)),
    });
    let validate = |mode: Option<Enforcement>| {
        let gate = gate.clone();
        move |State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body| {
            let gate = gate.clone();
            async move {
                let mode = mode.unwrap_or(state.enforcement);
                validate(&state, &gate, &headers, body, mode).await
            }
        }
    };
    Router::new()
        .route("/validate", post(validate(None)))
        .route(
            Enforcement::Deny.path(),
            post(validate(Some(Enforcement::Deny))),
        )
        .route(
            Enforcement::Warn.path(),
            post(validate(Some(Enforcement::Warn))),
        )
        .route(
            Enforcement::Audit.path(),
            post(validate(Some(Enforcement::Audit))),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.timeout,
        ))
        .with_state(state)
}

fn json(status: StatusCode, answer: &Answer<'_>) -> Response {
    let mut body = Vec::with_capacity(256);
    match serde_json::to_writer(&mut body, answer) {
        Ok(()) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// 400 with `message`, as kube's `AdmissionResponse::invalid` words it.
fn invalid(message: String) -> Response {
    let status = Status::failure(&message, "InvalidRequest");
    let answer = Answer {
        api_version: review::API_VERSION,
        kind: review::KIND,
        response: review::Response {
            uid: "",
            allowed: false,
            status: &status,
            warnings: &[],
        },
    };
    json(StatusCode::BAD_REQUEST, &answer)
}

/// A body as it came, or why it did not.
enum Received<'g> {
    Whole(Vec<u8>, Option<SemaphorePermit<'g>>),
    /// Over the limit: its first bytes (to find the uid in) and the length it declared.
    TooLarge(Vec<u8>, Option<u64>),
    Failed(String),
    /// The body memory is taken by other bodies.
    Busy,
}

/// Read a body of at most `limits.body_bytes`, taking its share of the body
/// memory as it arrives (none left: `Busy` at once, rather than a wait that
/// would not see the client leave). A body over the limit keeps only its first bytes and
/// the rest is read and dropped (so the answer is not lost to a reset), within
/// half the request timeout and four times the limit.
async fn receive<'g>(gate: &'g Gate, headers: &HeaderMap, mut body: Body) -> Received<'g> {
    let limit = gate.limits.body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let over = declared.is_some_and(|n| n > limit as u64);
    let keep = if over {
        UID_PREFIX_BYTES.min(limit)
    } else {
        limit
    };
    let mut bytes: Vec<u8> = Vec::new();
    let mut held: Option<SemaphorePermit<'g>> = None;
    let mut too_large = over;
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
            Err(e) => return Received::Failed(e.to_string()),
        };
        let take = data.len().min(keep - bytes.len());
        if take > 0 {
            let Ok(permit) = gate.body_memory.try_acquire_many(take as u32) else {
                return Received::Busy;
            };
            match &mut held {
                Some(h) => h.merge(permit),
                None => held = Some(permit),
            }
            if bytes.is_empty()
                && let Some(n) = declared
            {
                bytes.reserve_exact(n.min(keep as u64) as usize);
            }
            bytes.extend_from_slice(&data[..take]);
        }
        if take < data.len() {
            too_large = true;
            break;
        }
    }
    if !too_large {
        return Received::Whole(bytes, held);
    }
    let drain = async {
        let mut dropped = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            dropped += frame.data_ref().map_or(0, |d| d.len());
            if dropped > 4 * limit {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(gate.limits.timeout / 2, drain).await;
    drop(held);
    Received::TooLarge(bytes, declared)
}

/// The denial of a body over the limit: an AdmissionReview (HTTP 200, so the API
/// server shows the reason whatever the failure policy) with code 413 and the
/// review's uid when its first bytes carry it.
fn too_large(prefix: &[u8], declared: Option<u64>, limit: usize) -> Response {
    let uid = review::uid_in_prefix(prefix);
    let size = declared.map_or_else(|| "more than".to_string(), |n| format!("{n} bytes,"));
    let mut message = format!(
        "the AdmissionReview is {size} over the webhook's limit of {limit} bytes \
         ({:.1} MiB); a TrainingJob's spec is a few KiB: look for a large template or hfConfig",
        limit as f64 / (1024.0 * 1024.0)
    );
    if uid.is_none() {
        message.push_str(&format!(
            "; the review's uid could not be read from its first {} bytes",
            prefix.len()
        ));
    }
    let status = Status::failure(&message, "RequestEntityTooLarge").with_code(413);
    let answer = Answer {
        api_version: review::API_VERSION,
        kind: review::KIND,
        response: review::Response {
            uid: uid.as_deref().unwrap_or(""),
            allowed: false,
            status: &status,
            warnings: &[],
        },
    };
    json(StatusCode::OK, &answer)
}

async fn validate(
    state: &AppState,
    gate: &Gate,
    headers: &HeaderMap,
    body: Body,
    enforcement: Enforcement,
) -> Response {
    let started = Instant::now();
    let (body, _held) = match receive(gate, headers, body).await {
        Received::Whole(bytes, held) => (bytes, held),
        Received::TooLarge(prefix, declared) => {
            count(state, started, Verdict::Invalid, Reason::TooLarge);
            return too_large(&prefix, declared, gate.limits.body_bytes);
        }
        Received::Failed(e) => {
            count(state, started, Verdict::Invalid, Reason::Malformed);
            return invalid(format!("reading the body: {e}"));
        }
        // Not a verdict: the API server retries or applies the failure policy.
        Received::Busy => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                format!(
                    "the webhook holds {BODY_MEMORY_BYTES} bytes of review bodies already; try again"
                ),
            )
                .into_response();
        }
    };
    // Judged only with a place among `MAX_IN_FLIGHT` (the semaphore is never closed).
    let _judging = gate.judging.acquire().await.ok();
    // A valid TrainingJob is read once, straight into its type; anything else
    // is read again the general way, whose errors name the field.
    if let Ok(review) = serde_json::from_slice::<Review<'_, Job>>(&body) {
        return answer(state, review, started);
    }
    // A Job, JobSet, TrainJob or PyTorchJob is read whole (its pod template
    // is what it asks of GPUs).
    if let Ok(peek) = serde_json::from_slice::<Review<'_, serde::de::IgnoredAny>>(&body)
        && let Some(kind) = peek
            .request
            .as_ref()
            .and_then(|r| Kind::of(&r.kind.group, &r.kind.kind))
    {
        return match serde_json::from_slice::<Review<'_, serde_json::Value>>(&body) {
            Ok(review) => answer_workload(state, review, kind, enforcement, started),
            Err(e) => {
                count(state, started, Verdict::Invalid, Reason::Malformed);
                invalid(format!("not an AdmissionReview: {e}"))
            }
        };
    }
    match serde_json::from_slice::<Review<'_, Object>>(&body) {
        Ok(review) => answer(state, review, started),
        Err(e) => {
            count(state, started, Verdict::Invalid, Reason::Malformed);
            invalid(format!("not an AdmissionReview: {e}"))
        }
    }
}

fn count(state: &AppState, started: Instant, verdict: Verdict, reason: Reason) {
    let total = match verdict {
        Verdict::Allowed => &state.totals.allowed,
        Verdict::Denied => &state.totals.denied,
        Verdict::Invalid => &state.totals.invalid,
    };
    total.fetch_add(1, Ordering::Relaxed);
    state
        .metrics
        .reviews
        .get_or_create(&ReviewLabels { verdict, reason })
        .inc();
    state
        .metrics
        .latency
        .observe(started.elapsed().as_secs_f64());
}

/// The request of a well-formed review, or the answer to a malformed one
/// (counted as such): the wrong apiVersion or kind, or no request.
fn request_of<'a, O>(
    state: &AppState,
    review: &mut Review<'a, O>,
    started: Instant,
) -> Result<review::Request<'a, O>, Box<Response>> {
    if review.api_version != review::API_VERSION || review.kind != review::KIND {
        count(state, started, Verdict::Invalid, Reason::Malformed);
        return Err(Box::new(invalid(format!(
            "apiVersion {:?}, kind {:?}: only {} {} is served",
            review.api_version,
            review.kind,
            review::API_VERSION,
            review::KIND
        ))));
    }
    review.request.take().ok_or_else(|| {
        count(state, started, Verdict::Invalid, Reason::Malformed);
        Box::new(invalid(
            "the AdmissionReview has no request: failed to convert AdmissionReview into AdmissionRequest"
                .to_string(),
        ))
    })
}

fn answer<O: ReadJob>(state: &AppState, mut review: Review<'_, O>, started: Instant) -> Response {
    let request = match request_of(state, &mut review, started) {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let snapshot = state.inventory.snapshot();
    let now = Timestamp::now();
    if let Some(t) = snapshot.refreshed_unix {
        state
            .metrics
            .inventory_age
            .set((now.as_second() - t).max(0) as f64);
    }
    let uid = request.uid.clone();
    let name = request.name.clone();
    let namespace = request.namespace.clone();
    let dry_run = request.dry_run;
    let (decision, cached) = decide::review_cached(request, &snapshot, now, &state.decisions);
    if cached {
        state.totals.cached.fetch_add(1, Ordering::Relaxed);
    }
    // One line per review only when someone asked for debug: at info the
    // log gets a summary (`log_summaries`).
    tracing::debug!(
        uid = %uid,
        namespace = namespace.as_deref().unwrap_or(""),
        name = %name,
        dry_run = dry_run,
        allowed = decision.allowed,
        reason = ?decision.reason,
        cached = cached,
        "admission review"
    );
    count(state, started, decision.verdict, decision.reason);
    let answer = Answer {
        api_version: &review.api_version,
        kind: &review.kind,
        response: review::Response {
            uid: &uid,
            allowed: decision.allowed,
            status: &decision.status,
            warnings: &decision.warnings,
        },
    };
    json(StatusCode::OK, &answer)
}

/// Answer a review of a Job, JobSet, TrainJob or PyTorchJob: CREATE is
/// judged (`workload::judge`) and the verdict enforced; other operations are
/// allowed unjudged.
fn answer_workload(
    state: &AppState,
    mut review: Review<'_, serde_json::Value>,
    kind: Kind,
    enforcement: Enforcement,
    started: Instant,
) -> Response {
    let request = match request_of(state, &mut review, started) {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let namespace = request.namespace.as_deref().unwrap_or("").to_string();
    let judged = match (&request.operation, &request.object) {
        (kube::core::admission::Operation::Create, Some(obj)) => {
            let snapshot = state.inventory.snapshot();
            let now = Timestamp::now();
            let second = snapshot.as_of_unix.unwrap_or(now.as_second());
            // The decision depends on the kind, the name (in its message), the
            // annotations, the owner and the spec; the inventory; the second.
            let cache = &state.workload_decisions;
            let key = if cache.enabled() {
                let meta = obj.get("metadata");
                let part = |k: &str| meta.and_then(|m| m.get(k));
                serde_json::to_vec(&(
                    kind.name(),
                    part("name"),
                    part("annotations"),
                    part("ownerReferences"),
                    obj.get("spec"),
                ))
                .ok()
            } else {
                None
            };
            let hit = key.as_ref().and_then(|k| cache.get(&snapshot, second, k));
            let d = match hit {
                Some(d) => {
                    state.totals.cached.fetch_add(1, Ordering::Relaxed);
                    (*d).clone()
                }
                None => {
                    let d = workload::judge(kind, obj, &snapshot, now);
                    if let Some(k) = key {
                        cache.insert(&snapshot, second, k, Arc::new(d.clone()));
                    }
                    d
                }
            };
            state
                .metrics
                .workload_verdict(enforcement, d.verdict, d.reason, &namespace);
            // Audit records the verdict on the object, off the review's path;
            // a dry run creates no object to record it on.
            if enforcement == Enforcement::Audit
                && !request.dry_run
                && let Some(events) = &state.audit_events
                && let Some(e) = super::audit::event_for(kind, obj, &d)
            {
                events.record(e);
            }
            d
        }
        _ => workload::enforce(
            decide::Judgement::Allow {
                reason: Reason::NotJudged,
                warnings: Vec::new(),
            }
            .decision(""),
            Enforcement::Deny,
        ),
    };
    let decision = workload::enforce(judged, enforcement);
    tracing::debug!(
        uid = %request.uid,
        namespace = %namespace,
        name = %request.name,
        kind = kind.name(),
        enforcement = enforcement.name(),
        allowed = decision.allowed,
        reason = ?decision.reason,
        "admission review"
    );
    count(state, started, decision.verdict, decision.reason);
    let answer = Answer {
        api_version: &review.api_version,
        kind: &review.kind,
        response: review::Response {
            uid: &request.uid,
            allowed: decision.allowed,
            status: &decision.status,
            warnings: &decision.warnings,
        },
    };
    json(StatusCode::OK, &answer)
}

/// Every `every`, when reviews came in since the last line: one info line
/// with how many were allowed, denied and invalid, and how many were answered
/// from the judgement cache. Runs until cancelled.
pub async fn log_summaries(state: Arc<AppState>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let read = |t: &Totals| {
        [&t.allowed, &t.denied, &t.invalid, &t.cached].map(|c| c.load(Ordering::Relaxed))
    };
    let mut last = read(&state.totals);
    loop {
        tick.tick().await;
        let now = read(&state.totals);
        let [allowed, denied, invalid, cached] = [0, 1, 2, 3].map(|i| now[i] - last[i]);
        if allowed + denied + invalid > 0 {
            tracing::info!(
                allowed,
                denied,
                invalid,
                cached,
                seconds = every.as_secs(),
                "admission reviews"
            );
        }
        last = now;
    }
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.inventory.snapshot().synced {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the GPU inventory has not synced yet",
        )
            .into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
