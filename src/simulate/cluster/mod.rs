//! The simulated cluster around vramguard: GPU nodes (the agent's simulated
//! backend, probed and published by the agent's own code), a kubelet that
//! runs the Jobs the operator creates, and the trainers in them, which
//! allocate on their GPUs what the job truly needs and die with PyTorch's
//! out-of-memory message when the allocator cannot serve them.

mod start;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::agent::probe::{Assignment, Assignments};
use crate::agent::publish::{self, PublishConfig};

use super::nodes::{Clock, Node};
use super::record::{Outcome, Records};
use super::scenario::NodeSpec;
use super::truth::{self, RankNeed};
use super::{Prepared, capacity_bytes};

/// A rank of a running attempt: one process on one GPU.
#[derive(Clone, Debug)]
struct Rank {
    node: String,
    gpu: u32,
    pid: u32,
    offsets: Vec<u64>,
    need: RankNeed,
}

/// An attempt the kubelet runs (one batch/v1 Job).
struct Run {
    namespace: String,
    job: String,
    /// `namespace/pod` per node.
    pods: Vec<(String, String)>,
    ranks: Vec<Rank>,
    record: usize,
    task: Option<tokio::task::AbortHandle>,
}

/// What the kubelet, the trainers and the agents share.
pub struct World {
    pub nodes: BTreeMap<String, Node>,
    runs: HashMap<String, Run>,
    /// The runs with a pod on each node (uids): what an agent's probe reads
    /// without walking every run of the cluster.
    on_node: HashMap<String, std::collections::HashSet<String>>,
    /// Job uids already run (a relist must not start them again).
    seen: HashMap<String, ()>,
    next_pid: u32,
}

impl World {
    pub fn new(nodes: &[NodeSpec]) -> Result<World, String> {
        let mut map = BTreeMap::new();
        for n in nodes {
            map.insert(n.name.clone(), Node::new(n)?);
        }
        Ok(World {
            nodes: map,
            runs: HashMap::new(),
            on_node: HashMap::new(),
            seen: HashMap::new(),
            next_pid: 1000,
        })
    }

    /// Attempts running now.
    pub fn running(&self) -> usize {
        self.runs.len()
    }

    /// GPUs with at least one trainer on them.
    pub fn busy_gpus(&self) -> u64 {
        let mut busy: HashMap<(&str, u32), ()> = HashMap::new();
        for r in self.runs.values() {
            for k in &r.ranks {
                busy.insert((k.node.as_str(), k.gpu), ());
            }
        }
        busy.len() as u64
    }

    /// Which pods hold which GPUs on a node, as the kubelet's pod-resources
    /// API tells the agent (time-sliced: several pods may share a GPU).
    fn assignments(&self, node: &str) -> Assignments {
        let mut by_index: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        let here = self.on_node.get(node);
        for r in here
            .into_iter()
            .flatten()
            .filter_map(|uid| self.runs.get(uid))
        {
            for (pod, pod_node) in &r.pods {
                if pod_node != node {
                    continue;
                }
                for k in r.ranks.iter().filter(|k| k.node == node) {
                    by_index.entry(k.gpu).or_default().push(pod.clone());
                }
            }
        }
        Assignments {
            by_uuid: BTreeMap::new(),
            by_index: by_index
                .into_iter()
                .map(|(i, mut pods)| {
                    pods.sort();
                    pods.dedup();
                    (
                        i,
                        Assignment {
                            pod: pods.join(","),
                            shared: true,
                        },
                    )
                })
                .collect(),
        }
    }

    fn insert_run(&mut self, uid: String, run: Run) {
        for (_, node) in &run.pods {
            self.on_node
                .entry(node.clone())
                .or_default()
                .insert(uid.clone());
        }
        self.runs.insert(uid, run);
    }

    fn remove_run(&mut self, uid: &str) -> Option<Run> {
        let run = self.runs.remove(uid)?;
        for (_, node) in &run.pods {
            if let Some(set) = self.on_node.get_mut(node) {
                set.remove(uid);
            }
        }
        Some(run)
    }

    /// The other attempts on a GPU: what each uses and holds.
    fn neighbours(&self, node: &str, gpu: u32, me: &str, records: &Records) -> Vec<String> {
        let Some(n) = self.nodes.get(node) else {
            return Vec::new();
        };
        let sim = n.sim();
        let Some(alloc) = sim.allocator(gpu) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (uid, r) in &self.runs {
            if uid == me {
                continue;
            }
            let run = &records.runs[r.record];
            for k in r.ranks.iter().filter(|k| k.node == node && k.gpu == gpu) {
                out.push(format!(
                    "{} using {} GiB of its {} GiB hold",
                    run.tj,
                    crate::estimate::gib(alloc.used_by(k.pid)),
                    crate::estimate::gib(run.reserved_bytes_per_gpu)
                ));
            }
        }
        out.sort();
        out
    }

