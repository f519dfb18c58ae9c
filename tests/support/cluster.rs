//! The real control plane of the end-to-end tests (`tests/e2e_*.rs`): etcd, kube-apiserver
//! and kube-controller-manager that `tests/cluster/cluster.sh` builds and starts on loopback,
//! reached through kube's client with the kubeconfig it writes.
//!
//! Without it the tests say how to start it and skip; with `VRAMGUARD_E2E=require` (as
//! `.ci/run` sets) its absence fails them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::http;
use http_body_util::BodyExt;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn kubeconfig_path() -> PathBuf {
    root().join("target/cluster/kubeconfig")
}

fn required() -> bool {
    std::env::var("VRAMGUARD_E2E").is_ok_and(|v| v == "require")
}

/// Skips (returns None after saying why and how to fix it), or with
/// `VRAMGUARD_E2E=require` fails.
pub fn absent<T>(test: &str, why: &str) -> Option<T> {
    let msg = format!(
        "{test}: {why}. The end-to-end tests need the test control plane: \
         `tests/cluster/cluster.sh build && tests/cluster/cluster.sh up` \
         (Go and openssl; the first build takes about 10 minutes), then run the test again; \
         `tests/cluster/cluster.sh down` stops it"
    );
    if required() {
        panic!("{msg} (VRAMGUARD_E2E=require: not skipped)");
    }
    eprintln!("SKIPPED {msg}");
    None
}

/// A client for the cluster admin, once `/readyz` answers; None (skip) when there is no
/// control plane.
pub async fn connect(test: &str) -> Option<Client> {
    let path = kubeconfig_path();
    if !path.exists() {
        return absent(test, &format!("{} does not exist", path.display()));
    }
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let client = Client::try_from(config).expect("a client from the kubeconfig");
    let readyz = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a request");
    match tokio::time::timeout(Duration::from_secs(10), client.request_text(readyz)).await {
        Ok(Ok(text)) if text.trim() == "ok" => Some(client),
        Ok(Ok(text)) => absent(test, &format!("the API server is not ready: {text}")),
        Ok(Err(e)) => absent(test, &format!("the API server does not answer: {e}")),
        Err(_) => absent(test, "the API server did not answer /readyz within 10 s"),
    }
}

/// helm: $VRAMGUARD_HELM, else the one `.ci/tools.py` installs, else `helm` on PATH.
pub fn helm(test: &str) -> Option<PathBuf> {
    let candidates = std::env::var_os("VRAMGUARD_HELM")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            root().join("target/ci-tools/bin/helm"),
            PathBuf::from("helm"),
        ]);
    for c in candidates {
        let ok = Command::new(&c)
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(c);
        }
    }
    let msg = format!(
        "{test}: no helm (VRAMGUARD_HELM, target/ci-tools/bin/helm from `python3 .ci/tools.py`, or PATH)"
    );
    if required() {
        panic!("{msg} (VRAMGUARD_E2E=require: not skipped)");
    }
    eprintln!("SKIPPED {msg}");
    None
}

/// Runs helm with the test cluster's kubeconfig; panics with its output when it fails.
pub fn run_helm(helm: &Path, args: &[&str]) -> String {
    let out = Command::new(helm)
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A child process killed when dropped (a failing test leaves nothing behind).
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A directory under target/cluster/ for one test's files, emptied first.
pub fn scratch(test: &str) -> PathBuf {
    let dir = root().join("target/cluster/scratch").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// What the API server answered a raw request: status, body, and the warnings
/// (`Warning: 299 - "..."` headers) decoded. A warning header that is not ASCII
/// fails the test: HTTP clients (kube's among them) cannot read it as text.
pub struct Answer {
    pub status: u16,
    pub body: serde_json::Value,
    pub warnings: Vec<String>,
}

pub async fn send(
    client: &Client,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: &serde_json::Value,
) -> Answer {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::from(
            serde_json::to_vec(body).expect("JSON"),
        ))
        .expect("a request");
    let res = client.send(req).await.expect("the API server answers");
    let status = res.status().as_u16();
    let warnings = res
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| {
            let text = v.to_str().unwrap_or_else(|_| {
                panic!(
                    "a Warning header that is not ASCII, which HTTP clients drop: {}",
                    String::from_utf8_lossy(v.as_bytes())
                )
            });
            decode_warning(text)
        })
        .collect();
    let bytes = res
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
    });
    Answer {
        status,
        body,
        warnings,
    }
}

/// GETs `path` as JSON.
pub async fn get(client: &Client, path: &str) -> Answer {
    send(
        client,
        http::Method::GET,
        path,
        JSON,
        &serde_json::Value::Null,
    )
    .await
}

