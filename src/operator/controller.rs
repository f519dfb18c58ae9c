//! The controller: a kube-runtime `Controller` on TrainingJobs that owns
//! batch/v1 Jobs, watches their pods and the `GpuNode`s, and moves each job
//! through Pending → Admitted → Running → Succeeded | Failed (or Rejected).
//!
//! Every reconcile reads the world and writes at most one decision, with the
//! resourceVersion it read as the precondition, so a stale cache or a
//! restarted replica can never act twice on the same state:
//!
//! - Pending: validate, then (under the ledger lock) place with the learnt
//!   scale; Admitted records the plan, the placement and the Job's name in
//!   status *before* the Job exists;
//! - Admitted/Running: make the recorded Job (deterministic name: a second
//!   create is `AlreadyExists`), then follow it: running, complete, failed;
//! - a failed attempt: classify each failed container from its termination
//!   message and, when that does not show a GPU OOM, its log tail
//!   (`pods/log`, bounded); a GPU OOM is learnt (status and MemoryProfile)
//!   and, within `maxOomRetries`, retried smaller; a host OOM fails the job
//!   with its own reason;
//! - deletion: the finalizer releases the reservation, then lets go;
//! - a lesson written after a job was admitted: when its shape's
//!   MemoryProfile is written, every job admitted but not yet started (its
//!   Job's pods not running: suspended by a queue, pulling an image) is
//!   judged again before it starts, and if the learnt scale no longer fits
//!   its hold, its Job is deleted and it is placed again with the scale.
//!
//! Pending jobs are retried when capacity changes (a GpuNode changes, a
//! reservation is released), and otherwise only every `wait_requeue`.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

use super::admit::{self, Decision};
use super::conditions::{self as cond, truncate};
use super::events::{self, Kind};
use super::ledger::{self, Entry, Ledger};
use super::metrics::OomKind;
use super::oom::{self, Failure};
use super::render::{self, ATTEMPT_LABEL, AttemptSpec, JOB_LABEL};
use super::{fingerprint, learn, profiles};
use crate::api::{
    self, MemoryProfile, OomRecord, Phase, TrainingJob, TrainingJobStatus, ValidatedJob,
};
use crate::estimate;
use crate::inventory::{self, Source};
use crate::plan::{reservations_of, scale_bytes};

/// The finalizer that releases a job's reservation.
pub const FINALIZER: &str = "vramguard.io/reservation";

/// How the controller behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// Name of the reporting controller in Events.
    pub reporter: String,
    /// This replica, in Events.
    pub instance: Option<String>,
    /// Re-check a waiting job this often even when nothing changed.
    pub wait_requeue: Duration,
    /// Log tail read from a failed container: lines and bytes.
    pub log_tail_lines: i64,
    pub log_limit_bytes: i64,
    /// Requeue after an error.
    pub error_requeue: Duration,
    /// Reconciles at once. Each holds an HTTP connection to the API server
    /// while it runs: unbounded, a burst of jobs opens as many connections
    /// (and their buffers) as there are jobs.
    pub concurrency: u16,
    /// Where the operator's figures go (unregistered by default).
    pub metrics: super::OperatorMetrics,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            reporter: "vramguard".into(),
            instance: None,
            wait_requeue: Duration::from_secs(300),
            log_tail_lines: 200,
            log_limit_bytes: 256 * 1024,
            error_requeue: Duration::from_secs(5),
            concurrency: 16,
            metrics: super::OperatorMetrics::default(),
        }
    }
}

/// Why a reconcile failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
}

/// Give the heap memory freed after a burst of reconciles back to the OS.
/// glibc keeps freed pages of its arenas mapped; after placing thousands of
/// jobs that is a third of the process's resident memory.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: malloc_trim only walks and trims glibc's own heap; it has no
    // preconditions and is safe to call from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

/// How often freed memory is given back after reconciles ran.
const TRIM_EVERY: Duration = Duration::from_secs(5);

/// What reconciles share.
pub struct Context {
    client: Client,
    inventory: Arc<dyn Source>,
    ledger: Mutex<Ledger>,
    /// Jobs waiting for capacity, retried when it changes.
    waiting: StdMutex<HashSet<ObjectRef<TrainingJob>>>,
    /// Jobs admitted whose pods have not started: judged again when a
    /// MemoryProfile is written.
    admitted: StdMutex<HashSet<ObjectRef<TrainingJob>>>,
    kick: mpsc::UnboundedSender<ObjectRef<TrainingJob>>,
    reporter: events::Reporter,
    config: Config,
    /// Reconciles since freed memory was last given back.
    reconciles: AtomicU64,
}

