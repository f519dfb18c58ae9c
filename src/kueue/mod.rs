//! A Kueue `AdmissionCheck` controller (`controllerName: vramguard.io/vram-fit`):
//! Kueue reserves quota for a `Workload` and assigns flavors; vramguard then
//! judges whether its pods fit GPU memory on the product those flavors name,
//! by the rule the webhook judges Jobs by ([`crate::webhook::workload::assess`],
//! [`crate::decide::choose`]), and sets its check's state: `Ready`, `Retry`
//! (fits the product as written but its GPUs are not free now) or `Rejected`
//! (would run out of memory as written, with the numbers and the change).
//!
//! This module is pure: the Workload, its owner, the flavors and the
//! inventory in, the check states and the status patch out.
//! [`controller`] is the edge (kube's client and runtime).
//!
//! Kueue's `kueue.x-k8s.io/v1beta1` field names, served by every Kueue from
//! v0.5 to v0.17 (where v1beta2 is stored and v1beta1 still served):
//! `status.admissionChecks[] {name, state, lastTransitionTime, message,
//! requeueAfterSeconds}`, `status.admission.podSetAssignments[] {name,
//! flavors}`, `spec.podSets[] {name, count, template}`, a ResourceFlavor's
//! `spec.nodeLabels`, an AdmissionCheck's `spec.controllerName`.

pub mod controller;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::inventory::Snapshot;
use crate::kinds::{self, Kind};
use crate::webhook::metrics::Reason;
use crate::webhook::workload::{Assessment, assess};

/// The controller name vramguard's AdmissionChecks carry.
pub const CONTROLLER_NAME: &str = "vramguard.io/vram-fit";
/// Kueue's API group and the version read and written.
pub const GROUP: &str = "kueue.x-k8s.io";
pub const VERSION: &str = "v1beta1";
/// The version whose rules Kueue v0.15 and later store and validate Workloads by.
pub const STORAGE_VERSION: &str = "v1beta2";

/// The version a Workload's status is written in, of the group's `served` versions:
/// v1beta2 where served, else v1beta1. Kueue v0.17's v1beta1 rule
/// `oldSelf.spec.priorityClassSource == self.spec.priorityClassSource` fails ("no such
/// key") on a Workload stored as v1beta2 without a priority class once quota is reserved,
/// so a v1beta1 status write there is refused; v1beta2's rules guard with `has()`. The
/// fields written (`status.admissionChecks[]`) are spelled alike in both.
pub fn status_version<'a>(served: impl IntoIterator<Item = &'a str>) -> &'static str {
    if served.into_iter().any(|v| v == STORAGE_VERSION) {
        STORAGE_VERSION
    } else {
        VERSION
    }
}

/// Longest message written to a check (Kueue allows 32 768 bytes; a person reads this).
pub const MAX_MESSAGE: usize = 4096;

/// A check's state, as Kueue spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckState {
    Pending,
    Ready,
    Retry,
    Rejected,
}

impl CheckState {
    pub fn name(self) -> &'static str {
        match self {
            CheckState::Pending => "Pending",
            CheckState::Ready => "Ready",
            CheckState::Retry => "Retry",
            CheckState::Rejected => "Rejected",
        }
    }
}

/// What vramguard says of one Workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub state: CheckState,
    pub message: String,
}

fn str_at<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path).and_then(Value::as_str)
}

/// Whether an AdmissionCheck is one of vramguard's.
pub fn is_ours(admission_check: &Value) -> bool {
    str_at(admission_check, "/spec/controllerName") == Some(CONTROLLER_NAME)
}

