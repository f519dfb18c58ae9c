//! Events of `Audit` mode: the verdict on a Job, JobSet, TrainJob or
//! PyTorchJob recorded as an Event on the object (`kubectl get events
//! --field-selector involvedObject.name=NAME`), so a team sees what vramguard
//! would have done before it denies anything.
//!
//! The review never waits on the API server: the handler puts the event in a
//! bounded queue ([`AuditEvents::record`], never blocking) and one task
//! publishes it through kube's events `Recorder` ([`run`]). A full queue
//! drops the event and counts it (`vramguard_audit_events_total{result="Dropped"}`).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

use super::decide::{Decision, truncate};
use super::metrics::Reason;
use crate::kinds::Kind;

/// Events waiting to be published; past it they are dropped and counted.
pub const QUEUE: usize = 1024;
/// Longest note (the API server refuses an Event whose note is over 1 KiB).
pub const MAX_NOTE: usize = 1024;

/// What became of an audit event.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    Published,
    /// The queue was full: not recorded.
    Dropped,
    /// The API server refused it (logged at debug).
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub result: Outcome,
}

/// One verdict to record.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditEvent {
    pub reference: ObjectReference,
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// The handler's end of the queue.
#[derive(Clone)]
pub struct AuditEvents {
    tx: mpsc::Sender<AuditEvent>,
    counts: Family<OutcomeLabels, Counter>,
}

/// The publishing task's end.
pub struct Queue {
    rx: mpsc::Receiver<AuditEvent>,
    counts: Family<OutcomeLabels, Counter>,
}

impl AuditEvents {
    /// A queue of `capacity` events, its counts registered in `registry`.
    pub fn new(registry: &mut Registry, capacity: usize) -> (AuditEvents, Queue) {
        let counts = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "audit_events",
            "Events of enforcement Audit on the judged objects, by result (Published, Dropped: the queue was full, Failed)",
            counts.clone(),
        );
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            AuditEvents {
                tx,
                counts: counts.clone(),
            },
            Queue { rx, counts },
        )
    }

    /// Queue `event` without waiting; a full queue drops it (counted).
    pub fn record(&self, event: AuditEvent) {
        if self.tx.try_send(event).is_err() {
            self.counts
                .get_or_create(&OutcomeLabels {
                    result: Outcome::Dropped,
                })
                .inc();
        }
    }

    /// How many events had `result`.
    pub fn count(&self, result: Outcome) -> u64 {
        self.counts.get_or_create(&OutcomeLabels { result }).get()
    }
}

/// The event for `decision` (before enforcement) on `obj`, a `kind`; `None`
/// for what was not judged and told nothing (no GPU, no annotation) and for
/// objects owned by a controller (their owner was judged).
pub fn event_for(kind: Kind, obj: &serde_json::Value, decision: &Decision) -> Option<AuditEvent> {
    if decision.reason == Reason::NotJudged && decision.warnings.is_empty() {
        return None;
    }
    let meta = obj.get("metadata")?;
    let s = |k: &str| meta.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let reference = ObjectReference {
        api_version: obj
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        kind: Some(kind.name().to_string()),
        namespace: s("namespace"),
        name: s("name").or_else(|| s("generateName")),
        uid: s("uid"),
        ..ObjectReference::default()
    };
    let (warning, reason, note) = if !decision.allowed {
        (
            true,
            "WouldDeny",
            format!(
                "vramguard would deny this (enforcement Audit): {}",
                decision.status.message
            ),
        )
    } else if decision.reason == Reason::Fits && decision.warnings.is_empty() {
        (
            false,
            "Fits",
            "vramguard: fits GPU memory as written (enforcement Audit)".to_string(),
        )
    } else {
        (
            false,
            match decision.reason {
                Reason::Fits => "FitsNotNow",
                _ => "NotJudged",
            },
            format!(
                "vramguard (enforcement Audit): {}",
                decision.warnings.join(" ")
            ),
        )
    };
    Some(AuditEvent {
        reference,
        warning,
        reason: reason.to_string(),
        note: truncate(note, MAX_NOTE),
    })
}

/// The Event kube's `Recorder` publishes for a verdict: Warning or Normal, `reason`,
/// `action`, and `note` cut to [`MAX_NOTE`]. The audit verdicts here and the Kueue
/// controller's check verdicts ([`crate::kueue::controller`]) are recorded with it.
pub fn recorder_event(warning: bool, reason: &str, action: &str, note: &str) -> Event {
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(truncate(note.to_string(), MAX_NOTE)),
        action: action.to_string(),
        secondary: None,
    }
}

/// Publish the queued events as `reporter` until the queue's senders are gone.
pub async fn run(client: kube::Client, reporter: Reporter, mut queue: Queue) {
    let recorder = Recorder::new(client, reporter);
    while let Some(e) = queue.rx.recv().await {
        let event = recorder_event(e.warning, &e.reason, "Admission", &e.note);
        let result = match recorder.publish(&event, &e.reference).await {
            Ok(()) => Outcome::Published,
            Err(error) => {
                tracing::debug!(%error, name = ?e.reference.name, "audit event");
                Outcome::Failed
            }
        };
        queue.counts.get_or_create(&OutcomeLabels { result }).inc();
    }
}
