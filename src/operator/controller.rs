//! The controller: a kube-runtime `Controller` on TrainingJobs that owns
//! batch/v1 Jobs, watches their pods and the `GpuNode`s, and moves each job
//! through Pending → Admitted → Running → Succeeded | Failed (or Rejected).
//!
//! It only does I/O: each reconcile reads what the job's step needs
//! ([`step::reads`]: the ledger and the inventory for a pending job, the
//! attempt's Job and, when [`step::wants`] them, its pods' failure and its
//! shape's MemoryProfile), calls [`step::step`] and applies the effects in
//! order. What the operator decides, and why, is in [`super::step`].
//!
//! Every reconcile writes at most one decision, with the resourceVersion it
//! read as the precondition, so a stale cache or a restarted replica can
//! never act twice on the same state. A pending job is decided under the
//! ledger lock, and its hold taken under it; the lock is let go before any
//! API write (a status write that fails gives the hold back).
//!
//! Pending jobs are retried when capacity changes (a GpuNode changes, a
//! reservation is released), and otherwise only every `wait_requeue`; jobs
//! admitted but not started are judged again when a MemoryProfile changes.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Mutex;

use super::events::{self, Kind};
use super::ledger::{self, Ledger};
use super::metrics::OomKind;
use super::observe::{self, LogTail};
use super::profiles;
use super::render::{self, JOB_LABEL};
use super::step::{self, Cluster, Count, Effect, FINALIZER, Next, Observed, Reads, Step};
use crate::api::{self, MemoryProfile, TrainingJob, TrainingJobStatus};
use crate::inventory::Source;

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
    #[error(transparent)]
    Step(#[from] step::Error),
    #[error("TrainingJob without a namespace")]
    NoNamespace,
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

/// Steps one reconcile takes at most: add the finalizer, place, make the
/// Job, follow it.
const MAX_STEPS: usize = 8;

/// Entry point of one reconcile: read, step, apply, until a step leaves the
/// job to a later event.
#[tracing::instrument(
    name = "reconcile",
    skip_all,
    fields(
        job = %ledger::key(&tj),
        attempt = tj.status.as_ref().map_or(0, |s| s.oom_retries),
    )
)]
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
    let ns = tj.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    let mut tj = tj;
    // A Job this reconcile made: followed from the create's answer.
    let mut made: Option<Box<Job>> = None;
    for _ in 0..MAX_STEPS {
        let step = read_and_step(&tj, &ctx, &ns, made.take()).await?;
        match apply(&api, &tj, &ctx, step).await? {
            Applied::Done(action) => return Ok(action),
            Applied::Again { tj: next, job } => {
                tj = next;
                made = job;
            }
        }
    }
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Read what the step of `tj` needs, and take it. A pending job is decided
/// under the ledger lock and its hold taken under it; the lock is let go
/// before anything is written.
async fn read_and_step(
    tj: &Arc<TrainingJob>,
    ctx: &Context,
    ns: &str,
    made: Option<Box<Job>>,
) -> Result<Step, Error> {
    let now = Time(Timestamp::now());
    match step::reads(tj) {
        Reads::Nothing => Ok(step::step(tj, &Observed::at(now))?),
        Reads::Cluster => {
            let key = ledger::key(tj);
            let attempt = tj.status.as_ref().map_or(0, |s| s.oom_retries);
            let mut ledger = ctx.ledger.lock().await;
            let held = ledger.get(&key).is_some_and(|e| {
                Some(e.uid.as_str()) == tj.uid().as_deref() && e.attempt == attempt
            });
            let snapshot = (!held).then(|| ctx.inventory.snapshot());
            let step = {
                let reservations = snapshot.as_ref().map(|s| ledger.reservations_in(s));
                let cluster =
                    snapshot
                        .as_ref()
                        .zip(reservations)
                        .map(|(snapshot, reservations)| Cluster {
                            snapshot,
                            reservations,
                        });
                let seen = Observed {
                    held,
                    cluster,
                    ..Observed::at(now)
                };
                step::step(tj, &seen)?
            };
            if let Some(entry) = &step.reserve {
                ledger.insert(key, entry.clone());
            }
            Ok(step)
        }
        Reads::Job(name) => {
            let job = match made {
                Some(j) => Some(*j),
                None => {
                    Api::<Job>::namespaced(ctx.client.clone(), ns)
                        .get_opt(&name)
                        .await?
                }
            };
            let wants = job.as_ref().map(|j| step::wants(tj, j)).unwrap_or_default();
            let failure = if wants.failure {
                let tail = LogTail {
                    lines: ctx.config.log_tail_lines,
                    bytes: ctx.config.log_limit_bytes,
                };
                let attempt = tj.status.as_ref().map_or(0, |s| s.oom_retries);
                observe::failure(&ctx.client, tail, ns, &tj.name_any(), attempt).await
            } else {
                None
            };
            let profile_scale = if wants.profile {
                observe::profile_scale(&ctx.client, tj).await
            } else {
                1.0
            };
            let seen = Observed {
                job: job.as_ref(),
                failure: failure.as_ref(),
                profile_scale,
                ..Observed::at(now)
            };
            Ok(step::step(tj, &seen)?)
        }
    }
}

