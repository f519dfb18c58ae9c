//! The operator's Prometheus metrics (prefix `vramguard_operator`): jobs by
//! phase, placements (as written or adjusted by the shrink search), GPU and
//! host OOMs, retries, what an OOM proved against the estimate, and reconcile
//! latency. No per-job labels: phases and outcomes are bounded sets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::Phase;

/// A TrainingJob's phase as its status spells it, `New` before the first status: a
/// bounded set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

/// The label value of a phase.
pub fn phase_label(phase: Option<Phase>) -> String {
    phase
        .map(|p| super::enum_name(&p))
        .unwrap_or_else(|| "New".to_string())
}

/// How a placement's plan relates to the spec.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum PlanLabel {
    /// The spec as written.
    AsWritten,
    /// Changed by the shrink search within `fitPolicy.allow` (a shrink).
    Adjusted,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlanLabels {
    pub plan: PlanLabel,
}

/// Which memory ran out.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum OomKind {
    Gpu,
    Host,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OomLabels {
    pub kind: OomKind,
}

/// The operator's metric families; cheap to clone (each family is shared).
#[derive(Clone, Debug)]
pub struct OperatorMetrics {
    pub jobs: Family<PhaseLabels, Gauge>,
    pub placements: Family<PlanLabels, Counter>,
    pub ooms: Family<OomLabels, Counter>,
    pub oom_retries: Counter,
    pub oom_ratio: Histogram,
    pub reconcile_duration: Histogram,
    pub reconcile_errors: Counter,
    /// Each job's last counted phase, by uid: the gauge moves by one per change.
    phases: Arc<Mutex<HashMap<String, String>>>,
}

impl Default for OperatorMetrics {
    fn default() -> OperatorMetrics {
        OperatorMetrics {
            jobs: Family::default(),
            placements: Family::default(),
            ooms: Family::default(),
            oom_retries: Counter::default(),
            // What an OOM proved over the estimate: 1.0 .. ~4.
            oom_ratio: Histogram::new([0.9, 1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 2.0, 3.0, 4.0]),
            // 1 ms .. ~16 s.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            reconcile_errors: Counter::default(),
            phases: Arc::default(),
        }
    }
}

impl OperatorMetrics {
    pub fn register(registry: &mut Registry) -> OperatorMetrics {
        let m = OperatorMetrics::default();
        let r = registry.sub_registry_with_prefix("operator");
        r.register(
            "jobs",
            "TrainingJobs this replica leads, by phase",
            m.jobs.clone(),
        );
        r.register(
            "placements",
            "Jobs placed, as written or with a plan the shrink search adjusted",
            m.placements.clone(),
        );
        r.register(
            "ooms",
            "Failed attempts that ran out of GPU or host memory",
            m.ooms.clone(),
        );
        r.register(
            "oom_retries",
            "Attempts re-planned smaller after a GPU OOM",
            m.oom_retries.clone(),
        );
        r.register(
            "oom_ratio",
            "What a GPU OOM proved the attempt needed, over its estimate",
            m.oom_ratio.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time of one reconcile",
            m.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that failed and were retried",
            m.reconcile_errors.clone(),
        );
        m
    }

    /// The job `uid` is in `phase` now (`None`: it is gone).
    pub fn set_phase(&self, uid: &str, phase: Option<String>) {
        let Ok(mut phases) = self.phases.lock() else {
            return;
        };
        let before = match &phase {
            Some(p) => phases.insert(uid.to_string(), p.clone()),
            None => phases.remove(uid),
        };
        if before == phase {
            return;
        }
        if let Some(b) = before {
            self.jobs.get_or_create(&PhaseLabels { phase: b }).dec();
        }
        if let Some(p) = phase {
            self.jobs.get_or_create(&PhaseLabels { phase: p }).inc();
        }
    }

    /// Forget every job (leadership lost: another replica counts them now).
    pub fn clear_phases(&self) {
        if let Ok(mut phases) = self.phases.lock() {
            phases.clear();
        }
        self.jobs.clear();
    }

    pub fn placed(&self, adjusted: bool) {
        let plan = if adjusted {
            PlanLabel::Adjusted
        } else {
            PlanLabel::AsWritten
        };
        self.placements.get_or_create(&PlanLabels { plan }).inc();
    }

    pub fn oom(&self, kind: OomKind) {
        self.ooms.get_or_create(&OomLabels { kind }).inc();
    }

    /// A GPU OOM proved at least `observed` bytes where `estimated` were planned.
    pub fn proved(&self, observed: u64, estimated: u64) {
        if estimated > 0 {
            // Ratios of byte counts; f64's 53 bits are ample for a ratio.
            self.oom_ratio.observe(observed as f64 / estimated as f64);
        }
    }

    /// Records the reconcile's duration when dropped.
    pub fn reconcile_timer(&self) -> ReconcileTimer {
        ReconcileTimer {
            histogram: self.reconcile_duration.clone(),
            start: Instant::now(),
        }
    }
}

/// Observes the time since it was made when dropped.
pub struct ReconcileTimer {
    histogram: Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(registry: &Registry) -> String {
        crate::metrics::encode(registry).expect("the text encoding")
    }

    #[test]
    fn phases_move_one_job_at_a_time() {
        let mut registry = Registry::with_prefix("vramguard");
        let m = OperatorMetrics::register(&mut registry);
        m.set_phase("a", Some(phase_label(Some(Phase::Pending))));
        m.set_phase("b", Some(phase_label(None)));
        m.set_phase("a", Some(phase_label(Some(Phase::Admitted))));
        m.set_phase("a", Some(phase_label(Some(Phase::Admitted))));
        let out = text(&registry);
        assert!(
            out.contains("vramguard_operator_jobs{phase=\"Pending\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("vramguard_operator_jobs{phase=\"New\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("vramguard_operator_jobs{phase=\"Admitted\"} 1"),
            "{out}"
        );
        m.set_phase("a", None);
        let out = text(&registry);
        assert!(
            out.contains("vramguard_operator_jobs{phase=\"Admitted\"} 0"),
            "{out}"
        );
        m.clear_phases();
        assert!(!text(&registry).contains("vramguard_operator_jobs{"));
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut registry = Registry::with_prefix("vramguard");
        let m = OperatorMetrics::register(&mut registry);
        m.placed(true);
        m.placed(false);
        m.oom(OomKind::Gpu);
        m.oom_retries.inc();
        m.proved(120, 100);
        m.proved(1, 0);
        drop(m.reconcile_timer());
        let out = text(&registry);
        for line in [
            "vramguard_operator_placements_total{plan=\"Adjusted\"} 1",
            "vramguard_operator_placements_total{plan=\"AsWritten\"} 1",
            "vramguard_operator_ooms_total{kind=\"Gpu\"} 1",
            "vramguard_operator_oom_retries_total 1",
            "vramguard_operator_oom_ratio_count 1",
            "vramguard_operator_oom_ratio_bucket{le=\"1.2\"} 1",
            "vramguard_operator_oom_ratio_bucket{le=\"1.1\"} 0",
            "vramguard_operator_reconcile_duration_seconds_count 1",
        ] {
            assert!(out.contains(line), "{line} missing from\n{out}");
        }
    }
}
