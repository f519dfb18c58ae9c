//! A failed attempt, by its pods' most telling failure: a GPU OOM is learnt
//! (status and MemoryProfile) and, within `maxOomRetries`, retried smaller;
//! a host OOM or any other failure fails the job.

use k8s_openapi::api::core::v1::ContainerStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Count, Effect, Next, Observed, Step, finish, profile_name};
use crate::api::{Learned, Observation, OomRecord, Phase, TrainingJob, TrainingJobStatus};
use crate::estimate;
use crate::operator::admit;
use crate::operator::conditions::{self as cond, truncate};
use crate::operator::events::Kind;
use crate::operator::oom::{Failure, GpuOom};
use crate::operator::{fingerprint, learn, ledger};

/// The most telling failure of an attempt's pods: a GPU OOM (with the most
/// numbers), else a host OOM, else the first other failure.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub pod: String,
    pub container: String,
    pub failure: Failure,
}

/// A container's failed termination (this run's or the last): reason, exit
/// code, message. None when it did not fail.
pub fn terminated(cs: &ContainerStatus) -> Option<(Option<String>, i32, String)> {
    let t = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
    if t.exit_code == 0 {
        return None;
    }
    Some((
        t.reason.clone(),
        t.exit_code,
        t.message.clone().unwrap_or_default(),
    ))
}

/// How telling a failure is: a GPU OOM by its numbers, then a host OOM.
pub fn rank(f: &Failure) -> usize {
    match f {
        Failure::GpuOom(o) => 10 + o.known(),
        Failure::HostOom { .. } => 1,
        Failure::Other { .. } => 0,
    }
}

fn record(found: &Found, attempt: u32, estimated: u64, observed: Option<u64>) -> OomRecord {
    let mut r = OomRecord {
        kind: match found.failure {
            Failure::HostOom { .. } => "HostOutOfMemory".into(),
            _ => "GpuOutOfMemory".into(),
        },
        attempt,
        pod: found.pod.clone(),
        container: found.container.clone(),
        estimated_bytes: estimated,
        observed_bytes: observed,
        message: truncate(&found.failure.message(), 1024),
        ..OomRecord::default()
    };
    if let Failure::GpuOom(o) = &found.failure {
        r.framework = Some(o.framework.to_string());
        r.rank = o.rank;
        r.tried_bytes = o.tried_bytes;
        r.total_bytes = o.total_bytes;
        r.free_bytes = o.free_bytes;
        r.allocated_bytes = o.allocated_by_framework_bytes;
        r.reserved_bytes = o.reserved_by_framework_bytes;
    }
    r
}

pub(super) fn step(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    seen: &Observed<'_>,
    job_name: &str,
    job_message: String,
) -> Step {
    let attempt = status.oom_retries;
    let t = &seen.now;
    let estimated = estimated_bytes(&status);
    let Some(found) = seen.failure else {
        let message = format!("Job {job_name} failed: {job_message}");
        let condition = (cond::RUNNING, "JobFailed");
        return finish(tj, status, t, Phase::Failed, condition, message);
    };
    match &found.failure {
        Failure::HostOom { .. } => {
            let message = format!(
                "pod {} container {}: {}",
                found.pod,
                found.container,
                found.failure.message()
            );
            status.last_oom = Some(record(found, attempt, estimated, None));
            cond::set(
                &mut status.conditions,
                cond::OUT_OF_MEMORY,
                true,
                "HostOutOfMemory",
                &message,
                tj.metadata.generation,
                t,
            );
            let condition = (cond::RUNNING, "HostOutOfMemory");
            let mut s = finish(tj, status, t, Phase::Failed, condition, message);
            s.after.insert(0, Effect::Count(Count::HostOom));
            s
        }
        Failure::Other { .. } => {
            let message = format!(
                "Job {job_name} failed: pod {} container {}: {}",
                found.pod,
                found.container,
                found.failure.message()
            );
            let condition = (cond::RUNNING, "JobFailed");
            finish(tj, status, t, Phase::Failed, condition, message)
        }
        Failure::GpuOom(o) => gpu_oom(tj, status, t, found, o, job_name),
    }
}

/// The upper end of the attempt's estimate (what it was admitted with), bytes per GPU.
fn estimated_bytes(status: &TrainingJobStatus) -> u64 {
    status
        .estimate
        .as_ref()
        .map(|e| e.fit_per_gpu_bytes())
        .unwrap_or(0)
}

