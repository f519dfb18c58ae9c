//! The jobs teams already submit: batch/v1 `Job`, JobSet
//! (`jobset.x-k8s.io/v1alpha2`), Kubeflow Trainer's `TrainJob`
//! (`trainer.kubeflow.org/v1alpha1`) and the Training Operator's `PyTorchJob`
//! (`kubeflow.org/v1`), read into the TrainingJob spec vramguard estimates.
//! Pure: the object in, a spec (and where each field came from) out.
//!
//! - The GPUs: `nvidia.com/gpu` limits (else requests) of each pod set's
//!   containers, its pods (`parallelism`, `replicas`, `numNodes`), and so the
//!   world size and GPUs per node; the product from a `nvidia.com/gpu.product`
//!   node selector or required node affinity (`In`) when set.
//! - The model and recipe, in this order: the `vramguard.io/training`
//!   annotation (the `model`, `training`, `parallelism` and `fitPolicy`
//!   sections of a TrainingJob spec, read and validated as a TrainingJob's
//!   with its errors, their paths under the annotation); else the trainer's
//!   command line ([`trainer`]); else the job is not judged, and why is said.

pub mod knobs;
mod pods;
pub mod shell;
pub mod trainer;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};

use crate::api::{
    self, FieldError, FitMode, FitPolicy, ModelSpec, ParallelismSpec, TrainingJob, TrainingJobSpec,
    ValidatedJob, parse,
};
pub use knobs::Knobs;
pub use pods::{MIG_PREFIX, PodSetError, mig_profile, pod_sets};
pub use trainer::{Source, Trainer};

/// The annotation that tells vramguard the model and recipe of a job.
pub const TRAINING_ANNOTATION: &str = "vramguard.io/training";
/// The resource a pod asks GPUs with.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// GPU Feature Discovery's label of a node's GPU product.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// The sections the annotation may hold.
pub const ANNOTATION_SECTIONS: &[&str] = &["model", "training", "parallelism", "fitPolicy"];
/// Longest annotation read (the API server caps all annotations at 256 KiB).
pub const MAX_ANNOTATION: usize = 256 * 1024;
/// Most pod sets read from one object.
pub const MAX_POD_SETS: usize = 64;

/// The kinds read here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Job,
    JobSet,
    TrainJob,
    PyTorchJob,
    /// Kueue's `Workload` (`kueue.x-k8s.io/v1beta1`): the pod sets Kueue
    /// admits for any kind it manages. Read by the AdmissionCheck controller
    /// ([`crate::kueue`]), never reviewed by the webhook ([`Kind::of`] does
    /// not name it).
    Workload,
}

impl Kind {
    /// The kind of an object of `group` (`""` for core) and `kind`.
    pub fn of(group: &str, kind: &str) -> Option<Kind> {
        match (group, kind) {
            ("batch", "Job") => Some(Kind::Job),
            ("jobset.x-k8s.io", "JobSet") => Some(Kind::JobSet),
            ("trainer.kubeflow.org", "TrainJob") => Some(Kind::TrainJob),
            ("kubeflow.org", "PyTorchJob") => Some(Kind::PyTorchJob),
            _ => None,
        }
    }

    /// The kind of a document with `apiVersion` and `kind`.
    pub fn of_document(doc: &Value) -> Option<Kind> {
        let api_version = doc.get("apiVersion")?.as_str()?;
        let kind = doc.get("kind")?.as_str()?;
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        Kind::of(group, kind)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Job => "Job",
            Kind::JobSet => "JobSet",
            Kind::TrainJob => "TrainJob",
            Kind::PyTorchJob => "PyTorchJob",
            Kind::Workload => "Workload",
        }
    }
}

/// One container of a pod set: its path in the object and its command words.
#[derive(Clone, Debug, PartialEq)]
pub struct Container {
    pub path: String,
    pub argv: Vec<String>,
    pub gpus: u64,
}

/// Pods of one shape.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSet {
    /// Where its pod template is, e.g. `spec.replicatedJobs[0].template.spec.template`.
    pub path: String,
    pub pods: u64,
    pub gpus_per_pod: u64,
    /// A MIG resource asked for (`nvidia.com/mig-1g.10gb`), when one is.
    pub mig: Option<String>,
    /// MIG slices of that resource per pod.
    pub mig_per_pod: u64,
    /// GPU products a node selector or required affinity allows (empty: any).
    pub products: Vec<String>,
    /// Taint keys tolerated (`*` for every taint).
    pub tolerations: Vec<String>,
    pub containers: Vec<Container>,
}

/// Where the model and recipe came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Annotation,
    Command(Trainer),
}

impl Origin {
    pub fn knobs(self) -> Knobs {
        match self {
            Origin::Annotation => Knobs::Annotation,
            Origin::Command(t) => Knobs::Trainer(t),
        }
    }

