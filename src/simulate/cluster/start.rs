//! The kubelet starting an attempt: a Job the operator created becomes
//! pods bound to the placed nodes and a trainer per GPU, which allocates
//! what the plan it reads from its environment truly needs.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::api::{Checkpointing, Loss, Optimizer, Placement, Precision, TrainingJob, ValidatedJob};
use crate::estimate::gpus::GpuProduct;
use crate::operator::render::{ATTEMPT_LABEL, JOB_LABEL};
use crate::plan::settings::Settings;

use super::super::Prepared;
use super::super::record::{Outcome, RunRecord};
use super::{Cluster, Rank, Run, lock, time};

/// A Job the kubelet is starting: the attempt it runs, of which job.
struct Starting<'a> {
    uid: String,
    /// The Job's name.
    job: String,
    namespace: String,
    tj_name: String,
    /// `namespace/name` of the TrainingJob.
    key: String,
    attempt: u32,
    /// The scenario's job, and its spec as written (valid).
    prepared: &'a Prepared,
    written: &'a ValidatedJob,
}

/// One pod of the Job, bound to `node`, owned by the Job.
fn pod_of(start: &Starting<'_>, name: &str, node: &str, labels: &BTreeMap<String, String>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(start.namespace.clone()),
            labels: Some(labels.clone()),
            annotations: Some(
                [(
                    crate::operator::render::JOB_ANNOTATION.to_string(),
                    start.tj_name.clone(),
                )]
                .into(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: start.job.clone(),
                uid: start.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some(node.to_string()),
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "trainer".into(),
                image: Some("registry.example/trainer:sim".into()),
                ..Default::default()
            }],
            restart_policy: Some("Never".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The plan a trainer reads from its environment, over the job as written.
fn plan_from_env(job: &Job, written: &ValidatedJob) -> ValidatedJob {
    let mut settings = Settings::of(written);
    let env = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.env.clone())
        .unwrap_or_default();
    fn word<T: serde::de::DeserializeOwned>(v: &str) -> Option<T> {
        serde_json::from_value(Value::String(v.to_string())).ok()
    }
    for e in env {
        let Some(v) = e.value.as_deref() else {
            continue;
        };
        match e.name.as_str() {
            "VRAMGUARD_MICRO_BATCH_SIZE" => {
                if let Ok(n) = v.parse() {
                    settings.micro_batch_size = n;
                }
            }
            "VRAMGUARD_GRAD_ACCUM_STEPS" => {
                if let Ok(n) = v.parse() {
                    settings.gradient_accumulation_steps = n;
                }
            }
            "VRAMGUARD_PRECISION" => {
                if let Some(p) = word::<Precision>(v) {
                    settings.precision = p;
                }
            }
            "VRAMGUARD_GRADIENT_CHECKPOINTING" => {
                if let Some(c) = word::<Checkpointing>(v) {
                    settings.gradient_checkpointing = c;
                }
            }
            "VRAMGUARD_OPTIMIZER" => {
                if let Some(o) = word::<Optimizer>(v) {
                    settings.optimizer = o;
                }
            }
            "VRAMGUARD_ZERO_STAGE" => {
                if let Ok(n) = v.parse() {
                    settings.zero_stage = n;
                }
            }
            "VRAMGUARD_LOSS" => {
                if let Some(l) = word::<Loss>(v) {
                    settings.loss = l;
                }
            }
            _ => {}
        }
    }
    // The operator writes only settings the job takes; any others: as written.
    let planned = written.with_settings(&settings);
    planned.unwrap_or_else(|_| written.clone())
}

impl Cluster {
    /// The kubelet sees a Job: start its pods, unless it ran already, is
    /// suspended or finished.
    pub async fn job_seen(self: &Arc<Cluster>, job: Job) {
        let Some(uid) = self.first_sight(&job) else {
            return;
        };
        let namespace = job.namespace().unwrap_or_default();
        if self.start_after > 0.0 && !self.still_there_after_pull(&job, &uid, &namespace).await {
            return;
        }
        let Some(start) = self.starting(&job, uid, namespace) else {
            return;
        };
        let Some(placement) = self.placement_of(&start).await else {
            return;
        };
        let planned = plan_from_env(&job, start.written);
        let now = self.clock.secs();
        let (ranks, pods, lost_node) = self.ranks(&start, &placement, &planned);
        let need = ranks.first().map(|r| r.need);
        let record = lock(&self.records).start_run(RunRecord {
            tj: start.key.clone(),
            attempt: start.attempt,
            job: start.job.clone(),
            nodes: pods.iter().map(|(_, n)| n.clone()).collect(),
            gpus: ranks.len() as u64,
            start: now,
            end: None,
            outcome: Outcome::Running,
            need_per_gpu: need.map(|n| n.total()).unwrap_or(0),
            estimated_per_gpu: need.map(|n| n.estimated_bytes).unwrap_or(0),
            reserved_bytes_per_gpu: placement.reserved_bytes_per_gpu,
            oom_message: None,
            overuse_by_others: 0,
            oom_context: None,
        });
        self.run_pods(&job, &start, &pods).await;
        lock(&self.world).insert_run(
            start.uid.clone(),
            Run {
                namespace: start.namespace.clone(),
                job: start.job.clone(),
                pods,
                ranks,
                record,
                task: None,
            },
        );
        if let Some(node) = lost_node {
            let message = format!("node {node} was lost; the pod could not run");
            self.finish(&start.uid, Outcome::NodeLost, message).await;
            return;
        }
        self.train(start.uid, start.prepared.arrival.duration, now);
    }

    /// The Job's uid the first time the kubelet sees it running: not
    /// suspended, not being deleted, not already run.
    fn first_sight(&self, job: &Job) -> Option<String> {
        let uid = job.uid()?;
        let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
        if suspended || job.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let mut world = lock(&self.world);
        if world.seen.insert(uid.clone(), ()).is_some() {
            return None;
        }
        Some(uid)
    }

    /// Pulling the image: the Job may be deleted (or replaced under its
    /// name) before its pods run; true when it is still the same Job.
    async fn still_there_after_pull(&self, job: &Job, uid: &str, namespace: &str) -> bool {
        let at = self.clock.secs() + self.start_after;
        self.clock.until(at).await;
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        matches!(
            jobs.get_opt(&job.name_any()).await,
            Ok(Some(j)) if j.uid().as_deref() == Some(uid) && j.metadata.deletion_timestamp.is_none()
        )
    }

    /// The scenario job a Job runs an attempt of, when it is one with a
    /// valid spec.
    fn starting(&self, job: &Job, uid: String, namespace: String) -> Option<Starting<'_>> {
        let tj_name = crate::operator::render::training_job_of(&job.metadata)?;
        let attempt: u32 = job
            .labels()
            .get(ATTEMPT_LABEL)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let key = format!("{namespace}/{tj_name}");
        let &idx = self.by_name.get(&key)?;
        let prepared = &self.prepared[idx];
        let written = prepared.validated.as_ref()?;
        Some(Starting {
            uid,
            job: job.name_any(),
            namespace,
            tj_name,
            key,
            attempt,
            prepared,
            written,
        })
    }

    /// Where the operator placed the attempt, as its TrainingJob's status
    /// says now; None when the status names another Job.
    async fn placement_of(&self, start: &Starting<'_>) -> Option<Placement> {
        let tjs: Api<TrainingJob> = Api::namespaced(self.client.clone(), &start.namespace);
        let tj = match tjs.get_opt(&start.tj_name).await {
            Ok(Some(tj)) => tj,
            _ => return None,
        };
        let status = tj.status.unwrap_or_default();
        status
            .placement
            .filter(|_| status.job_name.as_deref() == Some(start.job.as_str()))
    }

    /// A rank per placed GPU with what it truly needs there, the pods
    /// (`namespace/pod`, node) and a placed node that is gone.
    fn ranks(
        &self,
        start: &Starting<'_>,
        placement: &Placement,
        planned: &ValidatedJob,
    ) -> (Vec<Rank>, Vec<(String, String)>, Option<String>) {
        let mut ranks = Vec::new();
        let mut pods = Vec::new();
        let mut lost_node = None;
        let mut world = lock(&self.world);
        for (k, d) in placement.devices.iter().enumerate() {
            let Some(node) = world.nodes.get(&d.node) else {
                lost_node = Some(d.node.clone());
                continue;
            };
            if node.lost {
                lost_node = Some(d.node.clone());
            }
            let product: &'static GpuProduct = node.spec.product;
            let need = match start.prepared.need(planned, start.written, product) {
                Ok(n) => n,
                Err(_) => continue,
            };
            pods.push((
                format!("{}/{}-{k}", start.namespace, start.job),
                d.node.clone(),
            ));
            for g in &d.gpus {
                world.next_pid += 1;
                let pid = world.next_pid;
                ranks.push(Rank {
                    node: d.node.clone(),
                    gpu: g.index,
                    pid,
                    offsets: Vec::new(),
                    need,
                });
            }
        }
        (ranks, pods, lost_node)
    }

    /// The pods, bound to their nodes, running; the Job's status says so.
    async fn run_pods(&self, job: &Job, start: &Starting<'_>, pods: &[(String, String)]) {
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &start.namespace);
        let mut labels = job
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert("job-name".into(), start.job.clone());
        labels.insert(
            JOB_LABEL.into(),
            crate::operator::render::label_value(&start.tj_name),
        );
        labels.insert(ATTEMPT_LABEL.into(), start.attempt.to_string());
        let ts = self.clock.timestamp();
        for (pod, node) in pods {
            let name = pod.rsplit('/').next().unwrap_or(pod).to_string();
            let p = pod_of(start, &name, node, &labels);
            if let Err(error) = pods_api.create(&PostParams::default(), &p).await {
                tracing::warn!(%error, pod = %name, "simulated kubelet: creating the pod");
                continue;
            }
            let status = json!({"status": {
                "phase": "Running",
                "startTime": time(ts),
                "containerStatuses": [{
                    "name": "trainer", "ready": true, "restartCount": 0,
                    "image": "registry.example/trainer:sim", "imageID": "", "started": true,
                    "state": {"running": {"startedAt": time(ts)}}
                }]
            }});
            let _ = pods_api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
        let jobs_api: Api<Job> = Api::namespaced(self.client.clone(), &start.namespace);
        let _ = jobs_api
            .patch_status(
                &start.job,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"active": pods.len(), "ready": pods.len(), "startTime": time(ts)}})),
            )
            .await;
    }

    /// The trainers run: the persistent state first, the peak when the step
    /// reaches it, then to the end (or an OOM on the way).
    fn train(self: &Arc<Cluster>, uid: String, duration: f64, now: f64) {
        let early = self.allocate(&uid, false);
        let cluster = self.clone();
        let run_uid = uid.clone();
        let peak_after = self.oom_after.min(duration);
        let task = tokio::spawn(async move {
            if let Some(message) = early {
                cluster.clock.until(now + peak_after.min(10.0)).await;
                cluster.finish(&uid, Outcome::Oom, message).await;
                return;
            }
            cluster.clock.until(now + peak_after).await;
            if let Some(message) = cluster.allocate(&uid, true) {
                cluster.finish(&uid, Outcome::Oom, message).await;
                return;
            }
            cluster.clock.until(now + duration).await;
            cluster
                .finish(&uid, Outcome::Succeeded, String::new())
                .await;
        });
        let mut world = lock(&self.world);
        if let Some(r) = world.runs.get_mut(&run_uid) {
            r.task = Some(task.abort_handle());
        }
    }
}
