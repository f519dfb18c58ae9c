//! The edge of the AdmissionCheck controller: kube's client and runtime.
//!
//! - AdmissionChecks are reflected into a store; each of ours
//!   (`spec.controllerName: vramguard.io/vram-fit`) is marked `Active`.
//! - Workloads are reconciled: an active one that lists a check of ours in state
//!   `Pending` and has quota reserved is judged ([`super::judge`]) with its
//!   flavors' products and its owner's annotation, and the checks' states are
//!   written to `workloads/status` by a merge patch carrying the
//!   resourceVersion read (a conflict is read again, never overwritten).
//! - Each write that changes a check's state is recorded as an `events.k8s.io/v1`
//!   Event on the Workload ([`super::verdict_events`]: `VramFit`, `VramRetry`,
//!   `VramRejected` with the verdict's message), published by kube's `Recorder` (a
//!   repeat within minutes is patched into its series). A failed Event is logged; the
//!   check state is what Kueue acts on.
//!
//! Until the inventory has synced nothing is judged (reconciles wait).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::watch;

use super::{CONTROLLER_NAME, GROUP, VERSION, status_version};
use crate::inventory::Source;
use crate::webhook::audit::recorder_event;

/// How the controller behaves.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seconds Kueue waits before it queues a `Retry` again.
    pub retry_after: u32,
    /// How soon a Workload is looked at again when it could not be judged yet.
    pub wait_requeue: Duration,
    /// How soon after an API error.
    pub error_requeue: Duration,
    /// The field manager of the writes, and the reporting controller of the Events.
    pub manager: String,
    /// The reporting instance of the Events (the replica); the manager when `None`.
    pub instance: Option<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            retry_after: 60,
            wait_requeue: Duration::from_secs(5),
            error_requeue: Duration::from_secs(10),
            manager: "vramguard-kueue".to_string(),
            instance: None,
        }
    }
}

/// What stopped a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
}

/// Workloads in the version their status is written in: [`super::status_version`] of the
/// versions the API server's discovery lists for Kueue's group (v1beta1 when it cannot say).
async fn workload_status_resource(client: &Client) -> ApiResource {
    let version = match client.list_api_groups().await {
        Ok(groups) => status_version(
            groups
                .groups
                .iter()
                .filter(|g| g.name == GROUP)
                .flat_map(|g| g.versions.iter().map(|v| v.version.as_str())),
        ),
        Err(error) => {
            tracing::debug!(%error, "kueue: API discovery; Workload status written as {VERSION}");
            VERSION
        }
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, version, "Workload"),
        "workloads",
    )
}

/// `kueue.x-k8s.io/v1beta1` Workload.
pub fn workloads() -> ApiResource {
    resource("Workload", "workloads")
}
/// `kueue.x-k8s.io/v1beta1` AdmissionCheck.
pub fn admission_checks() -> ApiResource {
    resource("AdmissionCheck", "admissionchecks")
}
/// `kueue.x-k8s.io/v1beta1` ResourceFlavor.
pub fn resource_flavors() -> ApiResource {
    resource("ResourceFlavor", "resourceflavors")
}

struct Context {
    client: Client,
    inventory: Arc<dyn Source>,
    checks: Store<DynamicObject>,
    /// Workloads in the version their status is written in.
    status: ApiResource,
    config: Config,
    /// The Events of the verdicts (one per controller: its cache makes a repeat a series).
    recorder: Recorder,
}

fn as_value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

/// The names of the AdmissionChecks of ours.
fn our_checks(store: &Store<DynamicObject>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .filter(|c| super::is_ours(&as_value(c)))
        .map(|c| c.name_any())
        .collect()
}

async fn get_opt(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>, Error> {
    Ok(api.get_opt(name).await?.map(|o| as_value(&o)))
}

async fn reconcile(wl: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    let value = as_value(&wl);
    if super::finished(&value) || !super::active(&value) {
        return Ok(Action::await_change());
    }
    let pending = super::pending_checks(&value, &our_checks(&ctx.checks));
    if pending.is_empty() || !super::quota_reserved(&value) {
        return Ok(Action::await_change());
    }
    let snapshot = ctx.inventory.snapshot();
    if !snapshot.synced {
        return Ok(Action::requeue(ctx.config.wait_requeue));
    }
    let ns = wl
        .namespace()
        .ok_or_else(|| Error::Other("a Workload without a namespace".into()))?;
    // The flavors assigned, by name.
    let flavors_api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &resource_flavors());
    let mut flavors = BTreeMap::new();
    for name in super::assigned_flavors(&value).into_values() {
        if flavors.contains_key(&name) {
            continue;
        }
        if let Some(f) = get_opt(&flavors_api, &name).await? {
            flavors.insert(name, f);
        }
    }
    // The owner, for its annotation (the pods' commands are in the pod sets).
    let owner = match super::owner(&value) {
        Some((api_version, kind, name)) => {
            match super::owner_resource(&api_version, &kind) {
                Some(plural) => {
                    let (group, version) = api_version
                        .rsplit_once('/')
                        .unwrap_or(("", api_version.as_str()));
                    let ar = ApiResource::from_gvk_with_plural(
                        &GroupVersionKind::gvk(group, version, &kind),
                        plural,
                    );
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(ctx.client.clone(), &ns, &ar);
                    match api.get_opt(&name).await {
                        Ok(o) => o.map(|o| as_value(&o)),
                        // An owner vramguard may not read, or whose kind is not
                        // served: judged by the Workload alone.
                        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => None,
                        Err(e) => return Err(e.into()),
                    }
                }
                None => None,
            }
        }
        None => None,
    };
    let now = Timestamp::now();
    let verdict = super::judge(&value, owner.as_ref(), &flavors, &snapshot, now);
    tracing::info!(
        namespace = %ns,
        workload = %wl.name_any(),
        state = verdict.state.name(),
        message = %verdict.message,
        "kueue: admission check"
    );
    let verdicts: BTreeMap<String, super::Verdict> =
        pending.into_iter().map(|n| (n, verdict.clone())).collect();
    let patch = super::status_patch(&value, &verdicts, now, Some(ctx.config.retry_after));
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ctx.status);
    api.patch_status(
        &wl.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    record(&ctx, &wl, super::verdict_events(&value, &verdicts)).await;
    Ok(Action::await_change())
}

