//! The webhook under abuse, over real TLS on loopback, bounded in count and
//! time: while clients send well-formed reviews, others send malformed and
//! truncated JSON, the wrong apiVersion or kind, reviews without a uid,
//! oversized and slow bodies, half request heads, and TLS handshakes that
//! never finish. Every well-formed review is answered with its uid, an
//! oversized one is denied in an AdmissionReview, the rest get a 4xx or are
//! dropped at the handshake and head timeouts, and the server keeps serving.
//! A second server takes 80 clients sending their bodies a byte a second
//! (health, metrics and reviews are still answered at once), connections that
//! finish their handshake and then idle (closed at the idle timeout), and four
//! times as many connections as its cap (the rest refused, the count in
//! `/metrics`, memory under the chart's limit). The shipped binary, run as the
//! chart runs it, takes 20 000 connection attempts and stays under the chart's
//! memory limit. Run with `--nocapture` to see the figures.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use vramguard::inventory::Static;
use vramguard::webhook::server::{HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, MAX_BODY_BYTES};
use vramguard::webhook::{self, AppState, Limits, tls};

/// How long a request (body included) may take in this test.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Well-formed reviews: this many clients, each sending this many over one connection.
const CLIENTS: usize = 8;
const REVIEWS_PER_CLIENT: usize = 25;
/// Connections that open TCP and never finish the TLS handshake.
const STALLED_HANDSHAKES: usize = 200;

struct Server {
    addr: SocketAddr,
    connector: TlsConnector,
    /// What `dial` connects with.
    dialer: Dialer,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

fn example(path: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).expect("example reads")
}

async fn start() -> Server {
    start_with(Limits {
        body_bytes: MAX_BODY_BYTES,
        timeout: REQUEST_TIMEOUT,
        ..Limits::default()
    })
    .await
}

async fn start_with(limits: Limits) -> Server {
    let pair = tls::self_signed(&["localhost".into()]).expect("a self-signed pair");
    let config = tls::server_config_from_pem(
        pair.cert_pem.as_bytes(),
        pair.key_pem.as_bytes(),
        Path::new("cert"),
        Path::new("key"),
    )
    .expect("the pair loads");
    let text = String::from_utf8(example("examples/cluster.yaml")).expect("UTF-8");
    let nodes = vramguard::api::parse::documents(&text)
        .expect("YAML")
        .into_iter()
        .map(|d| vramguard::api::parse::gpu_node(d).expect("a GpuNode"))
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let state = Arc::new(AppState::new(Arc::new(Static::new(nodes, now))));
    let connections = webhook::Connections::of(&state, limits);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(webhook::serve(
        "127.0.0.1:0".parse().expect("an address"),
        webhook::router_with(state, limits),
        connections,
        axum_server::tls_rustls::RustlsConfig::from_config(config),
        async move {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
        Some(bound_tx),
    ));
    let addr = bound_rx.await.expect("the server binds");
    let client = client_trusting(&pair.ca_pem);
    Server {
        addr,
        connector: TlsConnector::from(Arc::new(client.clone())),
        dialer: Dialer {
            addr,
            client: Arc::new(client),
        },
        stop,
        task,
    }
}

/// A TLS client that trusts the CA in `ca_pem`.
fn client_trusting(ca_pem: &str) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("a PEM certificate")).expect("a CA");
    }
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

async fn connect(server: &Server) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(server.addr).await.expect("connects");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    server
        .connector
        .connect(name, tcp)
        .await
        .expect("handshake")
}

/// Opens TLS connections to a server from any task.
#[derive(Clone)]
struct Dialer {
    addr: SocketAddr,
    client: Arc<ClientConfig>,
}

impl Dialer {
    /// A TLS connection offering `alpn` (none when empty); an error when the
    /// server closes it before the handshake ends.
    async fn dial(&self, alpn: &[u8]) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
        let mut client = (*self.client).clone();
        if !alpn.is_empty() {
            client.alpn_protocols = vec![alpn.to_vec()];
        }
        TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
    }
}

