//! The inventory from a live cluster: reflectors over `GpuNode` objects,
//! over nodes carrying GPU Feature Discovery labels, and over the
//! `MemoryProfile`s the operator learnt.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::{GFD_PRODUCT, Snapshot, Source, merge, profile_ratios};
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
    /// What the last build was made from, to update it in place.
    built: Arc<Mutex<Option<Built>>>,
}

/// The stores' objects a snapshot was built from (the stores hand out a new
/// `Arc` for every version, so an unchanged pointer is an unchanged object),
/// and the merged node list built from them.
struct Built {
    gpu_nodes: Vec<Arc<GpuNode>>,
    nodes: Vec<Arc<Node>>,
    profiles: Vec<Arc<MemoryProfile>>,
    merged: Arc<Vec<GpuNode>>,
    ratios: Arc<std::collections::HashMap<String, f64>>,
    /// GpuNode object name → its index in `merged`.
    at: std::collections::HashMap<String, usize>,
}

fn same<K>(a: &[Arc<K>], b: &[Arc<K>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

fn by_name<K: kube::Resource>(mut v: Vec<Arc<K>>) -> Vec<Arc<K>> {
    v.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    v
}

impl Reflected {
    /// The merged inventory, updated from the last one where only GpuNode
    /// statuses changed (the agents' every publish): each changed node is
    /// copied, not every node; the node list is copied whole only when
    /// another snapshot still shares it or the set of nodes changed.
    fn build(&self) -> Snapshot {
        let gpu_nodes = by_name(self.gpu_nodes.state());
        let nodes = by_name(self.nodes.state());
        let profiles = by_name(self.profiles.state());
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        let updated = built
            .take()
            .and_then(|b| Self::update(b, &gpu_nodes, &nodes, &profiles));
        let b = updated.unwrap_or_else(|| {
            let owned: Vec<GpuNode> = gpu_nodes.iter().map(|g| (**g).clone()).collect();
            let plain: Vec<Node> = nodes.iter().map(|n| (**n).clone()).collect();
            let merged = merge(owned, &plain);
            let at = gpu_nodes
                .iter()
                .filter_map(|g| {
                    // Name and uid: a node's synthetic GpuNode has no uid.
                    let i = merged.iter().position(|m| {
                        m.metadata.name == g.metadata.name && m.metadata.uid == g.metadata.uid
                    })?;
                    Some((g.metadata.name.clone()?, i))
                })
                .collect();
            Built {
                gpu_nodes,
                nodes,
                ratios: Arc::new(profile_ratios(profiles.iter().map(|p| &**p))),
                profiles,
                merged: Arc::new(merged),
                at,
            }
        });
        let mut snapshot = Snapshot::shared(b.merged.clone(), None, false, None);
        snapshot.profiles = b.ratios.clone();
        *built = Some(b);
        snapshot
    }

    /// `b` brought up to the stores' objects, or None when it must be built
    /// again (a GpuNode or Node came or went, or a Node changed).
    fn update(
        mut b: Built,
        gpu_nodes: &[Arc<GpuNode>],
        nodes: &[Arc<Node>],
        profiles: &[Arc<MemoryProfile>],
    ) -> Option<Built> {
        if b.gpu_nodes.len() != gpu_nodes.len()
            || b.at.len() != gpu_nodes.len()
            || !same(&b.nodes, nodes)
        {
            return None;
        }
        for (old, new) in b.gpu_nodes.iter().zip(gpu_nodes) {
            if old.metadata.name != new.metadata.name || old.spec.node_name != new.spec.node_name {
                return None;
            }
        }
        let changed: Vec<usize> = (0..gpu_nodes.len())
            .filter(|&i| !Arc::ptr_eq(&b.gpu_nodes[i], &gpu_nodes[i]))
            .collect();
        if !changed.is_empty() {
            let merged = Arc::make_mut(&mut b.merged);
            for i in changed {
                let name = gpu_nodes[i].metadata.name.as_deref().unwrap_or_default();
                let &at = b.at.get(name)?;
                merged[at] = (*gpu_nodes[i]).clone();
            }
            b.gpu_nodes = gpu_nodes.to_vec();
        }
        if !same(&b.profiles, profiles) {
            b.ratios = Arc::new(profile_ratios(profiles.iter().map(|p| &**p)));
            b.profiles = profiles.to_vec();
        }
        Some(b)
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
                    // Let go of the last one first, so that the node list it
                    // shares can be updated in place.
                    *cache = None;
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

/// Drive one reflector: after each event has reached its store, bump
/// `version` and, for GPU data, stamp `refreshed`; watch errors are logged
/// (the watcher backs off and retries).
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    what: &'static str,
    version: Arc<AtomicU64>,
    refreshed: Option<Arc<AtomicI64>>,
) -> impl Future<Output = ()> + Send + 'static
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    // The reflector has applied an event to its store by the time it passes it on.
    reflector::reflector(writer, watcher(api, config).default_backoff())
        .inspect(move |_| {
            version.fetch_add(1, Ordering::Release);
        })
        .touched_objects()
        .for_each(move |ev| {
            match ev {
                Err(error) => tracing::warn!(%error, "{what} watch"),
                Ok(_) => {
                    if let Some(r) = &refreshed {
                        r.store(now_unix(), Ordering::Relaxed);
                    }
                }
            }
            futures::future::ready(())
        })
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
        built: Arc::new(Mutex::new(None)),
    };
    let gpu_api: Api<GpuNode> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    let profile_api: Api<MemoryProfile> = Api::all(client);
    let gn_stream = reflect(
        gpu_api,
        watcher::Config::default(),
        gn_writer,
        "GpuNode",
        version.clone(),
        Some(refreshed.clone()),
    );
    let node_stream = reflect(
        node_api,
        watcher::Config::default().labels(GFD_PRODUCT),
        node_writer,
        "Node",
        version.clone(),
        Some(refreshed),
    );
    // Learnt profiles are not GPU data: they do not make the inventory fresher.
    let profile_stream = reflect(
        profile_api,
        watcher::Config::default(),
        profile_writer,
        "MemoryProfile",
        version,
        None,
    );
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
