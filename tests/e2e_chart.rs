//! The chart's life on a real API server (`tests/cluster/cluster.sh`), past `helm install`:
//!
//! - `helm upgrade` keeps the CA and certificate `tls.mode=generated` made at install (the
//!   chart's `lookup` of its own Secret): the Secret and every webhook's `caBundle` are
//!   unchanged while the upgrade's own change lands;
//! - the webhook behind its Service: the chart's Deployment makes its pod
//!   (kube-controller-manager's Deployment and ReplicaSet controllers), a kubelet stand-in of
//!   this test binds it and runs it (the container's args from the pod, the chart's generated
//!   certificate from the Secret volume, the ServiceAccount's token), the EndpointSlice
//!   controller publishes its address, and kube-apiserver calls the webhook through the
//!   Service (`--enable-aggregator-routing`: the endpoint's address, TLS checked against the
//!   chart's `caBundle` for `<service>.<namespace>.svc`);
//! - `helm test`: the chart's test pod, run by the same stand-in: its script with `kubectl`
//!   and the test ServiceAccount's token, the dry-run denial through that Service.
//!
//! What the stand-in cannot do as a kubelet does: it runs the host's binaries (this build's
//! `vramguard`, the `kubectl` of `.ci/tools.py`) instead of pulling the images, and mounts a
//! volume by writing it to a directory and putting that directory's path in place of the mount
//! path in the command, the environment and the mounted ConfigMap files. The pod's address is
//! this machine's own non-loopback address (Kubernetes refuses loopback endpoints).

#[path = "support/cluster.rs"]
mod cluster;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::Method;
use cluster::{JSON, RELEASE, RELEASE_NS};
use kube::Client;
use serde_json::{Value, json};

const TEST: &str = "e2e_chart";
const NODE: &str = "e2e-chart-node";

const GPUS: &str = "driverVersion: 570.124.06
cudaVersion: \"12.8\"
gpus:
  - product: h100-80gb
    count: 2
";

/// The tests of this file share the release: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn get(client: &Client, path: impl AsRef<str>) -> Option<Value> {
    let path = path.as_ref();
    let a = cluster::send(client, Method::GET, path, JSON, &Value::Null).await;
    match a.status {
        200 => Some(a.body),
        404 => None,
        s => panic!("GET {path}: {s} {}", a.body),
    }
}

fn secret_path() -> String {
    format!("/api/v1/namespaces/{RELEASE_NS}/secrets/{RELEASE}-webhook-tls")
}

/// Every webhook's caBundle in the chart's configuration.
fn ca_bundles(config: &Value) -> Vec<String> {
    config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            w["clientConfig"]["caBundle"]
                .as_str()
                .unwrap_or_else(|| panic!("a webhook without caBundle: {w}"))
                .to_string()
        })
        .collect()
}