/// Write `head` and `body` as one request on a fresh connection while reading
/// the answer until the server closes; the status code (0 when it closed
/// without one). The server may answer before the body is all sent (413), so
/// a write that fails is no failure.
async fn raw(server: &Server, head: &str, body: &[u8]) -> u16 {
    let tls = connect(server).await;
    let (mut rd, mut wr) = tokio::io::split(tls);
    let mut request = head.as_bytes().to_vec();
    request.extend_from_slice(body);
    let writer = tokio::spawn(async move {
        for chunk in request.chunks(64 * 1024) {
            if wr.write_all(chunk).await.is_err() {
                return;
            }
        }
        let _ = wr.flush().await;
        // Keep the write half open until the answer is read (the task is aborted then).
        std::future::pending::<()>().await;
    });
    let status = status_of(&mut rd, Duration::from_secs(10)).await;
    writer.abort();
    status
}

/// The status of the first response on `stream`, read until it closes.
async fn status_of<R: AsyncRead + Unpin>(stream: &mut R, within: Duration) -> u16 {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server neither answered nor closed");
    let text = String::from_utf8_lossy(&out);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn post_head(len: usize) -> String {
    format!(
        "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    )
}

/// One well-formed review with its own uid.
fn review_with_uid(template: &Value, uid: &str) -> Vec<u8> {
    let mut v = template.clone();
    v["request"]["uid"] = uid.into();
    serde_json::to_vec(&v).expect("JSON")
}

/// Send `CLIENTS × REVIEWS_PER_CLIENT` well-formed reviews over keep-alive
/// connections; each answer must be 200 with the review's own uid.
async fn well_formed(server: &Server, template: &Value, round: usize) -> usize {
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let tls = connect(server).await;
        let template = template.clone();
        tasks.push(tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(tls);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("HTTP/1 handshake");
            tokio::spawn(conn);
            for i in 0..REVIEWS_PER_CLIENT {
                let uid = format!("abuse-{round}-{c}-{i}");
                let req = hyper::Request::post("/validate")
                    .header("host", "localhost")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(review_with_uid(&template, &uid))))
                    .expect("a request");
                let resp = sender.send_request(req).await.expect("an answer");
                assert_eq!(resp.status(), 200);
                let body = resp.into_body().collect().await.expect("a body").to_bytes();
                let v: Value = serde_json::from_slice(&body).expect("JSON");
                assert_eq!(v["response"]["uid"], uid.as_str());
            }
            REVIEWS_PER_CLIENT
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("a client task");
    }
    n
}

/// A change that spoils a well-formed review.
type Edit = fn(&mut Value);

/// Peak and current resident memory of this process, in MiB (Linux).
fn memory_mib() -> (u64, u64) {
    memory_of("self")
}

