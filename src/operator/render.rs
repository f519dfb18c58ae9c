//! The batch/v1 Job (and, for multi-node jobs, the headless Service) that runs
//! one attempt of a TrainingJob: pure, from the TrainingJob and the decision
//! recorded in its status. Rendering from status alone is what makes a
//! restarted operator create exactly the Job it had decided on.
//!
//! On top of the user's pod template:
//! - labels `vramguard.io/training-job` and `vramguard.io/attempt` (pods are
//!   found by them), the Kueue queue label when the TrainingJob has one (the
//!   Job then starts suspended: Kueue admits it by quota);
//! - `restartPolicy: Never` and `backoffLimit: 0`: a failed rank fails the
//!   attempt, and the operator decides the retry;
//! - on every container the plan's `VRAMGUARD_*` variables and the framework
//!   hints (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` when learnt,
//!   `TF_FORCE_GPU_ALLOW_GROWTH`, `XLA_PYTHON_CLIENT_PREALLOCATE`), and
//!   `terminationMessagePolicy: FallbackToLogsOnError` unless set;
//! - the GPU limit on the first container (`nvidia.com/gpu`, or
//!   `nvidia.com/mig-<profile>` for a MIG slice), and a required node
//!   affinity to the placement (added to each of the user's own terms);
//! - multi-node: an Indexed Job of one pod per node, a required pod
//!   anti-affinity so no two share a node, the headless Service as subdomain
//!   and the rendezvous variables torchrun reads (`MASTER_ADDR`,
//!   `MASTER_PORT`, `WORLD_SIZE`, `NODE_RANK`, `NNODES`, `NPROC_PER_NODE`).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, EnvVarSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodTemplateSpec,
    ResourceRequirements, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::enum_name;
use crate::api::{Framework, Placement, PlanStatus, TrainingJob};

/// Label on the Job and its pods: the TrainingJob's name, as [`label_value`] writes it
/// (a name longer than a label value may be is cut, with a hash of the whole).
pub const JOB_LABEL: &str = "vramguard.io/training-job";
/// Annotation on the Job and its pods: the TrainingJob's name in full.
pub const JOB_ANNOTATION: &str = "vramguard.io/training-job";
/// Longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE: usize = 63;
/// Label on the Job and its pods: the attempt (0 first, +1 per OOM retry).
pub const ATTEMPT_LABEL: &str = "vramguard.io/attempt";
/// Kueue's queue label, copied from the TrainingJob.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The index of an Indexed Job's pod, as the Job controller annotates it.
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// torchrun's default rendezvous port.
pub const MASTER_PORT: u16 = 29500;
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The Job of one attempt: `<name>-<attempt>`, the name shortened (with a
/// hash of the whole, so two long names stay apart) to leave room for an
/// Indexed Job's pod hostnames (`<job>-<index>`, at most 63 characters).
pub fn job_name(training_job: &str, attempt: u32) -> String {
    format!("{}-{attempt}", shortened(training_job, 48))
}

/// `name` as a label value: itself when it fits, else cut and suffixed with a hash
/// of the whole, the way Kubernetes controllers shorten generated names.
pub fn label_value(name: &str) -> String {
    shortened(name, MAX_LABEL_VALUE)
}

/// `name` in at most `max` bytes: a prefix (ending in an alphanumeric) and 8 hex
/// digits of the whole name's hash, so two long names stay apart.
fn shortened(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let hash = super::fingerprint::fnv1a(name.as_bytes());
    let mut cut = max - 9;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}-{:08x}",
        name[..cut].trim_end_matches(|c: char| !c.is_ascii_alphanumeric()),
        hash as u32
    )
}

/// The TrainingJob a Job or pod belongs to: the annotation's full name, else the label.
pub fn training_job_of(meta: &ObjectMeta) -> Option<String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(JOB_ANNOTATION))
        .or_else(|| meta.labels.as_ref().and_then(|l| l.get(JOB_LABEL)))
        .cloned()
}

/// What one attempt runs with: the decision recorded in status.
#[derive(Clone, Debug)]
pub struct AttemptSpec<'a> {
    pub attempt: u32,
    pub plan: &'a PlanStatus,
    pub placement: &'a Placement,
    pub framework: Framework,
    /// Ranks (GPUs) in all.
    pub gpus: u64,
}

fn env(name: &str, value: impl ToString) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

/// Set (replace) an environment variable.
fn set_env(list: &mut Vec<EnvVar>, var: EnvVar) {
    match list.iter_mut().find(|e| e.name == var.name) {
        Some(e) => *e = var,
        None => list.push(var),
    }
}

