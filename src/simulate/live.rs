//! The run with vramguard on: the tasks of the simulated cluster and of
//! vramguard itself, started together on the paused clock and stopped when
//! every job has ended (or the scenario's time is up).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::Prepared;
use super::cluster::{Cluster, World};
use super::nodes::Clock;
use super::record::{AdmissionRecord, Records, Sample, clock};
use super::scenario::{Fault, Scenario};
use crate::api::{Phase, TrainingJob};
use crate::apiserver::{self, ApiServer};
use crate::inventory::{self, Snapshot, Source};
use crate::operator::{self, render::JOB_LABEL};
use crate::webhook::server::{AppState, router};

/// What the live run hands the report.
pub struct Outcome {
    pub records: Records,
    /// Scenario seconds when it stopped.
    pub ended_at: f64,
    /// Stopped by the scenario's duration with jobs still open.
    pub horizon_hit: bool,
    /// TrainingJobs the API server holds at the end, by `namespace/name`.
    pub final_jobs: HashMap<String, TrainingJob>,
    /// Attempts still running at the end.
    pub running_at_end: usize,
}

/// The inventory the webhook and the operator read, judged at simulated time.
struct SimSource {
    inner: inventory::reflect::Reflected,
    clock: Clock,
}

impl Source for SimSource {
    fn snapshot(&self) -> Snapshot {
        let mut s = self.inner.snapshot();
        s.as_of_unix = Some(self.clock.unix());
        s
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The API server's admission chain: the review goes to the webhook's own
/// router; an allowed job is then created.
async fn submit(
    webhook: &axum::Router,
    client: &Client,
    tj: &TrainingJob,
    n: usize,
) -> AdmissionRecord {
    let name = tj.name_any();
    let namespace = tj.namespace().unwrap_or_else(|| "default".into());
    let object = serde_json::to_value(tj).unwrap_or(Value::Null);
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-4000-9000-{n:012x}"),
            "kind": {"group": "vramguard.io", "version": "v1alpha1", "kind": "TrainingJob"},
            "resource": {"group": "vramguard.io", "version": "v1alpha1", "resource": "trainingjobs"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "simulated-user"},
            "object": object,
            "dryRun": false
        }
    });
    let mut record = AdmissionRecord {
        job: format!("{namespace}/{name}"),
        at: 0.0,
        allowed: false,
        message: String::new(),
        warnings: Vec::new(),
    };
    let request = axum::http::Request::post("/validate")
        .header("content-type", "application/json")
        .body(Body::from(review.to_string()));
    let answer: Value = match request {
        Ok(req) => match webhook.clone().oneshot(req).await {
            Ok(resp) => match axum::body::to_bytes(resp.into_body(), 1 << 20).await {
                Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
                Err(_) => Value::Null,
            },
            Err(e) => match e {},
        },
        Err(e) => {
            record.message = format!("could not build the review: {e}");
            return record;
        }
    };
    let response = &answer["response"];
    record.allowed = response["allowed"].as_bool().unwrap_or(false);
    record.message = response["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    record.warnings = response["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if record.allowed {
        let api: Api<TrainingJob> = Api::namespaced(client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), tj).await {
            record.allowed = false;
            record.message = format!("the API server refused it: {e}");
        }
    }
    record
}

/// The kubelet: runs the Jobs the operator creates.
async fn kubelet(cluster: Arc<Cluster>) {
    let api: Api<Job> = Api::all(cluster.client.clone());
    let mut stream = watcher(api, watcher::Config::default().labels(JOB_LABEL)).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) => {
                if cluster.start_after > 0.0 {
                    // Its pods start later; the kubelet watches on meanwhile.
                    let c = cluster.clone();
                    tokio::spawn(async move { c.job_seen(j).await });
                } else {
                    cluster.job_seen(j).await;
                }
            }
            Ok(watcher::Event::Delete(j)) => {
                if let Some(uid) = j.uid() {
                    cluster.job_deleted(&uid).await;
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "simulated kubelet watch");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Records every TrainingJob status the operator writes.
async fn observer(cluster: Arc<Cluster>, ttl: f64) {
    let api: Api<TrainingJob> = Api::all(cluster.client.clone());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        if let Ok(watcher::Event::Apply(tj) | watcher::Event::InitApply(tj)) = ev {
            let now = cluster.clock.secs();
            let published: HashMap<String, Option<f64>> = lock(&cluster.world)
                .nodes
                .iter()
                .map(|(k, n)| (k.clone(), n.last_publish))
                .collect();
            let last = |node: &str| published.get(node).copied().flatten();
            lock(&cluster.records).observe(&tj, now, &last, ttl + 1.0);
        }
    }
}