    /// Bytes the other attempts on a GPU hold beyond their own reservation.
    fn overuse_by_others(&self, node: &str, gpu: u32, me: &str, records: &Records) -> u64 {
        let Some(n) = self.nodes.get(node) else {
            return 0;
        };
        let sim = n.sim();
        let Some(alloc) = sim.allocator(gpu) else {
            return 0;
        };
        let mut over = 0u64;
        for (uid, r) in &self.runs {
            if uid == me {
                continue;
            }
            let reserved = records.runs[r.record].reserved_bytes_per_gpu;
            for k in r.ranks.iter().filter(|k| k.node == node && k.gpu == gpu) {
                over += alloc.used_by(k.pid).saturating_sub(reserved);
            }
        }
        over
    }
}

/// Everything the simulated cluster's tasks share.
pub struct Cluster {
    pub client: Client,
    pub clock: Clock,
    pub world: Mutex<World>,
    pub records: Arc<Mutex<Records>>,
    pub prepared: Arc<Vec<Prepared>>,
    /// `namespace/name` → index in `prepared`.
    pub by_name: HashMap<String, usize>,
    pub oom_after: f64,
    /// From a Job's creation until its pods run.
    pub start_after: f64,
    pub ttl_seconds: u64,
    pub interval: f64,
    /// Each node's agent's publisher.
    pub publishers: Mutex<HashMap<String, publish::Publisher>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn time(ts: Timestamp) -> Value {
    json!(Time(ts))
}

impl Cluster {
    /// Probe and publish one node's GpuNode with the agent's code.
    pub async fn publish(&self, node: &str) {
        let status = {
            let world = lock(&self.world);
            let Some(n) = world.nodes.get(node) else {
                return;
            };
            if n.lost || !n.publishing {
                return;
            }
            let assignments = world.assignments(node);
            match n.prober.probe(&assignments, self.clock.timestamp()) {
                Ok(s) => s,
                Err(error) => {
                    tracing::warn!(node, %error, "simulated probe failed");
                    return;
                }
            }
        };
        let config = PublishConfig {
            node_name: node.to_string(),
            interval: Duration::from_secs_f64(self.interval),
            ttl_seconds: self.ttl_seconds,
            copy_taints: false,
            heartbeat: publish::default_heartbeat(self.ttl_seconds),
        };
        // The node's agent remembers the spec and status it wrote (taken out
        // while it writes: one agent task per node); None: nothing was due.
        let mut publisher = lock(&self.publishers).remove(node).unwrap_or_default();
        let written = publisher.publish(&self.client, &config, &status).await;
        lock(&self.publishers).insert(node.to_string(), publisher);
        match written {
            Ok(written) => {
                if let (Some(_), Some(n)) = (written, lock(&self.world).nodes.get_mut(node)) {
                    n.last_publish = Some(self.clock.secs());
                }
            }
            Err(error) => tracing::warn!(node, %error, "simulated publish failed"),
        }
    }

    /// Every rank of the run allocates its persistent state (`peak` false)
    /// or its peak; the OOM message of the first rank that cannot.
    fn allocate(&self, uid: &str, peak: bool) -> Option<String> {
        let records = lock(&self.records);
        let mut world = lock(&self.world);
        let world = &mut *world;
        let run = world.runs.get(uid)?;
        let ranks = run.ranks.clone();
        let mut updated = Vec::new();
        let mut failure = None;
        let mut oom_context = None;
        for mut k in ranks {
            let Some(node) = world.nodes.get(&k.node) else {
                continue;
            };
            let bytes = if peak {
                k.need.peak_bytes
            } else {
                k.need.persistent_bytes
            };
            if bytes == 0 {
                updated.push(k);
                continue;
            }
            let mut sim = node.sim();
            // Pages mapped into the trainer's own address range: another
            // process's blocks between free ones do not split it.
            match sim.alloc_pages(k.gpu, k.pid, bytes) {
                Some(o) => {
                    k.offsets.extend(o);
                    updated.push(k);
                }
                None => {
                    let capacity = capacity_bytes(node.spec.product);
                    let free = sim.allocator(k.gpu).map(|a| a.free_bytes()).unwrap_or(0);
                    let in_use = sim.allocator(k.gpu).map(|a| a.used_by(k.pid)).unwrap_or(0);
                    let context = sim.context_bytes(k.gpu).unwrap_or(0);
                    let (holes, largest) = sim
                        .allocator(k.gpu)
                        .map(|a| (a.holes().len(), a.largest_hole()))
                        .unwrap_or((0, 0));
                    drop(sim);
                    let over = world.overuse_by_others(&k.node, k.gpu, uid, &records);
                    let neighbours = world.neighbours(&k.node, k.gpu, uid, &records);
                    oom_context = Some(format!(
                        "on {} GPU {}: {} free in {holes} hole(s), the largest {}; beside it {}",
                        k.node,
                        k.gpu,
                        crate::estimate::gib(free),
                        crate::estimate::gib(largest),
                        if neighbours.is_empty() {
                            "nothing".to_string()
                        } else {
                            neighbours.join(", ")
                        }
                    ));
                    failure = Some((
                        truth::torch_oom(
                            k.gpu,
                            bytes,
                            capacity,
                            free,
                            in_use,
                            in_use.saturating_sub(context),
                        ),
                        over,
                    ));
                    updated.push(k);
                    break;
                }
            }
        }
        let record = run.record;
        if let Some(r) = world.runs.get_mut(uid) {
            for k in updated {
                if let Some(slot) = r.ranks.iter_mut().find(|x| x.pid == k.pid) {
                    *slot = k;
                }
            }
        }
        drop(records);
        let (message, over) = failure?;
        let mut records = lock(&self.records);
        records.runs[record].overuse_by_others = over;
        records.runs[record].oom_context = oom_context;
        Some(message)
    }

