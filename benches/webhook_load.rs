//! Load on the admission webhook over TLS, as the API server applies it:
//! N keep-alive connections posting real AdmissionReviews. For each kind of
//! review (fits as written, fits after a change, does not fit, invalid) it
//! reports p50/p99 latency at a fixed 1 000 reviews/s and throughput at
//! saturation of three servers started in the same run:
//!
//! - `minimal`: a handler on the same TLS and HTTP stack that reads the body
//!   and answers a fixed AdmissionReview (the ceiling of TLS + HTTP here);
//! - `webhook`: the webhook as served, its judgement cache on (a spec seen
//!   before against the same inventory is not judged again);
//! - `uncached`: the webhook with the cache off, judging every review afresh
//!   (the estimates the process remembers per job and GPU, `plan::memo`, are
//!   off while it is measured).
//!
//! and the ratio of each webhook figure to the minimal handler's.
//!
//! Client and server share the machine's cores, so the client is kept cheap:
//! one task per connection writing prebuilt HTTP/1.1 request bytes and reading
//! the response by its Content-Length (checked to be 200).
//!
//!     cargo bench --bench webhook_load
//!
//! Environment: VRAMGUARD_LOAD_SECS (default 5, per measurement), VRAMGUARD_LOAD_CONNECTIONS
//! (default 16), VRAMGUARD_LOAD_REVIEW (one review file instead of the six kinds).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use vramguard::inventory::Static;
use vramguard::webhook::cache::DEFAULT_CAPACITY;
use vramguard::webhook::{self, AppState, tls};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A TLS configuration and the CA that signed it.
fn tls_pair() -> (axum_server::tls_rustls::RustlsConfig, String) {
    let pair = tls::self_signed(&["localhost".into()]).expect("certificate");
    let config = tls::server_config_from_pem(
        pair.cert_pem.as_bytes(),
        pair.key_pem.as_bytes(),
        Path::new("cert"),
        Path::new("key"),
    )
    .expect("TLS config");
    (
        axum_server::tls_rustls::RustlsConfig::from_config(config),
        pair.ca_pem,
    )
}

/// Serve `router` over TLS on a free loopback port.
async fn start(router: axum::Router, tls: axum_server::tls_rustls::RustlsConfig) -> SocketAddr {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let limits = webhook::Limits::default();
    let connections = webhook::Connections {
        limits,
        open: Default::default(),
        refused: Default::default(),
    };
    tokio::spawn(webhook::serve(
        "127.0.0.1:0".parse().expect("address"),
        router,
        connections,
        tls,
        std::future::pending(),
        Duration::from_secs(1),
        Some(tx),
    ));
    rx.await.expect("bound")
}

/// The webhook over `examples/cluster.yaml`, with a judgement cache of `cache` entries.
fn webhook_router(cache: usize) -> axum::Router {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("examples/cluster.yaml")).expect("cluster file");
    let nodes = vramguard::api::parse::documents(&text)
        .expect("cluster YAML")
        .into_iter()
        .map(|d| vramguard::api::parse::gpu_node(d).expect("GpuNode"))
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let state = AppState::with_cache(Arc::new(Static::new(nodes, now)), cache);
    webhook::router(Arc::new(state))
}

/// The answer of the minimal handler, whatever it is sent.
const FIXED_ANSWER: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true}}"#;

/// Reads the body as the webhook does, answers a fixed AdmissionReview.
fn minimal_router() -> axum::Router {
    axum::Router::new().route(
        "/validate",
        axum::routing::post(|body: Bytes| async move {
            std::hint::black_box(body);
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                FIXED_ANSWER,
            )
        }),
    )
}

/// One keep-alive connection. The client writes the request bytes it built once
/// and reads the response by its Content-Length: the load runs in the same
/// process as the server, so every cycle it spends is taken from the server.
struct Conn {
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    request: Bytes,
    buf: Vec<u8>,
}

/// The request as it goes on the wire, head and body.
fn request_bytes(body: &[u8]) -> Bytes {
    let mut out = format!(
        "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    Bytes::from(out)
}

async fn connect(addr: SocketAddr, ca_pem: &str, request: Bytes) -> Conn {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    Conn {
        tls,
        request,
        buf: Vec::with_capacity(4096),
    }
}

/// Status code and Content-Length of a response head (without the blank line).
fn parse_head(head: &[u8]) -> (u16, usize) {
    let text = std::str::from_utf8(head).expect("ASCII response head");
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .expect("content-length");
    (status, length)
}

/// Send the request once; the response body.
async fn exchange(c: &mut Conn) -> Vec<u8> {
    c.tls.write_all(&c.request).await.expect("send");
    c.tls.flush().await.expect("flush");
    c.buf.clear();
    let mut need = None;
    loop {
        if need.is_none()
            && let Some(end) = c.buf.windows(4).position(|w| w == b"\r\n\r\n")
        {
            let (status, length) = parse_head(&c.buf[..end]);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&c.buf));
            need = Some((end + 4, end + 4 + length));
        }
        if let Some((body, n)) = need
            && c.buf.len() >= n
        {
            assert_eq!(c.buf.len(), n, "one response per request");
            return c.buf[body..].to_vec();
        }
        let n = c.tls.read_buf(&mut c.buf).await.expect("receive");
        assert!(n > 0, "the server closed the connection");
    }
}

async fn one(c: &mut Conn) -> Duration {
    let t = Instant::now();
    exchange(c).await;
    t.elapsed()
}

/// Reviews answered, in how long, and the latency quantiles.
#[derive(Clone, Copy)]
struct Stats {
    rate: f64,
    p50: Duration,
    p99: Duration,
}