    pub fn describe(self) -> String {
        match self {
            Origin::Annotation => format!("the {TRAINING_ANNOTATION} annotation"),
            Origin::Command(t) => format!("the {} command line", t.name()),
        }
    }
}

/// A job read well enough to judge.
#[derive(Clone, Debug)]
pub struct Judged {
    pub kind: Kind,
    /// The job as a TrainingJob (name, preset hint, spec).
    pub job: TrainingJob,
    pub validated: ValidatedJob,
    pub origin: Origin,
    /// Where each field came from.
    pub sources: Vec<Source>,
    /// GPU products the pods may run on (empty: any).
    pub products: Vec<String>,
    /// The MIG profile each GPU of the job is a slice of (`3g.40gb`), when the
    /// pods ask MIG slices: judged against slices of that profile only.
    pub mig: Option<String>,
    pub tolerations: Vec<String>,
}

/// What reading a job gives.
#[derive(Clone, Debug)]
pub enum Reading {
    Judge(Box<Judged>),
    /// Not judged; the reason is for a warning.
    NotJudged(String),
    /// The annotation is wrong: its errors, each naming the field.
    Invalid(Vec<FieldError>),
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn annotation(obj: &Value, key: &str) -> Option<String> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Where the annotation's fields are named in errors.
fn annotation_path(inner: &str) -> String {
    let inner = inner.strip_prefix("spec").unwrap_or(inner);
    let inner = inner.strip_prefix('.').unwrap_or(inner);
    if inner.is_empty() {
        format!("metadata.annotations[{TRAINING_ANNOTATION}]")
    } else {
        format!("metadata.annotations[{TRAINING_ANNOTATION}].{inner}")
    }
}

fn field(path: String, reason: impl Into<String>) -> FieldError {
    FieldError {
        path,
        reason: reason.into(),
    }
}

/// The GPUs the pod sets ask, judged as one trainer shape.
struct GpuShape<'a> {
    /// The first pod set that asks GPUs.
    first: &'a PodSet,
    /// The MIG profile of its slices, when it asks slices.
    mig: Option<String>,
    per_pod: u64,
    world: u64,
    /// `2 pods x 8 nvidia.com/gpu`.
    layout: String,
}

/// The trainer shape of `sets`, or why the job is not judged.
fn gpu_shape(kind: Kind, sets: &[PodSet]) -> Result<GpuShape<'_>, String> {
    let gpu_sets: Vec<&PodSet> = sets
        .iter()
        .filter(|s| s.gpus_per_pod > 0 || s.mig.is_some())
        .collect();
    let Some(&first) = gpu_sets.first() else {
        let why = match kind {
            Kind::TrainJob => format!(
                "spec.trainer.resourcesPerNode asks no {GPU_RESOURCE}; GPUs set only in the runtime are not read"
            ),
            _ => format!("no container asks for {GPU_RESOURCE}"),
        };
        return Err(why);
    };
    // A MIG slice is judged as a GPU of the slice's memory (`mig`: its profile).
    let mig = match &first.mig {
        Some(m) if first.gpus_per_pod > 0 => {
            return Err(format!(
                "{}: asks both {GPU_RESOURCE} and {m}; one kind of GPU per pod is judged",
                first.path
            ));
        }
        Some(m) => match mig_profile(m) {
            Some(p) => Some(p.to_string()),
            None => {
                return Err(format!(
                    "{}: {m} is not a MIG profile vramguard reads ({MIG_PREFIX}<compute>g.<memory>gb)",
                    first.path
                ));
            }
        },
        None => None,
    };
    let per_pod_of = |s: &PodSet| {
        if s.mig.is_some() {
            s.mig_per_pod
        } else {
            s.gpus_per_pod
        }
    };
    if let Some(other) = gpu_sets
        .iter()
        .find(|s| per_pod_of(s) != per_pod_of(first) || s.mig != first.mig)
    {
        return Err(format!(
            "pod sets ask different GPUs ({}: {} {}, {}: {} {}); one trainer shape is judged",
            first.path,
            per_pod_of(first),
            first.mig.as_deref().unwrap_or(GPU_RESOURCE),
            other.path,
            per_pod_of(other),
            other.mig.as_deref().unwrap_or(GPU_RESOURCE),
        ));
    }
    let pods: u64 = gpu_sets.iter().map(|s| s.pods).fold(0, u64::saturating_add);
    let per_pod = per_pod_of(first);
    let world = pods.saturating_mul(per_pod);
    let layout = format!(
        "{pods} pod{} x {per_pod} {}",
        if pods == 1 { "" } else { "s" },
        first.mig.as_deref().unwrap_or(GPU_RESOURCE)
    );
    Ok(GpuShape {
        first,
        mig,
        per_pod,
        world,
        layout,
    })
}

