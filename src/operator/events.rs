//! Events for every decision, as `events.k8s.io/v1` Events about the
//! TrainingJob (`kubectl describe trainingjob` and `kubectl get events` show
//! them). Each is one create, with no client-side cache: the operator emits
//! an event when something changes, never in a loop, so there is no series
//! to aggregate, and a cache of every event for minutes would cost memory
//! and a scan per event in proportion to the number of jobs.

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

use super::conditions::truncate;
use crate::api::TrainingJob;

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

/// Who reports.
#[derive(Clone, Debug)]
pub struct Reporter {
    /// `reportingController` (the operator's name).
    pub controller: String,
    /// `reportingInstance` (the replica).
    pub instance: String,
}

/// The Event for `tj` (pure).
pub fn event(tj: &TrainingJob, reporter: &Reporter, kind: Kind, reason: &str, note: &str) -> Event {
    let now = Timestamp::now();
    let ns = tj.namespace();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", tj.name_any(), now.as_nanosecond())),
            namespace: ns,
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        regarding: Some(tj.object_ref(&())),
        reason: Some(truncate(reason, 128)),
        action: Some(truncate(reason, 128)),
        // The API server refuses notes over 1 kB.
        note: Some(truncate(note, 1024)),
        type_: Some(
            match kind {
                Kind::Normal => "Normal",
                Kind::Warning => "Warning",
            }
            .into(),
        ),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(truncate(&reporter.instance, 128)),
        ..Event::default()
    }
}

/// Publish an Event; a failure is logged, never fatal to the decision.
pub async fn publish(
    client: &Client,
    reporter: &Reporter,
    tj: &TrainingJob,
    kind: Kind,
    reason: &str,
    note: &str,
) {
    let Some(ns) = tj.namespace() else { return };
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    let ev = event(tj, reporter, kind, reason, note);
    if let Err(error) = api.create(&PostParams::default(), &ev).await {
        tracing::warn!(%error, job = %tj.name_any(), reason, "publishing an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_object_and_stays_in_limits() {
        let mut tj = TrainingJob::new("train", Default::default());
        tj.metadata.namespace = Some("ml".into());
        tj.metadata.uid = Some("u-1".into());
        let r = Reporter {
            controller: "vramguard".into(),
            instance: "vramguard-0".into(),
        };
        let e = event(&tj, &r, Kind::Warning, "GpuOutOfMemory", &"x".repeat(5000));
        assert!(e.note.as_ref().unwrap().len() <= 1024);
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        let regarding = e.regarding.unwrap();
        assert_eq!(regarding.name.as_deref(), Some("train"));
        assert_eq!(regarding.uid.as_deref(), Some("u-1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ml"));
        assert!(e.metadata.name.unwrap().starts_with("train."));
    }
}
