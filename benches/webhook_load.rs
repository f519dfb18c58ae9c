//! Load on the admission webhook over TLS, as the API server applies it:
//! N keep-alive connections posting real AdmissionReviews. Reports throughput
//! and p50/p99 latency at a fixed 1 000 reviews/s and at saturation.
//!
//! Client and server share the machine's cores, so the client is kept cheap:
//! one task per connection writing prebuilt HTTP/1.1 request bytes and reading
//! the response by its Content-Length (checked to be 200).
//!
//!     cargo bench --bench webhook_load
//!
//! Environment: VRAMGUARD_LOAD_SECS (default 5), VRAMGUARD_LOAD_CONNECTIONS (default 16),
//! VRAMGUARD_LOAD_REVIEW (default examples/admission/create-fits.json).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use vramguard::inventory::Static;
use vramguard::webhook::{self, AppState, tls};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn start() -> (SocketAddr, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("examples/cluster.yaml")).expect("cluster file");
    let nodes = vramguard::api::parse::documents(&text)
        .expect("cluster YAML")
        .into_iter()
        .map(|d| vramguard::api::parse::gpu_node(d).expect("GpuNode"))
        .collect();
    let pair = tls::self_signed(&["localhost".into()]).expect("certificate");
    let config = tls::server_config_from_pem(
        pair.cert_pem.as_bytes(),
        pair.key_pem.as_bytes(),
        Path::new("cert"),
        Path::new("key"),
    )
    .expect("TLS config");
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let state = Arc::new(AppState::new(Arc::new(Static::new(nodes, now))));
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(webhook::serve(
        "127.0.0.1:0".parse().expect("address"),
        webhook::router(state),
        axum_server::tls_rustls::RustlsConfig::from_config(config),
        std::future::pending(),
        Duration::from_secs(1),
        Some(tx),
    ));
    (rx.await.expect("bound"), pair.ca_pem)
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

async fn one(c: &mut Conn) -> Duration {
    let t = Instant::now();
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
            need = Some(end + 4 + length);
        }
        if let Some(n) = need
            && c.buf.len() >= n
        {
            assert_eq!(c.buf.len(), n, "one response per request");
            break;
        }
        let n = c.tls.read_buf(&mut c.buf).await.expect("receive");
        assert!(n > 0, "the server closed the connection");
    }
    t.elapsed()
}

fn report(label: &str, mut lat: Vec<Duration>, wall: Duration) {
    lat.sort();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    println!(
        "{label:<28} {:>7} reviews in {:>5.2} s = {:>8.0}/s   p50 {:>7.3} ms   p99 {:>7.3} ms   max {:>7.3} ms",
        lat.len(),
        wall.as_secs_f64(),
        lat.len() as f64 / wall.as_secs_f64(),
        q(0.50).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3,
    );
}

/// Every connection sends as fast as it can.
async fn saturate(addr: SocketAddr, ca: &str, conns: u64, secs: u64, request: Bytes) {
    let mut tasks = Vec::new();
    let start = Instant::now();
    for _ in 0..conns {
        let mut c = connect(addr, ca, request.clone()).await;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                lat.push(one(&mut c).await);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    report(
        &format!("saturation, {conns} connections"),
        all,
        start.elapsed(),
    );
}

/// A fixed total rate spread over the connections (open loop per connection).
async fn fixed_rate(addr: SocketAddr, ca: &str, conns: u64, secs: u64, rate: u64, request: Bytes) {
    let per_conn = Duration::from_secs_f64(conns as f64 / rate as f64);
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..conns {
        let mut c = connect(addr, ca, request.clone()).await;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let offset = per_conn.mul_f64(i as f64 / conns as f64);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, per_conn);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                tick.tick().await;
                lat.push(one(&mut c).await);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    report(
        &format!("{rate}/s, {conns} connections"),
        all,
        start.elapsed(),
    );
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
    let review = std::env::var("VRAMGUARD_LOAD_REVIEW")
        .map(Into::into)
        .unwrap_or_else(|_| root.join("examples/admission/create-fits.json"));
    let request = request_bytes(&std::fs::read(&review).expect("review file"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (addr, ca) = start().await;
        println!("review: {}", review.display());
        fixed_rate(addr, &ca, conns, secs, 1000, request.clone()).await;
        saturate(addr, &ca, conns, secs, request).await;
    });
}
