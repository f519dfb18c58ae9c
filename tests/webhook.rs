//! The webhook over real TLS with real AdmissionReview JSON (the reviews in
//! `examples/admission/`, shaped as the API server sends them), against the
//! static inventory of `examples/cluster.yaml`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio_rustls::rustls;
use vramguard::inventory::Static;
use vramguard::webhook::{self, AppState, Limits, tls};

#[path = "support/tls_webhook.rs"]
mod tls_webhook;
use tls_webhook::{Server, cluster, connector, connector_with_alpn, stop};

async fn start(limits: Limits) -> Server {
    tls_webhook::start_with(limits, |_| {}).await
}

async fn post(server: &Server, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector(&server.ca_pem).connect(name, tcp).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tls);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
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

fn review_file(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/admission")
            .join(name),
    )
    .unwrap()
}

async fn response_of(server: &Server, name: &str) -> Value {
    let (status, body) = post(server, "/validate", review_file(name)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    let req: Value = serde_json::from_slice(&review_file(name)).unwrap();
    assert_eq!(v["response"]["uid"], req["request"]["uid"], "uid copied");
    v["response"].clone()
}

#[tokio::test]
async fn reviews_over_tls() {
    let server = start(Limits::default()).await;

    let fits = response_of(&server, "create-fits.json").await;
    assert_eq!(fits["allowed"], true, "{fits}");

    let no = response_of(&server, "create-does-not-fit.json").await;
    assert_eq!(no["allowed"], false, "{no}");
    let msg = no["status"]["message"].as_str().unwrap();
    assert!(msg.contains("GiB per GPU"), "{msg}");
    assert!(msg.contains("biggest GPU in this cluster"), "{msg}");
    assert!(msg.len() <= 1024);
    assert_eq!(no["status"]["code"], 403);

    let dry = response_of(&server, "create-dry-run.json").await;
    assert_eq!(dry["allowed"], false, "dry-run reviews are judged the same");
    assert_eq!(
        dry["status"]["message"]
            .as_str()
            .unwrap()
            .replace("llama-3-1-405b-full", ""),
        msg.replace("llama-3-1-405b-full", "")
    );

    let adjust = response_of(&server, "create-fits-after-change.json").await;
    assert_eq!(adjust["allowed"], true, "{adjust}");
    let warnings = adjust["warnings"].as_array().expect("warnings");
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains(" -> ")),
        "{warnings:?}"
    );
    // Warnings reach users as HTTP headers, which clients read as ASCII only.
    assert!(
        warnings.iter().all(|w| w.as_str().unwrap().is_ascii()),
        "{warnings:?}"
    );
    assert!(warnings.iter().all(|w| w.as_str().unwrap().len() <= 120));
    // A long warning is split into several, never cut: the promise names the
    // product and every change whole.
    assert!(
        warnings
            .iter()
            .all(|w| !w.as_str().unwrap().ends_with("...")),
        "{warnings:?}"
    );
    let said: Vec<&str> = warnings.iter().map(|w| w.as_str().unwrap()).collect();
    let said = said.join(" ");
    assert!(said.contains("vramguard will run this on "), "{said}");

    let invalid = response_of(&server, "create-invalid.json").await;
    assert_eq!(invalid["allowed"], false);
    let m = invalid["status"]["message"].as_str().unwrap();
    assert!(m.contains("spec.training.microBatchSize"), "{m}");
    assert!(m.contains("spec.training.lora.rank"), "{m}");

    let upd = response_of(&server, "update-immutable.json").await;
    assert_eq!(upd["allowed"], false);
    assert!(
        upd["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.model")
    );

    let del = response_of(&server, "delete.json").await;
    assert_eq!(del["allowed"], true);
    let pod = response_of(&server, "other-kind.json").await;
    assert_eq!(pod["allowed"], true);

    // Malformed JSON: 400 with a reason.
    let (status, body) = post(&server, "/validate", b"{not json".to_vec()).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("not an AdmissionReview"));

    // A review without a request.
    let (status, _) = post(
        &server,
        "/validate",
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
    )
    .await;
    assert_eq!(status, 400);

    // Metrics count what was answered, by bounded labels.
    let (status, body) = get(&server, "/metrics").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    assert!(
        text.contains("vramguard_reviews_total{verdict=\"Denied\",reason=\"NoFit\"} 2"),
        "{text}"
    );
    assert!(text.contains("vramguard_review_duration_seconds_count"));
    let (status, _) = get(&server, "/readyz").await;
    assert_eq!(status, 200);
    stop(server).await;
}

async fn get(server: &Server, path: &str) -> (u16, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector(&server.ca_pem).connect(name, tcp).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tls);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    (
        status,
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

/// How a test sends a body.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// HTTP/1.1 with content-length.
    Http1,
    /// HTTP/1.1 chunked, no length.
    Http1Chunked,
    /// HTTP/2 (ALPN h2) with content-length.
    Http2,
    /// HTTP/2 in 16 KiB DATA frames with no length.
    Http2Streamed,
}