/// The plan's variables and the framework hints.
fn plan_env(spec: &AttemptSpec<'_>) -> Vec<EnvVar> {
    let p = spec.plan;
    let mut out = vec![
        env("VRAMGUARD_MICRO_BATCH_SIZE", p.micro_batch_size),
        env("VRAMGUARD_GRAD_ACCUM_STEPS", p.gradient_accumulation_steps),
        env("VRAMGUARD_PRECISION", enum_name(&p.precision)),
        env(
            "VRAMGUARD_GRADIENT_CHECKPOINTING",
            enum_name(&p.gradient_checkpointing),
        ),
        env("VRAMGUARD_OPTIMIZER", enum_name(&p.optimizer)),
        env("VRAMGUARD_ZERO_STAGE", p.zero_stage),
        env("VRAMGUARD_LOSS", enum_name(&p.loss)),
        env("VRAMGUARD_ATTEMPT", spec.attempt),
    ];
    match spec.framework {
        Framework::Tensorflow => out.push(env("TF_FORCE_GPU_ALLOW_GROWTH", "true")),
        Framework::Jax => out.push(env("XLA_PYTHON_CLIENT_PREALLOCATE", "false")),
        Framework::Pytorch => {}
    }
    out
}

fn rendezvous_env(job: &str, service: &str, spec: &AttemptSpec<'_>, nodes: usize) -> Vec<EnvVar> {
    let per_node = spec.gpus / (nodes as u64).max(1);
    vec![
        env("MASTER_ADDR", format!("{job}-0.{service}")),
        env("MASTER_PORT", MASTER_PORT),
        env("WORLD_SIZE", spec.gpus),
        env("NNODES", nodes),
        env("NPROC_PER_NODE", per_node),
        EnvVar {
            name: "NODE_RANK".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        },
    ]
}

/// PyTorch's allocator settings with expandable segments on, keeping what
/// the user set.
fn with_expandable_segments(existing: Option<&str>) -> String {
    match existing {
        Some(v) if v.contains("expandable_segments") => v.to_string(),
        Some(v) if !v.trim().is_empty() => format!("{v},expandable_segments:True"),
        _ => "expandable_segments:True".to_string(),
    }
}

fn gpu_limits(container: &mut Container, placement: &Placement, per_node: u64) {
    let first = placement.devices.first().and_then(|n| n.gpus.first());
    let (resource, count) = match first.and_then(|g| g.mig_profile.as_deref()) {
        Some(profile) => (format!("nvidia.com/mig-{profile}"), 1),
        None => ("nvidia.com/gpu".to_string(), per_node),
    };
    let resources = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    let q = Quantity(count.to_string());
    resources
        .limits
        .get_or_insert_with(BTreeMap::new)
        .insert(resource.clone(), q.clone());
    // Extended resources need request = limit when a request is given.
    if let Some(req) = resources.requests.as_mut()
        && req.contains_key(&resource)
    {
        req.insert(resource, q);
    }
}

/// Require one of `nodes`, in every term the user wrote (terms are ORed,
/// expressions within a term ANDed).
fn require_nodes(affinity: &mut Affinity, nodes: Vec<String>) {
    let requirement = NodeSelectorRequirement {
        key: HOSTNAME_LABEL.into(),
        operator: "In".into(),
        values: Some(nodes),
    };
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let selector = node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if selector.node_selector_terms.is_empty() {
        selector
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut selector.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
}

fn attempt_labels(tj: &TrainingJob, attempt: u32) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(JOB_LABEL.to_string(), label_value(&tj.name_any()));
    labels.insert(ATTEMPT_LABEL.to_string(), attempt.to_string());
    labels
}

fn owner(tj: &TrainingJob) -> Result<OwnerReference, String> {
    tj.controller_owner_ref(&())
        .ok_or_else(|| "the TrainingJob has no uid yet".to_string())
}

/// Placement's node names, in order.
fn nodes_of(placement: &Placement) -> Vec<String> {
    if placement.devices.is_empty() {
        if placement.nodes.is_empty() {
            vec![placement.node.clone()]
        } else {
            placement.nodes.clone()
        }
    } else {
        placement.devices.iter().map(|n| n.node.clone()).collect()
    }
}