/// [`memory_mib`] once this process's resident memory stops changing (the same over
/// consecutive reads 50 ms apart), or at `within`.
async fn settled_memory_mib(within: Duration) -> (u64, u64) {
    let deadline = Instant::now() + within;
    let mut last = memory_mib();
    let mut same = 0;
    while same < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = memory_mib();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// Peak and current resident memory of process `pid` ("self": this one), in MiB (Linux).
fn memory_of(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_keeps_serving_under_abuse() {
    let started = Instant::now();
    let server = start().await;
    let template: Value =
        serde_json::from_slice(&example("examples/admission/create-fits.json")).expect("JSON");
    let good = serde_json::to_vec(&template).expect("JSON");
    let mut by_class: BTreeMap<&str, BTreeMap<u16, usize>> = BTreeMap::new();
    let mut tally = |class: &'static str, status: u16| {
        *by_class
            .entry(class)
            .or_default()
            .entry(status)
            .or_default() += 1;
    };

    // Handshakes that never finish: half send nothing, half a ClientHello's first bytes.
    let mut stalled = Vec::new();
    for i in 0..STALLED_HANDSHAKES {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connects");
        if i % 2 == 1 {
            tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
                .await
                .expect("writes");
        }
        stalled.push(tcp);
    }
    // A request head that never ends.
    let mut half_head = connect(&server).await;
    half_head
        .write_all(b"POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-le")
        .await
        .expect("writes");
    half_head.flush().await.expect("flushes");
    // A body that never ends: 408 once the request timeout passes.
    let mut slow_body = connect(&server).await;
    slow_body
        .write_all(format!("{}{{\"apiVersion\":", post_head(1000)).as_bytes())
        .await
        .expect("writes");
    slow_body.flush().await.expect("flushes");

    // Well-formed reviews while all of that is open.
    let mut answered = well_formed(&server, &template, 0).await;
    for _ in 0..answered {
        tally("well-formed", 200);
    }

    // Malformed and truncated JSON.
    for cut in (0..good.len()).step_by(good.len() / 40 + 1) {
        tally(
            "truncated",
            raw(&server, &post_head(cut), &good[..cut]).await,
        );
    }
    let garbage: [&[u8]; 6] = [
        b"",
        b"null",
        b"\xff\xfe\x00garbage",
        b"{\"apiVersion\": 1e999}",
        b"[1, 2, 3]",
        b"{\"request\": {\"uid\": \"\\ud800\"}}",
    ];
    for body in garbage {
        tally(
            "malformed",
            raw(&server, &post_head(body.len()), body).await,
        );
    }
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    tally(
        "deep",
        raw(&server, &post_head(deep.len()), deep.as_bytes()).await,
    );

    // Well-formed JSON that is not a v1 AdmissionReview, or has no uid.
    let edits: [(&str, Edit); 5] = [
        ("wrong apiVersion", |v| {
            v["apiVersion"] = "admission.k8s.io/v1beta1".into()
        }),
        ("wrong kind", |v| v["kind"] = "Pod".into()),
        ("missing uid", |v| {
            v["request"]
                .as_object_mut()
                .expect("an object")
                .remove("uid");
        }),
        ("uid not a string", |v| v["request"]["uid"] = 7.into()),
        ("no request", |v| {
            v.as_object_mut().expect("an object").remove("request");
        }),
    ];
    for (class, edit) in edits {
        let mut v = template.clone();
        edit(&mut v);
        let body = serde_json::to_vec(&v).expect("JSON");
        tally(class, raw(&server, &post_head(body.len()), &body).await);
    }

    // Oversized bodies, with a length and chunked without one.
    let big = vec![b' '; MAX_BODY_BYTES + 1];
    tally("oversized", raw(&server, &post_head(big.len()), &big).await);
    let mut chunked = format!("{:x}\r\n", big.len()).into_bytes();
    chunked.extend_from_slice(&big);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let head = "POST /validate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    tally("oversized chunked", raw(&server, head, &chunked).await);

    tally(
        "slow body",
        status_of(&mut slow_body, REQUEST_TIMEOUT + Duration::from_secs(5)).await,
    );
    // The server drops the half head and the stalled handshakes once their time is up.
    let limit = HANDSHAKE_TIMEOUT + Duration::from_secs(5);
    tally("half head", status_of(&mut half_head, limit).await);
    let mut closed = 0;
    for mut tcp in stalled {
        let mut buf = [0u8; 256];
        let deadline = limit.saturating_sub(started.elapsed()) + Duration::from_secs(1);
        loop {
            match tokio::time::timeout(deadline, tcp.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed += 1;
                    break;
                }
                Ok(Ok(_)) => continue,
                Err(_) => break,
            }
        }
    }

    // And it still serves.
    let more = well_formed(&server, &template, 1).await;
    answered += more;
    for _ in 0..more {
        tally("well-formed", 200);
    }
    let (peak, now) = memory_mib();
    let requests: usize = by_class.values().flat_map(|m| m.values()).sum();
    eprintln!(
        "abuse: {requests} requests, {answered} well-formed answered with their uid, \
         {closed}/{STALLED_HANDSHAKES} stalled handshakes dropped, peak RSS {peak} MiB \
         (now {now} MiB), {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for (class, statuses) in &by_class {
        eprintln!("  {class}: {statuses:?}");
    }

    assert_eq!(answered, 2 * CLIENTS * REVIEWS_PER_CLIENT);
    assert_eq!(
        closed, STALLED_HANDSHAKES,
        "every stalled handshake is dropped"
    );
    for (class, statuses) in &by_class {
        let expected: &[u16] = match *class {
            // Denied in an AdmissionReview with code 413 (tests/webhook.rs reads it).
            "well-formed" | "oversized" | "oversized chunked" => &[200],
            "slow body" => &[408],
            // Dropped without an answer once the head timeout passes.
            "half head" => &[0, 408],
            _ => &[400],
        };
        for status in statuses.keys() {
            assert!(
                expected.contains(status),
                "{class}: status {status}, expected one of {expected:?}"
            );
        }
    }
    // Bodies in memory are bounded by the concurrency limit times the body limit;
    // the whole test process (clients included) stays far below that.
    assert!(peak < 1024, "peak RSS {peak} MiB");
    let _ = server.stop.send(());
    server.task.await.expect("the server task").expect("serve");
}

