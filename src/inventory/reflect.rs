//! The inventory from a live cluster: reflectors over `GpuNode` objects and
//! over nodes carrying GPU Feature Discovery labels.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::{GFD_PRODUCT, Snapshot, Source, merge};
use crate::api::GpuNode;

/// Reads the reflectors' stores; cheap to clone.
#[derive(Clone)]
pub struct Reflected {
    gpu_nodes: Store<GpuNode>,
    nodes: Store<Node>,
    synced: Arc<AtomicBool>,
    refreshed: Arc<AtomicI64>,
}

impl Source for Reflected {
    fn snapshot(&self) -> Snapshot {
        let gpu_nodes: Vec<GpuNode> = self
            .gpu_nodes
            .state()
            .iter()
            .map(|g| (**g).clone())
            .collect();
        let nodes: Vec<Node> = self.nodes.state().iter().map(|n| (**n).clone()).collect();
        let refreshed = self.refreshed.load(Ordering::Relaxed);
        Snapshot::new(
            merge(gpu_nodes, &nodes),
            (refreshed > 0).then_some(refreshed),
            self.synced.load(Ordering::Relaxed),
            None,
        )
    }
}

fn now_unix() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// Start watching; returns the source and the future that drives the
/// watches (join it with the server: if it ends, the process should too).
pub fn start(client: Client) -> (Reflected, impl Future<Output = ()> + Send + 'static) {
    let (gn_reader, gn_writer) = reflector::store::<GpuNode>();
    let (node_reader, node_writer) = reflector::store::<Node>();
    let synced = Arc::new(AtomicBool::new(false));
    let refreshed = Arc::new(AtomicI64::new(0));
    let source = Reflected {
        gpu_nodes: gn_reader.clone(),
        nodes: node_reader.clone(),
        synced: synced.clone(),
        refreshed: refreshed.clone(),
    };
    let gpu_api: Api<GpuNode> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client);
    let r1 = refreshed.clone();
    let gn_stream = reflector::reflector(
        gn_writer,
        watcher(gpu_api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects()
    .for_each(move |ev| {
        if let Err(error) = ev {
            tracing::warn!(%error, "GpuNode watch");
        } else {
            r1.store(now_unix(), Ordering::Relaxed);
        }
        futures::future::ready(())
    });
    let r2 = refreshed;
    let node_stream = reflector::reflector(
        node_writer,
        watcher(node_api, watcher::Config::default().labels(GFD_PRODUCT)).default_backoff(),
    )
    .touched_objects()
    .for_each(move |ev| {
        if let Err(error) = ev {
            tracing::warn!(%error, "Node watch");
        } else {
            r2.store(now_unix(), Ordering::Relaxed);
        }
        futures::future::ready(())
    });
    let ready = async move {
        let _ = gn_reader.wait_until_ready().await;
        let _ = node_reader.wait_until_ready().await;
        synced.store(true, Ordering::Relaxed);
    };
    let driver = async move {
        futures::join!(gn_stream, node_stream, ready);
    };
    (source, driver)
}