    /// The attempt ends: memory freed, pods and Job report the outcome.
    pub async fn finish(&self, uid: &str, outcome: Outcome, message: String) {
        let run = {
            let mut world = lock(&self.world);
            let Some(run) = world.remove_run(uid) else {
                return;
            };
            for k in &run.ranks {
                if let Some(n) = world.nodes.get(&k.node) {
                    n.sim().exit(k.gpu, k.pid, &k.offsets);
                }
            }
            run
        };
        let now = self.clock.secs();
        {
            let mut records = lock(&self.records);
            let r = &mut records.runs[run.record];
            r.end = Some(now);
            r.outcome = outcome;
            if outcome == Outcome::Oom {
                r.oom_message = Some(message.clone());
            }
        }
        if outcome == Outcome::Stopped {
            return;
        }
        let ts = self.clock.timestamp();
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &run.namespace);
        let (phase, exit, reason) = match outcome {
            Outcome::Succeeded => ("Succeeded", 0, "Completed"),
            Outcome::NodeLost => ("Failed", 137, "ContainerStatusUnknown"),
            _ => ("Failed", 1, "Error"),
        };
        for (i, (pod, _)) in run.pods.iter().enumerate() {
            let name = pod.rsplit('/').next().unwrap_or(pod);
            // The failing rank's pod carries the message; the others were
            // torn down by the launcher.
            let text = if i == 0 { message.as_str() } else { "" };
            let status = json!({"status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": "trainer", "ready": false, "restartCount": 0,
                    "image": "registry.example/trainer:sim", "imageID": "", "started": false,
                    "state": {"terminated": {"exitCode": exit, "reason": reason, "message": text,
                                             "finishedAt": time(ts)}}
                }]
            }});
            let _ = pods_api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
        let jobs_api: Api<Job> = Api::namespaced(self.client.clone(), &run.namespace);
        let n = run.pods.len();
        let status = if outcome == Outcome::Succeeded {
            json!({"status": {"active": 0, "ready": 0, "succeeded": n, "completionTime": time(ts),
                "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": time(ts)}]}})
        } else {
            json!({"status": {"active": 0, "ready": 0, "failed": n,
                "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit", "lastTransitionTime": time(ts)}]}})
        };
        let _ = jobs_api
            .patch_status(&run.job, &PatchParams::default(), &Patch::Merge(&status))
            .await;
    }

    /// A Job was deleted: its trainers stop (their pods go with it).
    pub async fn job_deleted(&self, uid: &str) {
        let task = lock(&self.world)
            .runs
            .get_mut(uid)
            .and_then(|r| r.task.take());
        if let Some(t) = task {
            t.abort();
        }
        self.finish(uid, Outcome::Stopped, String::new()).await;
    }

    /// A node disappears: its trainers die with it, its agent stops.
    pub async fn lose_node(&self, node: &str) {
        let victims: Vec<String> = {
            let mut world = lock(&self.world);
            if let Some(n) = world.nodes.get_mut(node) {
                n.lost = true;
                n.publishing = false;
            }
            // In the order the attempts were recorded, not the map's: the
            // same day ends the same attempts in the same order every run.
            let mut victims: Vec<(usize, String)> = world
                .runs
                .iter_mut()
                .filter(|(_, r)| r.ranks.iter().any(|k| k.node == node))
                .map(|(uid, r)| {
                    if let Some(t) = r.task.take() {
                        t.abort();
                    }
                    (r.record, uid.clone())
                })
                .collect();
            victims.sort_unstable();
            victims.into_iter().map(|(_, uid)| uid).collect()
        };
        for uid in victims {
            self.finish(
                &uid,
                Outcome::NodeLost,
                format!("node {node} was lost with the pod on it"),
            )
            .await;
        }
    }
}
