//! The same scenario with vramguard switched off: every job is admitted as
//! written and placed by GPU count, as the default scheduler places pods
//! asking for `nvidia.com/gpu` (whole GPUs, first node with enough free);
//! a batch/v1 Job restarts a failed pod with back-off (10 s doubling, capped
//! at 6 minutes) up to its default `backoffLimit` of 6. A trainer whose
//! true need does not fit its GPU dies of OOM when its step reaches the
//! peak. A plain discrete-event loop: no API server, nothing to restart, so
//! the operator and agent faults do not touch it; lost nodes do.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use serde::Serialize;

use super::scenario::{Fault, Scenario};
use super::{Prepared, capacity_bytes};
use crate::api::ValidatedJob;

/// batch/v1 Job's default `backoffLimit`.
pub const BACKOFF_LIMIT: u32 = 6;
const BACKOFF_FIRST_SECS: f64 = 10.0;
const BACKOFF_MAX_SECS: f64 = 360.0;

/// What the baseline run came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Baseline {
    pub submitted: u64,
    /// Jobs with at least one attempt that died of GPU OOM.
    pub oomed: u64,
    /// Attempts that died of GPU OOM.
    pub oom_attempts: u64,
    pub succeeded: u64,
    /// Back-off limit reached (every attempt OOMed or its node was lost).
    pub failed: u64,
    /// Specs the trainer cannot run at all (invalid).
    pub invalid: u64,
    /// Never started before the scenario ended.
    pub never_ran: u64,
    /// Still running when the scenario ended.
    pub running_at_end: u64,
    /// Started only after waiting for GPUs.
    pub waited: u64,
    pub gpu_hours_used: f64,
    /// GPU time of attempts that ended in an OOM.
    pub gpu_hours_lost_to_oom: f64,
    /// Mean fraction of all GPU memory in use by trainers, over the run.
    pub mean_memory_utilisation: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ev {
    Arrive(usize),
    Retry(usize),
    Peak(usize),
    End(usize),
    NodeLost(usize),
}

#[derive(Clone, Copy, Debug)]
struct Timed {
    at: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    // Earliest first in a max-heap.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

struct Attempt {
    job: usize,
    /// (node, GPUs taken there).
    gpus: Vec<(usize, u32)>,
    start: f64,
    /// Bytes the attempt's trainers hold, all ranks together.
    held_bytes: f64,
    /// Bytes added when the step reaches its peak.
    peak_bytes: f64,
    ooms: bool,
    live: bool,
}

struct Node {
    free: u32,
    alive: bool,
}

/// Run the baseline.
pub fn run(scenario: &Scenario, prepared: &[Prepared]) -> Baseline {
    let mut sim = Sim::new(scenario, prepared);
    while let Some(t) = sim.heap.pop() {
        if t.at > scenario.horizon {
            break;
        }
        sim.memory_integral += sim.held * (t.at - sim.now);
        sim.now = t.at;
        sim.play(t.ev);
        sim.place_waiting();
    }
    sim.finish()
}

/// The baseline as its events are played: the nodes' free GPUs, the
/// attempts, the queue of jobs waiting for GPUs and the counts so far.
struct Sim<'a> {
    scenario: &'a Scenario,
    prepared: &'a [Prepared],
    out: Baseline,
    nodes: Vec<Node>,
    heap: BinaryHeap<Timed>,
    /// Events pushed so far: ties in time play in push order.
    seq: u64,
    /// Jobs waiting for GPUs, in arrival (or retry) order.
    queue: VecDeque<usize>,
    /// By job: failed attempts, ever started, waited before starting, ever OOMed.
    failures: Vec<u32>,
    started: Vec<bool>,
    waited: Vec<bool>,
    oomed: Vec<bool>,
    attempts: Vec<Attempt>,
    /// Bytes the live attempts' trainers hold, all GPUs together.
    held: f64,
    /// Time of the event being played.
    now: f64,
    /// Bytes held × seconds, for the mean utilisation.
    memory_integral: f64,
}