/// The user's pod template, typed. Errors name the field that is wrong.
fn template(tj: &TrainingJob) -> Result<PodTemplateSpec, String> {
    let value = tj.spec.template.clone().ok_or_else(|| {
        "spec.template: required to run the job (a TrainingJob without a pod template can only be estimated)"
            .to_string()
    })?;
    let template: PodTemplateSpec =
        serde_path_to_error::deserialize(serde_json::Value::Object(value))
            .map_err(|e| format!("spec.template.{}: {}", e.path(), e.inner()))?;
    match &template.spec {
        None => Err("spec.template.spec: required (the pod's containers)".to_string()),
        Some(p) if p.containers.is_empty() => {
            Err("spec.template.spec.containers: at least one container is required".into())
        }
        Some(_) => Ok(template),
    }
}

/// Check that the TrainingJob's template can run (before placing it).
pub fn check_template(tj: &TrainingJob) -> Result<(), String> {
    template(tj).map(|_| ())
}

/// The Job of one attempt. Errors name the template field that is wrong.
pub fn job(tj: &TrainingJob, spec: &AttemptSpec<'_>) -> Result<Job, String> {
    let name = job_name(&tj.name_any(), spec.attempt);
    let mut template = template(tj)?;
    let Some(pod) = template.spec.as_mut() else {
        return Err("spec.template.spec: required (the pod's containers)".to_string());
    };
    let nodes = nodes_of(spec.placement);
    let multi = nodes.len() > 1;
    let per_node = spec.gpus / (nodes.len() as u64).max(1);

    let mut vars = plan_env(spec);
    if multi {
        vars.extend(rendezvous_env(&name, &name, spec, nodes.len()));
    }
    for c in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        let list = c.env.get_or_insert_with(Vec::new);
        for v in &vars {
            set_env(list, v.clone());
        }
        if spec.plan.expandable_segments {
            let existing = list
                .iter()
                .find(|e| e.name == "PYTORCH_CUDA_ALLOC_CONF")
                .and_then(|e| e.value.as_deref());
            let value = with_expandable_segments(existing);
            set_env(list, env("PYTORCH_CUDA_ALLOC_CONF", value));
        }
        if c.termination_message_policy.is_none() {
            c.termination_message_policy = Some("FallbackToLogsOnError".into());
        }
    }
    gpu_limits(&mut pod.containers[0], spec.placement, per_node);
    pod.restart_policy = Some("Never".into());
    let labels = attempt_labels(tj, spec.attempt);
    let affinity = pod.affinity.get_or_insert_with(Affinity::default);
    require_nodes(affinity, nodes.clone());
    if multi {
        affinity
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(labels.clone()),
                    match_expressions: None,
                }),
                topology_key: HOSTNAME_LABEL.into(),
                ..PodAffinityTerm::default()
            });
        pod.subdomain = Some(name.clone());
    }
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels.clone());
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(JOB_ANNOTATION.to_string(), tj.name_any());

    let mut job_labels = labels;
    let queue = tj.labels().get(KUEUE_QUEUE_LABEL).cloned();
    if let Some(q) = &queue {
        job_labels.insert(KUEUE_QUEUE_LABEL.to_string(), q.clone());
    }
    let count = i32::try_from(nodes.len()).map_err(|_| "too many nodes".to_string())?;
    let mut annotations = BTreeMap::new();
    annotations.insert(JOB_ANNOTATION.to_string(), tj.name_any());
    if !spec.plan.changes.is_empty() {
        annotations.insert(
            "vramguard.io/plan".to_string(),
            spec.plan.changes.join(", "),
        );
    }
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: tj.namespace(),
            labels: Some(job_labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner(tj)?]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            template,
            backoff_limit: Some(0),
            completions: Some(count),
            parallelism: Some(count),
            completion_mode: multi.then(|| "Indexed".to_string()),
            suspend: queue.is_some().then_some(true),
            ..JobSpec::default()
        }),
        status: None,
    })
}

/// The headless Service a multi-node attempt's pods resolve each other by.
pub fn service(tj: &TrainingJob, attempt: u32) -> Result<Service, String> {
    let name = job_name(&tj.name_any(), attempt);
    let labels = attempt_labels(tj, attempt);
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: tj.namespace(),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner(tj)?]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(labels),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("rendezvous".into()),
                port: i32::from(MASTER_PORT),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// True when the placement spans several nodes (an Indexed Job and a Service).
