//! Place: choose the node(s) and GPUs for a job over the cluster's `GpuNode`
//! objects. Pure: the caller passes the objects, the reservations of admitted
//! jobs and the time; nothing here reads a clock or the API.
//!
//! Rules:
//! - a node is skipped when its data is stale (no `probeTime`, or older than
//!   `ttlSeconds` at `now`) or it has a `NoSchedule`/`NoExecute` taint whose
//!   key the job does not tolerate (`*` tolerates every key); unhealthy GPUs
//!   are skipped;
//! - a GPU offers its probed free memory minus the reservations on it, and a
//!   largest block no larger than that; MIG slices take single-GPU jobs only
//!   (NCCL does not run across MIG devices), a GPU split into slices is not
//!   offered whole;
//! - all ranks on a node must fit; a job of `gpus` ranks with `gpusPerNode`
//!   gets `gpus / gpusPerNode` whole nodes' worth, `gpusPerNode` fitting GPUs
//!   on each;
//! - best fit: the node(s) whose chosen GPUs leave the least headroom, and on a
//!   node the GPUs with the least headroom, so big GPUs stay free for big jobs;
//!   ties go to the node name, then the GPU index;
//! - nothing fits now but would on empty GPUs of some eligible node, or of a
//!   node left out only for a `node.kubernetes.io/` taint (not ready,
//!   unreachable, under pressure: conditions that clear): Wait; otherwise
//!   Reject. Both say why, in bytes.

mod products;
mod why;

/// The prefix of the taints Kubernetes sets for a node's condition of the moment.
const TRANSIENT_TAINT_PREFIX: &str = "node.kubernetes.io/";

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::{GpuView, Verdict, fit_limited, with_margin};
use crate::api::{GpuNode, GpuStatus, PlacedGpu, PlacedNode, Placement, ValidatedJob};
use crate::estimate::framework::AllocatorLimit;
pub use products::architecture_of;
use products::{UNKNOWN_ARCHITECTURE, arch_slot, representative};
use why::Tally;

use crate::estimate::EstimateError;
use crate::estimate::gpus::{Architecture, DRIVER_RESERVE_BYTES};

/// Memory promised to an admitted job that does not run yet: counts as used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Kubernetes node name (`GpuNode.spec.nodeName`).
    pub node: String,
    pub gpu_index: u32,
    /// The MIG device on that GPU, if the reservation is on a slice.
    pub mig_index: Option<u32>,
    pub bytes: u64,
}

/// The reservations a placement recorded in `status.placement` stands for:
/// `reservedBytesPerGpu` on each of its devices.
pub fn reservations_of(p: &Placement) -> Vec<Reservation> {
    p.devices
        .iter()
        .flat_map(|n| {
            n.gpus.iter().map(|g| Reservation {
                node: n.node.clone(),
                gpu_index: g.index,
                mig_index: g.mig_index,
                bytes: p.reserved_bytes_per_gpu,
            })
        })
        .collect()
}

/// What one rank needs on a GPU of some architecture.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Need {
    pub per_gpu_bytes: u64,
    pub largest_tensor_bytes: u64,
    /// Peak reserved bytes and the framework allocator's limit, when it has one.
    pub allocator: Option<(u64, AllocatorLimit)>,
}

/// The shape of the job to place and the context of the decision.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Ranks (one GPU each).
    pub gpus: u64,
    /// Ranks per node of a multi-node job.
    pub gpus_per_node: u64,
    pub safety_margin: f64,
    /// Taint keys the job tolerates.
    pub tolerations: &'a [String],
    /// The time staleness is judged at.
    pub now: Timestamp,
}

/// One rank's GPU (or MIG slice).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAssignment {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    pub product: String,
    pub verdict: Verdict,
}

/// The GPUs chosen on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAssignment {
    pub node: String,
    pub gpus: Vec<DeviceAssignment>,
}

/// Where every rank goes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    pub nodes: Vec<NodeAssignment>,
    /// Headroom left on the chosen GPUs, summed.
    pub headroom_bytes: u64,
}

