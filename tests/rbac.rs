//! The chart's RBAC rules (`charts/vramguard/files/rbac/*.yaml`, which the
//! chart's roles include verbatim) allow every API call the code makes, and
//! nothing it does not make.
//!
//! The calls are not listed by hand nor grepped from the source: each part
//! (the webhook's inventory, the operator with its Lease, the agent) runs its
//! real code through kube's real client against the in-memory test API
//! server, which records every request. A grep would see `Api<Job>` but not
//! the list-then-watch a `Controller::owns` makes, the `create` a server-side
//! apply needs when it makes the object, or which type an `api` variable
//! holds. What the recording cannot see is a path no scenario drives: that is
//! why every rule must also be exercised, so a rule for an untested path fails
//! here until a scenario covers it (or the rule goes).

#[path = "support/chart_rbac.rs"]
mod chart_rbac;
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use chart_rbac::{Rule, granted, rules};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use support::apiserver::{ApiServer, Request};
use support::fixtures::{self, gpu_node};
use vramguard::agent::publish::{self, PublishConfig};
use vramguard::api::{MemoryProfile, Phase, TrainingJob};
use vramguard::inventory::reflect;
use vramguard::operator::{self, Config, LeaseConfig};

const NS: &str = "ml";
const RELEASE_NS: &str = "vramguard-system";

/// What authorization sees of a request: group, resource (with its
/// subresource, `pods/log`), verb, namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    group: String,
    resource: String,
    verb: String,
    namespace: Option<String>,
}

/// The verbs the API server authorizes a request under. A server-side apply
/// to a main resource may create the object, which also needs `create`.
fn accesses(req: &Request) -> Vec<Access> {
    // API discovery (the Kueue controller asks which versions of Kueue's group are served):
    // non-resource URLs every authenticated user may GET (the default ClusterRole
    // `system:discovery`); no rule of the chart's grants or needs them.
    if req.method == Method::GET && matches!(req.path.as_str(), "/api" | "/apis") {
        return Vec::new();
    }
    let (group, rest) = if let Some(rest) = req.path.strip_prefix("/api/v1/") {
        (String::new(), rest)
    } else if let Some(rest) = req.path.strip_prefix("/apis/") {
        let mut parts = rest.splitn(3, '/');
        let group = parts.next().unwrap_or_default().to_string();
        let _version = parts.next();
        (group, parts.next().unwrap_or_default())
    } else {
        // /version and other non-resource URLs: none is called.
        panic!("a non-resource request {} {}", req.method, req.path);
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segments) = match segments.as_slice() {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        all => (None, all),
    };
    let (resource, name, sub) = match segments {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        other => panic!("unexpected path {other:?} in {}", req.path),
    };
    let resource = match sub {
        Some(s) => format!("{resource}/{s}"),
        None => resource.to_string(),
    };
    let watch = req
        .query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verbs: Vec<&str> = match (&req.method, name) {
        (&Method::GET, Some(_)) => vec!["get"],
        (&Method::GET, None) if watch => vec!["watch"],
        (&Method::GET, None) => vec!["list"],
        (&Method::POST, _) => vec!["create"],
        (&Method::PUT, _) => vec!["update"],
        (&Method::PATCH, _) if req.content_type.contains("apply-patch") && sub.is_none() => {
            vec!["patch", "create"]
        }
        (&Method::PATCH, _) => vec!["patch"],
        (&Method::DELETE, Some(_)) => vec!["delete"],
        (&Method::DELETE, None) => vec!["deletecollection"],
        (m, _) => panic!("unexpected method {m} on {}", req.path),
    };
    verbs
        .into_iter()
        .map(|v| Access {
            group: group.clone(),
            resource: resource.clone(),
            verb: v.to_string(),
            namespace: namespace.clone(),
        })
        .collect()
}

fn observed(server: &ApiServer) -> BTreeSet<Access> {
    server.requests().iter().flat_map(accesses).collect()
}

