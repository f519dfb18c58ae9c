//! The agent's HTTP endpoint (plain HTTP, inside the cluster network):
//! `GET /check?gpus=K&bytes=N&block=B[&margin=M]` answers from a fresh probe
//! whether this node can give K GPUs N bytes each with a block of B bytes now
//! (JSON with per-GPU numbers; sizes take units, `bytes=20GiB`), and
//! `/healthz`. The verdict is `check::check`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tower_http::timeout::TimeoutLayer;

use super::Agent;
use super::check::{self, CheckAnswer};

/// Longest a check may take: a fresh probe runs largest-block searches.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// The agent's routes.
pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route("/check", get(check_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|State(agent): State<Arc<Agent>>| async move {
                crate::metrics::response(agent.registry())
            }),
        )
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            CHECK_TIMEOUT,
        ))
        .with_state(agent)
}

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    match serde_json::to_vec_pretty(body) {
        Ok(b) => (status, [(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn check_handler(State(agent): State<Arc<Agent>>, RawQuery(query): RawQuery) -> Response {
    let req = match check::parse_query(query.as_deref().unwrap_or("")) {
        Ok(r) => r,
        Err(error) => return json_response(StatusCode::BAD_REQUEST, &json!({ "error": error })),
    };
    let status = match agent.probe().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "check: probe failed");
            return json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({ "error": format!("probing the GPUs: {e}") }),
            );
        }
    };
    let answer: CheckAnswer = check::check(&status, &req);
    tracing::info!(
        gpus = req.gpus,
        bytes = req.bytes,
        block = req.block_bytes,
        fits = answer.fits,
        "check"
    );
    json_response(StatusCode::OK, &answer)
}

/// Serve `router` on `addr` until `shutdown` resolves. `bound` receives the
/// actual address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    if let Some(tx) = bound {
        let _ = tx.send(listener.local_addr()?);
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ProbeOptions;
    use crate::agent::simulated::Simulated;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn agent() -> Arc<Agent> {
        let sim = Simulated::from_yaml(
            "gpus:\n- {product: a100-40gb, processes: [{pid: 1, allocations: [{fill: 1GiB}, {freeEvery: 2}]}]}\n- {product: a100-40gb}",
        )
        .expect("valid");
        Arc::new(Agent::new(
            Arc::new(sim),
            ProbeOptions {
                probe_busy_gpus: true,
                ..ProbeOptions::default()
            },
            None,
        ))
    }

    async fn get(uri: &str) -> (StatusCode, serde_json::Value) {
        let resp = router(agent())
            .oneshot(axum::http::Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// `/metrics` shows what the last probe measured, per GPU.
    #[tokio::test]
    async fn metrics_follow_the_probes() {
        let agent = agent();
        let text = |agent: &Arc<Agent>| {
            let router = router(agent.clone());
            async move {
                let resp = router
                    .oneshot(
                        axum::http::Request::get("/metrics")
                            .body(Body::empty())
                            .unwrap(),
                    )
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(body.to_vec()).unwrap()
            }
        };
        let before = text(&agent).await;
        assert!(before.contains("vramguard_build_info{version="), "{before}");
        assert!(
            !before.contains("vramguard_agent_gpu_free_bytes{"),
            "{before}"
        );
        agent.probe().await.expect("a probe of the simulated GPUs");
        let after = text(&agent).await;
        for gpu in ["0", "1"] {
            for family in [
                "gpu_total_bytes",
                "gpu_free_bytes",
                "gpu_largest_free_block_bytes",
            ] {
                let series = format!("vramguard_agent_{family}{{gpu=\"{gpu}\"}}");
                assert!(after.contains(&series), "{series} missing from\n{after}");
            }
        }
    }

    #[tokio::test]
    async fn check_answers_from_a_fresh_probe() {
        let (status, body) = get("/check?gpus=2&bytes=16GiB&block=4GiB").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["fits"], false, "{body}");
        assert_eq!(body["gpusFitting"], 1, "{body}");
        assert_eq!(body["devices"][0]["fits"], false);
        assert_eq!(body["devices"][0]["blockMeasured"], true);
        assert!(body["probeTime"].is_string());
        let (_, body) = get("/check?gpus=1&bytes=16GiB&block=4GiB").await;
        assert_eq!(body["fits"], true, "{body}");
    }

    #[tokio::test]
    async fn bad_queries_say_what_is_wrong() {
        let (status, body) = get("/check?gpus=1").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("bytes: missing"),
            "{body}"
        );
        let resp = router(agent())
            .oneshot(
                axum::http::Request::get("/healthz")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}
