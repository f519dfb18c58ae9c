//! One decision for admission and placement, pure (no client, no clock of its
//! own): the webhook, the operator and `vramguard estimate --cluster` ask
//! [`choose`] what becomes of a job on a cluster as they see it, so the plan
//! the webhook promises at `kubectl apply` is the plan the operator applies
//! when nothing else changed.
//!
//! The rule, in one total order:
//! 1. the job as written, on the best-fitting GPUs free now;
//! 2. else, when its fit policy allows changes, the cheapest allowed plan of
//!    each GPU product the cluster has (cheapest by the planner's slowdown,
//!    ties by product name), the first one that places now;
//! 3. else wait when something would fit once memory frees, and reject when
//!    nothing would fit even on empty GPUs.

use k8s_openapi::jiff::Timestamp;

use crate::api::{TrainingJob, ValidatedJob};
use crate::estimate::{self, EstimateError, gpus};
use crate::inventory::Snapshot;
use crate::plan::{
    self, Allowance, Assignment, PlaceOutcome, Plan, ReservationIndex, place_scaled_in, scale_bytes,
};

/// The cluster as one door sees it.
#[derive(Clone, Copy, Debug)]
pub struct ClusterView<'a> {
    /// Nodes, their GPUs and what the agents measured; learnt profiles.
    pub snapshot: &'a Snapshot,
    /// What admitted jobs hold that the agents may not see yet (the
    /// operator's ledger; empty for the webhook and the CLI).
    pub reservations: &'a ReservationIndex,
    /// Taint keys the job's pods tolerate (`*`: every taint).
    pub tolerations: &'a [String],
    /// When staleness of the agents' reports is judged.
    pub now: Timestamp,
    /// What earlier out-of-memory deaths taught: a scale on every estimate (1: none).
    pub scale: f64,
}

/// What becomes of a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// It runs now on `assignment`: as written (`plan` None) or with `plan`'s
    /// changes; `job` is what runs.
    Run {
        plan: Option<Box<Plan>>,
        job: Box<ValidatedJob>,
        assignment: Assignment,
    },
    /// Something would fit once memory frees: `reason` says what holds it.
    Wait { reason: String },
    /// No node can take it now and none would once memory frees. `plan`:
    /// the cheapest allowed plan on empty GPUs of some product, when there is
    /// one (its nodes are cordoned, tainted or silent); `None` when nothing
    /// fits even on empty GPUs in any form the fit policy allows.
    Reject {
        reason: String,
        plan: Option<Box<Plan>>,
    },
}

impl Choice {
    /// The GPU product of the first GPU it runs on, as the node reports it.
    pub fn product(&self) -> Option<&str> {
        match self {
            Choice::Run { assignment, .. } => assignment
                .nodes
                .first()
                .and_then(|n| n.gpus.first())
                .map(|g| g.product.as_str()),
            _ => None,
        }
    }
}

/// The catalog entry assumed for a GPU product the catalog does not know.
pub fn fallback_product() -> &'static gpus::GpuProduct {
    gpus::find("h100-80gb").expect("the catalog has h100-80gb")
}

/// Taint keys a TrainingJob's pods tolerate, from its pod template (`*` for
/// an `Exists` toleration without a key).
pub fn tolerations(tj: &TrainingJob) -> Vec<String> {
    let Some(list) = tj
        .spec
        .template
        .as_ref()
        .and_then(|t| t.get("spec"))
        .and_then(|s| s.get("tolerations"))
        .and_then(|t| t.as_array())
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|t| {
            let key = t.get("key").and_then(|k| k.as_str()).unwrap_or("");
            if key.is_empty() {
                (t.get("operator").and_then(|o| o.as_str()) == Some("Exists"))
                    .then(|| "*".to_string())
            } else {
                Some(key.to_string())
            }
        })
        .collect()
}

/// The cheapest allowed plan of each GPU product in `snapshot` (one per
/// distinct set of settings), in the rule's order: slowdown, then product name.
pub fn candidate_plans(
    job: &ValidatedJob,
    snapshot: &Snapshot,
    scale: f64,
) -> Result<Vec<Plan>, EstimateError> {
    if Allowance::from_policy(&job.spec().fit_policy).is_empty() {
        return Ok(Vec::new());
    }
    let mut by_name: Vec<_> = snapshot.products().iter().collect();
    by_name.sort_by(|a, b| a.product.cmp(&b.product));
    let mut plans: Vec<Plan> = Vec::new();
    for p in by_name {
        let catalog = p.catalog.unwrap_or_else(fallback_product);
        let view = plan::scaled_view(p.usable_bytes, scale);
        if let Some(found) = plan::cheapest_plan(job, catalog, view)?
            && !found.changes.is_empty()
            && !plans.iter().any(|q| q.settings == found.settings)
        {
            plans.push(found);
        }
    }
    // Stable: equal slowdowns keep the name order.
    plans.sort_by(|a, b| a.slowdown.total_cmp(&b.slowdown));
    Ok(plans)
}