impl Assignment {
    /// `status.placement`: the first node and its GPU indices; every node when several.
    pub fn to_status(&self) -> Placement {
        let first = self.nodes.first();
        Placement {
            node: first.map(|n| n.node.clone()).unwrap_or_default(),
            nodes: if self.nodes.len() > 1 {
                self.nodes.iter().map(|n| n.node.clone()).collect()
            } else {
                Vec::new()
            },
            gpus: first
                .map(|n| n.gpus.iter().map(|g| g.index).collect())
                .unwrap_or_default(),
            devices: self
                .nodes
                .iter()
                .map(|n| PlacedNode {
                    node: n.node.clone(),
                    gpus: n
                        .gpus
                        .iter()
                        .map(|g| PlacedGpu {
                            index: g.index,
                            mig_index: g.mig_index,
                            mig_profile: g.mig_profile.clone(),
                            product: g.product.clone(),
                        })
                        .collect(),
                })
                .collect(),
            reserved_bytes_per_gpu: self
                .nodes
                .iter()
                .flat_map(|n| n.gpus.iter())
                .map(|g| g.verdict.need_bytes)
                .max()
                .unwrap_or(0),
        }
    }
}

/// The placement decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum PlaceOutcome {
    /// Run here now.
    Placed(Assignment),
    /// Nothing has room now, but empty GPUs of an eligible node would hold it.
    Wait { reason: String },
    /// No eligible node would hold it even empty.
    Reject { reason: String },
}

impl PlaceOutcome {
    pub fn assignment(&self) -> Option<&Assignment> {
        match self {
            PlaceOutcome::Placed(a) => Some(a),
            _ => None,
        }
    }
}

/// Place `job` (as written) over `nodes`, estimating it once per architecture.
pub fn place(
    job: &ValidatedJob,
    nodes: &[GpuNode],
    reservations: &[Reservation],
    tolerations: &[String],
    now: Timestamp,
) -> Result<PlaceOutcome, EstimateError> {
    place_scaled(job, nodes, reservations, tolerations, now, 1.0)
}

/// `bytes × scale`, rounded up, saturating; a scale below 1 (or not a
/// number) counts as 1: learnt corrections only ever raise an estimate.
pub fn scale_bytes(bytes: u64, scale: f64) -> u64 {
    if scale.is_nan() || scale <= 1.0 {
        return bytes;
    }
    let scaled = (bytes as f64 * scale).ceil();
    if scaled >= u64::MAX as f64 {
        u64::MAX
    } else {
        (scaled as u64).max(bytes)
    }
}

/// [`place`] with every per-GPU estimate multiplied by `scale` (what earlier
/// out-of-memory deaths of jobs of this shape proved was missing).
pub fn place_scaled(
    job: &ValidatedJob,
    nodes: &[GpuNode],
    reservations: &[Reservation],
    tolerations: &[String],
    now: Timestamp,
    scale: f64,
) -> Result<PlaceOutcome, EstimateError> {
    let by_node = by_node(reservations);
    let held = |node: &str, gpu: u32, mig: Option<u32>| held_by(&by_node, node, gpu, mig);
    place_job(job, nodes, &held, tolerations, now, scale)
}

fn place_job(
    job: &ValidatedJob,
    nodes: &[GpuNode],
    held: &dyn Fn(&str, u32, Option<u32>) -> u64,
    tolerations: &[String],
    now: Timestamp,
    scale: f64,
) -> Result<PlaceOutcome, EstimateError> {
    let request = Request {
        gpus: job.spec().parallelism.gpus,
        gpus_per_node: job.gpus_per_node,
        safety_margin: job.spec().fit_policy.safety_margin,
        tolerations,
        now,
    };
    let mut error = None;
    let outcome = place_held(
        &request,
        nodes,
        held,
        &mut |arch| match super::memo::estimate(job, representative(arch)) {
            Ok(e) if e.unsupported.is_some() => None,
            Ok(e) => Some(Need {
                per_gpu_bytes: scale_bytes(e.status.fit_per_gpu_bytes(), scale),
                largest_tensor_bytes: e.status.largest_tensor_bytes,
                allocator: e
                    .allocator_limit
                    .map(|l| (scale_bytes(e.status.fit_reserved_bytes(), scale), l)),
            }),
            Err(e) => {
                error = Some(e);
                None
            }
        },
    );
    match error {
        Some(e) => Err(e),
        None => Ok(outcome),
    }
}