/// Clients holding a body open, a byte a second.
const SLOW_BODIES: usize = 80;

/// The memory limit of the controller (webhook and operator) in the chart, in MiB.
fn chart_memory_limit_mib() -> u64 {
    let values = String::from_utf8(example("charts/vramguard/values.yaml")).expect("UTF-8");
    values
        .lines()
        .find_map(|l| l.trim().strip_prefix("limits: {memory: "))
        .and_then(|v| v.strip_suffix("Mi}"))
        .and_then(|v| v.parse().ok())
        .expect("the controller's memory limit in MiB")
}

/// A GET on a fresh HTTP/1.1 connection: the status, the body, and the time
/// from connecting to the last byte of the answer.
async fn timed_get(dialer: &Dialer, path: &str) -> std::io::Result<(u16, String, Duration)> {
    let started = Instant::now();
    let tls = dialer.dial(b"").await?;
    let io = hyper_util::rt::TokioIo::new(tls);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let resp = sender
        .send_request(req)
        .await
        .map_err(std::io::Error::other)?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((
        status,
        String::from_utf8_lossy(&body).into_owned(),
        started.elapsed(),
    ))
}

/// The value of an unlabelled metric in `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

/// A review whose body comes a byte a second and never ends: its status (0 when
/// the server closed without one) and when that came.
async fn slow_body(dialer: Dialer, sent: tokio::sync::mpsc::Sender<()>) -> (u16, Duration) {
    let started = Instant::now();
    let tls = dialer.dial(b"").await.expect("connects");
    let (mut rd, mut wr) = tokio::io::split(tls);
    let writer = tokio::spawn(async move {
        let head = format!("{}{{", post_head(1000));
        if wr.write_all(head.as_bytes()).await.is_err() || wr.flush().await.is_err() {
            return;
        }
        // The head and the first byte of the body are out.
        let _ = sent.send(()).await;
        drop(sent);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if wr.write_all(b" ").await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
    });
    let status = status_of(&mut rd, Duration::from_secs(30)).await;
    writer.abort();
    (status, started.elapsed())
}