/// What applying a step leaves.
enum Applied {
    Done(Action),
    /// Step again with the object as written and the Job just made.
    Again {
        tj: Arc<TrainingJob>,
        job: Option<Box<Job>>,
    },
}

/// Apply a step's effects in order around its status write.
async fn apply(
    api: &Api<TrainingJob>,
    tj: &Arc<TrainingJob>,
    ctx: &Context,
    step: Step,
) -> Result<Applied, Error> {
    let mut latest = tj.clone();
    let mut made = None;
    for e in step.before {
        match effect(api, tj, ctx, e).await? {
            Some(Written::Object(o)) => latest = Arc::new(*o),
            Some(Written::Job(j)) => made = Some(j),
            None => {}
        }
    }
    if let Some(status) = step.status {
        match write_status(api, tj, status).await {
            Ok(o) => latest = Arc::new(o),
            Err(e) => {
                if step.reserve.is_some() {
                    ctx.release(&ledger::key(tj)).await;
                }
                return Err(e);
            }
        }
    }
    for e in step.after {
        effect(api, tj, ctx, e).await?;
    }
    Ok(match step.next {
        Next::AwaitChange => Applied::Done(Action::await_change()),
        Next::Wait => Applied::Done(Action::requeue(ctx.config.wait_requeue)),
        Next::Soon => Applied::Done(Action::requeue(Duration::from_millis(10))),
        Next::Again => Applied::Again {
            tj: latest,
            job: made,
        },
    })
}

/// What an effect wrote that the next step reads.
enum Written {
    Object(Box<TrainingJob>),
    Job(Box<Job>),
}

/// Apply one effect about `tj` (as read: writes carry its resourceVersion).
async fn effect(
    api: &Api<TrainingJob>,
    tj: &TrainingJob,
    ctx: &Context,
    effect: Effect,
) -> Result<Option<Written>, Error> {
    let ns = tj.namespace().unwrap_or_default();
    match effect {
        Effect::AddFinalizer => {
            let mut finalizers: Vec<&str> = tj.finalizers().iter().map(String::as_str).collect();
            finalizers.push(FINALIZER);
            return Ok(Some(Written::Object(
                patch_finalizers(api, tj, &finalizers).await?,
            )));
        }
        Effect::RemoveFinalizer => {
            let finalizers: Vec<&str> = tj
                .finalizers()
                .iter()
                .map(String::as_str)
                .filter(|f| *f != FINALIZER)
                .collect();
            return Ok(Some(Written::Object(
                patch_finalizers(api, tj, &finalizers).await?,
            )));
        }
        Effect::CreateService(svc) => {
            let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
            match services.create(&PostParams::default(), &svc).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Effect::CreateJob { job, note } => {
            let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
            let made = match jobs.create(&PostParams::default(), &job).await {
                Ok(j) => {
                    ctx.event(tj, Kind::Normal, "JobCreated", note).await;
                    j
                }
                Err(kube::Error::Api(s)) if s.code == 409 => jobs.get(&job.name_any()).await?,
                Err(e) => return Err(e.into()),
            };
            return Ok(Some(Written::Job(Box::new(made))));
        }
        Effect::DeleteJob { name } => {
            let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
            match jobs.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => tracing::warn!(%error, job = %name, "deleting the attempt's Job"),
            }
        }
        Effect::Release => ctx.release(&ledger::key(tj)).await,
        Effect::Learn {
            profile,
            fingerprint,
            observation,
        } => {
            let observed = profiles::observe(&ctx.client, &profile, &fingerprint, tj, *observation);
            if let Err(error) = observed.await {
                tracing::warn!(%error, %profile, "recording a MemoryProfile observation");
            }
        }
        Effect::Event { kind, reason, note } => ctx.event(tj, kind, reason, note).await,
        Effect::Waiting(w) => ctx.set_waiting(ObjectRef::from_obj(tj), w),
        Effect::NotStarted(n) => ctx.set_admitted(ObjectRef::from_obj(tj), n),
        Effect::Count(c) => count(&ctx.config.metrics, c),
    }
    Ok(None)
}

/// Set the finalizers, with the resourceVersion read as the precondition.
async fn patch_finalizers(
    api: &Api<TrainingJob>,
    tj: &TrainingJob,
    finalizers: &[&str],
) -> Result<Box<TrainingJob>, Error> {
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": tj.resource_version()}});
    let name = tj.name_any();
    let written = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Box::new(written))
}

fn count(metrics: &super::OperatorMetrics, c: Count) {
    match c {
        Count::Placed { adjusted } => metrics.placed(adjusted),
        Count::HostOom => metrics.oom(OomKind::Host),
        Count::GpuOom {
            observed,
            estimated,
        } => {
            metrics.oom(OomKind::Gpu);
            if let Some(o) = observed {
                metrics.proved(o, estimated);
            }
        }
        Count::OomRetry => {
            metrics.oom_retries.inc();
        }
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

#[cfg(test)]
mod tests;