/// Publish the Events of a write that succeeded; a failure is logged, never the reconcile's.
async fn record(ctx: &Context, wl: &DynamicObject, events: Vec<super::VerdictEvent>) {
    // The Workload as the Event regards it: no resourceVersion, so a repeat on a later
    // version of the same Workload is the same series.
    let mut reference = wl.object_ref(&workloads());
    reference.resource_version = None;
    for e in events {
        let event = recorder_event(e.warning, e.reason, super::EVENT_ACTION, &e.note);
        if let Err(error) = ctx.recorder.publish(&event, &reference).await {
            tracing::warn!(
                %error,
                namespace = ?reference.namespace,
                workload = ?reference.name,
                reason = e.reason,
                "kueue: recording the verdict as an Event"
            );
        }
    }
}

fn error_policy(_wl: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    match error {
        // Changed since it was read: read it again now.
        Error::Kube(kube::Error::Api(e)) if e.code == 409 => {
            Action::requeue(Duration::from_millis(50))
        }
        _ => {
            tracing::warn!(%error, "kueue: reconciling a Workload");
            Action::requeue(ctx.config.error_requeue)
        }
    }
}

/// Mark each AdmissionCheck of ours `Active` as the store sees it.
async fn activate(client: &Client, check: &DynamicObject, manager: &str) {
    let value = as_value(check);
    if !super::is_ours(&value) {
        return;
    }
    let generation = check.metadata.generation.unwrap_or(1);
    let Some(patch) = super::active_patch(&value, generation, Timestamp::now()) else {
        return;
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &admission_checks());
    let params = PatchParams {
        field_manager: Some(manager.to_string()),
        ..PatchParams::default()
    };
    if let Err(error) = api
        .patch_status(&check.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(%error, check = %check.name_any(), "kueue: marking the AdmissionCheck active");
    }
}

/// Run the controller until `stop` resolves.
pub async fn run_controller(
    client: Client,
    inventory: Arc<dyn Source>,
    config: Config,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let checks_api: Api<DynamicObject> = Api::all_with(client.clone(), &admission_checks());
    let writer = reflector::store::Writer::new(admission_checks());
    let store = writer.as_reader();
    // When the checks change, every Workload is looked at again (a check
    // created after its Workloads, or turned to ours).
    let (kick_tx, kick_rx) = watch::channel(());
    let on_checks = {
        let client = client.clone();
        let manager = config.manager.clone();
        reflector::reflector(writer, watcher(checks_api, watcher::Config::default()))
            .applied_objects()
            .for_each(move |r| {
                let client = client.clone();
                let manager = manager.clone();
                let kick = kick_tx.clone();
                async move {
                    match r {
                        Ok(check) => {
                            activate(&client, &check, &manager).await;
                            let _ = kick.send(());
                        }
                        Err(error) => tracing::debug!(%error, "kueue: AdmissionCheck watch"),
                    }
                }
            })
    };
    let on_checks = tokio::spawn(on_checks);
    let _abort = crate::operator::leader::AbortOnDrop(on_checks);
    if store.wait_until_ready().await.is_err() {
        return Err(Error::Other("the AdmissionCheck watch ended".into()));
    }
    let reporter = Reporter {
        controller: config.manager.clone(),
        instance: config.instance.clone(),
    };
    let ctx = Arc::new(Context {
        status: workload_status_resource(&client).await,
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        inventory,
        checks: store,
        config,
    });
    let kicks = tokio_stream_of(kick_rx);
    let wl_api: Api<DynamicObject> = Api::all_with(client, &workloads());
    Controller::new_with(wl_api, watcher::Config::default(), workloads())
        .reconcile_all_on(kicks)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(error) = r {
                tracing::debug!(%error, "kueue: controller");
            }
            futures::future::ready(())
        })
        .await;
    tracing::info!(
        controller = CONTROLLER_NAME,
        "kueue: admission check controller stopped"
    );
    Ok(())
}

/// A stream of `()` each time `rx` is told of a change.
fn tokio_stream_of(rx: watch::Receiver<()>) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// Run as one of several replicas: only the holder of the Lease reconciles.
pub async fn run(
    client: Client,
    inventory: Arc<dyn Source>,
    config: Config,
    lease: crate::operator::LeaseConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let c = client.clone();
    crate::operator::leader::lead(client, lease, "kueue", shutdown, |stop| {
        run_controller(c.clone(), inventory.clone(), config.clone(), stop)
    })
    .await;
    Ok(())
}
