//! Prometheus metrics of the webhook (prefix `vramguard`): reviews by verdict
//! and reason (bounded labels), review latency, inventory age, open and
//! refused connections.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// allowed | denied | invalid.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Verdict {
    Allowed,
    Denied,
    Invalid,
}

/// Why, in a bounded set.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Reason {
    /// Fits some GPU product as written.
    Fits,
    /// Fits only after an allowed change.
    FitsAfterChange,
    /// Fits nowhere in any allowed form.
    NoFit,
    /// The spec has invalid fields.
    InvalidSpec,
    /// An immutable field changed on UPDATE.
    Immutable,
    /// Not a TrainingJob, or an operation we do not judge.
    NotJudged,
    /// The review itself could not be read.
    Malformed,
    /// The body was over the limit.
    TooLarge,
    /// The cluster reports no GPUs.
    NoInventory,
}

/// The verdict on a Job, JobSet, TrainJob or PyTorchJob before enforcement,
/// with the enforcement it was answered under and its namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub enforcement: String,
    pub verdict: Verdict,
    pub reason: Reason,
    pub namespace: String,
}

/// Distinct namespaces the workload metric names; the rest are counted as `_other`.
pub const MAX_NAMESPACES: usize = 1024;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub verdict: Verdict,
    pub reason: Reason,
}

/// The webhook's metric families.
#[derive(Clone)]
pub struct Metrics {
    pub reviews: Family<ReviewLabels, Counter>,
    pub latency: Histogram,
    pub inventory_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// TLS connections open now (handshakes under way included).
    pub connections: Gauge,
    /// Connections closed at once because `connections` was at the cap.
    pub refused: Counter,
    /// Verdicts on the other kinds, by enforcement, verdict, reason and namespace.
    pub workloads: Family<WorkloadLabels, Counter>,
    /// Namespaces named in `workloads` so far (at most [`MAX_NAMESPACES`]).
    namespaces: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            reviews: Family::default(),
            // 50 µs .. ~0.8 s.
            latency: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.00005, 2.0, 15,
            )),
            inventory_age: Gauge::default(),
            connections: Gauge::default(),
            refused: Counter::default(),
            workloads: Family::default(),
            namespaces: Default::default(),
        };
        registry.register(
            "reviews",
            "Admission reviews answered, by verdict and reason",
            m.reviews.clone(),
        );
        registry.register(
            "review_duration_seconds",
            "Time to answer one admission review",
            m.latency.clone(),
        );
        registry.register(
            "inventory_age_seconds",
            "Seconds since the GPU inventory was last refreshed",
            m.inventory_age.clone(),
        );
        registry.register(
            "connections_open",
            "Connections to the webhook open now, TLS handshakes under way included",
            m.connections.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections closed at once because the open ones were at the cap",
            m.refused.clone(),
        );
        registry.register(
            "workload_verdicts",
            "Verdicts on Jobs, JobSets, TrainJobs and PyTorchJobs before enforcement, by enforcement, verdict, reason and namespace",
            m.workloads.clone(),
        );
        m
    }

    /// Count a verdict on a Job, JobSet, TrainJob or PyTorchJob of `namespace`.
    pub fn workload_verdict(
        &self,
        enforcement: crate::webhook::Enforcement,
        verdict: Verdict,
        reason: Reason,
        namespace: &str,
    ) {
        let namespace = {
            let mut seen = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
            if seen.contains(namespace) {
                namespace.to_string()
            } else if seen.len() < MAX_NAMESPACES {
                seen.insert(namespace.to_string());
                namespace.to_string()
            } else {
                "_other".to_string()
            }
        };
        self.workloads
            .get_or_create(&WorkloadLabels {
                enforcement: enforcement.name().to_string(),
                verdict,
                reason,
                namespace,
            })
            .inc();
    }
}
