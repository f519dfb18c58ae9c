//! Where and how an admitted job runs now: pure. The job, the inventory, the
//! reservations of other admitted jobs and what earlier runs taught (a scale
//! on every estimate) in; a decision out.
//!
//! The rule is [`crate::decide::choose`], the one the webhook promises by;
//! this module turns its choice into the operator's terms (the plan's
//! status, the placement, the bytes reserved).

use k8s_openapi::jiff::Timestamp;

use crate::api::{EstimateStatus, Placement, PlanStatus, ValidatedJob};
use crate::decide::{self, Choice, ClusterView, fallback_product};
use crate::estimate::gpus;
use crate::inventory::{self, Snapshot};
use crate::plan::{self, ReservationIndex, Settings};

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
    let estimate = crate::plan::memo::estimate(job, placed_product(&placement))
        .map_err(|e| e.to_string())?
        .status;
    Ok(Admission {
        plan,
        reserved_bytes_per_gpu: placement.reserved_bytes_per_gpu,
        placement,
        estimate,
    })
}

/// Decide for `job` over `snapshot`, given the other jobs' reservations:
/// [`decide::choose`], the rule the webhook promises by.
pub fn decide(
    job: &ValidatedJob,
    snapshot: &Snapshot,
    reservations: &ReservationIndex,
    tolerations: &[String],
    now: Timestamp,
    scale: f64,
) -> Result<Decision, String> {
    let view = ClusterView {
        snapshot,
        reservations,
        tolerations,
        now,
        scale,
    };
    match decide::choose(job, &view).map_err(|e| e.to_string())? {
        Choice::Run {
            plan,
            job: runs,
            assignment,
        } => {
            let status = match &plan {
                Some(p) => p.to_status(),
                None => Settings::of(job).to_status(Vec::new()),
            };
            admission(status, &runs, &assignment).map(|a| Decision::Admit(Box::new(a)))
        }
        Choice::Wait { reason } => Ok(Decision::Wait(reason)),
        Choice::Reject { reason, .. } => Ok(Decision::Reject(reason)),
    }
}