/// The operator process: killed and restarted by faults.
async fn operator_process(
    client: Client,
    source: Arc<dyn Source>,
    mut kill: tokio::sync::mpsc::UnboundedReceiver<f64>,
    cluster: Arc<Cluster>,
) {
    let config = operator::Config {
        instance: Some("vramguard-simulated".into()),
        ..operator::Config::default()
    };
    let mut faults_left = true;
    loop {
        // The controller lives in this block: leaving it drops the future,
        // which is the kill (no graceful end, nothing released).
        let killed = {
            let run = operator::run_controller(
                client.clone(),
                source.clone(),
                config.clone(),
                std::future::pending::<()>(),
            );
            tokio::pin!(run);
            loop {
                tokio::select! {
                    r = &mut run => {
                        if let Err(error) = r {
                            tracing::warn!(%error, "simulated operator stopped; restarting");
                        }
                        break None;
                    }
                    down = kill.recv(), if faults_left => match down {
                        Some(down) => break Some(down),
                        // No more faults: the process runs on.
                        None => faults_left = false,
                    },
                }
            }
        };
        let Some(down) = killed else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let now = cluster.clock.secs();
        {
            let mut r = lock(&cluster.records);
            r.operator_restarts += 1;
            r.event(now, format!("operator killed; back in {}", clock(down)));
        }
        cluster.clock.until(now + down).await;
        lock(&cluster.records).event(
            cluster.clock.secs(),
            "operator restarted: ledger rebuilt from TrainingJob statuses".into(),
        );
    }
}

/// One node's agent: publish every interval while the node lives.
async fn agent(cluster: Arc<Cluster>, node: String, offset: f64) {
    cluster.clock.until(offset).await;
    loop {
        cluster.publish(&node).await;
        let gone = lock(&cluster.world).nodes.get(&node).is_none_or(|n| n.lost);
        if gone {
            return;
        }
        tokio::time::sleep(Duration::from_secs_f64(cluster.interval)).await;
    }
}

async fn faults(
    cluster: Arc<Cluster>,
    list: Vec<(f64, Fault)>,
    kill: tokio::sync::mpsc::UnboundedSender<f64>,
) {
    for (at, fault) in list {
        cluster.clock.until(at).await;
        let now = cluster.clock.secs();
        match fault {
            Fault::OperatorRestart { down } => {
                let _ = kill.send(down);
            }
            Fault::AgentStops { node } => {
                if let Some(n) = lock(&cluster.world).nodes.get_mut(&node) {
                    n.publishing = false;
                }
                lock(&cluster.records).event(now, format!("agent on {node} stops publishing"));
            }
            Fault::NodeLost { node } => {
                lock(&cluster.records).event(now, format!("node {node} lost"));
                cluster.lose_node(&node).await;
            }
        }
    }
}

async fn sampler(cluster: Arc<Cluster>, every: f64) {
    loop {
        let now = cluster.clock.secs();
        let (used, cap, busy, running) = {
            let w = lock(&cluster.world);
            let (mut used, mut cap) = (0u64, 0u64);
            for n in w.nodes.values().filter(|n| !n.lost) {
                let (u, c) = n.memory();
                used += u;
                cap += c;
            }
            (used, cap, w.busy_gpus(), w.running() as u64)
        };
        {
            let mut r = lock(&cluster.records);
            let pending = r
                .jobs
                .values()
                .filter(|j| j.phase == Some(Phase::Pending) || j.phase.is_none())
                .count() as u64;
            r.samples.push(Sample {
                at: now,
                memory_utilisation: if cap > 0 {
                    used as f64 / cap as f64
                } else {
                    0.0
                },
                busy_gpus: busy,
                running,
                pending,
            });
        }
        tokio::time::sleep(Duration::from_secs_f64(every)).await;
    }
}

/// Run the scenario with vramguard on.
pub async fn run(
    scenario: &Scenario,
    prepared: Vec<Prepared>,
    progress: &super::Progress,
) -> Result<Outcome, String> {
    let server = ApiServer::in_process(apiserver::Options {
        request_log: false,
        history_limit: Some(5_000),
        bookmark_every: Duration::from_secs(60),
    });
    let cluster = Arc::new(cluster(scenario, prepared, server.client())?);
    let (mut tasks, webhook) = start(scenario, &cluster).await;
    let (created, mut horizon_hit) = submit_all(scenario, &cluster, &webhook, progress).await;
    if !horizon_hit {
        horizon_hit = until_done(scenario.horizon, &cluster, created, progress).await;
    }
    let ended_at = cluster.clock.secs();
    let running_at_end = lock(&cluster.world).running();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let final_jobs: HashMap<String, TrainingJob> = server
        .objects::<TrainingJob>()
        .into_iter()
        .map(|tj| {
            (
                format!("{}/{}", tj.namespace().unwrap_or_default(), tj.name_any()),
                tj,
            )
        })
        .collect();
    let records = cluster.records.clone();
    drop(cluster);
    let records = Arc::try_unwrap(records)
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .unwrap_or_else(|arc| std::mem::take(&mut *lock(&arc)));
    Ok(Outcome {
        records,
        ended_at,
        horizon_hit,
        final_jobs,
        running_at_end,
    })
}

