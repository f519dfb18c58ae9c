//! The chart's RBAC as a real API server authorizes it (`tests/cluster/cluster.sh`), asked
//! with SubjectAccessReviews after `helm install`:
//!
//! - each ServiceAccount may make every call its rules grant (tests/rbac.rs proves those
//!   are exactly the calls the code makes), and not the calls listed here that it must not;
//! - the Lease only in the release namespace;
//! - the chart's user roles aggregate into the built-in `edit` and `view` (the
//!   kube-controller-manager's aggregation controller): a namespace editor may create
//!   TrainingJobs, a viewer may read them and not create them.

#[path = "support/chart_rbac.rs"]
mod chart_rbac;
#[path = "support/cluster.rs"]
mod cluster;

use std::path::Path;

use axum::http::Method;
use chart_rbac::{granted, rules};
use cluster::{JSON, RELEASE, RELEASE_NS};
use kube::Client;
use serde_json::json;

const TEST: &str = "e2e_rbac";
const NS: &str = "e2e-rbac";

fn service_account(name: &str) -> (String, Vec<String>) {
    (
        format!("system:serviceaccount:{RELEASE_NS}:{name}"),
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{RELEASE_NS}"),
            "system:authenticated".into(),
        ],
    )
}

/// Whether the API server's authorizer lets `who` do `verb` on `group`/`resource`
/// (`pods/log` style for a subresource) in `namespace` (None: cluster-wide).
async fn can(
    client: &Client,
    who: &(String, Vec<String>),
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who.0,
            "groups": who.1,
            "resourceAttributes": {
                "group": group, "resource": resource, "subresource": subresource,
                "verb": verb, "namespace": namespace.unwrap_or(""),
            }
        }
    });
    let a = cluster::send(
        client,
        Method::POST,
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        JSON,
        &review,
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["status"]["allowed"] == true
}

/// Every grant of `files` holds for `who`, in `namespace` (None: cluster-wide).
async fn check_grants(
    client: &Client,
    who: &(String, Vec<String>),
    files: &[&str],
    namespace: Option<&str>,
) {
    for file in files {
        for (g, r, v) in granted(&rules(file)) {
            assert!(
                can(client, who, &v, &g, &r, namespace).await,
                "{}: {file} grants {v} {r} (group {g:?}) in {namespace:?}, the API server says no",
                who.0
            );
        }
    }
}