/// What becomes of `job` on the cluster as `view` sees it.
pub fn choose(job: &ValidatedJob, view: &ClusterView<'_>) -> Result<Choice, EstimateError> {
    let nodes = &view.snapshot.nodes[..];
    let place = |j: &ValidatedJob| {
        place_scaled_in(
            j,
            nodes,
            view.reservations,
            view.tolerations,
            view.now,
            view.scale,
        )
    };
    let (mut would_fit_later, reason) = match place(job)? {
        PlaceOutcome::Placed(assignment) => {
            return Ok(Choice::Run {
                plan: None,
                job: Box::new(job.clone()),
                assignment,
            });
        }
        PlaceOutcome::Wait { reason } => (true, reason),
        PlaceOutcome::Reject { reason } => (false, reason),
    };
    // The cheapest plan first, by a search that stops at what cannot beat
    // the best so far; when it places now (most often) no other plan is
    // searched for. The full list, in the same order, only when it does not.
    let Some(cheapest) = cheapest_plan(job, view.snapshot, view.scale) else {
        return Ok(waiting_or_rejected(
            job,
            view,
            would_fit_later,
            reason,
            None,
        ));
    };
    // Plans come from the shrink search, which keeps only settings the job takes.
    if let Ok(shrunk) = cheapest.apply(job) {
        match place(&shrunk)? {
            PlaceOutcome::Placed(assignment) => {
                return Ok(Choice::Run {
                    plan: Some(Box::new(cheapest)),
                    job: Box::new(shrunk),
                    assignment,
                });
            }
            PlaceOutcome::Wait { .. } => would_fit_later = true,
            PlaceOutcome::Reject { .. } => {}
        }
    }
    let plans = candidate_plans(job, view.snapshot, view.scale)?;
    for plan in plans.iter().filter(|p| p.settings != cheapest.settings) {
        let Ok(shrunk) = plan.apply(job) else {
            continue;
        };
        match place(&shrunk)? {
            PlaceOutcome::Placed(assignment) => {
                return Ok(Choice::Run {
                    plan: Some(Box::new(plan.clone())),
                    job: Box::new(shrunk),
                    assignment,
                });
            }
            PlaceOutcome::Wait { .. } => would_fit_later = true,
            PlaceOutcome::Reject { .. } => {}
        }
    }
    Ok(waiting_or_rejected(
        job,
        view,
        would_fit_later,
        reason,
        Some(cheapest),
    ))
}

/// The cheapest allowed plan over the products of `snapshot` on empty GPUs
/// (least slowdown, the first product by name winning a tie), searched
/// product by product only below the best so far; `None` when no product
/// has one or the fit policy allows no change.
pub fn cheapest_plan(job: &ValidatedJob, snapshot: &Snapshot, scale: f64) -> Option<Plan> {
    let allowed = Allowance::from_policy(&job.spec().fit_policy);
    if allowed.is_empty() {
        return None;
    }
    let mut by_name: Vec<_> = snapshot.products().iter().collect();
    by_name.sort_by(|a, b| a.product.cmp(&b.product));
    let mut best: Option<Plan> = None;
    for p in by_name {
        let catalog = p.catalog.unwrap_or_else(fallback_product);
        let view = plan::scaled_view(p.usable_bytes, scale);
        let limit = best.as_ref().map_or(f64::INFINITY, |b| b.slowdown);
        if let Some(found) = plan::search_below(job, catalog, view, allowed, limit) {
            best = Some(found);
        }
    }
    best
}

/// Wait when something would fit once memory frees, else reject; `best` is
/// the cheapest plan on empty GPUs, named in the reason of a wait.
fn waiting_or_rejected(
    job: &ValidatedJob,
    view: &ClusterView<'_>,
    would_fit_later: bool,
    reason: String,
    best: Option<Plan>,
) -> Choice {
    if let Some(best) = &best
        && would_fit_later
    {
        return Choice::Wait {
            reason: format!(
                "{reason}; with {} it would fit once memory frees",
                best.changes.join(", ")
            ),
        };
    }
    let learnt = if view.scale > 1.0 {
        format!(
            " (estimates raised ×{:.2} by earlier out-of-memory deaths: {} per GPU as written)",
            view.scale,
            estimate::gib(scale_bytes(
                crate::plan::memo::estimate(job, fallback_product())
                    .map(|e| e.status.fit_per_gpu_bytes())
                    .unwrap_or(0),
                view.scale
            ))
        )
    } else {
        String::new()
    };
    let reason = format!("{reason}{learnt}");
    if would_fit_later {
        Choice::Wait { reason }
    } else {
        Choice::Reject {
            reason,
            plan: best.map(Box::new),
        }
    }
}