pub fn is_multi_node(placement: &Placement) -> bool {
    nodes_of(placement).len() > 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PlacedGpu, PlacedNode, TrainingJobSpec};

    fn tj(template: &str) -> TrainingJob {
        let spec: TrainingJobSpec = serde_saphyr::from_str(&format!(
            "model: {{preset: llama-3.1-8b}}\ntraining: {{mode: lora, microBatchSize: 2, sequenceLength: 512}}\n{template}"
        ))
        .expect("test spec");
        let mut tj = TrainingJob::new("train", spec);
        tj.metadata.namespace = Some("ml".into());
        tj.metadata.uid = Some("uid-1".into());
        tj
    }

    fn placement(nodes: &[&str], mig: Option<&str>) -> Placement {
        Placement {
            node: nodes[0].into(),
            devices: nodes
                .iter()
                .map(|n| PlacedNode {
                    node: n.to_string(),
                    gpus: vec![PlacedGpu {
                        index: 0,
                        mig_index: mig.map(|_| 1),
                        mig_profile: mig.map(str::to_string),
                        product: "NVIDIA A100-SXM4-80GB".into(),
                    }],
                })
                .collect(),
            ..Placement::default()
        }
    }

    const WITH_AFFINITY: &str = r#"template:
  spec:
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
            - matchExpressions: [{key: zone, operator: In, values: [a]}]
            - matchExpressions: [{key: zone, operator: In, values: [b]}]
    containers:
      - name: t
        image: x
        env: [{name: PYTORCH_CUDA_ALLOC_CONF, value: "max_split_size_mb:128"}, {name: VRAMGUARD_MICRO_BATCH_SIZE, value: "99"}]
        terminationMessagePolicy: File
"#;

    #[test]
    fn the_users_terms_keep_and_the_plan_wins() {
        let mut plan = PlanStatus {
            micro_batch_size: 1,
            gradient_accumulation_steps: 2,
            expandable_segments: true,
            ..PlanStatus::default()
        };
        plan.changes = vec!["microBatchSize 2 → 1".into()];
        let p = placement(&["n1"], None);
        let spec = AttemptSpec {
            attempt: 2,
            plan: &plan,
            placement: &p,
            framework: Framework::Pytorch,
            gpus: 1,
        };
        let job = job(&tj(WITH_AFFINITY), &spec).expect("renders");
        assert_eq!(job.metadata.name.as_deref(), Some("train-2"));
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let terms = &pod
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2, "the user's alternatives stay");
        for t in terms {
            let e = t.match_expressions.as_ref().unwrap();
            assert_eq!(e.len(), 2);
            assert_eq!(e[1].values.as_deref(), Some(&["n1".to_string()][..]));
        }
        let c = &pod.containers[0];
        let env = |n: &str| {
            c.env
                .as_ref()
                .unwrap()
                .iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(env("VRAMGUARD_MICRO_BATCH_SIZE").as_deref(), Some("1"));
        assert_eq!(
            env("PYTORCH_CUDA_ALLOC_CONF").as_deref(),
            Some("max_split_size_mb:128,expandable_segments:True")
        );
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(
            job.metadata.annotations.as_ref().unwrap()["vramguard.io/plan"],
            "microBatchSize 2 → 1"
        );
    }

    #[test]
    fn a_mig_slice_is_asked_for_by_its_profile() {
        let plan = PlanStatus::default();
        let p = placement(&["n1"], Some("3g.40gb"));
        let spec = AttemptSpec {
            attempt: 0,
            plan: &plan,
            placement: &p,
            framework: Framework::Jax,
            gpus: 1,
        };
        let t = tj("template: {spec: {containers: [{name: t, image: x}]}}");
        let job = job(&t, &spec).unwrap();
        let c = &job.spec.unwrap().template.spec.unwrap().containers[0];
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["nvidia.com/mig-3g.40gb"].0, "1");
        assert!(!limits.contains_key("nvidia.com/gpu"));
        assert!(
            c.env
                .as_ref()
                .unwrap()
                .iter()
                .any(|e| e.name == "XLA_PYTHON_CLIENT_PREALLOCATE")
        );
    }

    #[test]
    fn bad_templates_name_the_field() {
        let missing = tj("");
        assert!(
            check_template(&missing)
                .unwrap_err()
                .starts_with("spec.template")
        );
        let empty = tj("template: {spec: {containers: []}}");
        assert!(
            check_template(&empty)
                .unwrap_err()
                .contains("spec.template.spec.containers")
        );
        let wrong = tj("template: {spec: {containers: [{name: t, image: 5}]}}");
        let e = check_template(&wrong).unwrap_err();
        assert!(e.contains("containers[0].image"), "{e}");
    }

    #[test]
    fn job_names_stay_short_and_distinct() {
        let long_a = "a".repeat(60);
        let long_b = format!("{}b", "a".repeat(59));
        let (x, y) = (job_name(&long_a, 3), job_name(&long_b, 3));
        assert!(x.len() <= 52 && y.len() <= 52, "{x} {y}");
        assert_ne!(x, y);
        assert!(x.ends_with("-3"));
        assert_eq!(job_name("short", 0), "short-0");
    }
}
