//! The webhook served over real TLS on a loopback port, against the static
//! inventory of `examples/cluster.yaml`, and a client that trusts its CA;
//! shared by `tests/webhook.rs` and `tests/webhook_kinds.rs` (each uses part of it).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use vramguard::inventory::Static;
use vramguard::webhook::{self, AppState, Limits, tls};

pub struct Server {
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    pub config: axum_server::tls_rustls::RustlsConfig,
}

/// The GPU nodes of `examples/cluster.yaml`.
pub fn cluster() -> Vec<vramguard::api::GpuNode> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cluster.yaml"),
    )
    .unwrap();
    vramguard::api::parse::documents(&text)
        .unwrap()
        .into_iter()
        .map(|d| vramguard::api::parse::gpu_node(d).unwrap())
        .collect()
}

/// Serve the webhook with a fresh self-signed certificate; `configure`
/// sets what the test needs on the state before it is shared.
pub async fn start_with(limits: Limits, configure: impl FnOnce(&mut AppState)) -> Server {
    let pair = tls::self_signed(&["localhost".into(), "127.0.0.1".into()]).unwrap();
    let config = tls::server_config_from_pem(
        pair.cert_pem.as_bytes(),
        pair.key_pem.as_bytes(),
        Path::new("cert"),
        Path::new("key"),
    )
    .unwrap();
    let rustls = axum_server::tls_rustls::RustlsConfig::from_config(config);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let mut state = AppState::new(Arc::new(Static::new(cluster(), now)));
    configure(&mut state);
    let state = Arc::new(state);
    let connections = webhook::Connections::of(&state, limits);
    let router = webhook::router_with(state, limits);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(webhook::serve(
        "127.0.0.1:0".parse().unwrap(),
        router,
        connections,
        rustls.clone(),
        async move {
            let _ = stop_rx.await;
        },
        Duration::from_secs(5),
        Some(bound_tx),
    ));
    let addr = bound_rx.await.unwrap();
    Server {
        addr,
        ca_pem: pair.ca_pem,
        stop: Some(stop_tx),
        task,
        config: rustls,
    }
}

/// Stop the server and wait for it to finish.
pub async fn stop(mut server: Server) {
    let _ = server.stop.take().unwrap().send(());
    server.task.await.unwrap().unwrap();
}

/// A client that trusts the server's CA.
pub fn connector(ca_pem: &str) -> TlsConnector {
    connector_with_alpn(ca_pem, b"")
}

/// A client offering `alpn` (nothing when empty).
pub fn connector_with_alpn(ca_pem: &str, alpn: &[u8]) -> TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !alpn.is_empty() {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    TlsConnector::from(Arc::new(config))
}