fn decode(b64: &Value) -> Vec<u8> {
    serde_json::from_value::<k8s_openapi::ByteString>(b64.clone())
        .expect("base64")
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_keeps_the_generated_ca() {
    let _serial = SERIAL.lock().await;
    let Some((client, helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    let hooks = cluster::webhook_configuration_path();
    let secret = get(&client, secret_path()).await.expect("the TLS Secret");
    let config = get(&client, &hooks)
        .await
        .expect("the webhook configuration");
    let before = ca_bundles(&config);
    assert!(before.len() >= 2, "the chart's webhooks: {config}");
    assert!(
        before
            .iter()
            .all(|b| b == secret["data"]["ca.crt"].as_str().unwrap()),
        "every caBundle is the Secret's ca.crt"
    );
    // The serving certificate is the CA's (checked by openssl, as a client would).
    let scratch = cluster::scratch(TEST);
    std::fs::write(scratch.join("ca.crt"), decode(&secret["data"]["ca.crt"])).unwrap();
    std::fs::write(scratch.join("tls.crt"), decode(&secret["data"]["tls.crt"])).unwrap();
    let verify = std::process::Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(scratch.join("ca.crt"))
        .arg(scratch.join("tls.crt"))
        .output()
        .expect("openssl runs");
    assert!(
        verify.status.success(),
        "the chart's certificate is signed by its CA: {}",
        String::from_utf8_lossy(&verify.stdout) + String::from_utf8_lossy(&verify.stderr)
    );

    // An upgrade that changes something in the same template (the webhook's timeout).
    let timeout = if config["webhooks"][0]["timeoutSeconds"] == 7 {
        8
    } else {
        7
    };
    let chart = cluster::root().join("charts/vramguard");
    let set_timeout = format!("webhook.timeoutSeconds={timeout}");
    cluster::run_helm(
        &helm,
        &[
            "upgrade",
            RELEASE,
            chart.to_str().unwrap(),
            "-n",
            RELEASE_NS,
            "--set",
            "tls.mode=generated",
            "--set",
            &set_timeout,
        ],
    );
    let upgraded = get(&client, &hooks)
        .await
        .expect("the webhook configuration");
    assert_eq!(
        upgraded["webhooks"][0]["timeoutSeconds"], timeout,
        "the upgrade was applied: {upgraded}"
    );
    assert_eq!(
        ca_bundles(&upgraded),
        before,
        "helm upgrade kept every webhook's caBundle"
    );
    let after = get(&client, secret_path()).await.expect("the TLS Secret");
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        assert_eq!(
            after["data"][key], secret["data"][key],
            "helm upgrade kept the Secret's {key}"
        );
    }
}

/// This machine's address that is not loopback (the pod's address): the source address of
/// a route out (a UDP connect sends nothing), else the first of `hostname -I`.
fn host_ip() -> Option<IpAddr> {
    let usable = |ip: &IpAddr| !ip.is_loopback() && !ip.is_unspecified() && ip.is_ipv4();
    let routed = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .ok()
        .filter(usable);
    routed.or_else(|| {
        let out = std::process::Command::new("hostname")
            .arg("-I")
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .find(usable)
    })
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn register_node(client: &Client, ip: IpAddr) {
    let path = format!("/api/v1/nodes/{NODE}");
    if get(client, &path).await.is_some() {
        return;
    }
    let resources = json!({"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "2"});
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE,
                                              "nvidia.com/gpu.present": "true"}},
        "status": {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": ip.to_string()}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "the e2e test's kubelet stand-in",
                            "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
        }
    });
    let a = cluster::send(client, Method::POST, "/api/v1/nodes", JSON, &node).await;
    assert!(a.status == 201 || a.status == 409, "{}", a.body);
}

/// A pod's volume, written to `dir`: a Secret's or ConfigMap's keys as files, an emptyDir
/// empty. ConfigMap files get the mount paths rewritten as the command is.
async fn materialize(client: &Client, volume: &Value, dir: &Path, mounts: &[(String, PathBuf)]) {
    std::fs::create_dir_all(dir).expect("a volume directory");
    if let Some(name) = volume["secret"]["secretName"].as_str() {
        let s = get(
            client,
            format!("/api/v1/namespaces/{RELEASE_NS}/secrets/{name}"),
        )
        .await
        .unwrap_or_else(|| panic!("the pod's Secret {name}"));
        for (k, v) in s["data"].as_object().into_iter().flatten() {
            std::fs::write(dir.join(k), decode(v)).expect("a Secret file");
        }
    } else if let Some(name) = volume["configMap"]["name"].as_str() {
        let c = get(
            client,
            format!("/api/v1/namespaces/{RELEASE_NS}/configmaps/{name}"),
        )
        .await
        .unwrap_or_else(|| panic!("the pod's ConfigMap {name}"));
        for (k, v) in c["data"].as_object().into_iter().flatten() {
            let text = remount(v.as_str().expect("text"), mounts);
            std::fs::write(dir.join(k), text).expect("a ConfigMap file");
        }
    } else {
        // The ServiceAccount admission's token volume: the token reaches the process as its
        // KUBECONFIG instead ([`command_of`]).
        assert!(
            volume.get("emptyDir").is_some() || volume.get("projected").is_some(),
            "a volume the stand-in cannot mount: {volume}"
        );
    }
}

/// `text` with each mount path replaced by the directory that holds the volume, where a
/// path starts (at the start, after a space, `=`, `:` or a quote) and ends (`/`, a space, a
/// quote or the end): one pass, so a directory put in is not rewritten again.
fn remount(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut by_length: Vec<&(String, PathBuf)> = mounts.iter().collect();
    by_length.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    let starts = |c: char| c.is_whitespace() || matches!(c, '=' | ':' | '"' | '\'');
    let (mut out, mut i) = (String::new(), 0);
    while i < text.len() {
        let at_start = text[..i].chars().next_back().is_none_or(starts);
        let hit = by_length.iter().find(|(path, _)| {
            text[i..].starts_with(path.as_str())
                && text[i + path.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| c == '/' || starts(c))
        });
        match hit {
            Some((path, dir)) if at_start => {
                out.push_str(dir.to_str().expect("a UTF-8 path"));
                i += path.len();
            }
            _ => {
                let c = text[i..].chars().next().expect("a character");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// A pod's first container as a local command: its volumes written under `dir`, its
/// ServiceAccount's token in a kubeconfig, its environment resolved.
async fn command_of(client: &Client, pod: &Value, dir: &Path) -> tokio::process::Command {
    let spec = &pod["spec"];
    let container = &spec["containers"][0];
    let mut mounts = Vec::new();
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().expect("a volume name");
        let path = m["mountPath"].as_str().expect("a mount path");
        mounts.push((path.to_string(), dir.join("volumes").join(name)));
    }
    for (path, local) in &mounts {
        let name = local.file_name().unwrap().to_str().unwrap();
        let volume = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volume {name} for {path}"));
        materialize(client, volume, local, &mounts).await;
    }
    let words = |key: &str| -> Vec<String> {
        container[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| remount(w.as_str().expect("a word"), &mounts))
            .collect()
    };
    // The image's entrypoint: the controller image runs `vramguard`.
    let (program, args) = match words("command").split_first() {
        Some((p, rest)) => (PathBuf::from(p), [rest.to_vec(), words("args")].concat()),
        None => (
            PathBuf::from(env!("CARGO_BIN_EXE_vramguard")),
            words("args"),
        ),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).kill_on_drop(true).env_clear();
    let path = format!(
        "{}:/usr/local/bin:/usr/bin:/bin",
        cluster::root().join("target/ci-tools/bin").display()
    );
    cmd.env("PATH", path);
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("a name");
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => remount(v, &mounts),
            (None, Some("metadata.namespace")) => RELEASE_NS.to_string(),
            (None, Some("metadata.name")) => pod["metadata"]["name"].as_str().unwrap().into(),
            _ => panic!("an env var the stand-in cannot resolve: {e}"),
        };
        cmd.env(name, value);
    }
    let sa = spec["serviceAccountName"]
        .as_str()
        .expect("a ServiceAccount");
    let kubeconfig = dir.join("kubeconfig");
    cluster::service_account_kubeconfig(client, sa, &kubeconfig).await;
    cmd.env("KUBECONFIG", kubeconfig);
    cmd
}

async fn patch_status(client: &Client, name: &str, status: Value) {
    let a = cluster::send(
        client,
        Method::PATCH,
        &format!("/api/v1/namespaces/{RELEASE_NS}/pods/{name}/status"),
        "application/merge-patch+json",
        &json!({"status": status}),
    )
    .await;
    if a.status != 200 {
        eprintln!(
            "kubelet stand-in: status of {name}: {} {}",
            a.status, a.body
        );
    }
}

async fn force_delete(client: &Client, name: &str) {
    cluster::send(
        client,
        Method::DELETE,
        &format!("/api/v1/namespaces/{RELEASE_NS}/pods/{name}"),
        JSON,
        &json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}),
    )
    .await;
}