async fn check_denied(client: &Client, who: &(String, Vec<String>), denied: &[(&str, &str, &str)]) {
    for (verb, group, resource) in denied {
        for ns in [Some(NS), Some(RELEASE_NS), None] {
            assert!(
                !can(client, who, verb, group, resource, ns).await,
                "{} may {verb} {resource} (group {group:?}) in {ns:?}: more than the code needs",
                who.0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_grants_what_the_code_calls_and_not_more() {
    let Some((client, _helm)) = cluster::with_chart(TEST).await else {
        return;
    };
    cluster::namespace(&client, NS, json!({})).await;

    let controller = service_account(RELEASE);
    check_grants(
        &client,
        &controller,
        &["webhook.yaml", "operator.yaml"],
        Some(NS),
    )
    .await;
    check_grants(
        &client,
        &controller,
        &["webhook.yaml", "operator.yaml"],
        None,
    )
    .await;
    check_grants(&client, &controller, &["leader.yaml"], Some(RELEASE_NS)).await;
    for (g, r, v) in granted(&rules("leader.yaml")) {
        assert!(
            !can(&client, &controller, &v, &g, &r, Some(NS)).await,
            "the Lease rules reach beyond the release namespace: {v} {r} in {NS}"
        );
    }
    check_denied(
        &client,
        &controller,
        &[
            ("get", "", "secrets"),
            ("create", "", "pods"),
            ("delete", "", "pods"),
            ("patch", "", "nodes"),
            ("delete", "vramguard.io", "trainingjobs"),
            ("update", "vramguard.io", "trainingjobs"),
            ("delete", "vramguard.io", "gpunodes"),
            (
                "patch",
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
            ),
            ("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
            ("create", "", "serviceaccounts/token"),
        ],
    )
    .await;

    let agent = service_account(&format!("{RELEASE}-agent"));
    check_grants(&client, &agent, &["agent.yaml"], None).await;
    check_denied(
        &client,
        &agent,
        &[
            ("list", "vramguard.io", "gpunodes"),
            ("delete", "vramguard.io", "gpunodes"),
            ("create", "vramguard.io", "trainingjobs"),
            ("list", "", "pods"),
            ("get", "", "secrets"),
            ("patch", "", "nodes"),
            ("list", "", "nodes"),
        ],
    )
    .await;

    // People: a namespace's editors and viewers, through the built-in roles.
    for (user, role) in [("editor", "edit"), ("viewer", "view")] {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("e2e-{user}"), "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        });
        let path = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings");
        let a = cluster::send(&client, Method::POST, &path, JSON, &binding).await;
        assert!(a.status == 201 || a.status == 409, "{}", a.body);
    }
    let editor = (
        "editor".to_string(),
        vec!["system:authenticated".to_string()],
    );
    let viewer = (
        "viewer".to_string(),
        vec!["system:authenticated".to_string()],
    );
    // The aggregation controller folds the chart's roles into edit and view.
    cluster::until_some("edit to aggregate the TrainingJob rules", 60, || async {
        can(
            &client,
            &editor,
            "create",
            "vramguard.io",
            "trainingjobs",
            Some(NS),
        )
        .await
        .then_some(())
    })
    .await;
    for verb in ["get", "list", "watch", "update", "patch", "delete"] {
        assert!(
            can(
                &client,
                &editor,
                verb,
                "vramguard.io",
                "trainingjobs",
                Some(NS)
            )
            .await,
            "an editor may {verb} TrainingJobs"
        );
    }
    assert!(
        !can(
            &client,
            &editor,
            "create",
            "vramguard.io",
            "trainingjobs",
            Some("default")
        )
        .await,
        "an editor of {NS} only"
    );
    assert!(
        !can(
            &client,
            &editor,
            "update",
            "vramguard.io",
            "trainingjobs/status",
            Some(NS)
        )
        .await,
        "status is the operator's"
    );
    cluster::until_some("view to aggregate the TrainingJob rules", 60, || async {
        can(
            &client,
            &viewer,
            "list",
            "vramguard.io",
            "trainingjobs",
            Some(NS),
        )
        .await
        .then_some(())
    })
    .await;
    assert!(
        can(
            &client,
            &viewer,
            "get",
            "vramguard.io",
            "trainingjobs/status",
            Some(NS)
        )
        .await
    );
    for verb in ["create", "update", "patch", "delete"] {
        assert!(
            !can(
                &client,
                &viewer,
                verb,
                "vramguard.io",
                "trainingjobs",
                Some(NS)
            )
            .await,
            "a viewer may not {verb} TrainingJobs"
        );
    }
    // What a person may not touch: the cluster-scoped inventory the agents write.
    assert!(!can(&client, &editor, "patch", "vramguard.io", "gpunodes", None).await);
}

/// The agent's DaemonSet rendered with `sets`.
fn agent_daemonset(helm: &Path, sets: &[&str]) -> serde_json::Value {
    let chart = cluster::root().join("charts/vramguard");
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().expect("a UTF-8 path"),
        "-n",
        RELEASE_NS,
        "--set",
        "tls.mode=generated",
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let text = cluster::run_helm(helm, &args);
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).expect("the rendered chart");
    docs.into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the agent's DaemonSet")
}

/// Pod Security admission of the agent: with pod-resources (the default) it needs a
/// `privileged` namespace and is refused under `restricted`; with
/// `agent.podResources=false` it meets `restricted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_meets_the_pod_security_level_the_chart_documents() {
    let Some(client) = cluster::connect(TEST).await else {
        return;
    };
    let Some(helm) = cluster::helm(TEST) else {
        return;
    };
    // The RuntimeClass admission plugin needs the class the chart names.
    let class = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                       "metadata": {"name": "nvidia"}, "handler": "nvidia"});
    let a = cluster::send(
        &client,
        Method::POST,
        "/apis/node.k8s.io/v1/runtimeclasses",
        JSON,
        &class,
    )
    .await;
    assert!(a.status == 201 || a.status == 409, "{}", a.body);

    for (level, sets, admitted) in [
        ("privileged", &[][..], true),
        ("restricted", &[][..], false),
        ("restricted", &["agent.podResources=false"][..], true),
    ] {
        let ns = format!("e2e-psa-{level}-{}", sets.len());
        cluster::namespace(
            &client,
            &ns,
            json!({"pod-security.kubernetes.io/enforce": level,
                   "pod-security.kubernetes.io/warn": level}),
        )
        .await;
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": format!("{RELEASE}-agent"), "namespace": ns}});
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
        let a = cluster::send(&client, Method::POST, &path, JSON, &sa).await;
        assert!(a.status == 201 || a.status == 409, "{}", a.body);

        let mut ds = agent_daemonset(&helm, sets);
        ds["metadata"]["namespace"] = json!(ns);
        let path = format!("/apis/apps/v1/namespaces/{ns}/daemonsets?dryRun=All");
        let a = cluster::send(&client, Method::POST, &path, JSON, &ds).await;
        assert_eq!(a.status, 201, "{level} {sets:?}: the DaemonSet: {}", a.body);
        // Workloads get warnings; the pods they make are what enforcement refuses.
        let warned = a.warnings.iter().any(|w| w.contains("violate PodSecurity"));
        assert_eq!(warned, !admitted, "{level} {sets:?}: {:?}", a.warnings);

        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": "agent-e2e", "namespace": ns},
                             "spec": ds["spec"]["template"]["spec"].clone()});
        pod["spec"]["nodeName"] = json!("gpu-e2e-psa");
        let path = format!("/api/v1/namespaces/{ns}/pods?dryRun=All");
        let a = cluster::send(&client, Method::POST, &path, JSON, &pod).await;
        if admitted {
            assert_eq!(
                a.status, 201,
                "{level} {sets:?}: the agent's pod: {}",
                a.body
            );
        } else {
            assert_eq!(
                a.status, 403,
                "{level} {sets:?}: the agent's pod: {}",
                a.body
            );
            let message = a.body["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("violates PodSecurity \"restricted:latest\"")
                    && message.contains(
                        "volume \"pod-resources\" uses restricted volume type \"hostPath\""
                    ),
                "{message}"
            );
        }
    }
}
