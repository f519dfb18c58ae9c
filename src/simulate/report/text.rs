//! The report for people: the run's header, timeline and utilisation, the
//! summary beside the baseline, the first rejections, shrinks and failures,
//! and the invariants.

use std::fmt::Write as _;

use super::super::baseline::Baseline;
use super::super::record::clock;
use super::{Report, Summary};

impl Report {
    /// The report for people.
    pub fn text(&self, timeline_lines: usize) -> String {
        let mut out = String::new();
        self.header_and_timeline(&mut out, timeline_lines);
        self.utilisation_bars(&mut out);
        let _ = writeln!(out, "\n  {:<34} {:>12} {:>12}", "", "vramguard", "baseline");
        for (k, v, w) in rows(&self.summary, &self.baseline) {
            let _ = writeln!(out, "  {k:<38} {v:>8} {w:>12}");
        }
        first_five(
            &mut out,
            "rejected at admission",
            self.rejections
                .iter()
                .map(|a| format!("{}: {}", a.job, one_line(&a.message, 400))),
        );
        first_five(
            &mut out,
            "admitted after shrinking",
            self.shrinks
                .iter()
                .map(|(k, v)| format!("{k}: {}", v.join(", "))),
        );
        first_five(
            &mut out,
            "failed",
            self.failures
                .iter()
                .map(|(k, v)| format!("{k}: {}", one_line(v, 300))),
        );
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

    /// What ran, how long it took, and the first `timeline_lines` events.
    fn header_and_timeline(&self, out: &mut String, timeline_lines: usize) {
        let s = &self.summary;
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
    }

    /// GPU memory in use over the run, about 24 bars.
    fn utilisation_bars(&self, out: &mut String) {
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
    }
}

/// The summary beside the baseline: (what, vramguard, baseline), a dash
/// where the baseline has no such count.
fn rows(s: &Summary, b: &Baseline) -> Vec<(&'static str, String, String)> {
    let dash = "-".to_string();
    vec![
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
    ]
}

/// A titled list of at most five lines, with how many more there are; nothing
/// when the list is empty.
fn first_five(out: &mut String, title: &str, lines: impl ExactSizeIterator<Item = String>) {
    let len = lines.len();
    if len == 0 {
        return;
    }
    let _ = writeln!(out, "\n{title}");
    for line in lines.take(5) {
        let _ = writeln!(out, "  {line}");
    }
    if len > 5 {
        let _ = writeln!(out, "  ... {} more", len - 5);
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