/// How long until the server closes `stream` (sending nothing), if within `within`.
async fn closed_within<R: AsyncRead + Unpin>(stream: &mut R, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// One GET over a connection speaking `alpn`, then idle: how long after the
/// answer the server closed it, if within `within`.
async fn idle_after_a_request(dialer: &Dialer, alpn: &[u8], within: Duration) -> Option<Duration> {
    let io = hyper_util::rt::TokioIo::new(dialer.dial(alpn).await.expect("connects"));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let status = if alpn == b"h2" {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
            let _ = done_tx.send(Instant::now());
        });
        let req = hyper::Request::get("https://localhost/healthz")
            .body(Full::new(Bytes::new()))
            .expect("a request");
        let status = sender.send_request(req).await.expect("an answer").status();
        // The client keeps the connection while it holds a sender.
        (status, Box::new(sender) as Box<dyn std::any::Any + Send>)
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("HTTP/1 handshake");
        tokio::spawn(async move {
            let _ = conn.await;
            let _ = done_tx.send(Instant::now());
        });
        let req = hyper::Request::get("/healthz")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .expect("a request");
        let status = sender.send_request(req).await.expect("an answer").status();
        (status, Box::new(sender) as Box<dyn std::any::Any + Send>)
    };
    let (status, _sender) = status;
    assert_eq!(status, 200);
    let answered = Instant::now();
    tokio::time::timeout(within, done_rx)
        .await
        .ok()
        .and_then(Result::ok)
        .map(|closed| closed - answered)
}

