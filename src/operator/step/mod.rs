//! What the controller does with a TrainingJob, pure: the job as read and
//! what the controller observed around it (the ledger's hold and the
//! cluster for a pending job, the attempt's Job, its pods' most telling
//! failure, the job's shape's MemoryProfile) in; the status to write and the
//! effects to apply around that write out. No client, no clock of its own,
//! no lock: [`super::controller`] reads, calls [`step`] and applies.
//!
//! - Pending ([`pending`]): validate, then place with the learnt scale;
//!   Admitted records the plan, the placement and the Job's name in status
//!   *before* the Job exists, and the hold is taken under the ledger lock
//!   the decision was made under;
//! - Admitted/Running ([`active`]): make the recorded Job (deterministic
//!   name: a second create is `AlreadyExists`), then follow it: running,
//!   complete, failed; an admitted job not yet started whose shape's
//!   MemoryProfile learnt more than its hold holds is placed again;
//! - a failed attempt ([`failed`]): a GPU OOM is learnt (status and
//!   MemoryProfile) and, within `maxOomRetries`, retried smaller; a host OOM
//!   and any other failure fail the job;
//! - deletion: the hold is released, then the finalizer removed.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::conditions::{self as cond, truncate};
use super::events::Kind;
use super::fingerprint;
use super::ledger::Entry;
use crate::api::{self, Observation, Phase, TrainingJob, TrainingJobStatus, ValidatedJob};
use crate::inventory;
use crate::plan::ReservationIndex;

mod active;
mod failed;
mod pending;
#[cfg(test)]
mod tests;

pub use active::{JobState, Wants, job_name, job_state, wants};
pub use failed::{Found, rank, terminated};

/// The finalizer that releases a job's reservation.
pub const FINALIZER: &str = "vramguard.io/reservation";

/// Why a step could not be taken (the reconcile is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The placement rule could not estimate the job.
    #[error("deciding the placement: {0}")]
    Decide(String),
    /// The attempt's Service could not be rendered.
    #[error("rendering the Service: {0}")]
    Render(String),
    /// The controller did not observe what this phase is decided on.
    #[error("{0} was not observed")]
    NotObserved(&'static str),
}

/// The cluster a pending job is placed on, as the leader sees it: read and
/// decided on under the ledger lock.
#[derive(Clone, Copy, Debug)]
pub struct Cluster<'a> {
    pub snapshot: &'a inventory::Snapshot,
    /// Every hold of the ledger, as placement takes them.
    pub reservations: &'a ReservationIndex,
}

/// What the controller read for one step of one job.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// Condition times and MemoryProfile observations.
    pub now: Time,
    /// The ledger holds memory for this job's uid and attempt already.
    pub held: bool,
    /// For a pending job: the cluster and the other jobs' holds.
    pub cluster: Option<Cluster<'a>>,
    /// For an admitted or running job: the attempt's Job (None: none exists).
    pub job: Option<&'a Job>,
    /// For a failed attempt: its pods' most telling failure, when one was found.
    pub failure: Option<&'a Found>,
    /// For an admitted job not yet started: the scale its shape's
    /// MemoryProfile puts on estimates now (1 without one).
    pub profile_scale: f64,
}

impl<'a> Observed<'a> {
    /// Nothing read but the clock.
    pub fn at(now: Time) -> Observed<'a> {
        Observed {
            now,
            held: false,
            cluster: None,
            job: None,
            failure: None,
            profile_scale: 1.0,
        }
    }
}

/// A figure counted once the status that records it is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Count {
    /// A job placed; `adjusted` when its plan changed it.
    Placed {
        adjusted: bool,
    },
    HostOom,
    /// A GPU OOM and what it proved over the estimate, when it proved something.
    GpuOom {
        observed: Option<u64>,
        estimated: u64,
    },
    OomRetry,
}

/// What the controller does, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Add [`FINALIZER`] (precondition: the resourceVersion read).
    AddFinalizer,
    /// Remove [`FINALIZER`] (precondition: the resourceVersion read).
    RemoveFinalizer,
    /// Create the attempt's Service (`AlreadyExists` is fine).
    CreateService(Box<Service>),
    /// Create the attempt's Job (`AlreadyExists`: the existing one is read);
    /// when this created it, a `JobCreated` event with `note`.
    CreateJob {
        job: Box<Job>,
        note: String,
    },
    /// Delete a Job and its pods (gone already is fine; a failure is logged).
    DeleteJob {
        name: String,
    },
    /// Let go of the job's hold in the ledger; retry the waiting jobs when
    /// there was one.
    Release,
    /// Record what an OOM proved in the shape's MemoryProfile (a failure is
    /// logged).
    Learn {
        profile: String,
        fingerprint: String,
        observation: Box<Observation>,
    },
    /// An Event about the TrainingJob.
    Event {
        kind: Kind,
        reason: &'static str,
        note: String,
    },
    /// The job waits for capacity (retried when it changes) or not; not
    /// waiting ends "admitted, not started" too.
    Waiting(bool),
    /// The job is admitted and its pods have not started (judged again when
    /// a MemoryProfile is written) or not.
    NotStarted(bool),
    Count(Count),
}