/// Read a job of `kind` for judging.
pub fn read(kind: Kind, obj: &Value) -> Reading {
    let sets = match pod_sets(kind, obj) {
        Ok(s) => s,
        Err(e) => return Reading::NotJudged(format!("vramguard could not read the pods: {e}")),
    };
    let annotated = annotation(obj, TRAINING_ANNOTATION);
    let GpuShape {
        first,
        mig,
        per_pod,
        world,
        layout,
    } = match gpu_shape(kind, &sets) {
        Ok(shape) => shape,
        Err(why) => return Reading::NotJudged(why),
    };
    let products = first.products.clone();
    let tolerations = first.tolerations.clone();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let hint = annotation(obj, api::PRESET_HINT_ANNOTATION);
    let mut metadata = ObjectMeta {
        name: Some(name),
        namespace: obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..ObjectMeta::default()
    };
    if let Some(h) = hint {
        metadata.annotations = Some(BTreeMap::from([(
            api::PRESET_HINT_ANNOTATION.to_string(),
            h,
        )]));
    }
    let base_sources = vec![Source {
        field: "parallelism.gpus".to_string(),
        from: format!("{world}: {layout} ({})", first.path),
    }];
    if let Some(text) = annotated {
        return with_mig(
            from_annotation(
                kind,
                &text,
                world,
                per_pod,
                &layout,
                metadata,
                base_sources,
                products,
                tolerations,
            ),
            mig,
        );
    }
    // The trainer's command line, in the GPU containers first.
    let mut unreadable: Option<String> = None;
    let mut containers: Vec<&Container> = first.containers.iter().filter(|c| c.gpus > 0).collect();
    containers.extend(first.containers.iter().filter(|c| c.gpus == 0));
    for c in containers {
        let cmds = match shell::commands(&c.argv) {
            Ok(c) => c,
            Err(e) => {
                unreadable.get_or_insert(format!("{}: {e}", c.path));
                continue;
            }
        };
        for cmd in cmds {
            match trainer::parse(&cmd) {
                trainer::Parsed::Found(f) => {
                    return with_mig(
                        from_command(
                            kind,
                            *f,
                            world,
                            per_pod,
                            metadata,
                            base_sources,
                            products,
                            tolerations,
                            &c.path,
                        ),
                        mig,
                    );
                }
                trainer::Parsed::Unreadable(why) => {
                    unreadable.get_or_insert(format!("{}: {why}", c.path));
                }
                trainer::Parsed::NotTrainer => {}
            }
        }
    }
    Reading::NotJudged(match unreadable {
        Some(why) => format!("{why}; add the {TRAINING_ANNOTATION} annotation"),
        None => format!(
            "no {TRAINING_ANNOTATION} annotation and no trainer command vramguard reads \
             (accelerate launch/torchrun/python with --model_name_or_path, tune run, litgpt finetune)"
        ),
    })
}

/// `reading` of pods that ask MIG slices of `mig`.
fn with_mig(reading: Reading, mig: Option<String>) -> Reading {
    match reading {
        Reading::Judge(mut j) => {
            j.mig = mig;
            Reading::Judge(j)
        }
        other => other,
    }
}

/// The annotation's text read into its sections (`model`, `training`, ...), or what is
/// wrong with it, at its path under the annotation.
fn annotation_sections(kind: Kind, text: &str) -> Result<Map<String, Value>, Vec<FieldError>> {
    let at = || annotation_path("");
    if text.len() > MAX_ANNOTATION {
        return Err(vec![field(
            at(),
            format!(
                "{} bytes; vramguard reads at most {MAX_ANNOTATION}",
                text.len()
            ),
        )]);
    }
    let doc = match parse::documents(text) {
        Ok(mut d) if d.len() == 1 => d.remove(0),
        Ok(d) => {
            return Err(vec![field(
                at(),
                format!(
                    "{} YAML documents; write one mapping with {}",
                    d.len(),
                    ANNOTATION_SECTIONS.join(", ")
                ),
            )]);
        }
        Err(e) => return Err(vec![field(at(), e.to_string())]),
    };
    let Value::Object(map) = doc else {
        return Err(vec![field(
            at(),
            format!("expected a mapping with {}", ANNOTATION_SECTIONS.join(", ")),
        )]);
    };
    let unknown: Vec<FieldError> = map
        .keys()
        .filter(|k| !ANNOTATION_SECTIONS.contains(&k.as_str()))
        .map(|k| {
            field(
                annotation_path(k),
                format!(
                    "unknown section; the annotation holds {} (the pods come from the {} itself)",
                    ANNOTATION_SECTIONS.join(", "),
                    kind.name()
                ),
            )
        })
        .collect();
    if !unknown.is_empty() {
        return Err(unknown);
    }
    Ok(map)
}

