//! What the simulation saw, as it happened: admissions, every TrainingJob
//! status the operator wrote, every attempt the kubelet ran. The invariants
//! are checked here, on the fly where a moment matters (a placement on a
//! stale node, two holds on one GPU) and at the end otherwise.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::api::{Phase, TrainingJob, TrainingJobStatus};
use crate::estimate;
use crate::operator::fingerprint;
use kube::ResourceExt;

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    Running,
    Succeeded,
    Oom,
    NodeLost,
    /// Its Job was deleted while it ran.
    Stopped,
}

/// One attempt the kubelet ran.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub tj: String,
    pub attempt: u32,
    pub job: String,
    pub nodes: Vec<String>,
    pub gpus: u64,
    pub start: f64,
    pub end: Option<f64>,
    pub outcome: Outcome,
    /// What the trainer truly needed per GPU.
    pub need_per_gpu: u64,
    /// vramguard's estimate of the plan it ran, per GPU, before any learnt scale.
    pub estimated_per_gpu: u64,
    /// What the operator held for it per GPU.
    pub reserved_bytes_per_gpu: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_message: Option<String>,
    /// Bytes other attempts on its GPU held beyond their reservations when it died.
    pub overuse_by_others: u64,
    /// The GPU when it died: free bytes, holes, the neighbours' use and holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_context: Option<String>,
}

/// One job's history as the operator wrote it.
#[derive(Clone, Debug, Default)]
pub struct JobRecord {
    pub created_at: f64,
    pub fingerprint: String,
    pub max_oom_retries: u32,
    /// Seen Pending with a reason (waiting for capacity).
    pub waited: bool,
    /// (attempt, time, plan changes) of each placement.
    pub placed: Vec<(u32, f64, Vec<String>)>,
    pub phase: Option<Phase>,
    pub message: Option<String>,
    pub oom_retries: u32,
    pub learned_scale: Option<f64>,
    pub ended_at: Option<f64>,
    /// Job names the kubelet started for it, with their start times.
    pub started: Vec<(String, f64)>,
    /// Its attempts' places in [`Records::runs`].
    pub runs: Vec<usize>,
}

/// The webhook's answer to one submission.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRecord {
    pub job: String,
    pub at: f64,
    pub allowed: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One sample of the cluster.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    pub at: f64,
    /// Bytes trainers hold / the GPUs' capacity (live nodes).
    pub memory_utilisation: f64,
    pub busy_gpus: u64,
    pub running: u64,
    pub pending: u64,
}

/// An invariant's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub holds: bool,
    pub detail: String,
}

/// Names of the invariants (the keys of `invariants` in `-o json`).
pub mod invariants {
    pub const NO_OOM_UNLESS_UNDERESTIMATED: &str = "noOomUnlessTrueNeedExceedsEstimate";
    pub const RETRIES_BOUNDED_AND_LEARNT: &str = "oomRetriesBoundedAndLearnt";
    pub const NO_JOB_LOST_OR_DUPLICATED: &str = "noJobLostOrDuplicated";
    pub const NO_MEMORY_RESERVED_TWICE: &str = "noMemoryReservedTwice";
    pub const REJECTIONS_NAME_NUMBERS_AND_FIX: &str = "rejectionsNameNumbersAndAFix";
    pub const NO_STALE_GPU_NODE_TRUSTED: &str = "noStaleGpuNodeTrusted";
    pub const ALL: [&str; 6] = [
        NO_OOM_UNLESS_UNDERESTIMATED,
        RETRIES_BOUNDED_AND_LEARNT,
        NO_JOB_LOST_OR_DUPLICATED,
        NO_MEMORY_RESERVED_TWICE,
        REJECTIONS_NAME_NUMBERS_AND_FIX,
        NO_STALE_GPU_NODE_TRUSTED,
    ];
}

/// Everything recorded.
#[derive(Debug, Default)]
pub struct Records {
    pub admissions: Vec<AdmissionRecord>,
    pub jobs: HashMap<String, JobRecord>,
    pub runs: Vec<RunRecord>,
    pub timeline: Vec<(f64, String)>,
    pub samples: Vec<Sample>,
    /// Invariant → what broke it.
    pub violations: BTreeMap<&'static str, Vec<String>>,
    pub operator_restarts: u32,
    /// Holds the operator wrote, by job: (node, GPU, bytes).
    holds: HashMap<String, Vec<(String, u32, u64)>>,
    held: HashMap<(String, u32), u64>,
    /// GPU capacity by node.
    pub capacity: HashMap<String, u64>,
    /// When each fingerprint's first OOM was learnt.
    pub learnt_at: HashMap<String, f64>,
    /// Placements checked for staleness.
    pub placements_checked: u64,
}