/// When the job is looked at next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// On the next change of it, its Job or its pods.
    AwaitChange,
    /// After the controller's `wait_requeue`, or when capacity changes.
    Wait,
    /// At once, from the watch cache (the status just written must be read back).
    Soon,
    /// Step again now, with the object just written (and the Job just made).
    Again,
}

/// One step: effects before the status write, the status, effects after it.
/// A failed status write stops the step there (the reconcile is retried on
/// fresh data); a hold in `reserve` is then given back.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub before: Vec<Effect>,
    /// Taken under the ledger lock the decision was made under.
    pub reserve: Option<Entry>,
    pub status: Option<TrainingJobStatus>,
    pub after: Vec<Effect>,
    pub next: Next,
}

impl Step {
    fn new(next: Next) -> Step {
        Step {
            before: Vec::new(),
            reserve: None,
            status: None,
            after: Vec::new(),
            next,
        }
    }
}

/// What the step of a job reads beyond the watch cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reads {
    Nothing,
    /// Pending: the ledger's hold and the cluster, under the ledger lock.
    Cluster,
    /// Admitted or running: the attempt's Job of this name (then [`wants`]).
    Job(String),
}

/// What the step of `tj` reads.
pub fn reads(tj: &TrainingJob) -> Reads {
    let phase = tj.status.as_ref().and_then(|s| s.phase);
    let deleted = tj.meta().deletion_timestamp.is_some();
    if deleted || !tj.finalizers().iter().any(|f| f == FINALIZER) {
        return Reads::Nothing;
    }
    match phase {
        None | Some(Phase::Pending) => Reads::Cluster,
        Some(Phase::Succeeded | Phase::Failed | Phase::Rejected) => Reads::Nothing,
        _ => job_name(tj).map_or(Reads::Nothing, Reads::Job),
    }
}

/// What to do with `tj` now, given what was observed.
pub fn step(tj: &TrainingJob, seen: &Observed<'_>) -> Result<Step, Error> {
    let has_finalizer = tj.finalizers().iter().any(|f| f == FINALIZER);
    if tj.meta().deletion_timestamp.is_some() {
        let mut s = Step::new(Next::AwaitChange);
        s.before = vec![Effect::Waiting(false), Effect::Release];
        if has_finalizer {
            s.before.push(Effect::RemoveFinalizer);
        }
        return Ok(s);
    }
    let status = tj.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(Phase::Succeeded | Phase::Failed | Phase::Rejected)
    ) {
        let mut s = Step::new(Next::AwaitChange);
        s.before = vec![Effect::Waiting(false), Effect::Release];
        return Ok(s);
    }
    if !has_finalizer {
        let mut s = Step::new(Next::Again);
        s.before = vec![Effect::AddFinalizer];
        return Ok(s);
    }
    match status.phase {
        None | Some(Phase::Pending) => pending::step(tj, status, seen),
        _ => active::step(tj, status, seen),
    }
}

/// The spec's errors on one line.
fn validate(tj: &TrainingJob) -> Result<ValidatedJob, String> {
    api::validate_job(tj).map_err(|errors| {
        errors
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Terminal: Rejected or Failed with a reason and message.
fn finish(
    tj: &TrainingJob,
    mut status: TrainingJobStatus,
    now: &Time,
    phase: Phase,
    condition: (&str, &'static str),
    message: String,
) -> Step {
    let generation = tj.metadata.generation;
    status.phase = Some(phase);
    status.message = Some(truncate(&message, 4096));
    status.observed_generation = generation;
    cond::set(
        &mut status.conditions,
        condition.0,
        false,
        condition.1,
        &message,
        generation,
        now,
    );
    if phase == Phase::Failed {
        cond::set(
            &mut status.conditions,
            cond::FAILED,
            true,
            condition.1,
            &message,
            generation,
            now,
        );
    }
    let mut s = Step::new(Next::AwaitChange);
    s.status = Some(status);
    s.after = vec![
        Effect::Waiting(false),
        Effect::Release,
        Effect::Event {
            kind: Kind::Warning,
            reason: condition.1,
            note: message,
        },
    ];
    s
}

/// The learnt scale for this job: its own, or its profile's when larger
/// (with the profile's name then).
fn learnt_scale(tj: &TrainingJob, snapshot: &inventory::Snapshot) -> (f64, Option<String>) {
    let own = own_scale(tj.status.as_ref());
    let shared = snapshot.learnt_scale(&tj.spec);
    if shared > own {
        (shared, Some(profile_name(tj)))
    } else {
        (own, None)
    }
}

/// The scale the job's own status learnt (1 without a lesson).
fn own_scale(status: Option<&TrainingJobStatus>) -> f64 {
    status
        .and_then(|s| s.learned.as_ref())
        .map(|l| l.scale)
        .filter(|s| s.is_finite())
        .unwrap_or(1.0)
        .max(1.0)
}

/// The name of the MemoryProfile of the job's shape.
fn profile_name(tj: &TrainingJob) -> String {
    fingerprint::profile_name(&fingerprint::fingerprint(&tj.spec))
}

/// Staleness is judged as the webhook judges it: as of the snapshot's time
/// when it carries one (a simulated clock), else now.
fn as_of(snapshot: &inventory::Snapshot, now: &Time) -> Timestamp {
    snapshot
        .as_of_unix
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(now.0)
}
