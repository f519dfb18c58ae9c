//! The cluster's GPU view: `GpuNode` objects published by agents, falling back
//! to GPU Feature Discovery node labels where no agent runs. A snapshot is a
//! plain value the webhook and planner read; the sources that fill it (a
//! static file, kube reflectors) live at the edge.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::fingerprint;
use crate::api::{
    GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, MemoryProfile, NodeTaint, TrainingJobSpec,
};
use crate::estimate::gpus::{self, GpuProduct};

pub mod reflect;

/// GPU Feature Discovery labels read when a node has no GpuNode.
pub const GFD_PRODUCT: &str = "nvidia.com/gpu.product";
/// Per-GPU memory in MiB.
pub const GFD_MEMORY: &str = "nvidia.com/gpu.memory";
pub const GFD_COUNT: &str = "nvidia.com/gpu.count";

/// What the cluster has, at one moment. Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// GpuNodes from agents plus synthetic ones from GFD labels.
    pub nodes: Arc<Vec<GpuNode>>,
    /// Seconds since the Unix epoch when the snapshot was last refreshed.
    pub refreshed_unix: Option<i64>,
    /// True once every source has listed at least once.
    pub synced: bool,
    /// Judge staleness as of this time (seconds since the epoch) instead of
    /// now: a static file is a picture of one moment, not a live feed.
    pub as_of_unix: Option<i64>,
    /// What real runs taught: `MemoryProfile` name → observed/estimated ratio.
    pub profiles: Arc<HashMap<String, f64>>,
    /// `products()`, computed once per snapshot.
    products: Arc<OnceLock<Vec<ProductCount>>>,
    /// See [`Snapshot::generation`].
    generation: u64,
}

/// The generation the next snapshot gets (0 is a default, empty one's).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// A GPU product the cluster has, with how many of it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProductCount {
    /// Catalog entry (for overheads); None when the product is unknown to the catalog.
    pub catalog: Option<&'static GpuProduct>,
    /// Product as reported.
    pub product: String,
    /// Memory one GPU offers a process.
    pub usable_bytes: u64,
    pub gpus: u64,
    /// GPUs of this product on the node that has most of them.
    pub max_per_node: u64,
}

impl Snapshot {
    pub fn new(
        nodes: Vec<GpuNode>,
        refreshed_unix: Option<i64>,
        synced: bool,
        as_of_unix: Option<i64>,
    ) -> Snapshot {
        Snapshot::shared(Arc::new(nodes), refreshed_unix, synced, as_of_unix)
    }