/// GETs `path`; an answer other than 200 fails the test with the API server's words.
pub async fn get_ok(client: &Client, path: &str) -> serde_json::Value {
    let a = get(client, path).await;
    assert_eq!(a.status, 200, "GET {path}: {}", a.body);
    a.body
}

/// `299 - "text"` with `\"` and `\\` escaped, as the API server writes a warning.
pub fn decode_warning(header: &str) -> String {
    let Some(quoted) = header
        .strip_prefix("299 - \"")
        .and_then(|s| s.strip_suffix('"'))
    else {
        panic!("a warning header not shaped 299 - \"...\": {header}");
    };
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `probe` every 100 ms for up to `secs` seconds.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !probe().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub const RELEASE: &str = "vramguard";
pub const RELEASE_NS: &str = "vramguard-system";
pub const JSON: &str = "application/json";

/// The client and helm of a test that needs the chart installed as a user installs it
/// ([`install_chart`] with no `--set`); `None` (the test skips, saying why) when either is
/// absent.
pub async fn with_chart(test: &str) -> Option<(Client, PathBuf)> {
    let client = connect(test).await?;
    let helm = helm(test)?;
    install_chart(&client, &helm, &[]).await;
    Some((client, helm))
}

/// `helm upgrade --install` of charts/vramguard as release `vramguard` in
/// `vramguard-system`, with `tls.mode=generated` and `sets`. The webhook configuration an
/// earlier test pointed at its own server ([`point_webhook_at`]) goes first: helm applies
/// server-side, and would conflict with that test's change of `clientConfig`.
pub async fn install_chart(client: &Client, helm: &Path, sets: &[&str]) {
    send(
        client,
        http::Method::DELETE,
        &webhook_configuration_path(),
        JSON,
        &serde_json::Value::Null,
    )
    .await;
    let chart = root().join("charts/vramguard");
    let mut args = vec![
        "upgrade",
        "--install",
        RELEASE,
        chart.to_str().expect("a UTF-8 path"),
        "-n",
        RELEASE_NS,
        "--create-namespace",
        "--set",
        "tls.mode=generated",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    run_helm(helm, &args);
}

pub fn webhook_configuration_path() -> String {
    format!("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{RELEASE}")
}

/// Points the chart's webhook configuration at a `vramguard serve` on loopback: its
/// `clientConfig` only (URL and CA); rules, matchConditions and policies stay the chart's.
pub async fn point_webhook_at(client: &Client, port: u16, ca_pem: &str) {
    let patch = serde_json::json!([{
        "op": "replace",
        "path": "/webhooks/0/clientConfig",
        "value": {
            "url": format!("https://127.0.0.1:{port}/validate"),
            "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()),
        }
    }]);
    let patched = send(
        client,
        http::Method::PATCH,
        &webhook_configuration_path(),
        "application/json-patch+json",
        &patch,
    )
    .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
}

/// Points every webhook of the chart's configuration (TrainingJobs and the workload kinds'
/// Deny, Warn and Audit) at a `vramguard serve` on loopback, each at its own path (the
/// chart's `service.path`): `clientConfig` only, as [`point_webhook_at`] does for the first.
pub async fn point_webhooks_at(client: &Client, port: u16, ca_pem: &str) {
    let path = webhook_configuration_path();
    let installed = get_ok(client, &path).await;
    let hooks = installed["webhooks"].as_array().expect("webhooks");
    let patch: Vec<serde_json::Value> = hooks
        .iter()
        .enumerate()
        .map(|(i, hook)| {
            let service_path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or_else(|| panic!("webhook {i} is not called through its Service: {hook}"));
            serde_json::json!({
                "op": "replace",
                "path": format!("/webhooks/{i}/clientConfig"),
                "value": {
                    "url": format!("https://127.0.0.1:{port}{service_path}"),
                    "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()),
                }
            })
        })
        .collect();
    let patched = send(
        client,
        http::Method::PATCH,
        &path,
        "application/json-patch+json",
        &serde_json::Value::Array(patch),
    )
    .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
}

/// Namespace `ns` with `labels`, created if missing.
pub async fn namespace(client: &Client, ns: &str, labels: serde_json::Value) {
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": ns, "labels": labels}});
    let a = send(
        client,
        http::Method::POST,
        "/api/v1/namespaces",
        JSON,
        &body,
    )
    .await;
    assert!(
        a.status == 201 || a.status == 409,
        "creating namespace {ns}: {} {}",
        a.status,
        a.body
    );
}

/// `vramguard serve` on a free loopback port with a generated CA, `extra` arguments and
/// environment; returns the process, its port and the CA.
pub async fn start_serve(
    scratch: &Path,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (Process, u16, String) {
    let ca = scratch.join("ca.pem");
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vramguard"));
    cmd.args([
        "serve",
        "--self-signed",
        "--tls-hosts",
        "127.0.0.1",
        "--ca-out",
    ])
    .arg(&ca)
    .args(["--listen", &format!("127.0.0.1:{port}")])
    .args(extra)
    .env_remove("KUBECONFIG")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(scratch.join("serve.log")).expect("a log file"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let process = Process(cmd.spawn().expect("vramguard serve starts"));
    eventually("vramguard serve to listen", 60, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let ca_pem = std::fs::read_to_string(&ca).expect("the CA the webhook wrote");
    (process, port, ca_pem)
}

/// A token of ServiceAccount `sa` in the release namespace (TokenRequest), in a
/// kubeconfig written to `file`: the cluster's address and CA, nothing of the admin.
pub async fn service_account_kubeconfig(client: &Client, sa: &str, file: &Path) {
    let request = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    });
    let path = format!("/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/{sa}/token");
    let a = send(client, http::Method::POST, &path, JSON, &request).await;
    assert_eq!(a.status, 201, "a token for {sa}: {}", a.body);
    let token = a.body["status"]["token"].as_str().expect("a token");
    let admin = Kubeconfig::read_from(kubeconfig_path()).expect("the admin kubeconfig");
    let cluster = admin.clusters[0].cluster.as_ref().expect("a cluster");
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {}
    certificate-authority-data: {}
users:
- name: {sa}
  user:
    token: {token}
contexts:
- name: test
  context: {{cluster: test, user: {sa}}}
current-context: test
",
        cluster.server.as_deref().expect("a server"),
        cluster.certificate_authority_data.as_deref().expect("a CA"),
    );
    std::fs::write(file, text).expect("a kubeconfig");
}

/// Polls `probe` every 100 ms for up to `secs` seconds until it gives a value.
pub async fn until_some<T, F, Fut>(what: &str, secs: u64, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the CustomResourceDefinition `crd`, or replaces the one of its name (with the
/// resourceVersion it has), and waits until it is Established.
pub async fn apply_crd(client: &Client, mut crd: serde_json::Value) {
    let name = crd["metadata"]["name"]
        .as_str()
        .expect("a CRD's name")
        .to_string();
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
    let a = send(
        client,
        http::Method::POST,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        JSON,
        &crd,
    )
    .await;
    if a.status == 409 {
        let old = get_ok(client, &path).await;
        crd["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        let a = send(client, http::Method::PUT, &path, JSON, &crd).await;
        assert_eq!(a.status, 200, "{name}: {}", a.body);
    } else {
        assert_eq!(a.status, 201, "{name}: {}", a.body);
    }
    eventually(&format!("{name} established"), 60, || async {
        let c = get(client, &path).await;
        c.status == 200
            && c.body["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
    })
    .await;
}

/// vramguard's Kueue AdmissionCheck controller, as `vramguard serve --kueue-admission-check`
/// runs it (without the Lease), on the GpuNodes of `examples/cluster.yaml`.
pub struct KueueController {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), vramguard::kueue::controller::Error>>,
}

impl KueueController {
    pub fn start(client: &Client) -> KueueController {
        use vramguard::kueue::controller;
        let nodes = vramguard::cli::serve::read_cluster(&root().join("examples/cluster.yaml"))
            .expect("examples/cluster.yaml");
        let source = vramguard::inventory::Static::new(
            nodes,
            k8s_openapi::jiff::Timestamp::now().as_second(),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller::run_controller(
            client.clone(),
            std::sync::Arc::new(source),
            controller::Config::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        KueueController { stop, task }
    }

    /// Asks it to stop and gives it 10 s to.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// The `events.k8s.io/v1` Events in `ns` regarding the object with `uid` (a field selector
/// on `regarding.uid`, as `kubectl describe` lists an object's Events).
pub async fn events_regarding(client: &Client, ns: &str, uid: &str) -> Vec<serde_json::Value> {
    let path = format!(
        "/apis/events.k8s.io/v1/namespaces/{ns}/events?fieldSelector=regarding.uid%3D{uid}"
    );
    get_ok(client, &path).await["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The first Event in `ns` regarding the object with `uid` whose reason is `reason` (any
/// reason when `None`), waiting up to 60 s for it.
pub async fn event_regarding(
    client: &Client,
    ns: &str,
    uid: &str,
    reason: Option<&str>,
) -> serde_json::Value {
    let what = format!(
        "an Event {} on {ns}/{uid}",
        reason.unwrap_or("(any reason)")
    );
    until_some(&what, 60, || async {
        events_regarding(client, ns, uid)
            .await
            .into_iter()
            .find(|e| reason.is_none_or(|r| e["reason"] == r))
    })
    .await
}
