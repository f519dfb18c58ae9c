//! Where and how an admitted job runs now: pure. The job, the inventory, the
//! reservations of other admitted jobs and what earlier runs taught (a scale
//! on every estimate) in; a decision out.
//!
//! Order: the job as written on the best-fitting GPUs; else, when its fit
//! policy allows changes, the cheapest plan (by the planner's cost model) of
//! each GPU product the cluster has, cheapest first, each placed over the
//! cluster as it is now; else Wait when something would fit once memory
//! frees, Reject when nothing would fit even on empty GPUs.

use k8s_openapi::jiff::Timestamp;

use crate::api::{EstimateStatus, GpuNode, Placement, PlanStatus, ValidatedJob};
use crate::estimate::{self, gpus};
use crate::inventory::{self, Snapshot};
use crate::plan::{
    self, Allowance, PlaceOutcome, Plan, ReservationIndex, Settings, place_scaled_in, scale_bytes,
};

/// What the operator does with a job now.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Admit(Box<Admission>),
    /// Something would fit once memory frees: wait, with the reason.
    Wait(String),
    /// Nothing fits even on empty GPUs, in any form the fit policy allows.
    Reject(String),
}

/// A placement and the plan it was made for.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub plan: PlanStatus,
    pub placement: Placement,
    /// The plan's estimate on the GPU product it was placed on (unscaled).
    pub estimate: EstimateStatus,
    /// Per-GPU bytes with the learnt scale and the safety margin: reserved.
    pub reserved_bytes_per_gpu: u64,
}

/// The catalog entry assumed for a GPU product the catalog does not know (as
/// the webhook assumes it).
fn fallback_product() -> &'static gpus::GpuProduct {
    gpus::find("h100-80gb").expect("the catalog has h100-80gb")
}

/// The catalog entry of the placement's first GPU (its MIG slice when on
/// one); None when the catalog does not know the product.
pub fn placed_catalog(placement: &Placement) -> Option<&'static gpus::GpuProduct> {
    let g = placement.devices.first()?.gpus.first()?;
    g.mig_profile
        .as_deref()
        .and_then(|p| inventory::catalog_product(&format!("{} {p}", g.product)))
        .or_else(|| inventory::catalog_product(&g.product))
}

/// The GPU product the estimate of a placement is reported for.
fn placed_product(placement: &Placement) -> &'static gpus::GpuProduct {
    placed_catalog(placement).unwrap_or_else(fallback_product)
}

fn admission(
    plan: PlanStatus,
    job: &ValidatedJob,
    placed: &plan::Assignment,
) -> Result<Admission, String> {
    let placement = placed.to_status();
    let estimate = estimate::estimate(job, placed_product(&placement))
        .map_err(|e| e.to_string())?
        .status;
    Ok(Admission {
        plan,
        reserved_bytes_per_gpu: placement.reserved_bytes_per_gpu,
        placement,
        estimate,
    })
}

/// Decide for `job` over `snapshot`, given the other jobs' reservations.
pub fn decide(
    job: &ValidatedJob,
    snapshot: &Snapshot,
    reservations: &ReservationIndex,
    tolerations: &[String],
    now: Timestamp,
    scale: f64,
) -> Result<Decision, String> {
    let nodes: &[GpuNode] = &snapshot.nodes[..];
    let as_written = place_scaled_in(job, nodes, reservations, tolerations, now, scale)
        .map_err(|e| e.to_string())?;
    let written_reason = match &as_written {
        PlaceOutcome::Placed(a) => {
            let plan = Settings::of(job).to_status(Vec::new());
            return admission(plan, job, a).map(|a| Decision::Admit(Box::new(a)));
        }
        PlaceOutcome::Wait { reason } => (true, reason.clone()),
        PlaceOutcome::Reject { reason } => (false, reason.clone()),
    };
    let (mut would_fit_later, reason) = written_reason;

    let allowed = Allowance::from_policy(&job.spec.fit_policy);
    if !allowed.is_empty() {
        // The cheapest plan per product, cheapest first.
        let mut plans: Vec<Plan> = Vec::new();
        for p in snapshot.products() {
            let catalog = p.catalog.unwrap_or_else(fallback_product);
            let view = plan::scaled_view(p.usable_bytes, scale);
            // The plan alone: advice is for people, and nobody reads it here.
            if let Ok(Some(plan)) = plan::cheapest_plan(job, catalog, view)
                && !plans.iter().any(|q| q.settings == plan.settings)
            {
                plans.push(plan);
            }
        }
        plans.sort_by(|a, b| {
            a.slowdown
                .partial_cmp(&b.slowdown)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        for plan in &plans {
            let shrunk = plan.apply(job);
            match place_scaled_in(&shrunk, nodes, reservations, tolerations, now, scale)
                .map_err(|e| e.to_string())?
            {
                PlaceOutcome::Placed(a) => {
                    return admission(plan.to_status(), &shrunk, &a)
                        .map(|a| Decision::Admit(Box::new(a)));
                }
                PlaceOutcome::Wait { .. } => would_fit_later = true,
                PlaceOutcome::Reject { .. } => {}
            }
        }
        if let Some(best) = plans.first()
            && would_fit_later
        {
            return Ok(Decision::Wait(format!(
                "{reason}; with {} it would fit once memory frees",
                best.changes.join(", ")
            )));
        }
    }
    let learnt = if scale > 1.0 {
        format!(
            " (estimates raised ×{scale:.2} by earlier out-of-memory deaths: {} per GPU as written)",
            estimate::gib(scale_bytes(
                estimate::estimate(job, fallback_product())
                    .map(|e| e.status.fit_per_gpu_bytes())
                    .unwrap_or(0),
                scale
            ))
        )
    } else {
        String::new()
    };
    if would_fit_later {
        Ok(Decision::Wait(format!("{reason}{learnt}")))
    } else {
        Ok(Decision::Reject(format!("{reason}{learnt}")))
    }
}
