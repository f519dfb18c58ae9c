//! An admitted or running job: its Job made, then followed (running,
//! complete, failed); judged again before it starts when its shape's
//! MemoryProfile learnt more than its hold holds.

use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::{Effect, Error, Next, Observed, Step, finish, own_scale, profile_name};
use crate::api::{self, Phase, TrainingJob, TrainingJobStatus};
use crate::estimate;
use crate::operator::conditions::{self as cond, truncate};
use crate::operator::events::Kind;
use crate::operator::render::{self, AttemptSpec};
use crate::plan::scale_bytes;

/// Where an attempt's Job stands.
#[derive(Clone, Debug, PartialEq)]
pub struct JobState {
    pub complete: bool,
    /// Failed: the Job's reason ("a pod failed" when a pod failed before
    /// the Job gave up).
    pub failed: Option<String>,
    /// A pod of it ran or runs.
    pub started: bool,
    /// Pods are active or ready now.
    pub active: bool,
    /// Held by a queue.
    pub suspended: bool,
}

/// Where `job` stands.
pub fn job_state(job: &Job) -> JobState {
    let js = job.status.clone().unwrap_or_default();
    let condition = |type_: &str| -> Option<JobCondition> {
        js.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == "True")
            .cloned()
    };
    let failed_condition = condition("Failed");
    let pods_failed = js.failed.unwrap_or(0) > 0;
    let failed = (failed_condition.is_some() || pods_failed).then(|| {
        failed_condition
            .and_then(|c| c.message.or(c.reason))
            .unwrap_or_else(|| "a pod failed".into())
    });
    let active = js.active.unwrap_or(0) > 0 || js.ready.unwrap_or(0) > 0;
    JobState {
        complete: condition("Complete").is_some(),
        failed,
        started: active || js.succeeded.unwrap_or(0) > 0 || pods_failed,
        active,
        suspended: job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false),
    }
}

/// What a step of an admitted or running job reads beyond its Job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wants {
    /// The attempt's pods' failure: the Job failed.
    pub failure: bool,
    /// The shape's MemoryProfile: the job is admitted and its Job has not
    /// started.
    pub profile: bool,
}

/// What the step of `tj` reads beyond its Job `job`.
pub fn wants(tj: &TrainingJob, job: &Job) -> Wants {
    if !owned(tj, job) {
        return Wants::default();
    }
    let s = job_state(job);
    let phase = tj.status.as_ref().and_then(|s| s.phase);
    Wants {
        failure: !s.complete && s.failed.is_some(),
        profile: !s.complete && s.failed.is_none() && !s.started && phase == Some(Phase::Admitted),
    }
}

/// The Job is this TrainingJob's (a Job of the same name may not be).
fn owned(tj: &TrainingJob, job: &Job) -> bool {
    job.owner_references()
        .iter()
        .any(|o| Some(&o.uid) == tj.uid().as_ref())
}

/// The name of the attempt's Job, when the status records a decision to
/// run it (None: there is no Job to read).
pub fn job_name(tj: &TrainingJob) -> Option<String> {
    let status = tj.status.as_ref()?;
    status.plan.as_ref()?;
    status.placement.as_ref()?;
    Some(
        status
            .job_name
            .clone()
            .unwrap_or_else(|| render::job_name(&tj.name_any(), status.oom_retries)),
    )
}

pub(super) fn step(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    seen: &Observed<'_>,
) -> Result<Step, Error> {
    let attempt = status.oom_retries;
    let t = &seen.now;
    let (Some(plan), Some(placement)) = (&status.plan, &status.placement) else {
        // Admitted without a decision (written by hand): decide again.
        status.phase = Some(Phase::Pending);
        let mut s = Step::new(Next::AwaitChange);
        s.status = Some(status);
        return Ok(s);
    };
    let job_name = status
        .job_name
        .clone()
        .unwrap_or_else(|| render::job_name(&tj.name_any(), attempt));
    let Some(job) = seen.job else {
        let spec = AttemptSpec {
            attempt,
            plan,
            placement,
            framework: tj.spec.training.framework,
            gpus: tj.spec.parallelism.gpus,
        };
        let rendered = match render::job(tj, &spec) {
            Ok(j) => j,
            Err(message) => {
                let condition = (cond::RUNNING, "InvalidTemplate");
                return Ok(finish(tj, status, t, Phase::Failed, condition, message));
            }
        };
        let mut s = Step::new(Next::Again);
        if render::is_multi_node(placement) {
            let svc = render::service(tj, attempt).map_err(Error::Render)?;
            s.before.push(Effect::CreateService(Box::new(svc)));
        }
        s.before.push(Effect::CreateJob {
            job: Box::new(rendered),
            note: format!("created Job {job_name} (attempt {attempt})"),
        });
        return Ok(s);
    };
    if !owned(tj, job) {
        let message = format!(
            "a Job named {job_name} exists and does not belong to this TrainingJob; delete it or rename the TrainingJob"
        );
        let condition = (cond::RUNNING, "JobNameTaken");
        return Ok(finish(tj, status, t, Phase::Failed, condition, message));
    }
    let state = job_state(job);
    if state.complete {
        return Ok(succeeded(tj, status, t, &job_name));
    }
    if let Some(job_message) = state.failed {
        return Ok(super::failed::step(
            tj,
            status,
            seen,
            &job_name,
            job_message,
        ));
    }
    if !state.started
        && status.phase == Some(Phase::Admitted)
        && let Some(s) = rejudge(tj, &status, seen, &job_name)
    {
        return Ok(s);
    }
    Ok(follow(tj, status, t, &job_name, &state))
}