/// `1:05:00` for scenario seconds.
pub fn clock(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

impl Records {
    pub fn violate(&mut self, invariant: &'static str, detail: String) {
        let v = self.violations.entry(invariant).or_default();
        if v.len() < 20 {
            v.push(detail);
        }
    }

    pub fn event(&mut self, at: f64, text: String) {
        self.timeline.push((at, text));
    }

    /// Record an attempt the kubelet starts; its place in [`Records::runs`].
    pub fn start_run(&mut self, run: RunRecord) -> usize {
        let (tj, job, at) = (run.tj.clone(), run.job.clone(), run.start);
        self.runs.push(run);
        let at_index = self.runs.len() - 1;
        self.note_run_start(&tj, &job, at, at_index);
        at_index
    }

    fn note_run_start(&mut self, tj: &str, job: &str, at: f64, run: usize) {
        let r = self.jobs.entry(tj.to_string()).or_default();
        r.runs.push(run);
        if let Some((other, _)) = r.started.iter().find(|(j, _)| j == job) {
            let detail = format!("{tj}: Job {other} started twice");
            self.violate(invariants::NO_JOB_LOST_OR_DUPLICATED, detail);
            return;
        }
        r.started.push((job.to_string(), at));
        // Its own attempts only: not every run of the day.
        let overlapping = r
            .runs
            .iter()
            .filter_map(|&i| self.runs.get(i))
            .filter(|x| x.outcome == Outcome::Running && x.job != job)
            .map(|x| x.job.clone())
            .collect::<Vec<_>>();
        if !overlapping.is_empty() {
            let detail = format!(
                "{tj}: {job} started while {} still ran",
                overlapping.join(", ")
            );
            self.violate(invariants::NO_JOB_LOST_OR_DUPLICATED, detail);
        }
    }

    /// A TrainingJob as the operator just wrote it, seen at `now`;
    /// `last_publish` tells when each node's agent last published.
    pub fn observe(
        &mut self,
        tj: &TrainingJob,
        now: f64,
        last_publish: &dyn Fn(&str) -> Option<f64>,
        ttl: f64,
    ) {
        let key = format!("{}/{}", tj.namespace().unwrap_or_default(), tj.name_any());
        let status = tj.status.clone().unwrap_or_default();
        let entry = self.jobs.entry(key.clone()).or_default();
        if entry.fingerprint.is_empty() {
            entry.fingerprint = fingerprint::fingerprint(&tj.spec);
            entry.max_oom_retries = tj.spec.fit_policy.max_oom_retries;
        }
        let previous_phase = entry.phase;
        entry.phase = status.phase;
        entry.message = status.message.clone();
        if status.phase == Some(Phase::Pending) && status.message.is_some() {
            entry.waited = true;
        }
        let mut events = Vec::new();
        if status.oom_retries > entry.oom_retries {
            events.push(entry.note_oom(&key, &status));
            let fp = entry.fingerprint.clone();
            self.learnt_at.entry(fp).or_insert(now);
        }
        let entry = self.jobs.get_mut(&key).expect("inserted above");
        events.extend(entry.note_end(&key, &status, now));
        let placed_now = matches!(status.phase, Some(Phase::Admitted | Phase::Running))
            && status.placement.is_some();
        let stale = placed_now
            .then(|| entry.note_placement(&key, &status, previous_phase, now, last_publish, ttl))
            .flatten();
        if let Some(stale) = stale {
            self.placements_checked += 1;
            for s in stale {
                self.violate(invariants::NO_STALE_GPU_NODE_TRUSTED, s);
            }
        }
        let holds = if placed_now {
            holds_of(&status)
        } else {
            Vec::new()
        };
        self.set_holds(&key, holds, now);
        for e in events {
            self.event(now, e);
        }
    }

    /// Replace a job's holds; a GPU held beyond its capacity is a violation.
    fn set_holds(&mut self, key: &str, holds: Vec<(String, u32, u64)>, now: f64) {
        if let Some(old) = self.holds.remove(key) {
            for (n, g, b) in old {
                if let Some(h) = self.held.get_mut(&(n, g)) {
                    *h = h.saturating_sub(b);
                }
            }
        }
        let mut over = Vec::new();
        for (n, g, b) in &holds {
            let h = self.held.entry((n.clone(), *g)).or_default();
            *h = h.saturating_add(*b);
            let cap = self.capacity.get(n).copied().unwrap_or(u64::MAX);
            if *h > cap {
                over.push(format!(
                    "at {} GPU {g} of {n} is held {} GiB by admitted jobs ({key} the last), more than its {} GiB",
                    clock(now),
                    estimate::gib(*h),
                    estimate::gib(cap)
                ));
            }
        }
        if !holds.is_empty() {
            self.holds.insert(key.to_string(), holds);
        }
        for o in over {
            self.violate(invariants::NO_MEMORY_RESERVED_TWICE, o);
        }
    }
}

impl JobRecord {
    /// The operator counted one more OOM: what it learnt, as a timeline event.
    fn note_oom(&mut self, key: &str, status: &TrainingJobStatus) -> String {
        let scale = status.learned.as_ref().map(|l| l.scale);
        self.learned_scale = scale;
        let learnt = status
            .last_oom
            .as_ref()
            .map(|o| {
                format!(
                    "estimated {} GiB per GPU, needed at least {} GiB",
                    estimate::gib(o.estimated_bytes),
                    o.observed_bytes
                        .map(estimate::gib)
                        .unwrap_or_else(|| "?".into())
                )
            })
            .unwrap_or_default();
        self.oom_retries = status.oom_retries;
        format!(
            "{key}: attempt {} ran out of GPU memory ({learnt}); learnt ×{:.2}{}",
            status.oom_retries - 1,
            scale.unwrap_or(1.0),
            if status.phase == Some(Phase::Failed) {
                ", no retries left"
            } else {
                ", retrying"
            }
        )
    }

    /// The job's first final phase: when it ended, and an event unless it
    /// succeeded.
    fn note_end(&mut self, key: &str, status: &TrainingJobStatus, now: f64) -> Option<String> {
        if !matches!(
            status.phase,
            Some(Phase::Succeeded | Phase::Failed | Phase::Rejected)
        ) || self.ended_at.is_some()
        {
            return None;
        }
        self.ended_at = Some(now);
        if status.phase == Some(Phase::Succeeded) {
            return None;
        }
        Some(format!(
            "{key}: {} — {}",
            match status.phase {
                Some(Phase::Failed) => "failed",
                _ => "rejected by the operator",
            },
            status.message.clone().unwrap_or_default()
        ))
    }

    /// A placement the job did not have (a new attempt, not the same one
    /// seen again) is noted; its nodes must have published within the TTL:
    /// those that had not. None when the placement is not new.
    fn note_placement(
        &mut self,
        key: &str,
        status: &TrainingJobStatus,
        previous_phase: Option<Phase>,
        now: f64,
        last_publish: &dyn Fn(&str) -> Option<f64>,
        ttl: f64,
    ) -> Option<Vec<String>> {
        let attempt = status.oom_retries;
        let new_placement = !self.placed.iter().any(|(a, _, _)| *a == attempt)
            && previous_phase != Some(Phase::Running);
        if !new_placement {
            return None;
        }
        let changes = status
            .plan
            .as_ref()
            .map(|p| p.changes.clone())
            .unwrap_or_default();
        self.placed.push((attempt, now, changes));
        let mut stale = Vec::new();
        if let Some(p) = &status.placement {
            for d in &p.devices {
                match last_publish(&d.node) {
                    Some(t) if now - t <= ttl => {}
                    Some(t) => stale.push(format!(
                        "{key} placed on {} at {} whose agent last published at {}",
                        d.node,
                        clock(now),
                        clock(t)
                    )),
                    None => stale.push(format!(
                        "{key} placed on {} at {}, which never published",
                        d.node,
                        clock(now)
                    )),
                }
            }
        }
        Some(stale)
    }
}

/// The holds a placed job's status states: (node, GPU, bytes) per GPU.
fn holds_of(status: &TrainingJobStatus) -> Vec<(String, u32, u64)> {
    status
        .placement
        .as_ref()
        .map(|p| {
            p.devices
                .iter()
                .flat_map(|d| {
                    d.gpus
                        .iter()
                        .map(|g| (d.node.clone(), g.index, p.reserved_bytes_per_gpu))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// True when a capacity denial states bytes and a way out.
pub fn names_numbers_and_fix(message: &str) -> bool {
    let numbers = ["GiB", "MiB", "bytes"].iter().any(|u| {
        message.match_indices(u).any(|(i, _)| {
            message[..i]
                .trim_end()
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_digit())
        })
    });
    let fix = [
        "allow ",
        "it would",
        "would fit",
        "needs a GPU with",
        "spread it over",
        "→",
    ]
    .iter()
    .any(|f| message.contains(f));
    numbers && fix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_needs_bytes_and_a_fix() {
        assert!(names_numbers_and_fix(
            "needs 91.2 GiB per GPU; with allow gradientCheckpointing it would: micro-batch 8 → 2"
        ));
        assert!(!names_numbers_and_fix(
            "does not fit; allow gradientCheckpointing"
        ));
        assert!(!names_numbers_and_fix("needs 91.2 GiB per GPU"));
    }
}