#[allow(clippy::too_many_arguments)]
fn from_annotation(
    kind: Kind,
    text: &str,
    world: u64,
    per_pod: u64,
    layout: &str,
    metadata: ObjectMeta,
    mut sources: Vec<Source>,
    products: Vec<String>,
    tolerations: Vec<String>,
) -> Reading {
    let at = || annotation_path("");
    let mut map = match annotation_sections(kind, text) {
        Ok(map) => map,
        Err(errs) => return Reading::Invalid(errs),
    };
    // The GPUs are the pods'; the annotation may repeat them, not contradict them.
    let par = map
        .entry("parallelism")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(p) = par {
        let mut errs = Vec::new();
        for (key, want) in [("gpus", world), ("gpusPerNode", per_pod)] {
            match p.get(key) {
                None => {
                    p.insert(key.to_string(), json!(want));
                }
                Some(v) if v.as_u64() == Some(want) => {}
                Some(v) if v.is_u64() => errs.push(field(
                    annotation_path(&format!("parallelism.{key}")),
                    format!(
                        "{v}, but the {} asks {want} ({layout}); leave it out or make them agree",
                        kind.name()
                    ),
                )),
                // Wrong types are the schema's to report.
                Some(_) => {}
            }
        }
        if !errs.is_empty() {
            return Reading::Invalid(errs);
        }
    }
    let name = metadata.name.clone().unwrap_or_default();
    let doc = json!({
        "apiVersion": parse::API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": Value::Object(map),
    });
    let rename = |errs: Vec<FieldError>| {
        errs.into_iter()
            .map(|e| field(annotation_path(&e.path), e.reason))
            .collect::<Vec<_>>()
    };
    let mut tj = match parse::training_job(doc) {
        Ok(tj) => tj,
        Err(parse::ParseError::Fields(f)) => return Reading::Invalid(rename(f)),
        Err(e) => return Reading::Invalid(vec![field(at(), e.to_string())]),
    };
    tj.metadata = metadata;
    let validated = match api::validate_job(&tj) {
        Ok(v) => v,
        Err(e) => return Reading::Invalid(rename(e.0)),
    };
    sources.push(Source {
        field: "model, training, fitPolicy".to_string(),
        from: format!("the {TRAINING_ANNOTATION} annotation"),
    });
    Reading::Judge(Box::new(Judged {
        kind,
        job: tj,
        validated,
        origin: Origin::Annotation,
        sources,
        products,
        mig: None,
        tolerations,
    }))
}

#[allow(clippy::too_many_arguments)]
fn from_command(
    kind: Kind,
    f: trainer::FromCommand,
    world: u64,
    per_pod: u64,
    metadata: ObjectMeta,
    mut sources: Vec<Source>,
    products: Vec<String>,
    tolerations: Vec<String>,
    container: &str,
) -> Reading {
    if let Some(w) = f.launcher_world
        && w != world
    {
        sources.push(Source {
            field: "parallelism.gpus".to_string(),
            from: format!(
                "the launcher in {container} says {w} processes; the pods' {world} GPUs are judged"
            ),
        });
    }
    let mut training = f.training;
    if f.accumulation >= 1 {
        training.global_batch_size = Some(
            training
                .micro_batch_size
                .saturating_mul(f.accumulation)
                .saturating_mul(world),
        );
    }
    let allow = match f.trainer {
        Trainer::LitGpt => vec![api::AdjustableField::MicroBatchSize],
        _ => vec![
            api::AdjustableField::MicroBatchSize,
            api::AdjustableField::GradientCheckpointing,
        ],
    };
    let spec = TrainingJobSpec {
        model: ModelSpec {
            preset: Some(f.preset.to_string()),
            ..ModelSpec::default()
        },
        training,
        parallelism: ParallelismSpec {
            gpus: world,
            gpus_per_node: Some(per_pod),
            strategy: f.strategy,
            sharding: f.sharding,
            ..ParallelismSpec::default()
        },
        fit_policy: FitPolicy {
            mode: FitMode::Adjust,
            allow,
            ..FitPolicy::default()
        },
        template: None,
    };
    let tj = TrainingJob {
        metadata,
        spec,
        status: None,
    };
    sources.extend(f.sources);
    match api::validate_job(&tj) {
        Ok(validated) => Reading::Judge(Box::new(Judged {
            kind,
            job: tj,
            validated,
            origin: Origin::Command(f.trainer),
            sources,
            products,
            mig: None,
            tolerations,
        })),
        // What the command says does not make a valid job (a batch that does
        // not divide, too many GPUs): not judged, with the validator's words.
        Err(e) => Reading::NotJudged(format!(
            "the job read from {container}'s command is not one vramguard can estimate: {}",
            e.to_string().replace('\n', "; ")
        )),
    }
}

#[cfg(test)]
mod tests;
