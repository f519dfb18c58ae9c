//! The outcome of a simulation: the summary counts, the invariants with
//! their verdicts, the baseline beside them, the timeline and utilisation;
//! rendered as text for people and as JSON (`-o json`) for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::baseline::Baseline;
use super::live::Outcome;
use super::record::{
    AdmissionRecord, Outcome as RunOutcome, Sample, Verdict, clock, invariants,
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
        let r = &mut outcome.records;
        let mut s = Summary {
            submitted: r.admissions.len() as u64,
            operator_restarts: r.operator_restarts,
            simulated_seconds: end,
            wall_seconds: wall_live,
            running_at_end: outcome.running_at_end as u64,
            ..Summary::default()
        };
        let mut rejections = Vec::new();
        let mut created = Vec::new();
        for a in &r.admissions {
            if a.allowed {
                created.push(a.job.clone());
            } else {
                s.rejected_at_admission += 1;
                rejections.push(a.clone());
            }
        }
        // Rejection messages: numbers and a fix (an invalid spec: the field).
        let mut bad = Vec::new();
        for a in &rejections {
            let ok = if a.message.contains(" is invalid: ") {
                a.message.contains("spec.")
            } else {
                names_numbers_and_fix(&a.message)
            };
            if !ok {
                bad.push(format!("{}: {}", a.job, a.message));
            }
        }
        let mut shrinks = BTreeMap::new();
        let mut failures = BTreeMap::new();
        let mut lost = Vec::new();
        for name in &created {
            let Some(j) = r.jobs.get(name) else {
                lost.push(format!(
                    "{name} was admitted but the operator never wrote its status"
                ));
                continue;
            };
            let fin = outcome.final_jobs.get(name);
            if fin.is_none() {
                lost.push(format!("{name} disappeared from the API server"));
            }
            let phase = fin
                .and_then(|t| t.status.as_ref())
                .and_then(|s| s.phase)
                .or(j.phase);
            match j.placed.first() {
                Some((_, _, changes)) if changes.is_empty() => s.admitted_as_written += 1,
                Some((_, _, changes)) => {
                    s.admitted_after_shrinking += 1;
                    shrinks.insert(name.clone(), changes.clone());
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
                    failures.insert(name.clone(), j.message.clone().unwrap_or_default());
                }
                Some(Phase::Rejected) => {
                    s.rejected_by_operator += 1;
                    let m = j.message.clone().unwrap_or_default();
                    let ok = names_numbers_and_fix(&m) || m.contains("spec.");
                    if !ok {
                        bad.push(format!("{name} (operator): {m}"));
                    }
                }
                Some(Phase::Pending) | None if j.placed.is_empty() => s.never_ran += 1,
                Some(Phase::Admitted | Phase::Running) => {
                    let running = r
                        .runs
                        .iter()
                        .any(|x| &x.tj == name && x.outcome == RunOutcome::Running);
                    let last_placed = j.placed.last().map(|p| p.1).unwrap_or(0.0);
                    let just_placed = outcome.horizon_hit && end - last_placed < 600.0;
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
        }
        for l in lost {
            r.violate(invariants::NO_JOB_LOST_OR_DUPLICATED, l);
        }
        for b in bad {
            r.violate(invariants::REJECTIONS_NAME_NUMBERS_AND_FIX, b);
        }
        // Attempts: GPU hours, OOMs and whether each was excusable.
        let mut oom_jobs = BTreeMap::<String, u32>::new();
        let mut unexcused = Vec::new();
        let mut excused = 0u64;
        let mut not_prevented = Vec::new();
        for x in &r.runs {
            let stop = x.end.unwrap_or(end);
            let hours = (stop - x.start).max(0.0) / 3600.0 * x.gpus as f64;
            s.gpu_hours_used += hours;
            if x.outcome != RunOutcome::Oom {
                continue;
            }
            s.oom_attempts += 1;
            s.gpu_hours_lost_to_oom += hours;
            *oom_jobs.entry(x.tj.clone()).or_default() += 1;
            if x.need_per_gpu > x.reserved_bytes_per_gpu || x.overuse_by_others > 0 {
                excused += 1;
            } else {
                unexcused.push(format!(
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
            // A first attempt placed, or started, after its shape's OOM was
            // learnt: a job admitted before the lesson is judged again
            // before its pods start.
            if x.attempt == 0
                && let Some(j) = r.jobs.get(&x.tj)
                && let Some(&learnt) = r.learnt_at.get(&j.fingerprint)
                && (j.placed.first().is_some_and(|p| p.1 > learnt) || x.start > learnt)
            {
                not_prevented.push(format!(
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
        }
        s.oomed = oom_jobs.len() as u64;
        s.retried_after_oom = oom_jobs
            .keys()
            .filter(|k| r.jobs.get(*k).is_some_and(|j| j.placed.len() > 1))
            .count() as u64;
        let mut over_retried = Vec::new();
        for (k, n) in &oom_jobs {
            let max = r.jobs.get(k).map(|j| j.max_oom_retries).unwrap_or(0);
            if *n > max.saturating_add(1) {
                over_retried.push(format!("{k}: {n} OOMed attempts with maxOomRetries {max}"));
            }
        }
        for u in unexcused {
            r.violate(invariants::NO_OOM_UNLESS_UNDERESTIMATED, u);
        }
        for o in over_retried.into_iter().chain(not_prevented) {
            r.violate(invariants::RETRIES_BOUNDED_AND_LEARNT, o);
        }
        s.mean_memory_utilisation = if r.samples.is_empty() {
            0.0
        } else {
            r.samples.iter().map(|x| x.memory_utilisation).sum::<f64>() / r.samples.len() as f64
        };

        let details: BTreeMap<&str, String> = [
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
                    created.len(),
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
        .collect();
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
        let mut timeline: Vec<TimelineEntry> = r
            .timeline
            .iter()
            .map(|(at, e)| TimelineEntry {
                at: *at,
                event: e.clone(),
            })
            .collect();
        timeline.sort_by(|a, b| a.at.total_cmp(&b.at));
        Report {
            scenario: scenario.name.clone(),
            nodes: scenario.nodes.len(),
            gpus: scenario.gpus(),
            summary: s,
            invariants,
            baseline,
            rejections,
            shrinks,
            failures,
            timeline,
            utilisation: std::mem::take(&mut r.samples),
            wall_seconds_total: wall_total.max(0.0),
        }
    }

    /// True when every invariant holds.
    pub fn all_hold(&self) -> bool {
        self.invariants.values().all(|v| v.holds)
    }

    /// The report for people.
    pub fn text(&self, timeline_lines: usize) -> String {
        let s = &self.summary;
        let b = &self.baseline;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {}: {} nodes, {} GPUs; {} simulated in {:.1} s ({:.1} s with the baseline)",
            self.scenario,
            self.nodes,
            self.gpus,
            clock(s.simulated_seconds),
            s.wall_seconds,
            self.wall_seconds_total
        );
        let _ = writeln!(out, "\ntimeline");
        let shown = self.timeline.len().min(timeline_lines);
        for e in &self.timeline[..shown] {
            let _ = writeln!(out, "  {:>9}  {}", clock(e.at), one_line(&e.event, 160));
        }
        if self.timeline.len() > shown {
            let _ = writeln!(
                out,
                "  ... {} more (-o json has them all)",
                self.timeline.len() - shown
            );
        }
        let _ = writeln!(
            out,
            "\nGPU memory in use (trainers' bytes / capacity of live nodes)"
        );
        let step = (self.utilisation.len() / 24).max(1);
        for u in self.utilisation.iter().step_by(step) {
            let bar = (u.memory_utilisation * 40.0).round().clamp(0.0, 40.0) as usize;
            let _ = writeln!(
                out,
                "  {:>9}  {:<40} {:>3.0} %  {} GPUs busy, {} running, {} pending",
                clock(u.at),
                "#".repeat(bar),
                u.memory_utilisation * 100.0,
                u.busy_gpus,
                u.running,
                u.pending
            );
        }
        let _ = writeln!(out, "\n  {:<34} {:>12} {:>12}", "", "vramguard", "baseline");
        let dash = "-".to_string();
        let rows: Vec<(&str, String, String)> = vec![
            (
                "submitted",
                s.submitted.to_string(),
                b.submitted.to_string(),
            ),
            (
                "rejected at admission",
                s.rejected_at_admission.to_string(),
                "0".into(),
            ),
            (
                "rejected by the operator",
                s.rejected_by_operator.to_string(),
                dash.clone(),
            ),
            (
                "admitted as written",
                s.admitted_as_written.to_string(),
                b.submitted.saturating_sub(b.invalid).to_string(),
            ),
            (
                "admitted after shrinking",
                s.admitted_after_shrinking.to_string(),
                dash.clone(),
            ),
            (
                "waited for capacity",
                s.waited.to_string(),
                b.waited.to_string(),
            ),
            ("jobs that OOMed", s.oomed.to_string(), b.oomed.to_string()),
            (
                "attempts that OOMed",
                s.oom_attempts.to_string(),
                b.oom_attempts.to_string(),
            ),
            (
                "retried after OOM with what was learnt",
                s.retried_after_oom.to_string(),
                dash.clone(),
            ),
            (
                "succeeded",
                s.succeeded.to_string(),
                b.succeeded.to_string(),
            ),
            ("failed", s.failed.to_string(), b.failed.to_string()),
            (
                "never ran",
                s.never_ran.to_string(),
                b.never_ran.to_string(),
            ),
            (
                "running at the end",
                s.running_at_end.to_string(),
                b.running_at_end.to_string(),
            ),
            (
                "GPU-hours used",
                format!("{:.1}", s.gpu_hours_used),
                format!("{:.1}", b.gpu_hours_used),
            ),
            (
                "GPU-hours lost to OOM",
                format!("{:.1}", s.gpu_hours_lost_to_oom),
                format!("{:.1}", b.gpu_hours_lost_to_oom),
            ),
            (
                "mean GPU memory in use",
                format!("{:.0} %", s.mean_memory_utilisation * 100.0),
                format!("{:.0} %", b.mean_memory_utilisation * 100.0),
            ),
        ];
        for (k, v, w) in rows {
            let _ = writeln!(out, "  {k:<38} {v:>8} {w:>12}");
        }
        if !self.rejections.is_empty() {
            let _ = writeln!(out, "\nrejected at admission");
            for a in self.rejections.iter().take(5) {
                let _ = writeln!(out, "  {}: {}", a.job, one_line(&a.message, 400));
            }
            if self.rejections.len() > 5 {
                let _ = writeln!(out, "  ... {} more", self.rejections.len() - 5);
            }
        }
        if !self.shrinks.is_empty() {
            let _ = writeln!(out, "\nadmitted after shrinking");
            for (k, v) in self.shrinks.iter().take(5) {
                let _ = writeln!(out, "  {k}: {}", v.join(", "));
            }
            if self.shrinks.len() > 5 {
                let _ = writeln!(out, "  ... {} more", self.shrinks.len() - 5);
            }
        }
        if !self.failures.is_empty() {
            let _ = writeln!(out, "\nfailed");
            for (k, v) in self.failures.iter().take(5) {
                let _ = writeln!(out, "  {k}: {}", one_line(v, 300));
            }
            if self.failures.len() > 5 {
                let _ = writeln!(out, "  ... {} more", self.failures.len() - 5);
            }
        }
        let _ = writeln!(out, "\ninvariants");
        for (k, v) in &self.invariants {
            let _ = writeln!(
                out,
                "  {} {k}: {}",
                if v.holds { "holds " } else { "BROKEN" },
                one_line(&v.detail, 600)
            );
        }
        out
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.len() <= max {
        return flat;
    }
    let mut end = max;
    while !flat.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &flat[..end])
}
