//! The in-memory test API server itself, through kube's real client: the
//! REST semantics the operator and webhook scenarios rely on.

mod support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, ResourceExt};
use serde_json::json;

use support::apiserver::ApiServer;
use vramguard::api::{GpuNode, GpuNodeSpec};

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    }
}

fn status_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn crud_conflicts_and_selectors() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = api
        .create(&PostParams::default(), &cm("a", &[("app", "x")]))
        .await
        .unwrap();
    assert_eq!(a.namespace().as_deref(), Some("default"));
    assert!(a.uid().is_some());
    assert_eq!(a.metadata.generation, Some(1));
    let err = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap_err();
    assert_eq!(status_code(err), 409);
    assert_eq!(status_code(api.get("nope").await.unwrap_err()), 404);
    assert!(api.get_opt("nope").await.unwrap().is_none());
    api.create(&PostParams::default(), &cm("b", &[("app", "y")]))
        .await
        .unwrap();

    let list = api
        .list(&ListParams::default().labels("app=x"))
        .await
        .unwrap();
    assert_eq!(
        list.items.iter().map(|c| c.name_any()).collect::<Vec<_>>(),
        ["a"]
    );
    // Pages: `limit` items and a continue token, until none is left.
    let first = api.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(first.items.len(), 1);
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 1);
    assert_ne!(first.items[0].name_any(), second.items[0].name_any());
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    assert!(second.metadata.continue_.is_none_or(|c| c.is_empty()));
    let list = api
        .list(&ListParams::default().labels("app in (x,y),app!=y"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "other");
    assert!(
        other
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Merge patch, then a replace with a stale resourceVersion: 409.
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["k"], "w");
    assert_eq!(patched.metadata.generation, Some(2));
    let mut stale = a.clone();
    stale.data = Some([("k".to_string(), "z".to_string())].into());
    assert_eq!(
        status_code(
            api.replace("a", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    let mut fresh = patched.clone();
    fresh.data = Some([("k".to_string(), "z".to_string())].into());
    api.replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    // JSON patch, sent raw (kube's `Patch::Json` needs its `jsonpatch` feature).
    let req = axum::http::Request::patch("/api/v1/namespaces/default/configmaps/a")
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&json!([{"op": "test", "path": "/data/k", "value": "z"}, {"op": "add", "path": "/data/n", "value": "1"}])).unwrap())
        .unwrap();
    let out: ConfigMap = server.client().request(req).await.unwrap();
    assert_eq!(out.data.as_ref().unwrap()["n"], "1");
    let req = axum::http::Request::patch("/api/v1/namespaces/default/configmaps/a")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(&json!([{"op": "test", "path": "/data/k", "value": "nope"}]))
                .unwrap(),
        )
        .unwrap();
    assert_eq!(
        status_code(server.client().request::<ConfigMap>(req).await.unwrap_err()),
        422
    );
}

fn gpu_node(name: &str) -> GpuNode {
    GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.into(),
            ttl_seconds: 60,
            taints: Vec::new(),
        },
    )
}

#[tokio::test]
async fn apply_and_the_status_subresource() {
    let server = ApiServer::start().await;
    let api: Api<GpuNode> = Api::all(server.client());
    let pp = PatchParams::apply("test").force();
    let mut g = gpu_node("n1");
    g.status = Some(Default::default());
    g.status.as_mut().unwrap().gpu_count = 8;
    // Apply creates; the status in a main-resource write is dropped.
    let created = api.patch("n1", &pp, &Patch::Apply(&g)).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.status.is_none());
    // Apply without a field manager is refused, as the API server does.
    let req = axum::http::Request::patch("/apis/vramguard.io/v1alpha1/gpunodes/n1")
        .header("content-type", "application/apply-patch+yaml")
        .body(b"{}".to_vec())
        .unwrap();
    assert_eq!(
        status_code(server.client().request::<GpuNode>(req).await.unwrap_err()),
        400
    );
    // Status through the subresource: generation stays; spec changes in it are ignored.
    let st = api
        .patch_status("n1", &pp, &Patch::Apply(json!({"apiVersion": "vramguard.io/v1alpha1", "kind": "GpuNode", "spec": {"nodeName": "other", "ttlSeconds": 1}, "status": {"gpuCount": 8}})))
        .await
        .unwrap();
    assert_eq!(st.status.unwrap().gpu_count, 8);
    assert_eq!(st.spec.node_name, "n1");
    assert_eq!(st.metadata.generation, Some(1));
    assert_eq!(
        api.get_status("n1")
            .await
            .unwrap()
            .status
            .unwrap()
            .gpu_count,
        8
    );
    // A spec change bumps the generation and keeps the status.
    let mut g2 = gpu_node("n1");
    g2.spec.ttl_seconds = 90;
    let after = api.patch("n1", &pp, &Patch::Apply(&g2)).await.unwrap();
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(after.status.unwrap().gpu_count, 8);
    // Status of a missing object: 404.
    let e = api
        .patch_status("none", &pp, &Patch::Apply(json!({"status": {}})))
        .await
        .unwrap_err();
    assert_eq!(status_code(e), 404);
    // Leases are just another resource.
    let leases: Api<Lease> = Api::default_namespaced(server.client());
    let l = Lease {
        metadata: ObjectMeta {
            name: Some("vramguard".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    leases.create(&PostParams::default(), &l).await.unwrap();
    assert_eq!(server.objects::<Lease>().len(), 1);
}

#[tokio::test]
async fn watch_from_a_resource_version() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &cm("before", &[]))
        .await
        .unwrap();
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default().labels("app=x").timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("a", &[("app", "x")]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("ignored", &[("app", "y")]))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    // Losing the label looks like a deletion to a label-selected watch.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": null}}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let want = ["ADDED a", "MODIFIED a", "DELETED a"];
    while seen.len() < want.len() {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            WatchEvent::Added(c) => seen.push(format!("ADDED {}", c.name_any())),
            WatchEvent::Modified(c) => seen.push(format!("MODIFIED {}", c.name_any())),
            WatchEvent::Deleted(c) => seen.push(format!("DELETED {}", c.name_any())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, want);
    // Idle: a bookmark at the current resourceVersion.
    let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Bookmark(b) => assert_eq!(
            b.metadata.resource_version,
            server.resource_version().to_string()
        ),
        other => panic!("{other:?}"),
    }
    // After compaction an old resourceVersion is gone: 410.
    server.compact();
    let mut old = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match old.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn finalizers_owner_references_and_logs() {
    let server = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut owner = cm("owner", &[]);
    owner.metadata.finalizers = Some(vec!["vramguard.io/reservation".into()]);
    let owner = cms.create(&PostParams::default(), &owner).await.unwrap();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("p".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.uid().unwrap(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    pods.create(&PostParams::default(), &pod).await.unwrap();
    server.set_log("default", "p", "line 1\nline 2\nline 3\n");
    let tail = pods
        .logs(
            "p",
            &LogParams {
                tail_lines: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(tail, "line 2\nline 3\n");
    let limited = pods
        .logs(
            "p",
            &LogParams {
                limit_bytes: Some(4),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(limited, "line");

    // Deleting an object with a finalizer only marks it.
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    let marked = cms.get("owner").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(pods.get_opt("p").await.unwrap().is_some());
    // Removing the last finalizer lets it go, and its dependents with it.
    cms.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("owner").await.unwrap().is_none());
    assert!(pods.get_opt("p").await.unwrap().is_none());
}
