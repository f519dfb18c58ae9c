//! The outcome of a simulation: the summary counts, the invariants with
//! their verdicts, the baseline beside them, the timeline and utilisation;
//! rendered as text for people (`text.rs`) and as JSON (`-o json`) for
//! machines.

mod text;

use std::collections::BTreeMap;

use serde::Serialize;

use super::baseline::Baseline;
use super::live::Outcome;
use super::record::{
    AdmissionRecord, Outcome as RunOutcome, Records, RunRecord, Sample, Verdict, clock, invariants,
    names_numbers_and_fix,
};
use super::scenario::Scenario;
use crate::api::Phase;
use crate::estimate;

/// The counts of the run with vramguard.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub submitted: u64,
    pub rejected_at_admission: u64,
    /// Admitted by the webhook, then rejected by the operator (fits no GPU
    /// the cluster has now, e.g. after a node was lost).
    pub rejected_by_operator: u64,
    pub admitted_as_written: u64,
    pub admitted_after_shrinking: u64,
    /// Waited in Pending for capacity at least once.
    pub waited: u64,
    /// Jobs with at least one attempt that died of GPU OOM.
    pub oomed: u64,
    pub oom_attempts: u64,
    /// OOMed jobs that were placed again with what was learnt.
    pub retried_after_oom: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Admitted but never placed before the end.
    pub never_ran: u64,
    pub running_at_end: u64,
    pub gpu_hours_used: f64,
    pub gpu_hours_lost_to_oom: f64,
    pub mean_memory_utilisation: f64,
    pub operator_restarts: u32,
    pub simulated_seconds: f64,
    /// Wall-clock seconds of the run with vramguard.
    pub wall_seconds: f64,
}

/// Everything a simulation reports.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub scenario: String,
    pub nodes: usize,
    pub gpus: u64,
    pub summary: Summary,
    pub invariants: BTreeMap<String, Verdict>,
    pub baseline: Baseline,
    /// Denials at admission, each with its message.
    pub rejections: Vec<AdmissionRecord>,
    /// `namespace/name` → the changes of a job admitted after shrinking.
    pub shrinks: BTreeMap<String, Vec<String>>,
    pub failures: BTreeMap<String, String>,
    pub timeline: Vec<TimelineEntry>,
    pub utilisation: Vec<Sample>,
    /// Wall-clock seconds of both runs together.
    pub wall_seconds_total: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TimelineEntry {
    pub at: f64,
    pub event: String,
}

fn verdict(violations: Option<&Vec<String>>, ok: String) -> Verdict {
    match violations {
        Some(v) if !v.is_empty() => Verdict {
            holds: false,
            detail: v.join("; "),
        },
        _ => Verdict {
            holds: true,
            detail: ok,
        },
    }
}

impl Report {
    pub fn build(
        scenario: &Scenario,
        mut outcome: Outcome,
        baseline: Baseline,
        wall_live: f64,
        wall_total: f64,
    ) -> Report {
        let end = outcome.ended_at;
        let mut t = Tally::new(&outcome, wall_live);
        t.admissions(&outcome.records.admissions);
        let created = std::mem::take(&mut t.created);
        let lost: Vec<String> = created
            .iter()
            .flat_map(|name| t.job(name, &outcome))
            .collect();
        t.created = created;
        let r = &mut outcome.records;
        for l in lost {
            r.violate(invariants::NO_JOB_LOST_OR_DUPLICATED, l);
        }
        for b in std::mem::take(&mut t.bad) {
            r.violate(invariants::REJECTIONS_NAME_NUMBERS_AND_FIX, b);
        }
        let ooms = t.attempts(r, end);
        let over_retried = over_retried(r, &ooms.by_job);
        for u in ooms.unexcused {
            r.violate(invariants::NO_OOM_UNLESS_UNDERESTIMATED, u);
        }
        for o in over_retried.into_iter().chain(ooms.not_prevented) {
            r.violate(invariants::RETRIES_BOUNDED_AND_LEARNT, o);
        }
        t.s.mean_memory_utilisation = if r.samples.is_empty() {
            0.0
        } else {
            r.samples.iter().map(|x| x.memory_utilisation).sum::<f64>() / r.samples.len() as f64
        };
        let details = t.details(r, scenario, ooms.excused);
        let invariants = invariants::ALL
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    verdict(
                        r.violations.get(name),
                        details.get(name).cloned().unwrap_or_default(),
                    ),
                )
            })
            .collect();
        Report {
            scenario: scenario.name.clone(),
            nodes: scenario.nodes.len(),
            gpus: scenario.gpus(),
            summary: t.s,
            invariants,
            baseline,
            rejections: t.rejections,
            shrinks: t.shrinks,
            failures: t.failures,
            timeline: timeline(r),
            utilisation: std::mem::take(&mut r.samples),
            wall_seconds_total: wall_total.max(0.0),
        }
    }

    /// True when every invariant holds.
    pub fn all_hold(&self) -> bool {
        self.invariants.values().all(|v| v.holds)
    }
}