/// The checks of `ours` the Workload lists in state `Pending`.
pub fn pending_checks(workload: &Value, ours: &BTreeSet<String>) -> Vec<String> {
    workload
        .pointer("/status/admissionChecks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| str_at(c, "/state") == Some(CheckState::Pending.name()))
        .filter_map(|c| str_at(c, "/name"))
        .filter(|n| ours.contains(*n))
        .map(str::to_string)
        .collect()
}

/// Whether Kueue has reserved quota: `status.admission` with pod set assignments.
pub fn quota_reserved(workload: &Value) -> bool {
    workload
        .pointer("/status/admission/podSetAssignments")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// Whether Kueue is done with the Workload (finished, or admitted and running).
pub fn finished(workload: &Value) -> bool {
    workload
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| str_at(c, "/type") == Some("Finished") && str_at(c, "/status") == Some("True"))
}

/// Whether the Workload is active: Kueue sets `spec.active: false` when it deactivates one
/// (a check Rejected, say); its checks are reset to `Pending` while its quota is released,
/// and are not vramguard's to judge again.
pub fn active(workload: &Value) -> bool {
    workload.pointer("/spec/active") != Some(&Value::Bool(false))
}

/// The flavor each pod set was assigned for its GPUs: the flavor of
/// `nvidia.com/gpu`, else of a MIG resource, else of any resource.
pub fn assigned_flavors(workload: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for a in workload
        .pointer("/status/admission/podSetAssignments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(name), Some(flavors)) = (
            str_at(a, "/name"),
            a.get("flavors").and_then(Value::as_object),
        ) else {
            continue;
        };
        let flavor = flavors
            .get(kinds::GPU_RESOURCE)
            .or_else(|| {
                flavors
                    .iter()
                    .find(|(k, _)| k.starts_with("nvidia.com/mig-"))
                    .map(|(_, v)| v)
            })
            .or_else(|| flavors.values().next())
            .and_then(Value::as_str);
        if let Some(f) = flavor {
            out.insert(name.to_string(), f.to_string());
        }
    }
    out
}

/// The GPU product a ResourceFlavor's node labels name (GPU Feature
/// Discovery's `nvidia.com/gpu.product`).
pub fn flavor_product(flavor: &Value) -> Option<String> {
    flavor
        .pointer("/spec/nodeLabels")
        .and_then(|l| l.get(kinds::PRODUCT_LABEL))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The Workload's controlling owner: (apiVersion, kind, name).
pub fn owner(workload: &Value) -> Option<(String, String, String)> {
    workload
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller") == Some(&Value::Bool(true)))
        .and_then(|r| {
            Some((
                str_at(r, "/apiVersion")?.to_string(),
                str_at(r, "/kind")?.to_string(),
                str_at(r, "/name")?.to_string(),
            ))
        })
}

/// The resource (plural) of an owner vramguard reads (the chart grants `get`
/// on these): `None` for other kinds, whose Workloads are judged alone.
pub fn owner_resource(api_version: &str, kind: &str) -> Option<&'static str> {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    match (group, kind) {
        ("batch", "Job") => Some("jobs"),
        ("jobset.x-k8s.io", "JobSet") => Some("jobsets"),
        ("trainer.kubeflow.org", "TrainJob") => Some("trainjobs"),
        ("kubeflow.org", "PyTorchJob") => Some("pytorchjobs"),
        ("ray.io", "RayJob") => Some("rayjobs"),
        _ => None,
    }
}

