//! The HTTP side: a router any test can drive with `oneshot`, and `serve`,
//! which binds TLS, reloads certificates and drains in-flight reviews on
//! shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::jiff::Timestamp;
use kube::core::Status;
use prometheus_client::registry::Registry;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use super::cache::{self, Cache};
use super::decide::{self, Judgement};
use super::metrics::{Metrics, Reason, ReviewLabels, Verdict};
use super::review::{self, Answer, Job, Object, ReadJob, Review};
use crate::inventory::Source;

/// Largest AdmissionReview body accepted (the API server caps objects at 1.5 MiB; reviews
/// carry the object and the old object).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Longest a request may take, body included (the API server's default webhook timeout is 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Reviews judged at once; more wait (within `REQUEST_TIMEOUT`) before their body is read,
/// so bodies in memory stay under this many times `MAX_BODY_BYTES`.
pub const MAX_IN_FLIGHT: usize = 64;
/// Longest a client may take over its TLS handshake, and over a request's head (also the
/// longest an idle keep-alive connection is kept): a client that stalls there is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Shared state of every handler: the inventory, metrics, and the judgements
/// of specs already reviewed.
pub struct AppState {
    pub inventory: Arc<dyn Source>,
    pub metrics: Metrics,
    pub registry: Registry,
    pub decisions: Cache<Judgement>,
    /// Reviews answered, for the summary the log gets at info.
    pub totals: Totals,
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
            totals: Totals::default(),
        }
    }
}

/// Bounds on one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub body_bytes: usize,
    pub timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            body_bytes: MAX_BODY_BYTES,
            timeout: REQUEST_TIMEOUT,
        }
    }
}

/// The webhook's routes with the default body limit and request timeout.
pub fn router(state: Arc<AppState>) -> Router {
    router_with(state, Limits::default())
}

/// The webhook's routes with the given limits.
pub fn router_with(state: Arc<AppState>, limits: Limits) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(RequestBodyLimitLayer::new(limits.body_bytes))
        .layer(GlobalConcurrencyLimitLayer::new(MAX_IN_FLIGHT))
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

async fn validate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    // A valid TrainingJob is read once, straight into its type; anything else
    // is read again the general way, whose errors name the field.
    if let Ok(review) = serde_json::from_slice::<Review<'_, Job>>(&body) {
        return answer(&state, review, started);
    }
    match serde_json::from_slice::<Review<'_, Object>>(&body) {
        Ok(review) => answer(&state, review, started),
        Err(e) => {
            count(&state, started, Verdict::Invalid, Reason::Malformed);
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

fn answer<O: ReadJob>(state: &AppState, review: Review<'_, O>, started: Instant) -> Response {
    if review.api_version != review::API_VERSION || review.kind != review::KIND {
        count(state, started, Verdict::Invalid, Reason::Malformed);
        return invalid(format!(
            "apiVersion {:?}, kind {:?}: only {} {} is served",
            review.api_version,
            review.kind,
            review::API_VERSION,
            review::KIND
        ));
    }
    let Some(request) = review.request else {
        count(state, started, Verdict::Invalid, Reason::Malformed);
        return invalid(
            "the AdmissionReview has no request: failed to convert AdmissionReview into AdmissionRequest"
                .to_string(),
        );
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

/// Serve `router` over TLS on `addr` until `shutdown` resolves, then stop
/// accepting and give in-flight requests `drain` to finish. `bound` receives
/// the actual address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: axum_server::tls_rustls::RustlsConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: Duration,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> std::io::Result<()> {
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        h.graceful_shutdown(Some(drain));
    });
    if let Some(tx) = bound {
        let h = handle.clone();
        tokio::spawn(async move {
            if let Some(a) = h.listening().await {
                let _ = tx.send(a);
            }
        });
    }
    // TCP_NODELAY: an answer is one small write; without it Nagle's algorithm can
    // hold it back until the client's delayed ACK (tens of milliseconds).
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls)
        .handshake_timeout(HANDSHAKE_TIMEOUT)
        .acceptor(axum_server::accept::NoDelayAcceptor::new());
    let mut server = axum_server::bind(addr).acceptor(acceptor).handle(handle);
    // axum-server turns hyper's header-read timeout off: without it a client that
    // sends half a request head (or opens a connection and idles) holds it forever.
    server
        .http_builder()
        .http1()
        .header_read_timeout(Some(HANDSHAKE_TIMEOUT));
    server.serve(router.into_make_service()).await
}