impl<'a> Sim<'a> {
    /// Every arrival and lost node on the heap; every GPU free.
    fn new(scenario: &'a Scenario, prepared: &'a [Prepared]) -> Sim<'a> {
        let mut sim = Sim {
            scenario,
            prepared,
            out: Baseline {
                submitted: prepared.len() as u64,
                ..Baseline::default()
            },
            nodes: scenario
                .nodes
                .iter()
                .map(|n| Node {
                    free: n.gpus,
                    alive: true,
                })
                .collect(),
            heap: BinaryHeap::new(),
            seq: 0,
            queue: VecDeque::new(),
            failures: vec![0; prepared.len()],
            started: vec![false; prepared.len()],
            waited: vec![false; prepared.len()],
            oomed: vec![false; prepared.len()],
            attempts: Vec::new(),
            held: 0.0,
            now: 0.0,
            memory_integral: 0.0,
        };
        let by_name: BTreeMap<&str, usize> = scenario
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        for (i, p) in prepared.iter().enumerate() {
            sim.push(p.arrival.at, Ev::Arrive(i));
        }
        for (at, f) in &scenario.faults {
            if let Fault::NodeLost { node } = f
                && let Some(&n) = by_name.get(node.as_str())
            {
                sim.push(*at, Ev::NodeLost(n));
            }
        }
        sim
    }

    fn push(&mut self, at: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Timed {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// One event at `self.now`.
    fn play(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive(j) => {
                if self.prepared[j].validated.is_none() {
                    self.out.invalid += 1;
                } else {
                    self.queue.push_back(j);
                }
            }
            Ev::Retry(j) => self.queue.push_back(j),
            Ev::Peak(a) if self.attempts[a].live && !self.attempts[a].ooms => {
                let at = &mut self.attempts[a];
                self.held += at.peak_bytes;
                at.held_bytes += at.peak_bytes;
                let end = at.start + self.prepared[at.job].arrival.duration;
                self.push(end, Ev::End(a));
            }
            Ev::Peak(a) => {
                if self.attempts[a].live {
                    self.fail(a, true);
                }
            }
            Ev::End(a) => {
                if self.attempts[a].live {
                    self.succeed(a);
                }
            }
            Ev::NodeLost(n) => {
                self.nodes[n].alive = false;
                let on: Vec<usize> = self
                    .attempts
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.live && a.gpus.iter().any(|&(m, _)| m == n))
                    .map(|(i, _)| i)
                    .collect();
                for a in on {
                    self.fail(a, false);
                }
            }
        }
    }

    /// Attempt `a` ran to its end: its GPUs free again.
    fn succeed(&mut self, a: usize) {
        let at = &mut self.attempts[a];
        at.live = false;
        self.held -= at.held_bytes;
        self.out.gpu_hours_used += (self.now - at.start) / 3600.0 * gpus_of(&at.gpus);
        for &(n, g) in &at.gpus {
            self.nodes[n].free += g;
        }
        self.out.succeeded += 1;
    }

    /// Attempt `a` died (of OOM, or with its node): its GPUs free again, and
    /// its job retried after the back-off or failed at the limit.
    fn fail(&mut self, a: usize, oom: bool) {
        let at = &mut self.attempts[a];
        at.live = false;
        self.held -= at.held_bytes;
        let hours = (self.now - at.start) / 3600.0 * gpus_of(&at.gpus);
        self.out.gpu_hours_used += hours;
        for &(n, g) in &at.gpus {
            self.nodes[n].free += g;
        }
        let j = at.job;
        if oom {
            self.out.oom_attempts += 1;
            self.out.gpu_hours_lost_to_oom += hours;
            self.oomed[j] = true;
        }
        self.failures[j] += 1;
        if self.failures[j] > BACKOFF_LIMIT {
            self.out.failed += 1;
        } else {
            let backoff =
                (BACKOFF_FIRST_SECS * 2f64.powi(self.failures[j] as i32 - 1)).min(BACKOFF_MAX_SECS);
            self.push(self.now + backoff, Ev::Retry(j));
        }
    }

    /// Place what waits, in order; what does not fit stays queued.
    fn place_waiting(&mut self) {
        let mut still = VecDeque::new();
        while let Some(j) = self.queue.pop_front() {
            if !self.start(j) {
                still.push_back(j);
            }
        }
        self.queue = still;
    }

    /// Start job `j` on the first live nodes with enough free GPUs; false
    /// when there are not enough of them (it waits).
    fn start(&mut self, j: usize) -> bool {
        let prepared = self.prepared;
        let p = &prepared[j];
        let Some(job) = p.validated.as_ref() else {
            return true;
        };
        let gpus = job.spec().parallelism.gpus;
        let per_node = job.gpus_per_node.clamp(1, gpus.max(1));
        let want_nodes = gpus.div_ceil(per_node);
        let per_node = u32::try_from(per_node).unwrap_or(u32::MAX);
        let chosen: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| self.nodes[n].alive && self.nodes[n].free >= per_node)
            .take(usize::try_from(want_nodes).unwrap_or(usize::MAX))
            .collect();
        if (chosen.len() as u64) < want_nodes {
            if !self.started[j] {
                self.waited[j] = true;
            }
            return false;
        }
        self.started[j] = true;
        for &n in &chosen {
            self.nodes[n].free -= per_node;
        }
        let (ooms, held_bytes, peak_bytes) = self.bytes_on(p, job, &chosen);
        let held_bytes = held_bytes * f64::from(per_node);
        let peak_bytes = peak_bytes * f64::from(per_node);
        self.held += held_bytes;
        let a = self.attempts.len();
        self.attempts.push(Attempt {
            job: j,
            gpus: chosen.iter().map(|&n| (n, per_node)).collect(),
            start: self.now,
            held_bytes,
            peak_bytes,
            ooms,
            live: true,
        });
        // The step reaches its peak (and dies there, if it does not fit).
        let peak_at = self.now + self.scenario.oom_after.min(p.arrival.duration);
        self.push(peak_at, Ev::Peak(a));
        true
    }

    /// What one GPU's trainer on each chosen node holds from the start and
    /// adds at its peak, summed over the nodes; true when one of them does
    /// not fit its GPU (it holds what fits until it dies at the peak).
    fn bytes_on(&self, p: &Prepared, job: &ValidatedJob, chosen: &[usize]) -> (bool, f64, f64) {
        let mut ooms = false;
        let mut held_bytes = 0.0;
        let mut peak_bytes = 0.0;
        for &n in chosen {
            let product = self.scenario.nodes[n].product;
            match p.need(job, job, product) {
                Ok(need) => {
                    let cap = capacity_bytes(product);
                    if need.total() > cap {
                        ooms = true;
                        held_bytes += need.persistent_bytes.min(cap) as f64;
                    } else {
                        held_bytes += need.persistent_bytes as f64;
                        peak_bytes += need.peak_bytes as f64;
                    }
                }
                Err(_) => ooms = true,
            }
        }
        (ooms, held_bytes, peak_bytes)
    }

    /// The counts at the end: attempts still running are charged up to the
    /// last event (or the horizon).
    fn finish(mut self) -> Baseline {
        let end = self.scenario.horizon.min(self.now.max(0.0));
        for a in self.attempts.iter().filter(|a| a.live) {
            self.out.running_at_end += 1;
            self.out.gpu_hours_used += (end - a.start).max(0.0) / 3600.0 * gpus_of(&a.gpus);
        }
        self.out.never_ran = self
            .started
            .iter()
            .zip(self.prepared)
            .filter(|(s, p)| !**s && p.validated.is_some())
            .count() as u64;
        self.out.oomed = self.oomed.iter().filter(|o| **o).count() as u64;
        self.out.waited = self.waited.iter().filter(|w| **w).count() as u64;
        let total_memory: f64 = self
            .scenario
            .nodes
            .iter()
            .map(|n| capacity_bytes(n.product) as f64 * f64::from(n.gpus))
            .sum();
        self.out.mean_memory_utilisation = if self.now > 0.0 && total_memory > 0.0 {
            self.memory_integral / self.now / total_memory
        } else {
            0.0
        };
        self.out
    }
}

fn gpus_of(gpus: &[(usize, u32)]) -> f64 {
    gpus.iter().map(|&(_, g)| f64::from(g)).sum()
}