/// POST `body` to /validate the `how` way; the status and the body of the answer.
async fn post_as(server: &Server, how: Via, body: Vec<u8>) -> (u16, Vec<u8>) {
    use http_body_util::combinators::BoxBody;
    use http_body_util::{Full, StreamBody};
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let h2 = matches!(how, Via::Http2 | Via::Http2Streamed);
    let connector = if h2 {
        connector_with_alpn(&server.ca_pem, b"h2")
    } else {
        connector(&server.ca_pem)
    };
    let tls = connector.connect(name, tcp).await.unwrap();
    if h2 {
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    }
    let io = hyper_util::rt::TokioIo::new(tls);
    let body: BoxBody<Bytes, std::convert::Infallible> = match how {
        Via::Http1 | Via::Http2 => Full::new(Bytes::from(body)).boxed(),
        Via::Http1Chunked | Via::Http2Streamed => {
            let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = body
                .chunks(16 * 1024)
                .map(|c| Ok(hyper::body::Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            StreamBody::new(futures::stream::iter(frames)).boxed()
        }
    };
    let mut req = hyper::Request::post("/validate")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let resp = if h2 {
        *req.uri_mut() = "https://localhost/validate".parse().unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    } else {
        req.headers_mut()
            .insert("host", hyper::header::HeaderValue::from_static("localhost"));
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    };
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

/// A review of `examples/admission/create-fits.json` padded with spaces to `len` bytes.
fn padded_review(len: usize) -> Vec<u8> {
    let mut body = review_file("create-fits.json");
    let end = body.iter().rposition(|&b| b == b'}').unwrap();
    body.truncate(end);
    body.resize(len - 1, b' ');
    body.push(b'}');
    body
}

#[tokio::test]
async fn a_body_over_the_limit_is_denied_with_the_reason_over_http1_and_http2() {
    let server = start(Limits {
        body_bytes: 1024,
        timeout: Duration::from_secs(5),
        ..Limits::default()
    })
    .await;
    let uid = serde_json::from_slice::<Value>(&review_file("create-fits.json")).unwrap()["request"]
        ["uid"]
        .as_str()
        .unwrap()
        .to_string();
    for how in [
        Via::Http1,
        Via::Http1Chunked,
        Via::Http2,
        Via::Http2Streamed,
    ] {
        for (body, uid) in [
            (padded_review(200_000), uid.as_str()),
            (vec![b' '; 4096], ""),
        ] {
            let (status, answer) = post_as(&server, how, body).await;
            let text = String::from_utf8_lossy(&answer);
            assert_eq!(status, 200, "{how:?}: {text}");
            let v: Value = serde_json::from_slice(&answer).expect("an AdmissionReview");
            assert_eq!(v["kind"], "AdmissionReview", "{how:?}");
            assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{how:?}");
            let r = &v["response"];
            assert_eq!(r["uid"], uid, "{how:?}: {text}");
            assert_eq!(r["allowed"], false, "{how:?}");
            assert_eq!(r["status"]["code"], 413, "{how:?}");
            assert_eq!(r["status"]["reason"], "RequestEntityTooLarge", "{how:?}");
            let message = r["status"]["message"].as_str().unwrap();
            assert!(
                message.contains("limit of 1024 bytes"),
                "{how:?}: {message}"
            );
            assert_eq!(
                message.contains("uid could not be read"),
                uid.is_empty(),
                "{how:?}: {message}"
            );
        }
    }
    stop(server).await;
}

/// docs/DESIGN.md promises 4 MiB: a review of 3 MiB is judged, over either protocol.
#[tokio::test]
async fn a_review_under_the_documented_limit_is_judged() {
    assert_eq!(webhook::server::MAX_BODY_BYTES, 4 << 20);
    let server = start(Limits::default()).await;
    for how in [
        Via::Http1,
        Via::Http1Chunked,
        Via::Http2,
        Via::Http2Streamed,
    ] {
        let (status, answer) = post_as(&server, how, padded_review(3 << 20)).await;
        assert_eq!(status, 200, "{how:?}: {}", String::from_utf8_lossy(&answer));
        let v: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["response"]["allowed"], true, "{how:?}: {v}");
    }
    stop(server).await;
}

#[tokio::test]
async fn a_body_that_never_finishes_times_out() {
    let server = start(Limits {
        body_bytes: 1 << 20,
        timeout: Duration::from_millis(300),
        ..Limits::default()
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector(&server.ca_pem).connect(name, tcp).await.unwrap();
    tls.write_all(
        b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"apiVersion\":",
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut tls, &mut buf),
    )
    .await
    .expect("the server answers before the client gives up")
    .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    stop(server).await;
}

#[tokio::test]
async fn certificates_reload_when_the_files_change() {
    let dir = std::env::temp_dir().join(format!("vramguard-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let first = tls::self_signed(&["localhost".into()]).unwrap();
    std::fs::write(&cert, &first.cert_pem).unwrap();
    std::fs::write(&key, &first.key_pem).unwrap();
    let mut server = start(Limits::default()).await;
    server
        .config
        .reload_from_config(tls::load(&cert, &key).unwrap());
    server.ca_pem = first.ca_pem.clone();
    let watcher = tokio::spawn(tls::watch(
        cert.clone(),
        key.clone(),
        server.config.clone(),
        Duration::from_millis(50),
    ));
    assert_eq!(get(&server, "/healthz").await.0, 200);

    // Rotate: a new CA and certificate, as cert-manager would.
    let second = tls::self_signed(&["localhost".into()]).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&cert, &second.cert_pem).unwrap();
    std::fs::write(&key, &second.key_pem).unwrap();
    let mut rotated = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        if connector(&second.ca_pem).connect(name, tcp).await.is_ok() {
            rotated = true;
            break;
        }
    }
    assert!(
        rotated,
        "the server never presented the rotated certificate"
    );
    watcher.abort();
    stop(server).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_jax_job_over_the_allocator_fraction_is_told_the_setting() {
    let server = start(Limits::default()).await;
    let no = response_of(&server, "create-jax-over-fraction.json").await;
    assert_eq!(no["allowed"], false, "{no}");
    let msg = no["status"]["message"].as_str().unwrap();
    assert!(msg.contains("JAX's allocator holds at most 75 %"), "{msg}");
    assert!(msg.contains("XLA_PYTHON_CLIENT_MEM_FRACTION=0."), "{msg}");
    assert!(msg.len() <= 1024, "{msg}");
    stop(server).await;
}

/// An inventory a test can change between reviews, as the live reflectors do.
struct Swap(std::sync::Mutex<vramguard::inventory::Snapshot>);

impl vramguard::inventory::Source for Swap {
    fn snapshot(&self) -> vramguard::inventory::Snapshot {
        self.0.lock().unwrap().clone()
    }
}

/// The response of one review sent straight to the router.
async fn judged(router: &axum::Router, review: &Value) -> Value {
    use tower::ServiceExt;
    let req = axum::http::Request::post("/validate")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(review.to_string()))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
}

fn review_json(name: &str) -> Value {
    serde_json::from_slice(&review_file(name)).unwrap()
}

#[tokio::test]
async fn a_new_gpu_node_or_memory_profile_is_never_answered_from_the_cache() {
    use vramguard::inventory::Snapshot;
    let fresh = |nodes| Snapshot::new(nodes, None, true, None);
    let source = Arc::new(Swap(std::sync::Mutex::new(fresh(Vec::new()))));
    let state = Arc::new(AppState::new(source.clone()));
    let router = webhook::router(state.clone());
    let fits = review_json("create-fits.json");
    let cached = || {
        state
            .totals
            .cached
            .load(std::sync::atomic::Ordering::Relaxed)
    };

    // No GPUs: denied, and the second time from the cache.
    for _ in 0..2 {
        let r = judged(&router, &fits).await;
        assert_eq!(r["allowed"], false, "{r}");
        assert!(r["status"]["message"].as_str().unwrap().contains("no GPUs"));
    }
    assert_eq!(cached(), 1);

    // GpuNodes arrive: the same spec is judged again, and fits.
    *source.0.lock().unwrap() = fresh(cluster());
    let r = judged(&router, &fits).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(cached(), 1);
    assert_eq!(judged(&router, &fits).await, r);
    assert_eq!(cached(), 2);

    // A MemoryProfile says jobs of this shape need 100 times the estimate.
    let spec = vramguard::api::parse::training_job(fits["request"]["object"].clone())
        .unwrap()
        .spec;
    let profile = vramguard::operator::fingerprint::profile_name(
        &vramguard::operator::fingerprint::fingerprint(&spec),
    );
    let mut learnt = fresh(cluster());
    learnt.profiles = Arc::new([(profile, 100.0)].into());
    *source.0.lock().unwrap() = learnt;
    let r = judged(&router, &fits).await;
    assert_eq!(r["allowed"], false, "{r}");
    let message = r["status"]["message"].as_str().unwrap();
    assert!(message.contains("raised ×100.00"), "{message}");
    assert_eq!(cached(), 2);

    // The same spec under another name: from the cache, with its own name.
    let mut renamed = fits.clone();
    renamed["request"]["name"] = "another-job".into();
    let r2 = judged(&router, &renamed).await;
    assert_eq!(cached(), 3);
    assert_eq!(
        r2["status"]["message"],
        message.replacen(fits["request"]["name"].as_str().unwrap(), "another-job", 1)
    );
}

#[tokio::test]
async fn the_cache_changes_no_answer() {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let source = || Arc::new(Static::new(cluster(), now));
    let cached = webhook::router(Arc::new(AppState::new(source())));
    let fresh = webhook::router(Arc::new(AppState::with_cache(source(), 0)));
    for name in [
        "create-fits.json",
        "create-fits-after-change.json",
        "create-does-not-fit.json",
        "create-invalid.json",
        "create-jax-over-fraction.json",
        "update-immutable.json",
    ] {
        let review = review_json(name);
        let want = judged(&fresh, &review).await;
        for _ in 0..2 {
            assert_eq!(judged(&cached, &review).await, want, "{name}");
        }
    }
}