/// Every access is granted by `cluster` (ClusterRole rules) or, inside
/// `RELEASE_NS`, by `namespaced` (a Role's); every granted combination of
/// `must_use` is exercised by some access.
fn check(
    part: &str,
    seen: &BTreeSet<Access>,
    cluster: &[Rule],
    namespaced: &[Rule],
    must_use: &[&[Rule]],
) {
    let cluster_grants = granted(cluster);
    let ns_grants = granted(namespaced);
    let mut missing = Vec::new();
    for a in seen {
        let key = (a.group.clone(), a.resource.clone(), a.verb.clone());
        let in_release_ns = a.namespace.as_deref() == Some(RELEASE_NS);
        let allowed = cluster_grants.contains(&key) || (in_release_ns && ns_grants.contains(&key));
        if !allowed {
            missing.push(format!("{a:?}"));
        }
    }
    assert!(
        missing.is_empty(),
        "{part}: the chart does not allow calls the code makes:\n  {}",
        missing.join("\n  ")
    );
    let used: BTreeSet<(String, String, String)> = seen
        .iter()
        .map(|a| (a.group.clone(), a.resource.clone(), a.verb.clone()))
        .collect();
    let unused: Vec<String> = must_use
        .iter()
        .flat_map(|rules| granted(rules))
        .filter(|k| !used.contains(k))
        .map(|(g, r, v)| format!("{v} {r} (group {g:?})"))
        .collect();
    assert!(
        unused.is_empty(),
        "{part}: the chart grants what no call uses:\n  {}",
        unused.join("\n  ")
    );
}

async fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !probe() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn training_job(name: &str, spec_yaml: &str) -> TrainingJob {
    fixtures::training_job(NS, name, spec_yaml)
}

const TEMPLATE: &str = "template: {spec: {containers: [{name: trainer, image: trainer:1}]}}";

/// PyTorch's message: 78.12 GiB in use + 2 GiB tried, with little reserved slack.
const TORCH_OOM: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_inventory_calls_match_its_rules() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 1, 79));
    let (_source, driver) = reflect::start(server.client());
    let task = tokio::spawn(driver);
    let watched = |plural: &str| {
        observed(&server)
            .iter()
            .any(|a| a.resource == plural && a.verb == "watch")
    };
    eventually("the inventory's watches", || {
        watched("gpunodes") && watched("nodes") && watched("memoryprofiles")
    })
    .await;
    task.abort();
    let webhook = rules("webhook.yaml");
    check("webhook", &observed(&server), &webhook, &[], &[&webhook]);
}