    /// A snapshot of a node list already shared (the reflectors update
    /// theirs in place); a new generation all the same.
    pub fn shared(
        nodes: Arc<Vec<GpuNode>>,
        refreshed_unix: Option<i64>,
        synced: bool,
        as_of_unix: Option<i64>,
    ) -> Snapshot {
        Snapshot {
            nodes,
            refreshed_unix,
            synced,
            as_of_unix,
            profiles: Arc::default(),
            products: Arc::default(),
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Unique to this snapshot and its clones in this process: a snapshot
    /// built after any change to the inventory (a GpuNode, a node, a
    /// MemoryProfile) has a new generation, so what was judged against one
    /// generation is never taken for another.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The scale earlier runs of jobs shaped like `spec` put on its
    /// estimates (its MemoryProfile's ratio; 1 without one, never below 1).
    pub fn learnt_scale(&self, spec: &TrainingJobSpec) -> f64 {
        if self.profiles.is_empty() {
            return 1.0;
        }
        let name = fingerprint::profile_name(&fingerprint::fingerprint(spec));
        self.profiles
            .get(&name)
            .copied()
            .filter(|r| r.is_finite())
            .unwrap_or(1.0)
            .max(1.0)
    }

    /// Distinct GPU products, largest memory first (deterministic).
    pub fn products(&self) -> &[ProductCount] {
        self.products.get_or_init(|| self.compute_products())
    }

    fn compute_products(&self) -> Vec<ProductCount> {
        // Every GPU of the cluster passes here once per snapshot: names are
        // borrowed, and each distinct one is looked up in the catalog once.
        let mut tally = Tally::default();
        for node in self.nodes.iter() {
            let Some(status) = &node.status else { continue };
            let mut per_node: BTreeMap<(Cow<'_, str>, u64), u64> = BTreeMap::new();
            for gpu in &status.gpus {
                if gpu.mig_devices.is_empty() {
                    let product = Cow::Borrowed(gpu.product.as_str());
                    tally.count(product, gpu.total_bytes, &mut per_node);
                } else {
                    for m in &gpu.mig_devices {
                        let product = Cow::Owned(format!("{} MIG {}", gpu.product, m.profile));
                        tally.count(product, m.total_bytes, &mut per_node);
                    }
                }
            }
            for (key, n) in per_node {
                if let Some(e) = tally.by.get_mut(&key) {
                    e.max_per_node = e.max_per_node.max(n);
                }
            }
        }
        let by = tally.by;
        let mut out: Vec<ProductCount> = by.into_values().collect();
        out.sort_by(|a, b| {
            b.usable_bytes
                .cmp(&a.usable_bytes)
                .then(a.product.cmp(&b.product))
        });
        out
    }
}

/// GPUs counted by (product, usable bytes), and the catalog entry of each
/// product name met so far.
#[derive(Default)]
struct Tally<'a> {
    by: BTreeMap<(Cow<'a, str>, u64), ProductCount>,
    known: Vec<(Cow<'a, str>, Option<&'static GpuProduct>)>,
}

impl<'a> Tally<'a> {
    /// One device of `product` with `total` bytes, counted in `per_node` too.
    fn count(
        &mut self,
        product: Cow<'a, str>,
        total: u64,
        per_node: &mut BTreeMap<(Cow<'a, str>, u64), u64>,
    ) {
        let catalog = match self.known.iter().find(|(p, _)| *p == product) {
            Some((_, c)) => *c,
            None => {
                let c = catalog_product(&product);
                self.known.push((product.clone(), c));
                c
            }
        };
        let usable = match catalog {
            Some(c) if c.mig => total,
            _ => total.saturating_sub(gpus::DRIVER_RESERVE_BYTES),
        };
        let key = (product, usable);
        *per_node.entry(key.clone()).or_default() += 1;
        let e = self
            .by
            .entry(key)
            .or_insert_with_key(|(product, _)| ProductCount {
                catalog,
                product: product.to_string(),
                usable_bytes: usable,
                gpus: 0,
                max_per_node: 0,
            });
        e.gpus += 1;
    }
}

/// Map a reported product name ("NVIDIA H100 80GB HBM3", "NVIDIA-A100-SXM4-40GB")
/// to the catalog entry it is.
pub fn catalog_product(reported: &str) -> Option<&'static GpuProduct> {
    static NORMALISED: LazyLock<Vec<(String, &'static GpuProduct)>> = LazyLock::new(|| {
        gpus::GPUS
            .iter()
            .map(|g| (normalise_product(g.product), g))
            .collect()
    });
    let want = normalise_product(reported);
    NORMALISED
        .iter()
        .find(|(n, _)| *n == want)
        .map(|(_, g)| *g)
        .or_else(|| gpus::find(reported))
}

fn normalise_product(s: &str) -> String {
    s.to_ascii_lowercase()
        .replace(['-', '_'], " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A node with GFD labels and no GpuNode becomes a synthetic GpuNode whose GPUs
/// are all free (nothing measured them).
pub fn from_gfd_labels(node: &Node) -> Option<GpuNode> {
    let labels = node.metadata.labels.as_ref()?;
    let product = labels.get(GFD_PRODUCT)?.clone();
    let mib: u64 = labels.get(GFD_MEMORY)?.parse().ok()?;
    let count: u32 = labels.get(GFD_COUNT)?.parse().ok()?;
    let total = mib.checked_mul(1024 * 1024)?;
    let name = node.name_any();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| NodeTaint {
            key: t.key,
            value: t.value,
            effect: t.effect,
        })
        .collect();
    let mut gn = GpuNode::new(
        &name,
        GpuNodeSpec {
            node_name: name.clone(),
            ttl_seconds: u64::MAX / 4,
            taints,
        },
    );
    gn.status = Some(GpuNodeStatus {
        gpus: (0..count)
            .map(|index| GpuStatus {
                index,
                product: product.clone(),
                total_bytes: total,
                free_bytes: total,
                healthy: true,
                ..Default::default()
            })
            .collect(),
        gpu_count: count,
        product: Some(product),
        ..Default::default()
    });
    Some(gn)
}

/// Merge agent GpuNodes with GFD-labelled nodes that have none.
pub fn merge(gpu_nodes: Vec<GpuNode>, nodes: &[Node]) -> Vec<GpuNode> {
    let covered: std::collections::BTreeSet<String> =
        gpu_nodes.iter().map(|g| g.spec.node_name.clone()).collect();
    let mut out = gpu_nodes;
    for n in nodes {
        if covered.contains(&n.name_any()) {
            continue;
        }
        if let Some(g) = from_gfd_labels(n) {
            out.push(g);
        }
    }
    out.sort_by(|a, b| a.spec.node_name.cmp(&b.spec.node_name));
    out
}

/// The ratios of the profiles that hold evidence, by profile name: a profile
/// without observations, or whose ratio is not a positive finite number, teaches
/// nothing.
pub fn profile_ratios<'a>(
    profiles: impl IntoIterator<Item = &'a MemoryProfile>,
) -> HashMap<String, f64> {
    profiles
        .into_iter()
        .filter_map(|p| {
            let s = p.status.as_ref()?;
            (s.observation_count > 0 && s.ratio.is_finite() && s.ratio > 0.0)
                .then(|| (p.name_any(), s.ratio))
        })
        .collect()
}

/// Where the webhook reads the inventory from.
pub trait Source: Send + Sync {
    fn snapshot(&self) -> Snapshot;
}

/// A fixed inventory (a cluster file): synced from the start.
#[derive(Clone, Debug, Default)]
pub struct Static {
    snapshot: Snapshot,
}

impl Static {
    pub fn new(nodes: Vec<GpuNode>, now_unix: i64) -> Static {
        let as_of_unix = nodes
            .iter()
            .filter_map(|n| n.status.as_ref()?.probe_time.as_ref())
            .map(|t| t.0.as_second())
            .max();
        Static {
            snapshot: Snapshot::new(nodes, Some(now_unix), true, as_of_unix),
        }
    }
}

impl Source for Static {
    fn snapshot(&self) -> Snapshot {
        self.snapshot.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn gfd_labels_make_a_gpu_node() {
        let node = Node {
            metadata: ObjectMeta {
                name: Some("gpu-1".into()),
                labels: Some(
                    [
                        (GFD_PRODUCT.to_string(), "NVIDIA-A100-SXM4-40GB".to_string()),
                        (GFD_MEMORY.to_string(), "40960".to_string()),
                        (GFD_COUNT.to_string(), "8".to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let g = from_gfd_labels(&node).unwrap();
        let s = g.status.unwrap();
        assert_eq!(s.gpus.len(), 8);
        assert_eq!(s.gpus[0].total_bytes, 40960 * 1024 * 1024);
        let snap = Snapshot::new(merge(Vec::new(), &[node]), None, true, None);
        let p = snap.products();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].gpus, 8);
        assert_eq!(p[0].max_per_node, 8);
        assert_eq!(p[0].catalog.map(|c| c.name), Some("a100-40gb"));
    }

    #[test]
    fn products_count_gpus_and_mig_devices_per_product_and_node() {
        use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuStatus, MigDevice};
        let gpu = |product: &str, gib: u64, migs: &[&str]| GpuStatus {
            product: product.into(),
            total_bytes: gib << 30,
            mig_devices: migs
                .iter()
                .map(|m| MigDevice {
                    profile: m.to_string(),
                    total_bytes: 10 << 30,
                    ..MigDevice::default()
                })
                .collect(),
            ..GpuStatus::default()
        };
        let node = |name: &str, gpus: Vec<GpuStatus>| {
            let mut n = GpuNode::new(
                name,
                GpuNodeSpec {
                    node_name: name.into(),
                    ttl_seconds: 120,
                    taints: vec![],
                },
            );
            n.status = Some(GpuNodeStatus {
                gpu_count: gpus.len() as u32,
                gpus,
                ..GpuNodeStatus::default()
            });
            n
        };
        let (h100, a100) = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB");
        let snap = Snapshot::new(
            vec![
                node(
                    "a",
                    vec![gpu(h100, 80, &[]), gpu(h100, 80, &[]), gpu(a100, 40, &[])],
                ),
                node("b", vec![gpu(a100, 40, &[]); 3]),
                node("c", vec![gpu(a100, 40, &["1g.10gb", "1g.10gb"])]),
            ],
            None,
            true,
            None,
        );
        let seen: Vec<(&str, u64, u64, Option<&str>)> = snap
            .products()
            .iter()
            .map(|p| {
                let name = p.catalog.map(|c| c.name);
                (p.product.as_str(), p.gpus, p.max_per_node, name)
            })
            .collect();
        assert_eq!(
            seen,
            [
                (h100, 2, 2, Some("h100-80gb")),
                (a100, 4, 3, Some("a100-40gb")),
                ("NVIDIA A100-SXM4-40GB MIG 1g.10gb", 2, 2, seen[2].3),
            ]
        );
        assert!(
            snap.products()[1].usable_bytes < 40 << 30,
            "less the driver's reserve"
        );
    }

    #[test]
    fn a_node_without_labels_is_skipped() {
        assert!(from_gfd_labels(&Node::default()).is_none());
    }
}