fn stats(mut lat: Vec<Duration>, wall: Duration) -> Stats {
    lat.sort();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    Stats {
        rate: lat.len() as f64 / wall.as_secs_f64(),
        p50: q(0.50),
        p99: q(0.99),
    }
}

/// Run every connection's loop for `secs` and gather the latencies.
async fn load(
    target: &Target<'_>,
    conns: u64,
    secs: u64,
    rate: Option<u64>,
    request: &Bytes,
) -> Stats {
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..conns {
        let mut c = connect(target.addr, target.ca, request.clone()).await;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            // A fixed total rate is spread over the connections (open loop per connection).
            let mut tick = rate.map(|rate| {
                let per_conn = Duration::from_secs_f64(conns as f64 / rate as f64);
                let offset = per_conn.mul_f64(i as f64 / conns as f64);
                let mut t =
                    tokio::time::interval_at(tokio::time::Instant::now() + offset, per_conn);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                t
            });
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                if let Some(t) = &mut tick {
                    t.tick().await;
                }
                lat.push(one(&mut c).await);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    stats(all, start.elapsed())
}

/// A server under test.
struct Target<'a> {
    name: &'static str,
    addr: SocketAddr,
    ca: &'a str,
}

/// What one server did with one kind of review.
struct Row {
    server: &'static str,
    at_rate: Stats,
    saturated: Stats,
}

const RATE: u64 = 1000;
/// The targets: reviews/s saturated, p99 at 1 000/s, fraction of the minimal handler.
const TARGET_RATE: f64 = 10_000.0;
const TARGET_P99: Duration = Duration::from_millis(2);
const TARGET_RATIO: f64 = 0.5;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_rows(kind: &str, rows: &[Row]) {
    let minimal = &rows[0];
    println!("{kind}");
    for r in rows {
        let ratio = r.saturated.rate / minimal.saturated.rate;
        let p99_ratio = r.at_rate.p99.as_secs_f64() / minimal.at_rate.p99.as_secs_f64();
        let verdict = if r.server == "minimal" {
            String::new()
        } else {
            let ok = r.saturated.rate >= TARGET_RATE
                && r.at_rate.p99 <= TARGET_P99
                && ratio >= TARGET_RATIO;
            format!(
                "   ×{ratio:.2} of minimal (p99 ×{p99_ratio:.2})   {}",
                if ok { "meets the targets" } else { "MISSES" }
            )
        };
        println!(
            "  {:<9} {RATE}/s: p50 {:>6.3} ms  p99 {:>6.3} ms   saturated: {:>7.0}/s  p99 {:>6.3} ms{verdict}",
            r.server,
            ms(r.at_rate.p50),
            ms(r.at_rate.p99),
            r.saturated.rate,
            ms(r.saturated.p99),
        );
    }
}

/// The review files to load, with a word each.
fn reviews(root: &Path) -> Vec<(String, PathBuf)> {
    if let Ok(path) = std::env::var("VRAMGUARD_LOAD_REVIEW") {
        return vec![(path.clone(), path.into())];
    }
    [
        ("fits as written", "create-fits.json"),
        ("fits after a change", "create-fits-after-change.json"),
        ("does not fit", "create-does-not-fit.json"),
        ("invalid", "create-invalid.json"),
        ("PyTorchJob, fits as written", "create-pytorchjob-fits.json"),
        (
            "Job, denied: fits after a change",
            "create-job-does-not-fit-as-written.json",
        ),
    ]
    .into_iter()
    .map(|(what, file)| {
        (
            format!("{what} ({file})"),
            root.join("examples/admission").join(file),
        )
    })
    .collect()
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this once quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let secs = if quick {
        1
    } else {
        env_u64("VRAMGUARD_LOAD_SECS", 5)
    };
    let conns = env_u64("VRAMGUARD_LOAD_CONNECTIONS", 16);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (tls, ca) = tls_pair();
        let targets = [
            Target {
                name: "minimal",
                addr: start(minimal_router(), tls.clone()).await,
                ca: &ca,
            },
            Target {
                name: "webhook",
                addr: start(webhook_router(DEFAULT_CAPACITY), tls.clone()).await,
                ca: &ca,
            },
            Target {
                name: "uncached",
                addr: start(webhook_router(0), tls).await,
                ca: &ca,
            },
        ];
        println!(
            "{conns} keep-alive connections, {secs} s per figure; targets: ≥ {TARGET_RATE:.0}/s saturated, p99 ≤ {:.0} ms at {RATE}/s, ≥ ×{TARGET_RATIO} of the minimal handler",
            ms(TARGET_P99)
        );
        for (kind, path) in reviews(root) {
            let request = request_bytes(&std::fs::read(&path).expect("review file"));
            let mut rows = Vec::new();
            let mut answers = Vec::new();
            for target in &targets {
                vramguard::plan::memo::set_enabled(target.name != "uncached");
                let mut c = connect(target.addr, target.ca, request.clone()).await;
                let answer: serde_json::Value =
                    serde_json::from_slice(&exchange(&mut c).await).expect("JSON answer");
                assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
                answers.push(answer);
                rows.push(Row {
                    server: target.name,
                    at_rate: load(target, conns, secs, Some(RATE), &request).await,
                    saturated: load(target, conns, secs, None, &request).await,
                });
            }
            // The cache changes no answer.
            assert_eq!(answers[1], answers[2]);
            let allowed = answers[1]["response"]["allowed"] == true;
            print_rows(
                &format!("{kind}: {}", if allowed { "allowed" } else { "denied" }),
                &rows,
            );
        }
    });
}