/// Which view of a GPU a pass judges.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Free memory now, minus reservations.
    Now,
    /// The GPU empty: what it would offer once its jobs end.
    Empty,
}

/// One schedulable device of a node.
struct Device<'n> {
    index: u32,
    mig: Option<(u32, &'n str)>,
    arch: Architecture,
    view: GpuView,
}

/// A node's best-fit score for one pass.
struct NodeFit {
    fitting: usize,
    headroom: u128,
}

struct Placer<'a> {
    request: &'a Request<'a>,
    ranks_per_node: usize,
    single_rank: bool,
    /// Bytes reserved on (node, GPU index, MIG index).
    held: &'a dyn Fn(&str, u32, Option<u32>) -> u64,
    /// Per architecture: the need, and the need with the margin.
    needs: [Option<Option<(Need, u64)>>; 6],
    need_fn: &'a mut dyn FnMut(Architecture) -> Option<Need>,
    tally: Tally<'a>,
    scratch: Vec<(u64, u32, u32)>,
    /// `architecture_of` by (architecture field, product): a cluster has few distinct ones.
    arch_cache: Vec<(Option<&'a str>, &'a str, Option<Architecture>)>,
}

impl<'a> Placer<'a> {
    fn need(&mut self, arch: Architecture) -> Option<(Need, u64)> {
        let slot = arch_slot(arch);
        if let Some(n) = self.needs[slot] {
            return n;
        }
        let n = (self.need_fn)(arch)
            .map(|n| (n, with_margin(n.per_gpu_bytes, self.request.safety_margin)));
        self.needs[slot] = Some(n);
        n
    }

    fn architecture(&mut self, gpu: &'a GpuStatus) -> Option<Architecture> {
        let key = (gpu.architecture.as_deref(), gpu.product.as_str());
        if let Some(hit) = self.arch_cache.iter().find(|c| (c.0, c.1) == key) {
            return hit.2;
        }
        let arch = architecture_of(gpu);
        self.arch_cache.push((key.0, key.1, arch));
        arch
    }