#[test]
fn the_default_idle_timeout_is_at_most_a_minute() {
    assert!(IDLE_TIMEOUT <= Duration::from_secs(60), "{IDLE_TIMEOUT:?}");
    assert_eq!(Limits::default().idle_timeout, IDLE_TIMEOUT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_and_idle_connections_do_not_hold_the_webhook() {
    let timeout = Duration::from_secs(3);
    let idle = Duration::from_secs(2);
    let server = start_with(Limits {
        timeout,
        idle_timeout: idle,
        ..Limits::default()
    })
    .await;
    let template: Value =
        serde_json::from_slice(&example("examples/admission/create-fits.json")).expect("JSON");
    let good = serde_json::to_vec(&template).expect("JSON");

    // Slow bodies: more clients than reviews judged at once.
    let (sent, mut heads_out) = tokio::sync::mpsc::channel(SLOW_BODIES);
    let slow: Vec<_> = (0..SLOW_BODIES)
        .map(|_| tokio::spawn(slow_body(server.dialer.clone(), sent.clone())))
        .collect();
    drop(sent);
    // Every slow client has sent its head and a byte.
    for _ in 0..SLOW_BODIES {
        heads_out
            .recv()
            .await
            .expect("every slow client sends its head");
    }
    let (health, _, health_took) = timed_get(&server.dialer, "/healthz")
        .await
        .expect("/healthz");
    let (metrics_status, metrics_text, metrics_took) = timed_get(&server.dialer, "/metrics")
        .await
        .expect("/metrics");
    let review_started = Instant::now();
    let review = raw(&server, &post_head(good.len()), &good).await;
    let review_took = review_started.elapsed();
    let open_then = metric(&metrics_text, "vramguard_connections_open");
    let mut slow_statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut slow_longest = Duration::ZERO;
    let mut slow_shortest = Duration::MAX;
    for t in slow {
        let (status, took) = t.await.expect("a slow client");
        *slow_statuses.entry(status).or_default() += 1;
        slow_longest = slow_longest.max(took);
        slow_shortest = slow_shortest.min(took);
    }
    eprintln!(
        "slow bodies: {SLOW_BODIES} clients sending a byte a second; /healthz answered in \
         {:.0} ms, /metrics in {:.0} ms ({open_then} connections open), a review in {:.0} ms; \
         the slow bodies ended after {:.1} to {:.1} s (request timeout {:.0} s): {slow_statuses:?}",
        health_took.as_secs_f64() * 1e3,
        metrics_took.as_secs_f64() * 1e3,
        review_took.as_secs_f64() * 1e3,
        slow_shortest.as_secs_f64(),
        slow_longest.as_secs_f64(),
        timeout.as_secs_f64(),
    );
    assert_eq!((health, metrics_status, review), (200, 200, 200));
    for took in [health_took, metrics_took, review_took] {
        assert!(took < Duration::from_secs(1), "{took:?} under slow bodies");
    }
    assert!(open_then > SLOW_BODIES as f64, "{open_then} open");
    // One deadline for the whole body, however steadily its bytes come: a 408,
    // or a close when the answer is lost to the bytes still coming.
    for status in slow_statuses.keys() {
        assert!([408, 0].contains(status), "slow body: {slow_statuses:?}");
    }
    assert!(
        slow_shortest >= timeout - Duration::from_millis(500),
        "{slow_shortest:?}"
    );
    assert!(
        slow_longest <= timeout + Duration::from_secs(2),
        "{slow_longest:?}"
    );

    // Idle connections: handshake done, nothing sent (no ALPN, h2, http/1.1),
    // and keep-alive connections idle after one request.
    let within = idle + Duration::from_secs(3);
    let mut idle_closed = Vec::new();
    for alpn in [&b""[..], b"h2", b"http/1.1"] {
        let mut tls = server.dialer.dial(alpn).await.expect("connects");
        let took = closed_within(&mut tls, within).await;
        idle_closed.push((
            String::from_utf8_lossy(alpn).into_owned(),
            "nothing sent",
            took,
        ));
    }
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let took = idle_after_a_request(&server.dialer, alpn, within).await;
        idle_closed.push((
            String::from_utf8_lossy(alpn).into_owned(),
            "after a request",
            took,
        ));
    }
    for (alpn, how, took) in &idle_closed {
        eprintln!(
            "idle: ALPN {alpn:?}, {how}: closed after {} (idle timeout {:.0} s)",
            took.map_or("never".into(), |t| format!("{:.2} s", t.as_secs_f64())),
            idle.as_secs_f64()
        );
        let took = took.unwrap_or_else(|| panic!("{alpn:?} {how}: not closed within {within:?}"));
        assert!(
            took >= idle - Duration::from_millis(300),
            "{alpn:?} {how}: {took:?}"
        );
        assert!(
            took <= idle + Duration::from_secs(1),
            "{alpn:?} {how}: {took:?}"
        );
    }
    let _ = server.stop.send(());
    server.task.await.expect("the server task").expect("serve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_are_capped_and_counted() {
    let limits = Limits::default();
    let cap = limits.max_connections;
    let attempts = 4 * cap;
    let server = start_with(limits).await;
    let started = Instant::now();
    let dialer = server.dialer.clone();
    let outcomes: Vec<Option<TlsStream<TcpStream>>> = futures::stream::iter(0..attempts)
        .map(|_| {
            let dialer = dialer.clone();
            async move { dialer.dial(b"").await.ok() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let took = started.elapsed();
    let mut open: Vec<_> = outcomes.into_iter().flatten().collect();
    let established = open.len();
    // With one of ours gone, its place serves /metrics.
    drop(open.pop());
    let text = metrics_once_free(&dialer).await;
    let counted = metric(&text, "vramguard_connections_open");
    let refused = metric(&text, "vramguard_connections_refused_total");
    // Each then starts a 4 MiB review and sends its first 256 KiB: the server
    // holds what its body memory and read buffers allow, the rest waits in the
    // sockets.
    let head = post_head(MAX_BODY_BYTES);
    let part = vec![b' '; 256 * 1024];
    let open: Vec<_> = futures::stream::iter(open)
        .map(|mut tls| {
            let (head, part) = (head.clone(), part.clone());
            async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    tls.write_all(head.as_bytes()).await?;
                    tls.write_all(&part).await?;
                    tls.flush().await
                })
                .await;
                tls
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    // Measured once the server has taken in what it will: resident memory steady.
    let (peak, now) = settled_memory_mib(Duration::from_secs(10)).await;
    let limit = chart_memory_limit_mib();
    eprintln!(
        "connections: {attempts} attempted in {:.1} s, {established} established (cap {cap}), \
         each then sending 256 KiB of a 4 MiB body; /metrics: {counted} open, {refused} \
         refused; peak RSS of the test process (server and \
         clients, with the other tests) {peak} MiB (now {now} MiB), chart limit {limit} MiB",
        took.as_secs_f64()
    );
    assert_eq!(established, cap);
    assert_eq!(counted, cap as f64);
    assert!(refused >= (attempts - cap) as f64, "{refused} refused");
    assert!(
        peak < limit,
        "peak RSS {peak} MiB over the chart's {limit} MiB"
    );
    drop(open);
    let _ = server.stop.send(());
    server.task.await.expect("the server task").expect("serve");
}

/// `/metrics`, asked again every 50 ms for up to 5 s while the server's
/// connection slots may still be full.
async fn metrics_once_free(dialer: &Dialer) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match timed_get(dialer, "/metrics").await {
            Ok((200, text, _)) => return text,
            _ if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("/metrics once a connection is free: {other:?}"),
        }
    }
}

/// Connections a hostile client attempts against the shipped binary.
const BINARY_ATTEMPTS: usize = 20_000;

/// Kills the child process when the test ends, passing or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `vramguard serve` as the chart runs it (its default connection cap and idle
/// timeout), in a process of its own so that its memory is its own: 20 000
/// connections attempted, each kept open when the server takes it. The server
/// holds its cap, refuses the rest, counts them, and stays under the chart's
/// memory limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_binary_holds_20000_connection_attempts_under_the_chart_limit() {
    let dir = std::env::temp_dir().join(format!("vramguard-abuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let ca_path = dir.join("ca.pem");
    let _ = std::fs::remove_file(&ca_path);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("an address");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args([
            "serve",
            "--self-signed",
            "--tls-hosts",
            "localhost",
            "--listen",
        ])
        .arg(addr.to_string())
        .arg("--ca-out")
        .arg(&ca_path)
        .arg("--cluster")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster.yaml"))
        .env("RUST_LOG", "error")
        .env_remove("VRAMGUARD_MAX_CONNECTIONS")
        .env_remove("VRAMGUARD_IDLE_TIMEOUT_SECS")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("vramguard serve starts");
    let server = Killed(child);
    let pid = server.0.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let ca = loop {
        let written = std::fs::read_to_string(&ca_path).unwrap_or_default();
        if written.contains("END CERTIFICATE") && TcpStream::connect(addr).await.is_ok() {
            break written;
        }
        assert!(
            Instant::now() < deadline,
            "vramguard serve did not listen on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let dialer = Dialer {
        addr,
        client: Arc::new(client_trusting(&ca)),
    };
    let (before, _) = memory_of(&pid);
    let started = Instant::now();
    let outcomes: Vec<Option<TlsStream<TcpStream>>> = futures::stream::iter(0..BINARY_ATTEMPTS)
        .map(|_| {
            let dialer = dialer.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), dialer.dial(b""))
                    .await
                    .ok()?
                    .ok()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let took = started.elapsed();
    let mut open: Vec<_> = outcomes.into_iter().flatten().collect();
    let established = open.len();
    let (peak, now) = memory_of(&pid);
    drop(open.pop());
    let text = metrics_once_free(&dialer).await;
    let refused = metric(&text, "vramguard_connections_refused_total");
    let limit = chart_memory_limit_mib();
    eprintln!(
        "vramguard serve (pid {pid}): {BINARY_ATTEMPTS} connections attempted in {:.1} s, \
         {established} established (cap {}), {refused} refused; server RSS {before} MiB \
         before, peak {peak} MiB (now {now} MiB), chart limit {limit} MiB",
        took.as_secs_f64(),
        webhook::server::MAX_CONNECTIONS
    );
    assert_eq!(established, webhook::server::MAX_CONNECTIONS);
    assert!(
        refused >= (BINARY_ATTEMPTS - established) as f64,
        "{refused} refused"
    );
    assert!(
        peak < limit,
        "server peak RSS {peak} MiB over the chart's {limit} MiB"
    );
    drop(open);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
