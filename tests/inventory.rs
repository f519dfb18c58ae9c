//! The live inventory: `inventory::reflect` against the in-memory test API
//! server over HTTP, with kube's real client, so the LIST, the WATCH from its
//! resourceVersion and the label selector on nodes are the ones a cluster sees.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use support::apiserver::ApiServer;
use vramguard::api::{GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus};
use vramguard::inventory::{GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, Snapshot, Source, reflect};

const GIB: u64 = 1 << 30;

fn gpu_node(name: &str, free: &[u64]) -> GpuNode {
    let mut g = GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.into(),
            ttl_seconds: 120,
            taints: Vec::new(),
        },
    );
    g.status = Some(GpuNodeStatus {
        gpus: free
            .iter()
            .enumerate()
            .map(|(i, &f)| GpuStatus {
                index: i as u32,
                product: "NVIDIA H100 80GB HBM3".into(),
                total_bytes: 80 * GIB,
                free_bytes: f,
                healthy: true,
                ..Default::default()
            })
            .collect(),
        gpu_count: free.len() as u32,
        product: Some("NVIDIA H100 80GB HBM3".into()),
        ..Default::default()
    });
    g
}

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
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
        ..Default::default()
    }
}

/// Poll the source until `ok` holds, failing after 10 s.
async fn wait_for(source: &impl Source, what: &str, ok: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = source.snapshot();
        if ok(&s) {
            return s;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}; last snapshot: {s:#?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn names(s: &Snapshot) -> Vec<String> {
    s.nodes.iter().map(|n| n.spec.node_name.clone()).collect()
}

fn free_of(s: &Snapshot, node: &str) -> Vec<u64> {
    s.nodes
        .iter()
        .find(|n| n.spec.node_name == node)
        .and_then(|n| n.status.as_ref())
        .map(|st| st.gpus.iter().map(|g| g.free_bytes).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn reflector_follows_gpu_nodes_and_gfd_labelled_nodes() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", &[70 * GIB, 70 * GIB]));
    server.put(&gpu_node("gpu-b", &[80 * GIB]));
    server.put(&node(
        "gfd-1",
        &[
            (GFD_PRODUCT, "NVIDIA-A100-SXM4-40GB"),
            (GFD_MEMORY, "40960"),
            (GFD_COUNT, "4"),
        ],
    ));
    server.put(&node("cpu-1", &[("kubernetes.io/os", "linux")]));
    // A GFD-labelled node that also has a GpuNode counts once, as the GpuNode.
    server.put(&node(
        "gpu-a",
        &[
            (GFD_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            (GFD_MEMORY, "81559"),
            (GFD_COUNT, "2"),
        ],
    ));

    let (source, driver) = reflect::start(server.client());
    let driver = tokio::spawn(driver);

    let s = wait_for(&source, "a synced snapshot of 3 nodes", |s| {
        s.synced && s.nodes.len() == 3
    })
    .await;
    assert_eq!(names(&s), ["gfd-1", "gpu-a", "gpu-b"]);
    assert!(s.refreshed_unix.is_some());
    assert_eq!(free_of(&s, "gpu-a"), [70 * GIB, 70 * GIB]);
    let gfd = s
        .nodes
        .iter()
        .find(|n| n.spec.node_name == "gfd-1")
        .unwrap();
    let gfd_status = gfd.status.as_ref().unwrap();
    assert_eq!(gfd_status.gpus.len(), 4);
    assert_eq!(gfd_status.gpus[0].total_bytes, 40960 << 20);
    // The node watch asks the server only for GFD-labelled nodes.
    let node_requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/nodes")
        .collect();
    assert!(!node_requests.is_empty());
    assert!(
        node_requests
            .iter()
            .all(|r| r.query.contains("labelSelector=nvidia.com%2Fgpu.product")),
        "{node_requests:#?}"
    );

    // The agent publishes a new probe: free memory drops (through the status
    // subresource with server-side apply, as the agent writes it).
    let api: Api<GpuNode> = Api::all(server.client());
    let mut probe = gpu_node("gpu-a", &[10 * GIB, 70 * GIB]);
    probe.metadata = ObjectMeta::default();
    let patch = json!({
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GpuNode",
        "status": probe.status,
    });
    api.patch_status(
        "gpu-a",
        &PatchParams::apply("vramguard-agent").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("status applied");
    let s = wait_for(&source, "gpu-a's new free memory", |s| {
        free_of(s, "gpu-a") == [10 * GIB, 70 * GIB]
    })
    .await;
    assert_eq!(s.nodes.len(), 3);

    // A change made behind the client's back (another writer) also arrives.
    server.put(&gpu_node("gpu-b", &[5 * GIB]));
    wait_for(&source, "gpu-b's new free memory", |s| {
        free_of(s, "gpu-b") == [5 * GIB]
    })
    .await;

    // gpu-b's agent goes away: its GpuNode is deleted.
    api.delete("gpu-b", &Default::default())
        .await
        .expect("deleted");
    let s = wait_for(&source, "gpu-b gone", |s| s.nodes.len() == 2).await;
    assert_eq!(names(&s), ["gfd-1", "gpu-a"]);

    // gpu-a's GpuNode goes too: its GFD labels take over.
    server.delete::<GpuNode>(None, "gpu-a");
    let s = wait_for(&source, "gpu-a from its labels", |s| {
        s.nodes.len() == 2 && free_of(s, "gpu-a") == [81559 << 20, 81559 << 20]
    })
    .await;
    assert_eq!(names(&s), ["gfd-1", "gpu-a"]);

    // A node losing its GFD labels leaves the inventory (the label-selected
    // watch sees it as deleted).
    server.put(&node("gfd-1", &[]));
    let s = wait_for(&source, "gfd-1 gone", |s| s.nodes.len() == 1).await;
    assert_eq!(names(&s), ["gpu-a"]);
    assert!(s.synced);
    assert!(!driver.is_finished(), "the driver keeps running");
    driver.abort();
}

#[tokio::test]
async fn reflector_recovers_from_dropped_watches_and_compaction() {
    let server = ApiServer::start().await;
    server.put(&gpu_node("gpu-a", &[70 * GIB]));
    let (source, driver) = reflect::start(server.client());
    let driver = tokio::spawn(driver);
    wait_for(&source, "synced", |s| s.synced && s.nodes.len() == 1).await;

    // The API server drops every watch; a change made meanwhile still arrives
    // through the re-watch from the last resourceVersion.
    server.close_watches();
    server.put(&gpu_node("gpu-b", &[80 * GIB]));
    wait_for(&source, "gpu-b after a dropped watch", |s| {
        s.nodes.len() == 2
    })
    .await;

    // History compacted while watches are down, past the last event the
    // client saw: its re-watch gets 410 Expired and the reflector lists again.
    // (No await between these calls: the watcher cannot re-watch in between.)
    server.close_watches();
    server.delete::<GpuNode>(None, "gpu-a");
    server.compact();
    let s = wait_for(&source, "gpu-a gone after a relist", |s| s.nodes.len() == 1).await;
    assert_eq!(names(&s), ["gpu-b"]);
    let lists = server
        .requests()
        .iter()
        .filter(|r| {
            r.path == "/apis/vramguard.io/v1alpha1/gpunodes" && !r.query.contains("watch=true")
        })
        .count();
    assert_eq!(lists, 2, "one initial list and one after 410 Expired");
    driver.abort();
}

/// An agent's status write changes one GpuNode: the next snapshot updates
/// that node in the node list the last one built, in place, instead of
/// copying every node of the cluster again (what made each review cost
/// nodes × jobs on a large cluster). A snapshot still held elsewhere keeps
/// what it saw.
#[tokio::test]
async fn a_status_write_updates_the_node_list_in_place() {
    let server = ApiServer::start().await;
    for i in 0..8 {
        server.put(&gpu_node(&format!("gpu-{i}"), &[70 * GIB]));
    }
    let (source, driver) = reflect::start(server.client());
    let driver = tokio::spawn(driver);
    let s = wait_for(&source, "8 nodes", |s| s.synced && s.nodes.len() == 8).await;
    let list = std::sync::Arc::as_ptr(&s.nodes) as usize;
    let generation = s.generation();
    drop(s);

    let api: Api<GpuNode> = Api::all(server.client());
    let mut probe = gpu_node("gpu-3", &[10 * GIB]);
    probe.metadata = ObjectMeta::default();
    let patch = json!({
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GpuNode",
        "status": probe.status,
    });
    let params = PatchParams::apply("vramguard-agent").force();
    api.patch_status("gpu-3", &params, &Patch::Apply(&patch))
        .await
        .expect("status applied");
    let s = wait_for(&source, "gpu-3's new free memory", |s| {
        free_of(s, "gpu-3") == [10 * GIB]
    })
    .await;
    assert_eq!(std::sync::Arc::as_ptr(&s.nodes) as usize, list);
    assert_ne!(s.generation(), generation);
    assert_eq!(names(&s).len(), 8);
    assert_eq!(free_of(&s, "gpu-2"), [70 * GIB]);

    // Held: the next change leaves it as it was.
    let held = s;
    let mut probe = gpu_node("gpu-5", &[20 * GIB]);
    probe.metadata = ObjectMeta::default();
    let patch = json!({
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GpuNode",
        "status": probe.status,
    });
    api.patch_status("gpu-5", &params, &Patch::Apply(&patch))
        .await
        .expect("status applied");
    let s = wait_for(&source, "gpu-5's new free memory", |s| {
        free_of(s, "gpu-5") == [20 * GIB]
    })
    .await;
    assert_eq!(free_of(&held, "gpu-5"), [70 * GIB]);
    assert_eq!(free_of(&s, "gpu-3"), [10 * GIB]);
    driver.abort();
}