/// The counts and findings of the run with vramguard, gathered from its
/// records step by step.
struct Tally {
    s: Summary,
    rejections: Vec<AdmissionRecord>,
    /// Jobs the webhook admitted and the API server created, in order.
    created: Vec<String>,
    shrinks: BTreeMap<String, Vec<String>>,
    failures: BTreeMap<String, String>,
    /// Rejections without bytes and a fix (or the invalid field).
    bad: Vec<String>,
}

/// The attempts that died of OOM.
struct Ooms {
    /// OOMed attempts by job.
    by_job: BTreeMap<String, u32>,
    /// Those whose true need exceeded the hold, or beside a neighbour over its own.
    excused: u64,
    /// Those that died with their hold intact.
    unexcused: Vec<String>,
    /// First attempts that OOMed after their shape's OOM was learnt.
    not_prevented: Vec<String>,
}

impl Tally {
    fn new(outcome: &Outcome, wall_live: f64) -> Tally {
        let r = &outcome.records;
        Tally {
            s: Summary {
                submitted: r.admissions.len() as u64,
                operator_restarts: r.operator_restarts,
                simulated_seconds: outcome.ended_at,
                wall_seconds: wall_live,
                running_at_end: outcome.running_at_end as u64,
                ..Summary::default()
            },
            rejections: Vec::new(),
            created: Vec::new(),
            shrinks: BTreeMap::new(),
            failures: BTreeMap::new(),
            bad: Vec::new(),
        }
    }

    /// The webhook's answers: what was created, what was denied, and
    /// whether each denial names numbers and a fix (an invalid spec: the field).
    fn admissions(&mut self, admissions: &[AdmissionRecord]) {
        for a in admissions {
            if a.allowed {
                self.created.push(a.job.clone());
            } else {
                self.s.rejected_at_admission += 1;
                self.rejections.push(a.clone());
            }
        }
        for a in &self.rejections {
            let ok = if a.message.contains(" is invalid: ") {
                a.message.contains("spec.")
            } else {
                names_numbers_and_fix(&a.message)
            };
            if !ok {
                self.bad.push(format!("{}: {}", a.job, a.message));
            }
        }
    }

    /// One created job: how it was admitted and how it ended; what says it
    /// was lost (no status, gone from the API server, placed with nothing
    /// running).
    fn job(&mut self, name: &str, outcome: &Outcome) -> Vec<String> {
        let r = &outcome.records;
        let Some(j) = r.jobs.get(name) else {
            return vec![format!(
                "{name} was admitted but the operator never wrote its status"
            )];
        };
        let mut lost = Vec::new();
        let fin = outcome.final_jobs.get(name);
        if fin.is_none() {
            lost.push(format!("{name} disappeared from the API server"));
        }
        let phase = fin
            .and_then(|t| t.status.as_ref())
            .and_then(|s| s.phase)
            .or(j.phase);
        let s = &mut self.s;
        match j.placed.first() {
            Some((_, _, changes)) if changes.is_empty() => s.admitted_as_written += 1,
            Some((_, _, changes)) => {
                s.admitted_after_shrinking += 1;
                self.shrinks.insert(name.to_string(), changes.clone());
            }
            None => {}
        }
        if j.waited {
            s.waited += 1;
        }
        match phase {
            Some(Phase::Succeeded) => s.succeeded += 1,
            Some(Phase::Failed) => {
                s.failed += 1;
                let m = j.message.clone().unwrap_or_default();
                self.failures.insert(name.to_string(), m);
            }
            Some(Phase::Rejected) => {
                s.rejected_by_operator += 1;
                let m = j.message.clone().unwrap_or_default();
                let ok = names_numbers_and_fix(&m) || m.contains("spec.");
                if !ok {
                    self.bad.push(format!("{name} (operator): {m}"));
                }
            }
            Some(Phase::Pending) | None if j.placed.is_empty() => s.never_ran += 1,
            Some(Phase::Admitted | Phase::Running) => {
                let running = r
                    .runs
                    .iter()
                    .any(|x| x.tj == name && x.outcome == RunOutcome::Running);
                let last_placed = j.placed.last().map(|p| p.1).unwrap_or(0.0);
                let just_placed = outcome.horizon_hit && outcome.ended_at - last_placed < 600.0;
                if !(running || just_placed) {
                    lost.push(format!(
                        "{name} is {:?} since {} with no attempt running",
                        phase.unwrap_or(Phase::Admitted),
                        clock(last_placed)
                    ));
                }
            }
            _ => {}
        }
        lost
    }