/// The kubelet stand-in, every 200 ms over the release namespace's pods: binds them to its
/// node; runs the webhook's (kept running, marked Ready once its readinessProbe path answers
/// over HTTPS) and the `helm test` pod's (to the end: Succeeded or Failed by its exit code,
/// its output in the termination message and in `scratch/<pod>.out`); removes the pods being
/// deleted, and the ones bound before it started (it did not start them). It has one
/// address for every pod, so it runs one webhook replica; the other stays Pending.
async fn kubelet(client: Client, ip: IpAddr, port: u16, scratch: PathBuf) {
    let mut running: HashMap<String, tokio::process::Child> = HashMap::new();
    let mut ready: Vec<String> = Vec::new();
    let mut done: Vec<String> = Vec::new();
    loop {
        let pods = get(&client, format!("/api/v1/namespaces/{RELEASE_NS}/pods"))
            .await
            .expect("the pod list");
        for pod in pods["items"].as_array().into_iter().flatten() {
            let name = pod["metadata"]["name"]
                .as_str()
                .expect("a name")
                .to_string();
            let component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap_or_default();
            if !matches!(component, "webhook" | "test") {
                continue;
            }
            let bound = pod["spec"]["nodeName"].as_str();
            let ours = running.contains_key(&name) || done.contains(&name);
            if !pod["metadata"]["deletionTimestamp"].is_null() || (bound.is_some() && !ours) {
                running.remove(&name);
                force_delete(&client, &name).await;
                continue;
            }
            // The webhook's pods of this test's port (one address: older ReplicaSets' pods,
            // on another port, stay unbound and unready), and the test pod.
            let this_port = pod["spec"]["containers"][0]["ports"][0]["containerPort"] == port;
            if component == "webhook" && !this_port {
                continue;
            }
            let webhooks = running.keys().filter(|n| !n.ends_with("-test")).count();
            if bound.is_none() && component == "webhook" && webhooks > 0 {
                continue;
            }
            if bound.is_none() {
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                                     "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
                let path = format!("/api/v1/namespaces/{RELEASE_NS}/pods/{name}/binding");
                let a = cluster::send(&client, Method::POST, &path, JSON, &binding).await;
                if a.status != 201 {
                    eprintln!("kubelet stand-in: binding {name}: {} {}", a.status, a.body);
                    continue;
                }
                let dir = scratch.join(&name);
                let mut cmd = command_of(&client, pod, &dir).await;
                let log = std::fs::File::create(scratch.join(format!("{name}.out"))).unwrap();
                cmd.stdout(log.try_clone().unwrap()).stderr(log);
                running.insert(name.clone(), cmd.spawn().expect("the pod's process starts"));
                patch_status(&client, &name, running_status(pod, ip, false)).await;
                continue;
            }
            let Some(child) = running.get_mut(&name) else {
                continue;
            };
            if component == "test" {
                if let Some(exit) = child.try_wait().expect("the test pod's process") {
                    let code = exit.code().unwrap_or(-1);
                    let out = std::fs::read_to_string(scratch.join(format!("{name}.out")))
                        .unwrap_or_default();
                    patch_status(&client, &name, ended_status(pod, code, &out)).await;
                    running.remove(&name);
                    done.push(name);
                }
                continue;
            }
            if !ready.contains(&name) && probe_ready(pod, ip).await {
                patch_status(&client, &name, running_status(pod, ip, true)).await;
                ready.push(name);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The container's readinessProbe (httpGet over HTTPS, the certificate not checked, as the
/// kubelet does) against the pod's address.
async fn probe_ready(pod: &Value, ip: IpAddr) -> bool {
    let container = &pod["spec"]["containers"][0];
    let probe = &container["readinessProbe"]["httpGet"];
    let port = match &probe["port"] {
        Value::Number(n) => n.as_u64(),
        Value::String(named) => container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == named.as_str())
            .and_then(|p| p["containerPort"].as_u64()),
        _ => None,
    }
    .expect("the probe's port");
    let url = format!(
        "https://{ip}:{port}{}",
        probe["path"].as_str().unwrap_or("/")
    );
    tokio::process::Command::new("curl")
        .args(["-sfk", "--max-time", "2", "-o", "/dev/null", &url])
        .status()
        .await
        .is_ok_and(|s| s.success())
}

fn running_status(pod: &Value, ip: IpAddr, ready: bool) -> Value {
    let r = if ready { "True" } else { "False" };
    let c = &pod["spec"]["containers"][0];
    json!({
        "phase": "Running", "hostIP": ip.to_string(), "podIP": ip.to_string(),
        "hostIPs": [{"ip": ip.to_string()}], "podIPs": [{"ip": ip.to_string()}],
        "startTime": now(),
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now()},
            {"type": "ContainersReady", "status": r, "lastTransitionTime": now()},
            {"type": "Ready", "status": r, "lastTransitionTime": now()},
        ],
        "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "",
                               "ready": ready, "started": true, "restartCount": 0,
                               "state": {"running": {"startedAt": now()}}}],
    })
}