/// Admission to a Job, a GPU OOM found in the log tail, the retry and the
/// MemoryProfile, a multi-node job with its Service, a deletion, and the
/// Lease taken and given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_calls_match_its_rules() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", 8, 79));
    server.put(&gpu_node("gpu-b", 8, 79));
    server.put(&gpu_node("gpu-c", 8, 79));
    let client = server.client();
    let (source, driver) = reflect::start(client.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = Config {
        wait_requeue: Duration::from_secs(600),
        error_requeue: Duration::from_millis(200),
        ..Config::default()
    };
    let lease = LeaseConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        renew_every: Duration::from_millis(200),
        retry_every: Duration::from_millis(200),
        ..LeaseConfig::new(RELEASE_NS, "vramguard-operator", "op-a")
    };
    let task = tokio::spawn(async move {
        let run = operator::run(client, Arc::new(source), config, lease, async move {
            let _ = stopped.await;
        });
        tokio::select! {
            r = run => r.expect("operator"),
            _ = driver => {},
        }
    });

    let lora = format!(
        "model: {{preset: llama-3.1-8b}}
training: {{mode: lora, microBatchSize: 2, globalBatchSize: 32, sequenceLength: 2048, attention: flash}}
fitPolicy: {{mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}}
{TEMPLATE}"
    );
    server.put(&training_job("ft", &lora));
    let job_exists = |name: &str| server.get::<Job>(Some(NS), name).is_some();
    eventually("Job ft-0", || job_exists("ft-0")).await;
    // The termination message says nothing: the OOM is in the log tail.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "ft-0-abcde", "namespace": NS,
                     "labels": {"vramguard.io/training-job": "ft", "vramguard.io/attempt": "0"}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "trainer", "image": "trainer:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "exit 1"}}}]},
    }))
    .expect("a Pod");
    server.put(&pod);
    server.set_log(NS, "ft-0-abcde", &format!("step 10\n{TORCH_OOM}\n"));
    let mut job = server.get::<Job>(Some(NS), "ft-0").expect("ft-0");
    job.status = Some(
        serde_json::from_value(
            json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}),
        )
        .expect("a JobStatus"),
    );
    server.put(&job);
    eventually("Job ft-1", || job_exists("ft-1")).await;
    eventually("a MemoryProfile with the observation", || {
        server
            .objects::<MemoryProfile>()
            .iter()
            .any(|p| p.status.is_some())
    })
    .await;

    let wide = format!(
        "model: {{preset: llama-3.1-8b}}
training: {{mode: full, microBatchSize: 1, sequenceLength: 2048, attention: flash}}
parallelism: {{gpus: 16, gpusPerNode: 8, strategy: fsdp, zeroStage: 3}}
{TEMPLATE}"
    );
    server.put(&training_job("wide", &wide));
    eventually("the headless Service of wide-0", || {
        server.get::<Service>(Some(NS), "wide-0").is_some()
    })
    .await;

    assert!(server.delete::<TrainingJob>(Some(NS), "ft"));
    eventually("ft to go", || {
        server.get::<TrainingJob>(Some(NS), "ft").is_none()
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the operator stops")
        .expect("the operator task");
    assert!(
        server
            .get::<TrainingJob>(Some(NS), "wide")
            .and_then(|t| t.status)
            .is_some_and(|s| s.phase == Some(Phase::Admitted))
    );

    let (webhook, operator, leader) = (
        rules("webhook.yaml"),
        rules("operator.yaml"),
        rules("leader.yaml"),
    );
    let cluster: Vec<Rule> = rules("webhook.yaml")
        .into_iter()
        .chain(rules("operator.yaml"))
        .collect();
    let seen = observed(&server);
    assert!(
        seen.iter()
            .filter(|a| a.group == "coordination.k8s.io")
            .all(|a| a.namespace.as_deref() == Some(RELEASE_NS)),
        "the Lease lives in the release namespace, where the Role is"
    );
    check(
        "operator",
        &seen,
        &cluster,
        &leader,
        &[&webhook, &operator, &leader],
    );
}

#[tokio::test]
async fn agent_calls_match_its_rules() {
    let server = ApiServer::start().await;
    server.put(&Node {
        metadata: ObjectMeta {
            name: Some("gpu-a".into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let config = PublishConfig {
        node_name: "gpu-a".into(),
        interval: Duration::from_secs(30),
        ttl_seconds: 90,
        copy_taints: true,
        heartbeat: Duration::ZERO,
    };
    let status = gpu_node("gpu-a", 2, 79).status.expect("a status");
    publish::publish(&server.client(), &config, &status)
        .await
        .expect("the first publish creates the GpuNode");
    publish::publish(&server.client(), &config, &status)
        .await
        .expect("the second updates it");
    let agent = rules("agent.yaml");
    check("agent", &observed(&server), &agent, &[], &[&agent]);
}

#[test]
fn the_mapping_reads_verbs_as_the_api_server_does() {
    let req = |method: Method, path: &str, query: &str, content_type: &str| Request {
        method,
        path: path.into(),
        query: query.into(),
        content_type: content_type.into(),
        body: serde_json::Value::Null,
    };
    let one = |r: Request| {
        accesses(&r)
            .into_iter()
            .map(|a| format!("{} {}/{} {:?}", a.verb, a.group, a.resource, a.namespace))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        one(req(
            Method::GET,
            "/api/v1/namespaces/ml/pods/p/log",
            "tailLines=200",
            ""
        )),
        ["get /pods/log Some(\"ml\")"]
    );
    assert_eq!(
        one(req(
            Method::GET,
            "/apis/batch/v1/jobs",
            "watch=true&labelSelector=x",
            ""
        )),
        ["watch batch/jobs None"]
    );
    assert_eq!(
        one(req(
            Method::GET,
            "/apis/batch/v1/jobs",
            "labelSelector=x",
            ""
        )),
        ["list batch/jobs None"]
    );
    assert_eq!(
        one(req(
            Method::PATCH,
            "/apis/vramguard.io/v1alpha1/gpunodes/n",
            "fieldManager=a",
            "application/apply-patch+yaml"
        )),
        [
            "patch vramguard.io/gpunodes None",
            "create vramguard.io/gpunodes None"
        ]
    );
    assert_eq!(
        one(req(
            Method::PATCH,
            "/apis/vramguard.io/v1alpha1/gpunodes/n/status",
            "",
            "application/apply-patch+yaml"
        )),
        ["patch vramguard.io/gpunodes/status None"]
    );
    assert_eq!(
        one(req(
            Method::PUT,
            "/apis/vramguard.io/v1alpha1/namespaces/ml/trainingjobs/t/status",
            "",
            ""
        )),
        ["update vramguard.io/trainingjobs/status Some(\"ml\")"]
    );
    // A rule the code does not need is reported, and so is a call no rule allows.
    let seen: BTreeSet<Access> = accesses(&req(Method::GET, "/api/v1/nodes/n", "", ""))
        .into_iter()
        .collect();
    let agent = rules("agent.yaml");
    let unused = std::panic::catch_unwind(|| check("agent", &seen, &agent, &[], &[&agent]));
    assert!(unused.is_err());
    let extra: BTreeSet<Access> = accesses(&req(Method::DELETE, "/api/v1/nodes/n", "", ""))
        .into_iter()
        .collect();
    let denied = std::panic::catch_unwind(|| check("agent", &extra, &agent, &[], &[]));
    assert!(denied.is_err());
}

/// The Kueue AdmissionCheck controller with its Lease: its AdmissionCheck
/// marked Active, and a Workload owned by each kind whose annotation it reads
/// (a Job that exists, the others' owners gone) judged and its check set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admission_check_calls_match_its_rules() {
    use support::apiserver::Res;
    use vramguard::inventory::Source;
    use vramguard::kueue::{self, controller};

    let server = ApiServer::start().await;
    let kueue_res = |plural: &str| Res::new(kueue::GROUP, kueue::VERSION, plural);
    server.put_value(
        &kueue_res("admissionchecks"),
        "AdmissionCheck",
        None,
        json!({"metadata": {"name": "vram-fit"}, "spec": {"controllerName": kueue::CONTROLLER_NAME}}),
    );
    server.put_value(
        &kueue_res("resourceflavors"),
        "ResourceFlavor",
        None,
        json!({"metadata": {"name": "h100"},
               "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}),
    );
    let pod = json!({"spec": {"containers": [{"name": "t", "image": "t:1",
        "command": ["python", "train.py"], "resources": {"limits": {"nvidia.com/gpu": 1}}}]}});
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "owner-job", "namespace": NS, "annotations": {
            "vramguard.io/training": "model: {preset: llama-3.1-8b}\ntraining: {mode: lora, microBatchSize: 1, sequenceLength: 1024}\n"}},
        "spec": {"template": pod},
    }))
    .expect("a Job");
    server.put(&job);
    let owners = [
        ("batch/v1", "Job"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("kubeflow.org/v1", "PyTorchJob"),
        ("ray.io/v1", "RayJob"),
    ];
    for (i, (api_version, kind)) in owners.iter().enumerate() {
        let owner = if *kind == "Job" {
            "owner-job".to_string()
        } else {
            format!("owner-{i}")
        };
        server.put_value(
            &kueue_res("workloads"),
            "Workload",
            Some(NS),
            json!({
                "metadata": {"name": format!("wl-{i}"), "ownerReferences": [
                    {"apiVersion": api_version, "kind": kind, "name": owner, "uid": "u", "controller": true}]},
                "spec": {"podSets": [{"name": "main", "count": 1, "template": pod}]},
                "status": {
                    "admission": {"clusterQueue": "cq", "podSetAssignments": [
                        {"name": "main", "flavors": {"nvidia.com/gpu": "h100"}}]},
                    "admissionChecks": [{"name": "vram-fit", "state": "Pending",
                        "lastTransitionTime": "2026-11-22T12:00:00Z", "message": ""}],
                },
            }),
        );
    }
    let nodes = vec![gpu_node("gpu-a", 8, 79)];
    let source =
        vramguard::inventory::Static::new(nodes, k8s_openapi::jiff::Timestamp::now().as_second());
    assert!(source.snapshot().synced);
    let lease = LeaseConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        renew_every: Duration::from_millis(200),
        retry_every: Duration::from_millis(200),
        ..LeaseConfig::new(RELEASE_NS, "vramguard-operator-kueue", "kq-a")
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let client = server.client();
    let task = tokio::spawn(async move {
        controller::run(
            client,
            Arc::new(source),
            controller::Config::default(),
            lease,
            async move {
                let _ = stopped.await;
            },
        )
        .await
        .expect("the controller");
    });
    let decided = |i: usize| {
        server
            .get_value(&kueue_res("workloads"), Some(NS), &format!("wl-{i}"))
            .is_some_and(|w| w["status"]["admissionChecks"][0]["state"] != "Pending")
    };
    eventually("every Workload's check set", || {
        (0..owners.len()).all(decided)
    })
    .await;
    eventually("the AdmissionCheck active", || {
        server
            .get_value(&kueue_res("admissionchecks"), None, "vram-fit")
            .is_some_and(|c| c["status"]["conditions"][0]["status"] == "True")
    })
    .await;
    // Each verdict an Event on its Workload; one put back to Pending (as Kueue does after
    // a Retry) is judged again, and its repeated Event patched into the series.
    let events = |method: Method| {
        server
            .requests()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with("/apis/events.k8s.io/"))
            .count()
    };
    eventually("an Event on every Workload", || {
        events(Method::POST) == owners.len()
    })
    .await;
    let mut again = server
        .get_value(&kueue_res("workloads"), Some(NS), "wl-0")
        .expect("wl-0");
    again["status"]["admissionChecks"][0]["state"] = json!("Pending");
    server.put_value(&kueue_res("workloads"), "Workload", Some(NS), again);
    eventually("the repeat patched into its series", || {
        events(Method::PATCH) == 1
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the controller stops")
        .expect("the controller task");

    let (kueue_rules, leader) = (rules("kueue.yaml"), rules("leader.yaml"));
    check(
        "kueue",
        &observed(&server),
        &kueue_rules,
        &leader,
        &[&kueue_rules, &leader],
    );
}

/// The Events of enforcement Audit: one created, its repeat patched into the series.
#[tokio::test]
async fn audit_event_calls_match_their_rules() {
    use vramguard::webhook::audit::{self, AuditEvent, AuditEvents};

    let server = ApiServer::start().await;
    let mut registry = prometheus_client::registry::Registry::default();
    let (events, queue) = AuditEvents::new(&mut registry, 8);
    let event = AuditEvent {
        reference: k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
            namespace: Some(NS.into()),
            name: Some("sft".into()),
            ..Default::default()
        },
        warning: true,
        reason: "WouldDeny".into(),
        note: "vramguard would deny this".into(),
    };
    events.record(event.clone());
    events.record(event);
    let reporter = kube::runtime::events::Reporter {
        controller: "vramguard-webhook".into(),
        instance: Some("w-a".into()),
    };
    let task = tokio::spawn(audit::run(server.client(), reporter, queue));
    eventually("both events published", || {
        events.count(audit::Outcome::Published) == 2
    })
    .await;
    task.abort();
    let rules_ = rules("audit.yaml");
    check("audit events", &observed(&server), &rules_, &[], &[&rules_]);
}
