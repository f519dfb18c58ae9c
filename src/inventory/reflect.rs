//! The inventory from a live cluster: reflectors over `GpuNode` objects,
//! over nodes carrying GPU Feature Discovery labels, and over the
//! `MemoryProfile`s the operator learnt.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{GFD_PRODUCT, Snapshot, Source, merge};
use crate::api::{GpuNode, MemoryProfile};

/// Reads the reflectors' stores; cheap to clone.
#[derive(Clone)]
pub struct Reflected {
    gpu_nodes: Store<GpuNode>,
    nodes: Store<Node>,
    profiles: Store<MemoryProfile>,
    synced: Arc<AtomicBool>,
    refreshed: Arc<AtomicI64>,
    /// Bumped after every watch event has reached its store.
    version: Arc<AtomicU64>,
    /// The last snapshot built and the version it was built at: every review
    /// takes a snapshot, and copying every node and counting products each
    /// time costs far more than the review itself on a cluster of any size.
    cache: Arc<Mutex<Option<(u64, Snapshot)>>>,
}

impl Reflected {
    fn build(&self) -> Snapshot {
        let gpu_nodes: Vec<GpuNode> = self
            .gpu_nodes
            .state()
            .iter()
            .map(|g| (**g).clone())
            .collect();
        let nodes: Vec<Node> = self.nodes.state().iter().map(|n| (**n).clone()).collect();
        let mut snapshot = Snapshot::new(merge(gpu_nodes, &nodes), None, false, None);
        snapshot.profiles = Arc::new(
            self.profiles
                .state()
                .iter()
                .filter_map(|p| {
                    let s = p.status.as_ref()?;
                    (s.observation_count > 0 && s.ratio.is_finite() && s.ratio > 0.0)
                        .then(|| (p.name_any(), s.ratio))
                })
                .collect(),
        );
        snapshot
    }
}

impl Source for Reflected {
    fn snapshot(&self) -> Snapshot {
        let refreshed = self.refreshed.load(Ordering::Relaxed);
        let synced = self.synced.load(Ordering::Relaxed);
        // Read the version before the stores: an event that lands while the
        // snapshot is built bumps it afterwards, so the next call rebuilds.
        let version = self.version.load(Ordering::Acquire);
        let mut snapshot = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match &*cache {
                Some((v, s)) if *v == version => s.clone(),
                _ => {
                    let s = self.build();
                    *cache = Some((version, s.clone()));
                    s
                }
            }
        };
        snapshot.refreshed_unix = (refreshed > 0).then_some(refreshed);
        snapshot.synced = synced;
        snapshot
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
    let (profile_reader, profile_writer) = reflector::store::<MemoryProfile>();
    let synced = Arc::new(AtomicBool::new(false));
    let refreshed = Arc::new(AtomicI64::new(0));
    let version = Arc::new(AtomicU64::new(0));
    let source = Reflected {
        gpu_nodes: gn_reader.clone(),
        nodes: node_reader.clone(),
        profiles: profile_reader.clone(),
        synced: synced.clone(),
        refreshed: refreshed.clone(),
        version: version.clone(),
        cache: Arc::new(Mutex::new(None)),
    };
    let gpu_api: Api<GpuNode> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    let profile_api: Api<MemoryProfile> = Api::all(client);
    let v3 = version.clone();
    let profile_stream = reflector::reflector(
        profile_writer,
        watcher(profile_api, watcher::Config::default()).default_backoff(),
    )
    .inspect(move |_| {
        v3.fetch_add(1, Ordering::Release);
    })
    .touched_objects()
    .for_each(|ev| {
        if let Err(error) = ev {
            tracing::warn!(%error, "MemoryProfile watch");
        }
        futures::future::ready(())
    });
    let r1 = refreshed.clone();
    let v1 = version.clone();
    // The reflector has applied an event to its store by the time it passes it on.
    let gn_stream = reflector::reflector(
        gn_writer,
        watcher(gpu_api, watcher::Config::default()).default_backoff(),
    )
    .inspect(move |_| {
        v1.fetch_add(1, Ordering::Release);
    })
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
    .inspect(move |_| {
        version.fetch_add(1, Ordering::Release);
    })
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
        let _ = profile_reader.wait_until_ready().await;
        synced.store(true, Ordering::Relaxed);
    };
    let driver = async move {
        futures::join!(gn_stream, node_stream, profile_stream, ready);
    };
    (source, driver)
}