    /// Every attempt: GPU hours, OOMs and whether each was excusable.
    fn attempts(&mut self, r: &Records, end: f64) -> Ooms {
        let mut ooms = Ooms {
            by_job: BTreeMap::new(),
            excused: 0,
            unexcused: Vec::new(),
            not_prevented: Vec::new(),
        };
        for x in &r.runs {
            let stop = x.end.unwrap_or(end);
            let hours = (stop - x.start).max(0.0) / 3600.0 * x.gpus as f64;
            self.s.gpu_hours_used += hours;
            if x.outcome != RunOutcome::Oom {
                continue;
            }
            self.s.oom_attempts += 1;
            self.s.gpu_hours_lost_to_oom += hours;
            *ooms.by_job.entry(x.tj.clone()).or_default() += 1;
            if x.need_per_gpu > x.reserved_bytes_per_gpu || x.overuse_by_others > 0 {
                ooms.excused += 1;
            } else {
                ooms.unexcused.push(format!(
                    "{} attempt {} died of OOM needing {} GiB per GPU with {} GiB held for it and no neighbour over its hold{}",
                    x.tj,
                    x.attempt,
                    estimate::gib(x.need_per_gpu),
                    estimate::gib(x.reserved_bytes_per_gpu),
                    x.oom_context
                        .as_deref()
                        .map(|c| format!(" ({c})"))
                        .unwrap_or_default()
                ));
            }
            ooms.not_prevented.extend(not_prevented(r, x));
        }
        self.s.oomed = ooms.by_job.len() as u64;
        self.s.retried_after_oom = ooms
            .by_job
            .keys()
            .filter(|k| r.jobs.get(*k).is_some_and(|j| j.placed.len() > 1))
            .count() as u64;
        ooms
    }

    /// What each invariant reports when it holds.
    fn details(&self, r: &Records, scenario: &Scenario, excused: u64) -> BTreeMap<&str, String> {
        let s = &self.s;
        [
            (
                invariants::NO_OOM_UNLESS_UNDERESTIMATED,
                format!(
                    "{} OOMed attempts, each needing more than the estimate held for it ({} of them) or beside a job over its hold",
                    s.oom_attempts, excused
                ),
            ),
            (
                invariants::RETRIES_BOUNDED_AND_LEARNT,
                format!(
                    "{} jobs OOMed, none beyond maxOomRetries; {} shapes learnt, no later first attempt of one OOMed",
                    s.oomed,
                    r.learnt_at.len()
                ),
            ),
            (
                invariants::NO_JOB_LOST_OR_DUPLICATED,
                format!(
                    "{} jobs admitted, {} operator restarts: every job accounted for, no Job started twice",
                    self.created.len(),
                    r.operator_restarts
                ),
            ),
            (
                invariants::NO_MEMORY_RESERVED_TWICE,
                "no GPU was ever held beyond its capacity by the admitted jobs' reservations".into(),
            ),
            (
                invariants::REJECTIONS_NAME_NUMBERS_AND_FIX,
                format!(
                    "{} rejections, each with bytes and a change that would fit (or the invalid field)",
                    s.rejected_at_admission + s.rejected_by_operator
                ),
            ),
            (
                invariants::NO_STALE_GPU_NODE_TRUSTED,
                format!(
                    "{} placements, each on nodes whose agent had published within the TTL ({} s)",
                    r.placements_checked, scenario.agent_ttl
                ),
            ),
        ]
        .into_iter()
        .collect()
    }
}

/// A first attempt placed, or started, after its shape's OOM was learnt: a
/// job admitted before the lesson is judged again before its pods start,
/// so it must not die of OOM.
fn not_prevented(r: &Records, x: &RunRecord) -> Option<String> {
    if x.attempt == 0
        && let Some(j) = r.jobs.get(&x.tj)
        && let Some(&learnt) = r.learnt_at.get(&j.fingerprint)
        && (j.placed.first().is_some_and(|p| p.1 > learnt) || x.start > learnt)
    {
        return Some(format!(
            "{} ran out of GPU memory on its first attempt although its shape's OOM was learnt at {} (placed at {}, started at {}, needing {} GiB per GPU, estimated {} GiB, {} GiB held)",
            x.tj,
            clock(learnt),
            clock(j.placed.first().map(|p| p.1).unwrap_or(0.0)),
            clock(x.start),
            estimate::gib(x.need_per_gpu),
            estimate::gib(x.estimated_per_gpu),
            estimate::gib(x.reserved_bytes_per_gpu)
        ));
    }
    None
}

/// Jobs with more OOMed attempts than their `maxOomRetries` allows.
fn over_retried(r: &Records, by_job: &BTreeMap<String, u32>) -> Vec<String> {
    let mut over = Vec::new();
    for (k, n) in by_job {
        let max = r.jobs.get(k).map(|j| j.max_oom_retries).unwrap_or(0);
        if *n > max.saturating_add(1) {
            over.push(format!("{k}: {n} OOMed attempts with maxOomRetries {max}"));
        }
    }
    over
}

/// The timeline's events in time order.
fn timeline(r: &Records) -> Vec<TimelineEntry> {
    let mut timeline: Vec<TimelineEntry> = r
        .timeline
        .iter()
        .map(|(at, e)| TimelineEntry {
            at: *at,
            event: e.clone(),
        })
        .collect();
    timeline.sort_by(|a, b| a.at.total_cmp(&b.at));
    timeline
}