fn succeeded(tj: &TrainingJob, mut status: TrainingJobStatus, t: &Time, job_name: &str) -> Step {
    let generation = tj.metadata.generation;
    status.phase = Some(Phase::Succeeded);
    status.message = None;
    let done = format!("Job {job_name} completed");
    cond::set(
        &mut status.conditions,
        cond::RUNNING,
        false,
        "Completed",
        "the job finished",
        generation,
        t,
    );
    cond::set(
        &mut status.conditions,
        cond::COMPLETE,
        true,
        "Completed",
        &done,
        generation,
        t,
    );
    let mut s = Step::new(Next::AwaitChange);
    s.status = Some(status);
    s.after = vec![
        Effect::Release,
        Effect::Event {
            kind: Kind::Normal,
            reason: "Succeeded",
            note: done,
        },
    ];
    s
}

/// Queued behind a suspended Job, or running: the status says so once.
fn follow(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    t: &Time,
    job_name: &str,
    state: &JobState,
) -> Step {
    let generation = tj.metadata.generation;
    let mut s = Step::new(Next::AwaitChange);
    if state.started {
        s.before.push(Effect::NotStarted(false));
    }
    let mut changed = false;
    if state.suspended {
        if cond::get(&status.conditions, cond::QUEUED).is_none_or(|c| c.status != "True") {
            cond::set(
                &mut status.conditions,
                cond::QUEUED,
                true,
                "Suspended",
                &format!("Job {job_name} is suspended until Kueue admits it"),
                generation,
                t,
            );
            changed = true;
        }
    } else if state.active && status.phase != Some(Phase::Running) {
        status.phase = Some(Phase::Running);
        if cond::get(&status.conditions, cond::QUEUED).is_some() {
            cond::set(
                &mut status.conditions,
                cond::QUEUED,
                false,
                "Admitted",
                "the queue admitted the Job",
                generation,
                t,
            );
        }
        cond::set(
            &mut status.conditions,
            cond::RUNNING,
            true,
            "PodsActive",
            &format!("Job {job_name} has active pods"),
            generation,
            t,
        );
        changed = true;
    }
    if changed {
        if status.phase == Some(Phase::Running) {
            s.after.push(Effect::Event {
                kind: Kind::Normal,
                reason: "Running",
                note: format!("Job {job_name} is running"),
            });
        }
        s.status = Some(status);
    }
    s
}

/// An admitted job whose pods have not started, judged again: when its
/// shape's MemoryProfile now scales its estimate past its hold, the Job is
/// deleted before it runs, the hold released, and the job goes back to
/// Pending to be placed with the lesson. None: the hold still fits.
fn rejudge(
    tj: &TrainingJob,
    status: &TrainingJobStatus,
    seen: &Observed<'_>,
    job_name: &str,
) -> Option<Step> {
    let decided = own_scale(Some(status));
    let scale = seen.profile_scale;
    let (Some(estimate), Some(placement)) = (&status.estimate, &status.placement) else {
        return None;
    };
    let needed = scale_bytes(estimate.fit_per_gpu_bytes(), scale);
    if scale <= decided || needed <= placement.reserved_bytes_per_gpu {
        return None;
    }
    let message = format!(
        "its shape's MemoryProfile learnt ×{scale:.2} after it was admitted: {} GiB per GPU is more than the {} GiB held; Job {job_name} deleted before it started, placing again",
        estimate::gib(needed),
        estimate::gib(placement.reserved_bytes_per_gpu)
    );
    let mut next = status.clone();
    let generation = tj.metadata.generation;
    let learned = next.learned.get_or_insert(api::Learned {
        scale: 1.0,
        expandable_segments: false,
        profile: None,
    });
    learned.scale = scale;
    learned.profile = Some(profile_name(tj));
    next.phase = Some(Phase::Pending);
    next.placement = None;
    next.job_name = None;
    next.message = Some(truncate(&message, 4096));
    cond::set(
        &mut next.conditions,
        cond::PLACED,
        false,
        "LearntBeforeStart",
        &message,
        generation,
        &seen.now,
    );
    let mut s = Step::new(Next::Soon);
    s.status = Some(next);
    s.after = vec![
        Effect::DeleteJob {
            name: job_name.to_string(),
        },
        Effect::NotStarted(false),
        Effect::Release,
        Effect::Event {
            kind: Kind::Normal,
            reason: "LearntBeforeStart",
            note: message,
        },
    ];
    Some(s)
}
