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
    let mut out = Baseline {
        submitted: prepared.len() as u64,
        ..Baseline::default()
    };
    let mut nodes: Vec<Node> = scenario
        .nodes
        .iter()
        .map(|n| Node {
            free: n.gpus,
            alive: true,
        })
        .collect();
    let total_memory: f64 = scenario
        .nodes
        .iter()
        .map(|n| capacity_bytes(n.product) as f64 * f64::from(n.gpus))
        .sum();
    let by_name: BTreeMap<&str, usize> = scenario
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Timed>, at: f64, ev: Ev| {
        seq += 1;
        heap.push(Timed { at, seq, ev });
    };
    for (i, p) in prepared.iter().enumerate() {
        push(&mut heap, p.arrival.at, Ev::Arrive(i));
    }
    for (at, f) in &scenario.faults {
        if let Fault::NodeLost { node } = f
            && let Some(&n) = by_name.get(node.as_str())
        {
            push(&mut heap, *at, Ev::NodeLost(n));
        }
    }
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut failures = vec![0u32; prepared.len()];
    let mut started = vec![false; prepared.len()];
    let mut waited = vec![false; prepared.len()];
    let mut oomed = vec![false; prepared.len()];
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut held = 0.0f64;
    let mut last = 0.0f64;
    let mut memory_integral = 0.0f64;
    let horizon = scenario.horizon;

    while let Some(t) = heap.pop() {
        if t.at > horizon {
            break;
        }
        memory_integral += held * (t.at - last);
        last = t.at;
        let mut fail = |a: usize,
                        attempts: &mut Vec<Attempt>,
                        nodes: &mut Vec<Node>,
                        heap: &mut BinaryHeap<Timed>,
                        held: &mut f64,
                        oom: bool,
                        out: &mut Baseline| {
            let at = &mut attempts[a];
            at.live = false;
            *held -= at.held_bytes;
            let hours = (t.at - at.start) / 3600.0 * gpus_of(&at.gpus);
            out.gpu_hours_used += hours;
            for &(n, g) in &at.gpus {
                nodes[n].free += g;
            }
            let j = at.job;
            if oom {
                out.oom_attempts += 1;
                out.gpu_hours_lost_to_oom += hours;
                oomed[j] = true;
            }
            failures[j] += 1;
            if failures[j] > BACKOFF_LIMIT {
                out.failed += 1;
            } else {
                let backoff =
                    (BACKOFF_FIRST_SECS * 2f64.powi(failures[j] as i32 - 1)).min(BACKOFF_MAX_SECS);
                push(heap, t.at + backoff, Ev::Retry(j));
            }
        };
        match t.ev {
            Ev::Arrive(j) => {
                if prepared[j].validated.is_none() {
                    out.invalid += 1;
                } else {
                    queue.push_back(j);
                }
            }
            Ev::Retry(j) => queue.push_back(j),
            Ev::Peak(a) if attempts[a].live && !attempts[a].ooms => {
                let at = &mut attempts[a];
                held += at.peak_bytes;
                at.held_bytes += at.peak_bytes;
                let end = at.start + prepared[at.job].arrival.duration;
                push(&mut heap, end, Ev::End(a));
            }
            Ev::Peak(a) => {
                if attempts[a].live {
                    fail(
                        a,
                        &mut attempts,
                        &mut nodes,
                        &mut heap,
                        &mut held,
                        true,
                        &mut out,
                    );
                }
            }
            Ev::End(a) => {
                if attempts[a].live {
                    let at = &mut attempts[a];
                    at.live = false;
                    held -= at.held_bytes;
                    out.gpu_hours_used += (t.at - at.start) / 3600.0 * gpus_of(&at.gpus);
                    for &(n, g) in &at.gpus {
                        nodes[n].free += g;
                    }
                    out.succeeded += 1;
                }
            }
            Ev::NodeLost(n) => {
                nodes[n].alive = false;
                let on: Vec<usize> = attempts
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.live && a.gpus.iter().any(|&(m, _)| m == n))
                    .map(|(i, _)| i)
                    .collect();
                for a in on {
                    fail(
                        a,
                        &mut attempts,
                        &mut nodes,
                        &mut heap,
                        &mut held,
                        false,
                        &mut out,
                    );
                }
            }
        }
        // Place what waits, in order; what does not fit stays queued.
        let mut still = VecDeque::new();
        while let Some(j) = queue.pop_front() {
            let p = &prepared[j];
            let Some(job) = p.validated.as_ref() else {
                continue;
            };
            let gpus = job.spec().parallelism.gpus;
            let per_node = job.gpus_per_node.clamp(1, gpus.max(1));
            let want_nodes = gpus.div_ceil(per_node);
            let per_node = u32::try_from(per_node).unwrap_or(u32::MAX);
            let chosen: Vec<usize> = (0..nodes.len())
                .filter(|&n| nodes[n].alive && nodes[n].free >= per_node)
                .take(usize::try_from(want_nodes).unwrap_or(usize::MAX))
                .collect();
            if (chosen.len() as u64) < want_nodes {
                if !started[j] {
                    waited[j] = true;
                }
                still.push_back(j);
                continue;
            }
            started[j] = true;
            let mut ooms = false;
            let mut held_bytes = 0.0;
            let mut peak_bytes = 0.0;
            for &n in &chosen {
                nodes[n].free -= per_node;
                let product = scenario.nodes[n].product;
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
            held_bytes *= f64::from(per_node);
            peak_bytes *= f64::from(per_node);
            held += held_bytes;
            let a = attempts.len();
            attempts.push(Attempt {
                job: j,
                gpus: chosen.iter().map(|&n| (n, per_node)).collect(),
                start: t.at,
                held_bytes,
                peak_bytes,
                ooms,
                live: true,
            });
            // The step reaches its peak (and dies there, if it does not fit).
            push(
                &mut heap,
                t.at + scenario.oom_after.min(p.arrival.duration),
                Ev::Peak(a),
            );
        }
        queue = still;
    }
    let end = horizon.min(last.max(0.0));
    for a in attempts.iter().filter(|a| a.live) {
        out.running_at_end += 1;
        out.gpu_hours_used += (end - a.start).max(0.0) / 3600.0 * gpus_of(&a.gpus);
    }
    out.never_ran = started
        .iter()
        .zip(prepared)
        .filter(|(s, p)| !**s && p.validated.is_some())
        .count() as u64;
    out.oomed = oomed.iter().filter(|o| **o).count() as u64;
    out.waited = waited.iter().filter(|w| **w).count() as u64;
    out.mean_memory_utilisation = if last > 0.0 && total_memory > 0.0 {
        memory_integral / last / total_memory
    } else {
        0.0
    };
    out
}

fn gpus_of(gpus: &[(usize, u32)]) -> f64 {
    gpus.iter().map(|&(_, g)| f64::from(g)).sum()
}