fn ended_status(pod: &Value, code: i32, out: &str) -> Value {
    let c = &pod["spec"]["containers"][0];
    let tail: String = out
        .chars()
        .rev()
        .take(4000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    json!({
        "phase": if code == 0 { "Succeeded" } else { "Failed" },
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "",
                               "ready": false, "restartCount": 0,
                               "state": {"terminated": {
                                   "exitCode": code,
                                   "reason": if code == 0 { "Completed" } else { "Error" },
                                   "message": tail, "startedAt": now(), "finishedAt": now()}}}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_answers_behind_its_service_and_helm_test_passes() {
    let _serial = SERIAL.lock().await;
    let Some(client) = cluster::connect(TEST).await else {
        return;
    };
    let Some(helm) = cluster::helm(TEST) else {
        return;
    };
    let Some(ip) = host_ip() else {
        cluster::absent::<()>(
            TEST,
            "this machine has no non-loopback IPv4 address for the webhook pod \
             (Kubernetes refuses loopback endpoints)",
        );
        return;
    };
    // The test pod's image brings kubectl; here the one `.ci/tools.py` installs stands in.
    let kubectl = cluster::root().join("target/ci-tools/bin/kubectl");
    if !kubectl.exists() {
        cluster::absent::<()>(
            TEST,
            &format!(
                "{} is missing (`python3 .ci/tools.py` installs it)",
                kubectl.display()
            ),
        );
        return;
    }
    let port = cluster::free_port();
    // The webhook alone (the operator's Lease is other tests' business), on a free port.
    let set_port = format!("webhook.port={port}");
    cluster::install_chart(&client, &helm, &["operator.enabled=false", &set_port]).await;
    let config = get(&client, cluster::webhook_configuration_path())
        .await
        .expect("the webhook configuration");
    let service = &config["webhooks"][0]["clientConfig"];
    assert_eq!(service["service"]["name"], RELEASE, "{service}");
    assert!(service.get("url").is_none(), "{service}");

    register_node(&client, ip).await;
    let scratch = cluster::scratch("e2e_chart_service");
    // The node's GPUs, published by the agent (`--simulate`) with the agent's token.
    let agent_config = scratch.join("agent.kubeconfig");
    cluster::service_account_kubeconfig(&client, &format!("{RELEASE}-agent"), &agent_config).await;
    let gpus = scratch.join("gpus.yaml");
    std::fs::write(&gpus, GPUS).expect("gpus.yaml");
    let agent = std::process::Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args(["agent", "--simulate"])
        .arg(&gpus)
        .args(["--node-name", NODE, "--interval-secs", "2", "--listen"])
        .arg(format!("127.0.0.1:{}", cluster::free_port()))
        .arg("--pod-resources-socket")
        .arg(scratch.join("no-kubelet.sock"))
        .env("KUBECONFIG", &agent_config)
        .stderr(std::fs::File::create(scratch.join("agent.log")).expect("a log"))
        .spawn()
        .expect("the agent starts");
    let _agent = cluster::Process(agent);
    let gpunode = format!("/apis/vramguard.io/v1alpha1/gpunodes/{NODE}");
    cluster::eventually("the agent's GpuNode", 60, || async {
        get(&client, &gpunode)
            .await
            .is_some_and(|g| g["status"]["gpuCount"] == 2)
    })
    .await;
    let stand_in = tokio::spawn(kubelet(client.clone(), ip, port, scratch.clone()));

    // The EndpointSlice controller lists the pod once it is Ready.
    let slices = format!(
        "/apis/discovery.k8s.io/v1/namespaces/{RELEASE_NS}/endpointslices\
         ?labelSelector=kubernetes.io%2Fservice-name%3D{RELEASE}"
    );
    // Ready endpoints by port: this test's pod only (what an earlier run left is gone).
    let ready_ports = |slices: &Value| -> Vec<Value> {
        let mut ports = Vec::new();
        for s in slices["items"].as_array().into_iter().flatten() {
            let ready =
                s["endpoints"].as_array().into_iter().flatten().any(|e| {
                    e["addresses"][0] == ip.to_string() && e["conditions"]["ready"] == true
                });
            if ready {
                ports.extend(
                    s["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|p| p["port"].clone()),
                );
            }
        }
        ports
    };
    cluster::eventually(
        "the webhook's Service to have this pod as its one ready endpoint",
        90,
        || async {
            get(&client, &slices)
                .await
                .is_some_and(|l| ready_ports(&l) == [json!(port)])
        },
    )
    .await;

    // A job no GPU holds, through the Service: denied with our message.
    let ns = "e2e-chart";
    cluster::namespace(&client, ns, json!({})).await;
    let text = std::fs::read_to_string(
        cluster::root().join("examples/denied-llama-3.1-70b-full-1gpu.yaml"),
    )
    .expect("the example");
    let mut job: Value = serde_saphyr::from_str(&text).expect("a TrainingJob");
    job["metadata"]["namespace"] = json!(ns);
    let path = format!("/apis/vramguard.io/v1alpha1/namespaces/{ns}/trainingjobs?dryRun=All");
    let got = cluster::send(&client, Method::POST, &path, JSON, &job).await;
    assert_eq!(got.status, 403, "{}", got.body);
    let message = got.body["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("admission webhook \"trainingjobs.vramguard.io\" denied the request:")
            && message.contains("GiB"),
        "{message}"
    );

    // helm test: the chart's test pod, run by the stand-in, passes only on the denial.
    let helm_test = {
        let helm = helm.clone();
        tokio::task::spawn_blocking(move || {
            cluster::run_helm(
                &helm,
                &["test", RELEASE, "-n", RELEASE_NS, "--timeout", "120s"],
            )
        })
    };
    let out = helm_test.await.expect("helm test");
    eprintln!("{out}");
    assert!(out.contains("Succeeded"), "helm test: {out}");
    let run = std::fs::read_to_string(scratch.join(format!("{RELEASE}-test.out")))
        .expect("the test pod ran here");
    assert!(
        run.contains("PASS: the webhook denied it"),
        "the test pod's output: {run}"
    );
    stand_in.abort();
    let _ = stand_in.await;
    // The pods the stand-in ran go (their processes went with it): nothing routes to them.
    let pods = get(&client, format!("/api/v1/namespaces/{RELEASE_NS}/pods"))
        .await
        .expect("the pod list");
    for pod in pods["items"].as_array().into_iter().flatten() {
        if pod["spec"]["nodeName"] == NODE {
            force_delete(&client, pod["metadata"]["name"].as_str().unwrap()).await;
        }
    }
}