/// The Workload as [`kinds::read`] reads it: named after its owner, with the
/// owner's `vramguard.io/training` and preset-hint annotations, and each pod
/// set's node selector naming the product of its flavor (`products`: pod
/// set name to product), as Kueue will set it when the job starts.
pub fn as_read(
    workload: &Value,
    owner: Option<&Value>,
    products: &BTreeMap<String, String>,
) -> Value {
    let mut doc = json!({
        "metadata": {
            "name": owner
                .and_then(|o| str_at(o, "/metadata/name"))
                .or_else(|| str_at(workload, "/metadata/name"))
                .unwrap_or(""),
            "namespace": str_at(workload, "/metadata/namespace").unwrap_or(""),
            "annotations": {},
        },
        "spec": {"podSets": workload.pointer("/spec/podSets").cloned().unwrap_or(Value::Null)},
    });
    let mut annotations = Map::new();
    for source in [Some(workload), owner].into_iter().flatten() {
        for key in [
            kinds::TRAINING_ANNOTATION,
            crate::api::PRESET_HINT_ANNOTATION,
        ] {
            if let Some(v) = source
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
            {
                annotations.insert(key.to_string(), v.clone());
            }
        }
    }
    doc["metadata"]["annotations"] = Value::Object(annotations);
    if let Some(sets) = doc
        .pointer_mut("/spec/podSets")
        .and_then(Value::as_array_mut)
    {
        for set in sets {
            let Some(product) = set
                .get("name")
                .and_then(Value::as_str)
                .and_then(|n| products.get(n))
                .cloned()
            else {
                continue;
            };
            let Some(spec) = set
                .pointer_mut("/template/spec")
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            let selector = spec
                .entry("nodeSelector")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = selector {
                m.insert(kinds::PRODUCT_LABEL.to_string(), Value::String(product));
            }
            // The flavor decides the product; an affinity naming others is Kueue's to honour.
            if let Some(aff) = spec.get_mut("affinity").and_then(Value::as_object_mut) {
                aff.remove("nodeAffinity");
            }
        }
    }
    doc
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The check state for what the rule said. Not judged (no annotation and no
/// trainer command vramguard reads, no GPU of the product reporting) is
/// `Ready` with the reason: the check guards memory, it does not hold jobs
/// it cannot judge.
pub fn verdict(assessment: Assessment, on: &str) -> Verdict {
    let (state, message) = match assessment {
        Assessment::Fits => (
            CheckState::Ready,
            format!("vramguard: fits {on} as written"),
        ),
        Assessment::NotNow { product, reason } => (
            CheckState::Retry,
            format!("vramguard: fits {product} as written, but not now: {reason}"),
        ),
        Assessment::NotJudged { why, .. } => (
            CheckState::Ready,
            format!("vramguard did not judge this workload: {why}"),
        ),
        Assessment::NoInventory(what) => (
            CheckState::Ready,
            format!("vramguard did not judge this workload: {what}"),
        ),
        Assessment::Allowed { reason, warnings } => (
            CheckState::Ready,
            if warnings.is_empty() {
                format!("vramguard: {}", reason_words(reason))
            } else {
                format!("vramguard: {}", warnings.join(" "))
            },
        ),
        Assessment::Denied { message, .. } => (CheckState::Rejected, message),
    };
    Verdict {
        state,
        message: cut(message),
    }
}

fn reason_words(r: Reason) -> &'static str {
    match r {
        Reason::Fits => "fits as written",
        Reason::FitsAfterChange => "fits after a change",
        _ => "allowed",
    }
}

/// Judge `workload` (owned by `owner`, its flavors `flavors` by name) against
/// `snapshot` at `now`.
pub fn judge(
    workload: &Value,
    owner: Option<&Value>,
    flavors: &BTreeMap<String, Value>,
    snapshot: &Snapshot,
    now: Timestamp,
) -> Verdict {
    let mut products = BTreeMap::new();
    for (set, flavor) in assigned_flavors(workload) {
        if let Some(p) = flavors.get(&flavor).and_then(flavor_product) {
            products.insert(set, p);
        }
    }
    let on: BTreeSet<&String> = products.values().collect();
    let on = if on.is_empty() {
        "the GPUs it may run on".to_string()
    } else {
        on.into_iter().cloned().collect::<Vec<_>>().join(" or ")
    };
    let doc = as_read(workload, owner, &products);
    verdict(assess(Kind::Workload, &doc, snapshot, now), &on)
}

/// The merge patch of `status.admissionChecks` that sets each check of
/// `verdicts` (name to verdict) and keeps the others as they are; it carries
/// the Workload's resourceVersion, so a Workload changed since it was read
/// is a conflict, not overwritten. `retry_after`: the seconds Kueue waits
/// before it queues a `Retry` again.
pub fn status_patch(
    workload: &Value,
    verdicts: &BTreeMap<String, Verdict>,
    now: Timestamp,
    retry_after: Option<u32>,
) -> Value {
    let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let checks: Vec<Value> = workload
        .pointer("/status/admissionChecks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let Some(v) = str_at(c, "/name").and_then(|n| verdicts.get(n)) else {
                return c.clone();
            };
            let mut c = c.clone();
            if let Value::Object(m) = &mut c {
                if str_at(&Value::Object(m.clone()), "/state") != Some(v.state.name()) {
                    m.insert("lastTransitionTime".into(), Value::String(stamp.clone()));
                }
                m.insert("state".into(), Value::String(v.state.name().into()));
                m.insert("message".into(), Value::String(v.message.clone()));
                match (v.state, retry_after) {
                    (CheckState::Retry, Some(s)) => {
                        m.insert("requeueAfterSeconds".into(), json!(s));
                    }
                    _ => {
                        m.remove("requeueAfterSeconds");
                    }
                }
            }
            c
        })
        .collect();
    json!({
        "metadata": {
            "resourceVersion": workload.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
        },
        "status": {"admissionChecks": checks},
    })
}