/// The simulated cluster on a fresh clock: its nodes, empty records with
/// each node's capacity, and the jobs by `namespace/name`.
fn cluster(
    scenario: &Scenario,
    prepared: Vec<Prepared>,
    client: Client,
) -> Result<Cluster, String> {
    let mut records = Records::default();
    for n in &scenario.nodes {
        records
            .capacity
            .insert(n.name.clone(), super::capacity_bytes(n.product));
    }
    let by_name: HashMap<String, usize> = prepared
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                format!(
                    "{}/{}",
                    p.arrival.job.namespace().unwrap_or_default(),
                    p.arrival.job.name_any()
                ),
                i,
            )
        })
        .collect();
    Ok(Cluster {
        client,
        clock: Clock::new(),
        world: Mutex::new(World::new(&scenario.nodes)?),
        records: Arc::new(Mutex::new(records)),
        prepared: Arc::new(prepared),
        by_name,
        oom_after: scenario.oom_after,
        start_after: scenario.start_after,
        ttl_seconds: scenario.agent_ttl.ceil() as u64,
        interval: scenario.agent_interval,
        publishers: Mutex::new(HashMap::new()),
    })
}

/// Every task of the run, in the order a cluster comes up: the agents
/// publish first, the reflectors see every node, then the webhook, the
/// operator, the kubelet, the observer, the sampler, the agents' loops and
/// the faults.
async fn start(
    scenario: &Scenario,
    cluster: &Arc<Cluster>,
) -> (tokio::task::JoinSet<()>, axum::Router) {
    for n in &scenario.nodes {
        cluster.publish(&n.name).await;
    }
    let client = cluster.client.clone();
    let (reflected, reflectors) = inventory::reflect::start(client.clone());
    let source: Arc<dyn Source> = Arc::new(SimSource {
        inner: reflected,
        clock: cluster.clock,
    });
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(reflectors);
    while source.snapshot().nodes.len() < scenario.nodes.len() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let webhook = router(Arc::new(AppState::new(source.clone())));
    let (kill_tx, kill_rx) = tokio::sync::mpsc::unbounded_channel();
    tasks.spawn(operator_process(
        client,
        source.clone(),
        kill_rx,
        cluster.clone(),
    ));
    tasks.spawn(kubelet(cluster.clone()));
    tasks.spawn(observer(cluster.clone(), scenario.agent_ttl));
    tasks.spawn(sampler(cluster.clone(), scenario.sample_every));
    let count = scenario.nodes.len().max(1) as f64;
    for (i, n) in scenario.nodes.iter().enumerate() {
        let offset = scenario.agent_interval * (i as f64 + 1.0) / count;
        tasks.spawn(agent(cluster.clone(), n.name.clone(), offset));
    }
    tasks.spawn(faults(cluster.clone(), scenario.faults.clone(), kill_tx));
    (tasks, webhook)
}

/// Each job at its arrival time through the admission chain; how many
/// were created, and true when the horizon came first.
async fn submit_all(
    scenario: &Scenario,
    cluster: &Cluster,
    webhook: &axum::Router,
    progress: &super::Progress,
) -> (usize, bool) {
    let clock = cluster.clock;
    let mut created = 0usize;
    for (i, p) in cluster.prepared.iter().enumerate() {
        if p.arrival.at > scenario.horizon {
            return (created, true);
        }
        clock.until(p.arrival.at).await;
        let mut a = submit(webhook, &cluster.client, &p.arrival.job, i).await;
        a.at = clock.secs();
        progress.seen(a.at);
        progress.submitted.fetch_add(1, Relaxed);
        let mut r = lock(&cluster.records);
        if a.allowed {
            created += 1;
            if let Some(w) = a.warnings.iter().find(|w| w.contains("will run this")) {
                let text = format!("{} admitted: {w}", a.job);
                r.event(a.at, text);
            }
        } else {
            let text = format!("{} denied at admission: {}", a.job, a.message);
            r.event(a.at, text);
        }
        r.admissions.push(a);
    }
    (created, false)
}

/// Until every created job has ended, or nothing moves for an hour, or
/// time is up (then true).
async fn until_done(
    horizon: f64,
    cluster: &Cluster,
    created: usize,
    progress: &super::Progress,
) -> bool {
    let clock = cluster.clock;
    let mut quiet_since = clock.secs();
    let mut last_state = (usize::MAX, usize::MAX);
    loop {
        let now = clock.secs();
        progress.seen(now);
        if now >= horizon {
            return true;
        }
        let running = lock(&cluster.world).running();
        let ended = lock(&cluster.records)
            .jobs
            .values()
            .filter(|j| j.ended_at.is_some())
            .count();
        if ended >= created && running == 0 {
            return false;
        }
        if (ended, running) != last_state {
            last_state = (ended, running);
            quiet_since = now;
        } else if running == 0 && now - quiet_since > 3600.0 {
            let open = created - ended;
            lock(&cluster.records).event(
                now,
                format!("nothing ran for an hour with {open} jobs still open: stopping"),
            );
            return false;
        }
        clock.until((now + 60.0).min(horizon)).await;
    }
}
