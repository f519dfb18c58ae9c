//! A pending job: validated, then placed where it fits now with the learnt
//! scale ([`admit::decide`], the rule the webhook promises by), told to wait,
//! or rejected.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::{Cluster, Count, Effect, Error, Next, Observed, Step, as_of, finish, learnt_scale};
use crate::api::{self, Phase, Placement, TrainingJob, TrainingJobStatus};
use crate::estimate;
use crate::operator::admit::{self, Admission, Decision};
use crate::operator::conditions::{self as cond, truncate};
use crate::operator::events::Kind;
use crate::operator::ledger::Entry;
use crate::operator::render;
use crate::plan::{reservations_of, scale_bytes};

pub(super) fn step(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    seen: &Observed<'_>,
) -> Result<Step, Error> {
    let generation = tj.metadata.generation;
    let t = &seen.now;
    let job = match super::validate(tj) {
        Ok(j) => j,
        Err(message) => {
            let condition = (cond::VALIDATED, "InvalidSpec");
            return Ok(finish(tj, status, t, Phase::Rejected, condition, message));
        }
    };
    if let Err(message) = render::check_template(tj) {
        let condition = (cond::VALIDATED, "InvalidTemplate");
        return Ok(finish(tj, status, t, Phase::Rejected, condition, message));
    }
    cond::set(
        &mut status.conditions,
        cond::VALIDATED,
        true,
        "Valid",
        "the spec is valid",
        generation,
        t,
    );
    status.model = Some(job.model_name.clone());
    if seen.held {
        // Admitted already; this object is older than that decision.
        return Ok(Step::new(Next::AwaitChange));
    }
    let Cluster {
        snapshot,
        reservations,
    } = seen.cluster.ok_or(Error::NotObserved("the cluster"))?;
    let (scale, from_profile) = learnt_scale(tj, snapshot);
    let tolerations = crate::decide::tolerations(tj);
    let at = as_of(snapshot, t);
    let decision = admit::decide(&job, snapshot, reservations, &tolerations, at, scale)
        .map_err(Error::Decide)?;
    let attempt = status.oom_retries;
    match decision {
        Decision::Admit(a) => Ok(admitted(tj, status, t, &a, scale, from_profile)),
        Decision::Wait(reason) => {
            let mut s = Step::new(Next::Wait);
            s.before = vec![Effect::Waiting(true)];
            let changed = status.phase != Some(Phase::Pending)
                || status.message.as_deref() != Some(reason.as_str());
            if changed {
                status.phase = Some(Phase::Pending);
                status.message = Some(truncate(&reason, 4096));
                status.observed_generation = generation;
                cond::set(
                    &mut status.conditions,
                    cond::PLACED,
                    false,
                    "WaitingForCapacity",
                    &reason,
                    generation,
                    t,
                );
                s.status = Some(status);
                s.after = vec![Effect::Event {
                    kind: Kind::Normal,
                    reason: "WaitingForCapacity",
                    note: reason,
                }];
            }
            Ok(s)
        }
        Decision::Reject(reason) if attempt > 0 => {
            let message = format!(
                "after {attempt} out-of-memory retr{}, no plan the fit policy allows fits: {reason}",
                if attempt == 1 { "y" } else { "ies" }
            );
            let condition = (cond::PLACED, "NoSmallerPlan");
            Ok(finish(tj, status, t, Phase::Failed, condition, message))
        }
        Decision::Reject(reason) => {
            let condition = (cond::PLACED, "DoesNotFit");
            Ok(finish(tj, status, t, Phase::Rejected, condition, reason))
        }
    }
}

/// Admitted: the plan, the placement and the Job's name recorded, the hold
/// taken; the Job is made at once (the next step).
fn admitted(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    t: &Time,
    a: &Admission,
    scale: f64,
    from_profile: Option<String>,
) -> Step {
    let generation = tj.metadata.generation;
    let attempt = status.oom_retries;
    let job_name = render::job_name(&tj.name_any(), attempt);
    let mut plan = a.plan.clone();
    let adjusted = !plan.changes.is_empty();
    plan.expandable_segments = status
        .learned
        .as_ref()
        .is_some_and(|l| l.expandable_segments);
    if let Some(profile) = from_profile {
        let l = status.learned.get_or_insert(api::Learned {
            scale: 1.0,
            expandable_segments: false,
            profile: None,
        });
        l.scale = scale;
        l.profile = Some(profile);
    }
    let mut placement = a.placement.clone();
    placement.reserved_bytes_per_gpu = a.reserved_bytes_per_gpu;
    let per_gpu = format!(
        "{} GiB",
        estimate::gib(scale_bytes(a.estimate.fit_per_gpu_bytes(), scale))
    );
    let message = format!(
        "{}: {per_gpu} per GPU estimated{}{}",
        placement_words(&placement),
        if scale > 1.0 {
            format!(" (×{scale:.2} learnt)")
        } else {
            String::new()
        },
        if plan.changes.is_empty() {
            String::new()
        } else {
            format!(", with {}", plan.changes.join(", "))
        }
    );
    let reserve = Entry {
        uid: tj.uid().unwrap_or_default(),
        attempt,
        job: format!("{}/{job_name}", tj.namespace().unwrap_or_default()),
        reservations: reservations_of(&placement),
    };
    status.phase = Some(Phase::Admitted);
    status.per_gpu = Some(per_gpu);
    status.estimate = Some(a.estimate.clone());
    status.plan = Some(plan);
    status.placement = Some(placement);
    status.job_name = Some(job_name);
    status.message = None;
    status.observed_generation = generation;
    cond::set(
        &mut status.conditions,
        cond::PLACED,
        true,
        "Placed",
        &message,
        generation,
        t,
    );
    let mut s = Step::new(Next::Again);
    s.reserve = Some(reserve);
    s.status = Some(status);
    s.after = vec![
        Effect::Count(Count::Placed { adjusted }),
        Effect::Waiting(false),
        Effect::NotStarted(true),
        Effect::Event {
            kind: Kind::Normal,
            reason: "Placed",
            note: message,
        },
    ];
    s
}

/// "placed on node GPU 0,1; node-b GPU 2:1 (1g.10gb)".
pub(super) fn placement_words(p: &Placement) -> String {
    let gpus = |n: &api::PlacedNode| {
        n.gpus
            .iter()
            .map(|g| match (g.mig_index, &g.mig_profile) {
                (Some(m), Some(profile)) => format!("{}:{m} ({profile})", g.index),
                _ => g.index.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let nodes: Vec<String> = p
        .devices
        .iter()
        .map(|n| format!("{} GPU {}", n.node, gpus(n)))
        .collect();
    if nodes.is_empty() {
        format!("placed on {}", p.node)
    } else {
        format!("placed on {}", nodes.join("; "))
    }
}