    fn eligible(&mut self, node: &'a GpuNode) -> bool {
        let name = node.spec.node_name.as_str();
        let probe = node.status.as_ref().and_then(|s| s.probe_time.as_ref());
        let fresh = probe.is_some_and(|t| {
            let age = self.request.now.as_second().saturating_sub(t.0.as_second());
            age <= i64::try_from(node.spec.ttl_seconds).unwrap_or(i64::MAX)
        });
        if !fresh {
            self.tally.stale.push(name);
            return false;
        }
        if let Some(t) = node.spec.taints.iter().find(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                && !self
                    .request
                    .tolerations
                    .iter()
                    .any(|k| k == &t.key || k == "*")
        }) {
            let value = t
                .value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default();
            self.tally
                .tainted
                .push((name, format!("{}{value}:{}", t.key, t.effect)));
            return false;
        }
        true
    }

    /// Left out now only for a condition of the moment: fresh, and every taint the job does
    /// not tolerate is one the node lifecycle controller or the kubelet sets and clears
    /// (`node.kubernetes.io/not-ready`, `unreachable`, `unschedulable`, the pressures). A
    /// new node carries `not-ready` until its kubelet reports; a job waits for such a node
    /// instead of being rejected.
    fn recovering(&mut self, node: &'a GpuNode) -> bool {
        let probe = node.status.as_ref().and_then(|s| s.probe_time.as_ref());
        let fresh = probe.is_some_and(|t| {
            let age = self.request.now.as_second().saturating_sub(t.0.as_second());
            age <= i64::try_from(node.spec.ttl_seconds).unwrap_or(i64::MAX)
        });
        let blocking = node.spec.taints.iter().filter(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                && !self
                    .request
                    .tolerations
                    .iter()
                    .any(|k| k == &t.key || k == "*")
        });
        let mut any = false;
        for t in blocking {
            if !t.key.starts_with(TRANSIENT_TAINT_PREFIX) {
                return false;
            }
            any = true;
        }
        if fresh && any {
            self.tally.recovering.push(node.spec.node_name.as_str());
        }
        fresh && any
    }

    /// Calls `f` with every device of `node` the job could use, in index order.
    fn devices(
        &mut self,
        node: &'a GpuNode,
        pass: Pass,
        count: bool,
        f: &mut dyn FnMut(&mut Self, Device<'a>),
    ) {
        let Some(status) = node.status.as_ref() else {
            return;
        };
        let name = node.spec.node_name.as_str();
        let held = self.held;
        let reserved = |index: u32, mig: Option<u32>| held(name, index, mig);
        for gpu in &status.gpus {
            if !gpu.healthy {
                if count {
                    self.tally.unhealthy_gpus += 1;
                }
                continue;
            }
            let arch = match self.architecture(gpu) {
                Some(a) => a,
                None => {
                    if count {
                        self.tally.unknown_gpus += 1;
                    }
                    UNKNOWN_ARCHITECTURE
                }
            };
            if !gpu.mig_devices.is_empty() {
                if !self.single_rank {
                    if count {
                        self.tally.mig_gpus += 1;
                    }
                    continue;
                }
                for m in &gpu.mig_devices {
                    let view = match pass {
                        Pass::Now => {
                            let free = m
                                .free_bytes
                                .min(m.total_bytes)
                                .saturating_sub(reserved(gpu.index, Some(m.index)));
                            GpuView {
                                total_bytes: m.total_bytes,
                                free_bytes: free,
                                largest_block_bytes: free,
                            }
                        }
                        Pass::Empty => GpuView::empty(m.total_bytes),
                    };
                    f(
                        self,
                        Device {
                            index: gpu.index,
                            mig: Some((m.index, m.profile.as_str())),
                            arch,
                            view,
                        },
                    );
                }
                continue;
            }
            let view = match pass {
                Pass::Now => {
                    let free = gpu
                        .free_bytes
                        .min(gpu.total_bytes)
                        .saturating_sub(reserved(gpu.index, None));
                    let block = gpu.largest_free_block_bytes.unwrap_or(free).min(free);
                    GpuView {
                        total_bytes: gpu.total_bytes,
                        free_bytes: free,
                        largest_block_bytes: block,
                    }
                }
                Pass::Empty => {
                    let reserve = if gpu.reserved_bytes > 0 {
                        gpu.reserved_bytes
                    } else {
                        DRIVER_RESERVE_BYTES
                    };
                    GpuView::empty(gpu.total_bytes.saturating_sub(reserve))
                }
            };
            f(
                self,
                Device {
                    index: gpu.index,
                    mig: None,
                    arch,
                    view,
                },
            );
        }
    }

    fn verdict(&mut self, d: &Device<'_>) -> Option<Verdict> {
        let (need, _) = self.need(d.arch)?;
        Some(fit_limited(
            need.per_gpu_bytes,
            need.largest_tensor_bytes,
            self.request.safety_margin,
            d.view,
            need.allocator,
        ))
    }

    /// How many devices of `node` fit and the headroom of the best-fitting
    /// `ranks_per_node` of them.
    fn score(&mut self, node: &'a GpuNode, pass: Pass) -> NodeFit {
        let name = node.spec.node_name.as_str();
        let count = pass == Pass::Now;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        self.devices(node, pass, count, &mut |p, d| {
            // `fit` inlined: this runs for every GPU of the cluster.
            let Some((n, need)) = p.need(d.arch) else {
                return;
            };
            if count {
                p.tally.need = Some(
                    p.tally
                        .need
                        .map_or((need, need), |(lo, hi)| (lo.min(need), hi.max(need))),
                );
            }
            let free = d.view.free_bytes;
            let block = d.view.largest_block_bytes;
            // What the framework's allocator may hold on this device (JAX's
            // fraction of the total, TensorFlow's reserve): over it, the job
            // dies with free memory left, so the device does not fit either.
            let allocator_short = n.allocator.map_or(0, |(reserved, l)| {
                with_margin(reserved, p.request.safety_margin)
                    .saturating_sub(l.bytes(d.view.total_bytes, free))
            });
            if need <= free && n.largest_tensor_bytes <= block && allocator_short == 0 {
                scratch.push((free - need, d.index, d.mig.map_or(0, |m| m.0)));
            } else if count {
                let short = need
                    .saturating_sub(free)
                    .max(n.largest_tensor_bytes.saturating_sub(block))
                    .max(allocator_short);
                if p.tally.closest.is_none_or(|c| (short, name, d.index) < c) {
                    p.tally.closest = Some((short, name, d.index));
                }
            }
        });
        let fitting = scratch.len();
        let mut headroom = 0u128;
        if fitting >= self.ranks_per_node && self.ranks_per_node > 0 {
            // The `ranks_per_node` tightest devices, in no particular order.
            scratch.select_nth_unstable(self.ranks_per_node - 1);
            headroom = scratch[..self.ranks_per_node]
                .iter()
                .map(|x| u128::from(x.0))
                .sum();
        }
        self.scratch = scratch;
        NodeFit { fitting, headroom }
    }

    /// The chosen devices of a node that scored as a candidate.
    fn assign(&mut self, node: &'a GpuNode, pass: Pass) -> NodeAssignment {
        let mut chosen: Vec<(u64, u32, u32, DeviceAssignment)> = Vec::new();
        self.devices(node, pass, false, &mut |p, d| {
            let Some(v) = p.verdict(&d) else { return };
            if !v.fits {
                return;
            }
            let product = node
                .status
                .as_ref()
                .and_then(|s| s.gpus.iter().find(|g| g.index == d.index))
                .map(|g| g.product.clone())
                .unwrap_or_default();
            let mig = d.mig.map(|m| m.0);
            chosen.push((
                v.headroom_bytes,
                d.index,
                mig.unwrap_or(0),
                DeviceAssignment {
                    index: d.index,
                    mig_index: mig,
                    mig_profile: d.mig.map(|m| m.1.to_string()),
                    product,
                    verdict: v,
                },
            ));
        });
        chosen.sort_by_key(|c| (c.0, c.1, c.2));
        chosen.truncate(self.ranks_per_node);
        let mut gpus: Vec<DeviceAssignment> = chosen.into_iter().map(|c| c.3).collect();
        gpus.sort_by_key(|g| (g.index, g.mig_index));
        NodeAssignment {
            node: node.spec.node_name.clone(),
            gpus,
        }
    }

    /// The best nodes for one pass, or `None` when too few can hold their ranks.
    fn choose(
        &mut self,
        nodes: &'a [GpuNode],
        eligible: &[usize],
        pass: Pass,
    ) -> Option<Vec<usize>> {
        let nodes_needed = usize::try_from(
            self.request
                .gpus
                .div_ceil(self.request.gpus_per_node.max(1)),
        )
        .unwrap_or(usize::MAX);
        let mut candidates: Vec<(u128, &'a str, usize)> = Vec::new();
        for &i in eligible {
            let node = &nodes[i];
            let s = self.score(node, pass);
            if pass == Pass::Now && self.tally.best.is_none_or(|b| s.fitting > b.0) {
                self.tally.best = Some((s.fitting, node.spec.node_name.as_str()));
            }
            if s.fitting >= self.ranks_per_node {
                candidates.push((s.headroom, node.spec.node_name.as_str(), i));
            }
        }
        match pass {
            Pass::Now => self.tally.candidates = candidates.len(),
            Pass::Empty => self.tally.candidates_empty = candidates.len(),
        }
        if candidates.len() < nodes_needed || nodes_needed == 0 {
            return None;
        }
        // The `nodes_needed` best, then in order.
        candidates.select_nth_unstable(nodes_needed - 1);
        candidates[..nodes_needed].sort_unstable();
        Some(candidates[..nodes_needed].iter().map(|c| c.2).collect())
    }
}

/// Place a job of `request.gpus` ranks, each needing `need(architecture)` on a
/// GPU of that architecture (`None`: cannot run there).
pub fn place_with(
    request: &Request<'_>,
    nodes: &[GpuNode],
    reservations: &[Reservation],
    need: &mut dyn FnMut(Architecture) -> Option<Need>,
) -> PlaceOutcome {
    let by_node = by_node(reservations);
    let held = |node: &str, gpu: u32, mig: Option<u32>| held_by(&by_node, node, gpu, mig);
    place_held(request, nodes, &held, need)
}

fn by_node(reservations: &[Reservation]) -> HashMap<&str, Vec<&Reservation>> {
    let mut by_node: HashMap<&str, Vec<&Reservation>> = HashMap::new();
    for r in reservations {
        by_node.entry(r.node.as_str()).or_default().push(r);
    }
    by_node
}

fn held_by(
    by_node: &HashMap<&str, Vec<&Reservation>>,
    node: &str,
    gpu: u32,
    mig: Option<u32>,
) -> u64 {
    by_node
        .get(node)
        .map_or(0, |rs| sum_on(rs.iter().copied(), gpu, mig))
}

fn sum_on<'r>(rs: impl Iterator<Item = &'r Reservation>, gpu: u32, mig: Option<u32>) -> u64 {
    rs.filter(|r| r.gpu_index == gpu && r.mig_index == mig)
        .fold(0u64, |acc, r| acc.saturating_add(r.bytes))
}

