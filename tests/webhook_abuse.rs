//! The webhook under abuse, over real TLS on loopback, bounded in count and
//! time: while clients send well-formed reviews, others send malformed and
//! truncated JSON, the wrong apiVersion or kind, reviews without a uid,
//! oversized and slow bodies, half request heads, and TLS handshakes that
//! never finish. Every well-formed review is answered with its uid, the rest
//! get a 4xx or are dropped at the handshake and head timeouts, and the
//! server keeps serving. Run with `--nocapture` to see the figures.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use vramguard::inventory::Static;
use vramguard::webhook::server::{HANDSHAKE_TIMEOUT, MAX_BODY_BYTES};
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
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

fn example(path: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).expect("example reads")
}

async fn start() -> Server {
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
    let limits = Limits {
        body_bytes: MAX_BODY_BYTES,
        timeout: REQUEST_TIMEOUT,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(webhook::serve(
        "127.0.0.1:0".parse().expect("an address"),
        webhook::router_with(state, limits),
        axum_server::tls_rustls::RustlsConfig::from_config(config),
        async move {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
        Some(bound_tx),
    ));
    let addr = bound_rx.await.expect("the server binds");
    let mut roots = RootCertStore::empty();
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    for c in CertificateDer::pem_slice_iter(pair.ca_pem.as_bytes()) {
        roots.add(c.expect("a PEM certificate")).expect("a CA");
    }
    let client =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    Server {
        addr,
        connector: TlsConnector::from(Arc::new(client)),
        stop,
        task,
    }
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
        // Keep the write half open until the answer is read.
        tokio::time::sleep(Duration::from_secs(30)).await;
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
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
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
            "well-formed" => &[200],
            "oversized" | "oversized chunked" => &[413],
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