/// A GPU OOM: learnt, then retried with the lesson or, with every retry
/// used, the end.
fn gpu_oom(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    t: &Time,
    found: &Found,
    o: &GpuOom,
    job_name: &str,
) -> Step {
    let attempt = status.oom_retries;
    let estimated = estimated_bytes(&status);
    // What an OOM proves is measured against the estimate's point, not its
    // upper end: the learnt scale multiplies the upper end of later
    // estimates (other plans, other GPUs), whose spread over the point
    // differs; a ratio over one plan's wide range fell short on a plan
    // with a narrower one, and the retry or the next job OOMed again.
    let point = status
        .estimate
        .as_ref()
        .map(|e| e.per_gpu_bytes)
        .filter(|b| *b > 0)
        .unwrap_or(estimated);
    let usable = status
        .placement
        .as_ref()
        .and_then(admit::placed_catalog)
        .map(|p| p.usable_bytes());
    let lesson = learn::learn(o, status.learned.as_ref(), point, usable);
    let profile = profile_name(tj);
    let observed = lesson.observed_bytes.filter(|_| !lesson.fragmentation);
    let before: Vec<Effect> = observed
        .map(|observed| Effect::Learn {
            profile: profile.clone(),
            fingerprint: fingerprint::fingerprint(&tj.spec),
            observation: Box::new(Observation {
                job: ledger::key(tj),
                attempt,
                gpu: status.estimate.as_ref().and_then(|e| e.gpu.clone()),
                estimated_bytes: point,
                observed_bytes: observed,
                kind: "GpuOutOfMemory".into(),
                time: Some(t.clone()),
            }),
        })
        .into_iter()
        .collect();
    let counted = Effect::Count(Count::GpuOom {
        observed: lesson.observed_bytes,
        estimated,
    });
    let what = format!(
        "attempt {attempt} ran out of GPU memory (pod {}, container {}): {}",
        found.pod,
        found.container,
        found.failure.message()
    );
    let mut learned = lesson.learned.clone();
    learned.profile = Some(profile);
    status.last_oom = Some(record(found, attempt, estimated, lesson.observed_bytes));
    status.learned = Some(learned.clone());
    let mut s = if attempt >= tj.spec.fit_policy.max_oom_retries {
        exhausted(tj, status, t, &what, estimated, lesson.observed_bytes)
    } else {
        retry(tj, status, t, &learned, &what, job_name)
    };
    s.before = before;
    s.after.insert(0, counted);
    s
}

/// A GPU OOM with a retry left: pending again, with what was learnt (in
/// `status.learned`), the attempt's Job deleted and its hold given back.
fn retry(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    t: &Time,
    learned: &Learned,
    what: &str,
    job_name: &str,
) -> Step {
    let attempt = status.oom_retries;
    let next = if learned.expandable_segments
        && !status.plan.as_ref().is_some_and(|p| p.expandable_segments)
    {
        "retrying with PyTorch's expandable_segments (the memory was reserved but fragmented)"
            .to_string()
    } else {
        format!("retrying with estimates ×{:.2}", learned.scale)
    };
    let message = format!("{what}; {next}");
    for (type_, status_) in [(cond::OUT_OF_MEMORY, true), (cond::RUNNING, false)] {
        cond::set(
            &mut status.conditions,
            type_,
            status_,
            "GpuOutOfMemory",
            &message,
            tj.metadata.generation,
            t,
        );
    }
    status.oom_retries = attempt.saturating_add(1);
    status.phase = Some(Phase::Pending);
    status.placement = None;
    status.job_name = None;
    status.message = Some(truncate(&message, 4096));
    let mut s = Step::new(Next::Soon);
    s.status = Some(status);
    s.after = vec![
        Effect::Count(Count::OomRetry),
        // Replace the Job: its pods go with it.
        Effect::DeleteJob {
            name: job_name.to_string(),
        },
        Effect::Release,
        Effect::Event {
            kind: Kind::Warning,
            reason: "GpuOutOfMemory",
            note: message,
        },
    ];
    s
}

/// A GPU OOM with every retry `fitPolicy.maxOomRetries` allows used: the end.
fn exhausted(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    t: &Time,
    what: &str,
    estimated: u64,
    observed: Option<u64>,
) -> Step {
    let max = tj.spec.fit_policy.max_oom_retries;
    let message = format!(
        "{what}; {max} retr{} allowed by fitPolicy.maxOomRetries and all used; estimated {} GiB per GPU{}",
        if max == 1 { "y" } else { "ies" },
        estimate::gib(estimated),
        observed
            .map(|b| format!(", at least {} GiB needed", estimate::gib(b)))
            .unwrap_or_default()
    );
    cond::set(
        &mut status.conditions,
        cond::OUT_OF_MEMORY,
        true,
        "GpuOutOfMemory",
        what,
        tj.metadata.generation,
        t,
    );
    let condition = (cond::RUNNING, "OutOfMemoryRetriesExhausted");
    finish(tj, status, t, Phase::Failed, condition, message)
}
