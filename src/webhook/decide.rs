//! The admission decision for one review: a plain function of the request and
//! an inventory snapshot. The webhook keeps no state of its own, so any replica
//! answers any review the same.

use k8s_openapi::jiff::Timestamp;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};

use super::metrics::{Reason, Verdict};
use crate::api::{self, ValidatedJob, parse};
use crate::estimate::{GIB, gpus};
use crate::inventory::{ProductCount, Snapshot};
use crate::plan::{self, GpuView, PlaceOutcome, Shrink};

/// Longest denial message we send (the API server shows it to the user whole).
pub const MAX_MESSAGE: usize = 1024;
/// Warnings beyond this are truncated by clients; keep each short.
pub const MAX_WARNING: usize = 120;

/// A response plus the bounded labels it is counted under.
#[derive(Debug)]
pub struct Decision {
    pub response: AdmissionResponse,
    pub verdict: Verdict,
    pub reason: Reason,
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn deny(req: &AdmissionRequest<DynamicObject>, reason: Reason, message: &str) -> Decision {
    let mut response = AdmissionResponse::from(req).deny(truncate(message, MAX_MESSAGE));
    response.result.code = 403;
    response.result.reason = match reason {
        Reason::InvalidSpec | Reason::Immutable => "Invalid".to_string(),
        _ => "Forbidden".to_string(),
    };
    Decision {
        response,
        verdict: Verdict::Denied,
        reason,
    }
}

fn allow(req: &AdmissionRequest<DynamicObject>, reason: Reason, warnings: Vec<String>) -> Decision {
    let mut response = AdmissionResponse::from(req);
    if !warnings.is_empty() {
        response.warnings = Some(warnings.iter().map(|w| truncate(w, MAX_WARNING)).collect());
    }
    Decision {
        response,
        verdict: Verdict::Allowed,
        reason,
    }
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

fn read_job(obj: &DynamicObject) -> Result<(api::TrainingJob, ValidatedJob), String> {
    let value = object_value(obj)?;
    let tj = parse::training_job(value).map_err(|e| e.to_string())?;
    let job = api::validate(&tj.spec).map_err(|e| e.to_string())?;
    Ok((tj, job))
}

/// The object as JSON, built from its parts (cheaper than serialising it whole).
fn object_value(obj: &DynamicObject) -> Result<serde_json::Value, String> {
    // The pod template does not change the estimate and is kept as written
    // (a free-form object): leave it out rather than copy and re-read it.
    let mut map = serde_json::Map::new();
    match &obj.data {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if k == "spec"
                    && let serde_json::Value::Object(spec) = v
                {
                    let spec: serde_json::Map<_, _> = spec
                        .iter()
                        .filter(|(key, _)| key.as_str() != "template")
                        .map(|(key, value)| (key.clone(), value.clone()))
                        .collect();
                    map.insert(k.clone(), serde_json::Value::Object(spec));
                } else {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        serde_json::Value::Null => {}
        other => return Err(format!("the object is {other}, not a JSON object")),
    }
    if let Some(types) = &obj.types {
        map.insert("apiVersion".into(), types.api_version.clone().into());
        map.insert("kind".into(), types.kind.clone().into());
    }
    let metadata =
        serde_json::to_value(&obj.metadata).map_err(|e| format!("the object's metadata: {e}"))?;
    map.insert("metadata".into(), metadata);
    Ok(serde_json::Value::Object(map))
}

/// What one GPU product says about the job.
struct ProductAnswer<'a> {
    product: &'a ProductCount,
    shrink: Shrink,
}

/// Judge one review against `snapshot` at `now`.
pub fn review(
    req: &AdmissionRequest<DynamicObject>,
    snapshot: &Snapshot,
    now: Timestamp,
) -> Decision {
    let is_training_job = req.kind.group == "vramguard.io" && req.kind.kind == "TrainingJob";
    if !is_training_job || !matches!(req.operation, Operation::Create | Operation::Update) {
        return allow(req, Reason::NotJudged, Vec::new());
    }
    let Some(obj) = &req.object else {
        return deny(req, Reason::InvalidSpec, "the review carries no object");
    };
    let (tj, job) = match read_job(obj) {
        Ok(j) => j,
        Err(e) => {
            let msg = format!(
                "TrainingJob {} is invalid: {}",
                req.name,
                e.replace('\n', "; ")
            );
            return deny(req, Reason::InvalidSpec, &msg);
        }
    };
    if req.operation == Operation::Update
        && let Some(old) = &req.old_object
        && let Ok(old_value) = object_value(old)
        && let Ok(old_tj) = parse::training_job(old_value)
    {
        let mut changed = Vec::new();
        if old_tj.spec.model != tj.spec.model {
            changed.push("spec.model");
        }
        if old_tj.spec.training.mode != tj.spec.training.mode {
            changed.push("spec.training.mode");
        }
        if !changed.is_empty() {
            let msg = format!(
                "{} cannot change on a TrainingJob (its estimate, plan and placement depend on it); delete and re-create the job",
                changed.join(" and ")
            );
            return deny(req, Reason::Immutable, &msg);
        }
    }

    let now = snapshot
        .as_of_unix
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(now);
    let products = snapshot.products();
    if products.is_empty() {
        return deny(
            req,
            Reason::NoInventory,
            "the cluster reports no GPUs: no GpuNode objects and no nodes with GPU Feature Discovery labels (nvidia.com/gpu.product, nvidia.com/gpu.memory, nvidia.com/gpu.count)",
        );
    }
    let gpus_needed = job.spec.parallelism.gpus;
    let single_node = gpus_needed <= job.gpus_per_node;
    let fallback = gpus::find("h100-80gb").expect("the catalog has h100-80gb");
    // Enough GPUs of a product to host every rank.
    let eligible: Vec<&ProductCount> = products
        .iter()
        .filter(|p| p.gpus >= gpus_needed && (!single_node || p.max_per_node >= gpus_needed))
        .collect();

    // Fits as written on some product? One estimate per GPU model, no search.
    let mut estimates: Vec<(&'static str, crate::estimate::Estimate)> = Vec::new();
    for p in &eligible {
        let catalog = p.catalog.unwrap_or(fallback);
        let est = match estimates.iter().find(|(n, _)| *n == catalog.name) {
            Some((_, e)) => e.clone(),
            None => match crate::estimate::estimate(&job, catalog) {
                Ok(e) => {
                    estimates.push((catalog.name, e.clone()));
                    e
                }
                Err(e) => return deny(req, Reason::InvalidSpec, &e.to_string()),
            },
        };
        let v = plan::fit(
            est.status.per_gpu_bytes,
            est.status.largest_tensor_bytes,
            job.spec.fit_policy.safety_margin,
            GpuView::empty(p.usable_bytes),
        );
        if v.fits {
            let warnings = busy_warning(&job, snapshot, now).into_iter().collect();
            return allow(req, Reason::Fits, warnings);
        }
    }

    let mut answers = Vec::new();
    for p in eligible {
        let catalog = p.catalog.unwrap_or(fallback);
        match plan::shrink(&job, catalog, GpuView::empty(p.usable_bytes)) {
            Ok(shrink) => answers.push(ProductAnswer { product: p, shrink }),
            Err(e) => return deny(req, Reason::InvalidSpec, &e.to_string()),
        }
    }
    // Fits after an allowed change?
    let cheapest = answers
        .iter()
        .filter_map(|a| a.shrink.plan.as_ref().map(|p| (a, p)))
        .min_by(|x, y| {
            x.1.slowdown
                .partial_cmp(&y.1.slowdown)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(x.0.product.product.cmp(&y.0.product.product))
        });
    if let Some((a, p)) = cheapest {
        let mut warnings = vec![format!(
            "vramguard will run this on {} with {}",
            a.product.product,
            p.changes.join(", ")
        )];
        if let Some(w) = busy_warning(&p.apply(&job), snapshot, now) {
            warnings.push(w);
        }
        return allow(req, Reason::FitsAfterChange, warnings);
    }

    // Nothing fits: say why in numbers and what would.
    let biggest = &products[0];
    let need = answers
        .iter()
        .map(|a| a.shrink.as_written.need_bytes)
        .min()
        .or_else(|| {
            let catalog = biggest.catalog.unwrap_or(fallback);
            crate::estimate::estimate(&job, catalog).ok().map(|e| {
                plan::with_margin(e.status.per_gpu_bytes, job.spec.fit_policy.safety_margin)
            })
        })
        .unwrap_or(0);
    let mut msg = format!(
        "TrainingJob {} needs {} per GPU (with the {:.0} % safety margin) on {} GPU{}; the biggest GPU in this cluster is {} with {} usable",
        req.name,
        gib(need),
        job.spec.fit_policy.safety_margin * 100.0,
        gpus_needed,
        if gpus_needed == 1 { "" } else { "s" },
        biggest.product,
        gib(biggest.usable_bytes),
    );
    if answers.is_empty() {
        msg.push_str(&format!(
            "; no GPU product here has {gpus_needed} GPUs{}",
            if single_node { " on one node" } else { "" }
        ));
    }
    let advice = answers
        .iter()
        .filter_map(|a| a.shrink.advice.as_ref())
        .find(|adv| adv.plan_if_allowed.is_some())
        .or_else(|| answers.iter().find_map(|a| a.shrink.advice.as_ref()));
    if let Some(adv) = advice {
        msg.push_str(". ");
        msg.push_str(&adv.message);
    }
    deny(req, Reason::NoFit, &msg)
}

/// A warning when the job fits an empty GPU but no node has room now.
fn busy_warning(job: &ValidatedJob, snapshot: &Snapshot, now: Timestamp) -> Option<String> {
    match plan::place(job, &snapshot.nodes[..], &[], &[], now) {
        Ok(PlaceOutcome::Placed(_)) => None,
        Ok(PlaceOutcome::Wait { reason }) => {
            Some(format!("cluster busy now, the job will wait: {reason}"))
        }
        Ok(PlaceOutcome::Reject { reason }) => Some(format!("no node can take it now: {reason}")),
        Err(_) => None,
    }
}