/// Reservations by node name, as a long-lived holder (the operator's
/// ledger) keeps them: placement then costs nothing per reservation held
/// elsewhere in the cluster.
pub type ReservationIndex = HashMap<String, Vec<Reservation>>;

/// Bytes `index` holds on one device.
pub fn held_in(index: &ReservationIndex, node: &str, gpu: u32, mig: Option<u32>) -> u64 {
    index.get(node).map_or(0, |rs| sum_on(rs.iter(), gpu, mig))
}

/// [`place_scaled`] with the reservations as an index.
pub fn place_scaled_in(
    job: &ValidatedJob,
    nodes: &[GpuNode],
    reservations: &ReservationIndex,
    tolerations: &[String],
    now: Timestamp,
    scale: f64,
) -> Result<PlaceOutcome, EstimateError> {
    let held = |node: &str, gpu: u32, mig: Option<u32>| held_in(reservations, node, gpu, mig);
    place_job(job, nodes, &held, tolerations, now, scale)
}

fn place_held(
    request: &Request<'_>,
    nodes: &[GpuNode],
    held: &dyn Fn(&str, u32, Option<u32>) -> u64,
    need: &mut dyn FnMut(Architecture) -> Option<Need>,
) -> PlaceOutcome {
    let ranks = request.gpus.max(1);
    let gpus_per_node = request.gpus_per_node.max(1);
    let ranks_per_node = usize::try_from(ranks.min(gpus_per_node)).unwrap_or(usize::MAX);
    let mut placer = Placer {
        request,
        ranks_per_node,
        single_rank: ranks == 1,
        held,
        needs: [None; 6],
        need_fn: need,
        tally: Tally::default(),
        scratch: Vec::with_capacity(16),
        arch_cache: Vec::new(),
    };
    let eligible: Vec<usize> = (0..nodes.len())
        .filter(|&i| placer.eligible(&nodes[i]))
        .collect();
    placer.tally.eligible = eligible.len();

    if let Some(chosen) = placer.choose(nodes, &eligible, Pass::Now) {
        let assigned: Vec<NodeAssignment> = chosen
            .iter()
            .map(|&i| placer.assign(&nodes[i], Pass::Now))
            .collect();
        let headroom = assigned
            .iter()
            .flat_map(|n| n.gpus.iter())
            .fold(0u64, |acc, g| acc.saturating_add(g.verdict.headroom_bytes));
        return PlaceOutcome::Placed(Assignment {
            nodes: assigned,
            headroom_bytes: headroom,
        });
    }
    let mut later_nodes = eligible.clone();
    later_nodes.extend(
        (0..nodes.len())
            .filter(|&i| eligible.binary_search(&i).is_err() && placer.recovering(&nodes[i])),
    );
    later_nodes.sort_unstable();
    let later = placer.choose(nodes, &later_nodes, Pass::Empty);

    why::explain(
        &placer.tally,
        nodes,
        later,
        ranks_per_node,
        ranks.div_ceil(gpus_per_node),
    )
}

#[cfg(test)]
mod tests;