/// The Event vramguard records on a Workload whose check it sets (`kubectl describe
/// workload` lists it): Kueue resets a `Rejected` or `Retry` check to `Pending` when it
/// evicts or deactivates the Workload, and the Event is what keeps the verdict and its
/// numbers in sight.
#[derive(Clone, Debug, PartialEq)]
pub struct VerdictEvent {
    /// Warning for `Retry` and `Rejected`, Normal for `Ready`.
    pub warning: bool,
    /// `VramFit`, `VramRetry` or `VramRejected`.
    pub reason: &'static str,
    /// The verdict's message (numbers and the change).
    pub note: String,
}

/// The action the Events of [`verdict_events`] are recorded under.
pub const EVENT_ACTION: &str = "AdmissionCheck";

impl CheckState {
    /// Whether its Event is a Warning, and its reason; `None` for `Pending` (nothing decided).
    pub fn event_reason(self) -> Option<(bool, &'static str)> {
        match self {
            CheckState::Pending => None,
            CheckState::Ready => Some((false, "VramFit")),
            CheckState::Retry => Some((true, "VramRetry")),
            CheckState::Rejected => Some((true, "VramRejected")),
        }
    }
}

/// The Events for what [`status_patch`] changes: one for each distinct verdict of a check
/// whose state it changes (the check's state on `workload` differs); none when every check
/// keeps its state, so a reconcile that decides again what was decided records nothing.
pub fn verdict_events(workload: &Value, verdicts: &BTreeMap<String, Verdict>) -> Vec<VerdictEvent> {
    let mut out: Vec<VerdictEvent> = Vec::new();
    for c in workload
        .pointer("/status/admissionChecks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(v) = str_at(c, "/name").and_then(|n| verdicts.get(n)) else {
            continue;
        };
        if str_at(c, "/state") == Some(v.state.name()) {
            continue;
        }
        let Some((warning, reason)) = v.state.event_reason() else {
            continue;
        };
        let event = VerdictEvent {
            warning,
            reason,
            note: v.message.clone(),
        };
        if !out.contains(&event) {
            out.push(event);
        }
    }
    out
}

/// The merge patch that marks an AdmissionCheck of ours `Active` (Kueue
/// keeps a ClusterQueue whose checks are not active from admitting), or
/// `None` when it already is.
pub fn active_patch(admission_check: &Value, generation: i64, now: Timestamp) -> Option<Value> {
    let conditions: Vec<Value> = admission_check
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let already = conditions.iter().any(|c| {
        str_at(c, "/type") == Some("Active")
            && str_at(c, "/status") == Some("True")
            && c.get("observedGeneration").and_then(Value::as_i64) == Some(generation)
    });
    if already {
        return None;
    }
    let mut rest: Vec<Value> = conditions
        .into_iter()
        .filter(|c| str_at(c, "/type") != Some("Active"))
        .collect();
    rest.push(json!({
        "type": "Active",
        "status": "True",
        "reason": "Active",
        "message": "vramguard judges the GPU memory of workloads using this check",
        "observedGeneration": generation,
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }));
    Some(json!({"status": {"conditions": rest}}))
}

#[cfg(test)]
mod tests;