impl Context {
    fn waiting(&self) -> Vec<ObjectRef<TrainingJob>> {
        self.waiting
            .lock()
            .map(|w| w.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn set_waiting(&self, r: ObjectRef<TrainingJob>, waiting: bool) {
        if !waiting {
            self.set_admitted(r.clone(), false);
        }
        if let Ok(mut w) = self.waiting.lock() {
            if waiting {
                w.insert(r);
            } else {
                w.remove(&r);
            }
        }
    }

    fn set_admitted(&self, r: ObjectRef<TrainingJob>, admitted: bool) {
        if let Ok(mut w) = self.admitted.lock() {
            if admitted {
                w.insert(r);
            } else {
                w.remove(&r);
            }
        }
    }

    /// A MemoryProfile changed: every job not yet started is judged again.
    fn not_started(&self) -> Vec<ObjectRef<TrainingJob>> {
        let mut out = self.waiting();
        if let Ok(a) = self.admitted.lock() {
            out.extend(a.iter().cloned());
        }
        out
    }

    /// Memory was freed: retry every waiting job.
    fn kick_waiting(&self) {
        for r in self.waiting() {
            let _ = self.kick.unbounded_send(r);
        }
    }

    /// Release a job's hold; retry the waiting jobs when there was one.
    async fn release(&self, key: &str) {
        let released = self.ledger.lock().await.release(key);
        if released {
            self.kick_waiting();
        }
    }

    async fn event(&self, tj: &TrainingJob, kind: Kind, reason: &str, note: String) {
        events::publish(&self.client, &self.reporter, tj, kind, reason, &note).await;
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Write `status` over the one `tj` was read with (the read's
/// resourceVersion is the precondition: a stale write is a 409, retried on
/// fresh data).
async fn write_status(
    api: &Api<TrainingJob>,
    tj: &TrainingJob,
    status: TrainingJobStatus,
) -> Result<TrainingJob, Error> {
    let mut obj = tj.clone();
    obj.status = Some(status);
    Ok(api
        .replace_status(&tj.name_any(), &PostParams::default(), &obj)
        .await?)
}

/// Entry point of one reconcile.
pub async fn reconcile(tj: Arc<TrainingJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconciles.fetch_add(1, Ordering::Relaxed);
    let metrics = &ctx.config.metrics;
    let _timer = metrics.reconcile_timer();
    let uid = tj.uid().unwrap_or_default();
    if tj.meta().deletion_timestamp.is_some() {
        metrics.set_phase(&uid, None);
    } else {
        let phase = tj.status.as_ref().and_then(|s| s.phase);
        metrics.set_phase(&uid, Some(super::metrics::phase_label(phase)));
    }
    let ns = tj
        .namespace()
        .ok_or_else(|| Error::Other("TrainingJob without a namespace".into()))?;
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    let key = ledger::key(&tj);

    if tj.meta().deletion_timestamp.is_some() {
        ctx.set_waiting(ObjectRef::from_obj(&*tj), false);
        ctx.release(&key).await;
        if tj.finalizers().iter().any(|f| f == FINALIZER) {
            let rest: Vec<&String> = tj.finalizers().iter().filter(|f| *f != FINALIZER).collect();
            let patch =
                json!({"metadata": {"finalizers": rest, "resourceVersion": tj.resource_version()}});
            api.patch(
                &tj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
        return Ok(Action::await_change());
    }

    let status = tj.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        Some(Phase::Succeeded | Phase::Failed | Phase::Rejected)
    ) {
        ctx.set_waiting(ObjectRef::from_obj(&*tj), false);
        ctx.release(&key).await;
        return Ok(Action::await_change());
    }

    let tj = if tj.finalizers().iter().any(|f| f == FINALIZER) {
        tj
    } else {
        let mut finalizers = tj.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": tj.resource_version()}});
        Arc::new(
            api.patch(
                &tj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?,
        )
    };

    match status.phase {
        None | Some(Phase::Pending) => pending(&api, &tj, &ctx).await,
        _ => active(&api, &tj, &ctx).await,
    }
}

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
async fn finish(
    api: &Api<TrainingJob>,
    tj: &TrainingJob,
    ctx: &Context,
    mut status: TrainingJobStatus,
    phase: Phase,
    condition: (&str, &str),
    message: String,
) -> Result<Action, Error> {
    let t = now();
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
        &t,
    );
    if phase == Phase::Failed {
        cond::set(
            &mut status.conditions,
            cond::FAILED,
            true,
            condition.1,
            &message,
            generation,
            &t,
        );
    }
    write_status(api, tj, status).await?;
    ctx.set_waiting(ObjectRef::from_obj(tj), false);
    ctx.release(&ledger::key(tj)).await;
    ctx.event(tj, Kind::Warning, condition.1, message).await;
    Ok(Action::await_change())
}

/// The learnt scale for this job: its own, or its profile's when larger
/// (with the profile's name then).
fn learnt_scale(tj: &TrainingJob, snapshot: &inventory::Snapshot) -> (f64, Option<String>) {
    let own = tj
        .status
        .as_ref()
        .and_then(|s| s.learned.as_ref())
        .map(|l| l.scale)
        .filter(|s| s.is_finite())
        .unwrap_or(1.0)
        .max(1.0);
    let shared = snapshot.learnt_scale(&tj.spec);
    if shared > own {
        let name = fingerprint::profile_name(&fingerprint::fingerprint(&tj.spec));
        (shared, Some(name))
    } else {
        (own, None)
    }
}

async fn pending(
    api: &Api<TrainingJob>,
    tj: &Arc<TrainingJob>,
    ctx: &Context,
) -> Result<Action, Error> {
    let mut status = tj.status.clone().unwrap_or_default();
    let generation = tj.metadata.generation;
    let t = now();
    let job = match validate(tj) {
        Ok(j) => j,
        Err(message) => {
            return finish(
                api,
                tj,
                ctx,
                status,
                Phase::Rejected,
                (cond::VALIDATED, "InvalidSpec"),
                message,
            )
            .await;
        }
    };
    if let Err(message) = render::check_template(tj) {
        return finish(
            api,
            tj,
            ctx,
            status,
            Phase::Rejected,
            (cond::VALIDATED, "InvalidTemplate"),
            message,
        )
        .await;
    }
    cond::set(
        &mut status.conditions,
        cond::VALIDATED,
        true,
        "Valid",
        "the spec is valid",
        generation,
        &t,
    );
    status.model = Some(job.model_name.clone());

    let key = ledger::key(tj);
    let attempt = status.oom_retries;
    let tolerations = crate::decide::tolerations(tj);
    let mut ledger = ctx.ledger.lock().await;
    if let Some(e) = ledger.get(&key)
        && Some(e.uid.as_str()) == tj.uid().as_deref()
        && e.attempt == attempt
    {
        // Admitted already; this object is older than that decision.
        return Ok(Action::await_change());
    }
    let snapshot = ctx.inventory.snapshot();
    let (scale, from_profile) = learnt_scale(tj, &snapshot);
    let reservations = ledger.reservations(&snapshot.nodes);
    // Staleness is judged as the webhook judges it: as of the snapshot's
    // time when it carries one (a simulated clock), else now.
    let as_of = snapshot
        .as_of_unix
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or_else(Timestamp::now);
    let decision = admit::decide(&job, &snapshot, &reservations, &tolerations, as_of, scale)
        .map_err(Error::Other)?;
    match decision {
        Decision::Admit(a) => {
            let job_name = render::job_name(&tj.name_any(), attempt);
            let mut plan = a.plan.clone();
            let adjusted = !plan.changes.is_empty();
            let learned = status.learned.clone();
            plan.expandable_segments = learned.as_ref().is_some_and(|l| l.expandable_segments);
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
            let where_ = placement_words(&placement);
            let per_gpu = format!(
                "{} GiB",
                estimate::gib(scale_bytes(a.estimate.fit_per_gpu_bytes(), scale))
            );
            let message = format!(
                "{where_}: {per_gpu} per GPU estimated{}{}",
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
            status.phase = Some(Phase::Admitted);
            status.per_gpu = Some(per_gpu);
            status.estimate = Some(a.estimate.clone());
            status.plan = Some(plan);
            status.placement = Some(placement.clone());
            status.job_name = Some(job_name.clone());
            status.message = None;
            status.observed_generation = generation;
            cond::set(
                &mut status.conditions,
                cond::PLACED,
                true,
                "Placed",
                &message,
                generation,
                &t,
            );
            ledger.insert(
                key.clone(),
                Entry {
                    uid: tj.uid().unwrap_or_default(),
                    attempt,
                    job: format!("{}/{job_name}", tj.namespace().unwrap_or_default()),
                    reservations: reservations_of(&placement),
                },
            );
            let written = match write_status(api, tj, status).await {
                Ok(obj) => obj,
                Err(e) => {
                    ledger.release(&key);
                    return Err(e);
                }
            };
            drop(ledger);
            ctx.config.metrics.placed(adjusted);
            ctx.set_waiting(ObjectRef::from_obj(&**tj), false);
            ctx.set_admitted(ObjectRef::from_obj(&**tj), true);
            ctx.event(tj, Kind::Normal, "Placed", message).await;
            // Make the Job now rather than on the next event.
            active(api, &Arc::new(written), ctx).await
        }
        Decision::Wait(reason) => {
            drop(ledger);
            ctx.set_waiting(ObjectRef::from_obj(&**tj), true);
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
                    &t,
                );
                write_status(api, tj, status).await?;
                ctx.event(tj, Kind::Normal, "WaitingForCapacity", reason)
                    .await;
            }
            Ok(Action::requeue(ctx.config.wait_requeue))
        }
        Decision::Reject(reason) => {
            drop(ledger);
            if attempt > 0 {
                let message = format!(
                    "after {attempt} out-of-memory retr{}, no plan the fit policy allows fits: {reason}",
                    if attempt == 1 { "y" } else { "ies" }
                );
                finish(
                    api,
                    tj,
                    ctx,
                    status,
                    Phase::Failed,
                    (cond::PLACED, "NoSmallerPlan"),
                    message,
                )
                .await
            } else {
                finish(
                    api,
                    tj,
                    ctx,
                    status,
                    Phase::Rejected,
                    (cond::PLACED, "DoesNotFit"),
                    reason,
                )
                .await
            }
        }
    }
}

fn placement_words(p: &api::Placement) -> String {
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

async fn active(
    api: &Api<TrainingJob>,
    tj: &Arc<TrainingJob>,
    ctx: &Context,
) -> Result<Action, Error> {
    let mut status = tj.status.clone().unwrap_or_default();
    let ns = tj.namespace().unwrap_or_default();
    let attempt = status.oom_retries;
    let (Some(plan), Some(placement)) = (status.plan.clone(), status.placement.clone()) else {
        // Admitted without a decision (written by hand): decide again.
        status.phase = Some(Phase::Pending);
        write_status(api, tj, status).await?;
        return Ok(Action::await_change());
    };
    let job_name = status
        .job_name
        .clone()
        .unwrap_or_else(|| render::job_name(&tj.name_any(), attempt));
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let job = match jobs.get_opt(&job_name).await? {
        Some(j) => j,
        None => {
            let spec = AttemptSpec {
                attempt,
                plan: &plan,
                placement: &placement,
                framework: tj.spec.training.framework,
                gpus: tj.spec.parallelism.gpus,
            };
            let rendered = match render::job(tj, &spec) {
                Ok(j) => j,
                Err(message) => {
                    return finish(
                        api,
                        tj,
                        ctx,
                        status,
                        Phase::Failed,
                        (cond::RUNNING, "InvalidTemplate"),
                        message,
                    )
                    .await;
                }
            };
            if render::is_multi_node(&placement) {
                let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
                let svc = render::service(tj, attempt).map_err(Error::Other)?;
                match services.create(&PostParams::default(), &svc).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            match jobs.create(&PostParams::default(), &rendered).await {
                Ok(j) => {
                    ctx.event(
                        tj,
                        Kind::Normal,
                        "JobCreated",
                        format!("created Job {job_name} (attempt {attempt})"),
                    )
                    .await;
                    j
                }
                Err(kube::Error::Api(s)) if s.code == 409 => jobs.get(&job_name).await?,
                Err(e) => return Err(e.into()),
            }
        }
    };
    let owned = job
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == tj.uid().as_ref());
    if !owned {
        let message = format!(
            "a Job named {job_name} exists and does not belong to this TrainingJob; delete it or rename the TrainingJob"
        );
        return finish(
            api,
            tj,
            ctx,
            status,
            Phase::Failed,
            (cond::RUNNING, "JobNameTaken"),
            message,
        )
        .await;
    }
    let js = job.status.clone().unwrap_or_default();
    let job_condition = |type_: &str| {
        js.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_ && c.status == "True")
            .cloned()
    };
    let generation = tj.metadata.generation;
    let t = now();
    if job_condition("Complete").is_some() {
        status.phase = Some(Phase::Succeeded);
        status.message = None;
        cond::set(
            &mut status.conditions,
            cond::RUNNING,
            false,
            "Completed",
            "the job finished",
            generation,
            &t,
        );
        cond::set(
            &mut status.conditions,
            cond::COMPLETE,
            true,
            "Completed",
            &format!("Job {job_name} completed"),
            generation,
            &t,
        );
        write_status(api, tj, status).await?;
        ctx.release(&ledger::key(tj)).await;
        ctx.event(
            tj,
            Kind::Normal,
            "Succeeded",
            format!("Job {job_name} completed"),
        )
        .await;
        return Ok(Action::await_change());
    }
    let failed = job_condition("Failed");
    if failed.is_some() || js.failed.unwrap_or(0) > 0 {
        let job_message = failed
            .and_then(|c| c.message.or(c.reason))
            .unwrap_or_else(|| "a pod failed".into());
        return attempt_failed(api, tj, ctx, &job_name, job_message).await;
    }
    let started = js.active.unwrap_or(0) > 0
        || js.ready.unwrap_or(0) > 0
        || js.succeeded.unwrap_or(0) > 0
        || js.failed.unwrap_or(0) > 0;
    if !started
        && status.phase == Some(Phase::Admitted)
        && let Some(action) = rejudge(api, tj, ctx, &job_name, &status).await?
    {
        return Ok(action);
    }
    if started {
        ctx.set_admitted(ObjectRef::from_obj(&**tj), false);
    }
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    let mut changed = false;
    if suspended {
        if cond::get(&status.conditions, cond::QUEUED).is_none_or(|c| c.status != "True") {
            cond::set(
                &mut status.conditions,
                cond::QUEUED,
                true,
                "Suspended",
                &format!("Job {job_name} is suspended until Kueue admits it"),
                generation,
                &t,
            );
            changed = true;
        }
    } else if (js.active.unwrap_or(0) > 0 || js.ready.unwrap_or(0) > 0)
        && status.phase != Some(Phase::Running)
    {
        status.phase = Some(Phase::Running);
        if cond::get(&status.conditions, cond::QUEUED).is_some() {
            cond::set(
                &mut status.conditions,
                cond::QUEUED,
                false,
                "Admitted",
                "the queue admitted the Job",
                generation,
                &t,
            );
        }
        cond::set(
            &mut status.conditions,
            cond::RUNNING,
            true,
            "PodsActive",
            &format!("Job {job_name} has active pods"),
            generation,
            &t,
        );
        changed = true;
    }
    if changed {
        let running = status.phase == Some(Phase::Running);
        write_status(api, tj, status).await?;
        if running {
            ctx.event(
                tj,
                Kind::Normal,
                "Running",
                format!("Job {job_name} is running"),
            )
            .await;
        }
    }
    Ok(Action::await_change())
}

/// The scale the job's shape's MemoryProfile puts on estimates now, read
/// from the API server (not the reflector, which may not have the profile
/// yet when its own watch event triggered this reconcile); 1 without one.
async fn profile_scale(ctx: &Context, tj: &TrainingJob) -> f64 {
    let name = fingerprint::profile_name(&fingerprint::fingerprint(&tj.spec));
    let profiles: Api<MemoryProfile> = Api::all(ctx.client.clone());
    match profiles.get_opt(&name).await {
        Ok(Some(p)) => inventory::profile_ratios(std::iter::once(&p))
            .get(&name)
            .copied()
            .unwrap_or(1.0)
            .max(1.0),
        Ok(None) => 1.0,
        Err(error) => {
            tracing::debug!(%error, profile = %name, "reading a MemoryProfile");
            1.0
        }
    }
}

/// An admitted job whose pods have not started, judged again: when its
/// shape's MemoryProfile now scales its estimate past its hold, the Job is
/// deleted before it runs, the hold released, and the job goes back to
/// Pending to be placed with the lesson. None: the hold still fits.
async fn rejudge(
    api: &Api<TrainingJob>,
    tj: &Arc<TrainingJob>,
    ctx: &Context,
    job_name: &str,
    status: &TrainingJobStatus,
) -> Result<Option<Action>, Error> {
    let decided = status
        .learned
        .as_ref()
        .map(|l| l.scale)
        .filter(|s| s.is_finite())
        .unwrap_or(1.0)
        .max(1.0);
    let scale = profile_scale(ctx, tj).await;
    let (Some(estimate), Some(placement)) = (&status.estimate, &status.placement) else {
        return Ok(None);
    };
    let needed = scale_bytes(estimate.fit_per_gpu_bytes(), scale);
    if scale <= decided || needed <= placement.reserved_bytes_per_gpu {
        return Ok(None);
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
    learned.profile = Some(fingerprint::profile_name(&fingerprint::fingerprint(
        &tj.spec,
    )));
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
        &now(),
    );
    write_status(api, tj, next).await?;
    let ns = tj.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    match jobs.delete(job_name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(error) => tracing::warn!(%error, job = job_name, "deleting a Job judged again"),
    }
    ctx.set_admitted(ObjectRef::from_obj(&**tj), false);
    ctx.release(&ledger::key(tj)).await;
    ctx.event(tj, Kind::Normal, "LearntBeforeStart", message)
        .await;
    Ok(Some(Action::requeue(Duration::from_millis(10))))
}

/// The most telling failure of an attempt's pods: a GPU OOM (with the most
/// numbers), else a host OOM, else the first other failure.
struct Found {
    pod: String,
    container: String,
    failure: Failure,
}

fn terminated(cs: &ContainerStatus) -> Option<(Option<String>, i32, String)> {
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

fn rank(f: &Failure) -> usize {
    match f {
        Failure::GpuOom(o) => 10 + o.known(),
        Failure::HostOom { .. } => 1,
        Failure::Other { .. } => 0,
    }
}

async fn find_failure(ctx: &Context, ns: &str, tj_name: &str, attempt: u32) -> Option<Found> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{JOB_LABEL}={},{ATTEMPT_LABEL}={attempt}",
        render::label_value(tj_name)
    );
    let list = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l,
        Err(error) => {
            tracing::warn!(%error, job = tj_name, "listing the attempt's pods");
            return None;
        }
    };
    let mut best: Option<Found> = None;
    for pod in list.items {
        let pod_name = pod.name_any();
        let statuses = pod
            .status
            .as_ref()
            .map(|s| {
                s.init_container_statuses
                    .iter()
                    .flatten()
                    .chain(s.container_statuses.iter().flatten())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for cs in statuses {
            let Some((reason, exit, message)) = terminated(&cs) else {
                continue;
            };
            let mut failure = oom::classify(reason.as_deref(), Some(exit), &message);
            if !matches!(failure, Failure::GpuOom(_)) && reason.as_deref() != Some("OOMKilled") {
                // The termination message keeps only the last 2 KB / 80
                // lines; a traceback can push the OOM line out of it.
                let lp = LogParams {
                    container: Some(cs.name.clone()),
                    tail_lines: Some(ctx.config.log_tail_lines),
                    limit_bytes: Some(ctx.config.log_limit_bytes),
                    ..LogParams::default()
                };
                match pods.logs(&pod_name, &lp).await {
                    Ok(log) => {
                        let from_log = oom::classify(reason.as_deref(), Some(exit), &log);
                        if rank(&from_log) > rank(&failure) {
                            failure = from_log;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, pod = %pod_name, "reading the log tail");
                    }
                }
            }
            if best
                .as_ref()
                .is_none_or(|b| rank(&failure) > rank(&b.failure))
            {
                best = Some(Found {
                    pod: pod_name.clone(),
                    container: cs.name.clone(),
                    failure,
                });
            }
        }
    }
    best
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

async fn attempt_failed(
    api: &Api<TrainingJob>,
    tj: &Arc<TrainingJob>,
    ctx: &Context,
    job_name: &str,
    job_message: String,
) -> Result<Action, Error> {
    let mut status = tj.status.clone().unwrap_or_default();
    let ns = tj.namespace().unwrap_or_default();
    let attempt = status.oom_retries;
    let found = find_failure(ctx, &ns, &tj.name_any(), attempt).await;
    let generation = tj.metadata.generation;
    let t = now();
    let estimated = status
        .estimate
        .as_ref()
        .map(|e| e.fit_per_gpu_bytes())
        .unwrap_or(0);
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
    let Some(found) = found else {
        let message = format!("Job {job_name} failed: {job_message}");
        return finish(
            api,
            tj,
            ctx,
            status,
            Phase::Failed,
            (cond::RUNNING, "JobFailed"),
            message,
        )
        .await;
    };
    match &found.failure {
        Failure::HostOom { .. } => {
            let message = format!(
                "pod {} container {}: {}",
                found.pod,
                found.container,
                found.failure.message()
            );
            status.last_oom = Some(record(&found, attempt, estimated, None));
            cond::set(
                &mut status.conditions,
                cond::OUT_OF_MEMORY,
                true,
                "HostOutOfMemory",
                &message,
                generation,
                &t,
            );
            let done = finish(
                api,
                tj,
                ctx,
                status,
                Phase::Failed,
                (cond::RUNNING, "HostOutOfMemory"),
                message,
            )
            .await;
            if done.is_ok() {
                ctx.config.metrics.oom(OomKind::Host);
            }
            done
        }
        Failure::Other { .. } => {
            let message = format!(
                "Job {job_name} failed: pod {} container {}: {}",
                found.pod,
                found.container,
                found.failure.message()
            );
            finish(
                api,
                tj,
                ctx,
                status,
                Phase::Failed,
                (cond::RUNNING, "JobFailed"),
                message,
            )
            .await
        }
        Failure::GpuOom(o) => {
            let lesson = learn::learn(
                o,
                status.learned.as_ref(),
                point,
                status
                    .placement
                    .as_ref()
                    .and_then(admit::placed_catalog)
                    .map(|p| p.usable_bytes()),
            );
            let fp = fingerprint::fingerprint(&tj.spec);
            let profile_name = fingerprint::profile_name(&fp);
            let rec = record(&found, attempt, estimated, lesson.observed_bytes);
            if let Some(observed) = lesson.observed_bytes.filter(|_| !lesson.fragmentation) {
                let gpu = status.estimate.as_ref().and_then(|e| e.gpu.clone());
                if let Err(error) = profiles::observe(
                    &ctx.client,
                    &profile_name,
                    &fp,
                    tj,
                    api::Observation {
                        job: ledger::key(tj),
                        attempt,
                        gpu,
                        estimated_bytes: point,
                        observed_bytes: observed,
                        kind: "GpuOutOfMemory".into(),
                        time: Some(t.clone()),
                    },
                )
                .await
                {
                    tracing::warn!(%error, profile = %profile_name, "recording a MemoryProfile observation");
                }
            }
            let max = tj.spec.fit_policy.max_oom_retries;
            let what = format!(
                "attempt {attempt} ran out of GPU memory (pod {}, container {}): {}",
                found.pod,
                found.container,
                found.failure.message()
            );
            let mut learned = lesson.learned.clone();
            learned.profile = Some(profile_name);
            status.last_oom = Some(rec);
            status.learned = Some(learned.clone());
            if attempt >= max {
                let message = format!(
                    "{what}; {max} retr{} allowed by fitPolicy.maxOomRetries and all used; estimated {} GiB per GPU{}",
                    if max == 1 { "y" } else { "ies" },
                    estimate::gib(estimated),
                    lesson
                        .observed_bytes
                        .map(|b| format!(", at least {} GiB needed", estimate::gib(b)))
                        .unwrap_or_default()
                );
                cond::set(
                    &mut status.conditions,
                    cond::OUT_OF_MEMORY,
                    true,
                    "GpuOutOfMemory",
                    &what,
                    generation,
                    &t,
                );
                let done = finish(
                    api,
                    tj,
                    ctx,
                    status,
                    Phase::Failed,
                    (cond::RUNNING, "OutOfMemoryRetriesExhausted"),
                    message,
                )
                .await;
                if done.is_ok() {
                    gpu_oom_counted(&ctx.config.metrics, lesson.observed_bytes, estimated);
                }
                return done;
            }
            let next = if learned.expandable_segments
                && !status.plan.as_ref().is_some_and(|p| p.expandable_segments)
            {
                "retrying with PyTorch's expandable_segments (the memory was reserved but fragmented)".to_string()
            } else {
                format!("retrying with estimates ×{:.2}", learned.scale)
            };
            let message = format!("{what}; {next}");
            cond::set(
                &mut status.conditions,
                cond::OUT_OF_MEMORY,
                true,
                "GpuOutOfMemory",
                &message,
                generation,
                &t,
            );
            cond::set(
                &mut status.conditions,
                cond::RUNNING,
                false,
                "GpuOutOfMemory",
                &message,
                generation,
                &t,
            );
            status.oom_retries = attempt.saturating_add(1);
            status.phase = Some(Phase::Pending);
            status.placement = None;
            status.job_name = None;
            status.message = Some(truncate(&message, 4096));
            write_status(api, tj, status).await?;
            gpu_oom_counted(&ctx.config.metrics, lesson.observed_bytes, estimated);
            ctx.config.metrics.oom_retries.inc();
            // Replace the Job: its pods go with it.
            let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
            match jobs.delete(job_name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => tracing::warn!(%error, job = job_name, "deleting the failed Job"),
            }
            ctx.release(&ledger::key(tj)).await;
            ctx.event(tj, Kind::Warning, "GpuOutOfMemory", message)
                .await;
            Ok(Action::requeue(Duration::from_millis(10)))
        }
    }
}

/// A GPU OOM, and what it proved over the estimate when it proved something.
fn gpu_oom_counted(metrics: &super::OperatorMetrics, observed: Option<u64>, estimated: u64) {
    metrics.oom(OomKind::Gpu);
    if let Some(o) = observed {
        metrics.proved(o, estimated);
    }
}

fn error_policy(tj: Arc<TrainingJob>, error: &Error, ctx: Arc<Context>) -> Action {
    match error {
        Error::Kube(kube::Error::Api(s)) if s.code == 409 => {
            tracing::debug!(job = %tj.name_any(), "stale object; retrying on fresh data");
            Action::requeue(Duration::from_millis(50))
        }
        _ => {
            ctx.config.metrics.reconcile_errors.inc();
            tracing::warn!(job = %tj.name_any(), %error, "reconcile failed");
            Action::requeue(ctx.config.error_requeue)
        }
    }
}

/// Run the controller until `stop` resolves. The ledger is rebuilt from the
/// TrainingJobs' statuses first.
pub async fn run_controller(
    client: Client,
    inventory: Arc<dyn Source>,
    config: Config,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let tjs: Api<TrainingJob> = Api::all(client.clone());
    // Page by page: the holds are small, the TrainingJobs not.
    let mut ledger = Ledger::default();
    let mut page = ListParams::default().limit(500);
    loop {
        let list = tjs.list(&page).await?;
        for tj in &list.items {
            ledger.absorb(tj);
        }
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => page = page.continue_token(&token),
            None => break,
        }
    }
    tracing::info!(
        holds = ledger.len(),
        "ledger rebuilt from TrainingJob statuses"
    );
    let (kick, kicks) = mpsc::unbounded();
    let concurrency = config.concurrency;
    let reporter = events::Reporter {
        controller: config.reporter.clone(),
        instance: config
            .instance
            .clone()
            .unwrap_or_else(|| config.reporter.clone()),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        inventory,
        ledger: Mutex::new(ledger),
        waiting: StdMutex::new(HashSet::new()),
        admitted: StdMutex::new(HashSet::new()),
        kick,
        reporter,
        config,
        reconciles: AtomicU64::new(0),
    });
    let trim_ctx = ctx.clone();
    let trim = async move {
        // Walking the heap costs in proportion to its size: at most once per
        // TRIM_EVERY of real time too, so a paused clock (a simulated day,
        // where 5 s pass in microseconds) does not walk it thousands of times.
        let mut last = std::time::Instant::now();
        loop {
            tokio::time::sleep(TRIM_EVERY).await;
            if last.elapsed() >= TRIM_EVERY && trim_ctx.reconciles.swap(0, Ordering::Relaxed) > 0 {
                release_free_memory();
                last = std::time::Instant::now();
            }
        }
    };
    let on_gpu_nodes = ctx.clone();
    let on_profiles = ctx.clone();
    let controller = Controller::new(tjs, watcher::Config::default().any_semantic())
        .owns(
            Api::<Job>::all(client.clone()),
            watcher::Config::default().labels(JOB_LABEL),
        )
        .watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(JOB_LABEL),
            |pod: Pod| {
                let ns = pod.namespace()?;
                let name = render::training_job_of(pod.meta())?;
                Some(ObjectRef::<TrainingJob>::new(&name).within(&ns))
            },
        )
        .watches(
            Api::<api::GpuNode>::all(client.clone()),
            watcher::Config::default(),
            move |_| on_gpu_nodes.waiting(),
        )
        .watches(
            Api::<MemoryProfile>::all(client.clone()),
            watcher::Config::default(),
            move |_| on_profiles.not_started(),
        )
        .reconcile_on(kicks)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(error) = r {
                tracing::debug!(%error, "controller");
            }
            futures::future::ready(())
        });
    tokio::select! {
        _ = controller => {},
        _ = trim => {},
    }
    Ok(())
}

/// Run as one of several replicas: only the holder of the Lease reconciles.
/// Returns when `shutdown` resolves (releasing the Lease if held).
pub async fn run(
    client: Client,
    inventory: Arc<dyn Source>,
    config: Config,
    lease: super::leader::LeaseConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let c = client.clone();
    super::leader::lead(client, lease, "operator", shutdown, |stop| {
        let (c, inv, cfg) = (c.clone(), inventory.clone(), config.clone());
        let metrics = config.metrics.clone();
        async move {
            let r = run_controller(c, inv, cfg, stop).await;
            // Another replica leads and counts the jobs now.
            metrics.clear_phases();
            r
        }
    })
    .await;
    Ok(())
}
