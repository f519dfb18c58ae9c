//! The admission decision for one review: a plain function of the request and
//! an inventory snapshot. The webhook keeps no state of its own, so any replica
//! answers any review the same.

use k8s_openapi::jiff::Timestamp;
use kube::core::Status;
use kube::core::admission::Operation;

use super::metrics::{Reason, Verdict};
use super::review::{ReadJob, Request};
use crate::api::{self, ValidatedJob};
use crate::estimate::{GIB, gpus};
use crate::inventory::{ProductCount, Snapshot};
use crate::plan::{self, PlaceOutcome, Shrink};

/// Longest denial message we send (the API server shows it to the user whole).
pub const MAX_MESSAGE: usize = 1024;
/// Warnings beyond this are truncated by clients; keep each short.
pub const MAX_WARNING: usize = 120;

/// The answer to one review plus the bounded labels it is counted under.
#[derive(Debug)]
pub struct Decision {
    pub allowed: bool,
    /// The response's `status`: empty when allowed; code, message and reason when denied.
    pub status: Status,
    /// Shown to the user when allowed; empty otherwise.
    pub warnings: Vec<String>,
    pub verdict: Verdict,
    pub reason: Reason,
}

/// `s` cut to at most `max` bytes, ending in `...` when cut.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("...");
    s
}

fn deny(reason: Reason, message: String) -> Decision {
    let status = Status {
        code: 403,
        message: truncate(message, MAX_MESSAGE),
        reason: match reason {
            Reason::InvalidSpec | Reason::Immutable => "Invalid".to_string(),
            _ => "Forbidden".to_string(),
        },
        ..Status::default()
    };
    Decision {
        allowed: false,
        status,
        warnings: Vec::new(),
        verdict: Verdict::Denied,
        reason,
    }
}

fn allow(reason: Reason, warnings: Vec<String>) -> Decision {
    Decision {
        allowed: true,
        status: Status::default(),
        warnings: warnings
            .into_iter()
            .map(|w| truncate(w, MAX_WARNING))
            .collect(),
        verdict: Verdict::Allowed,
        reason,
    }
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

fn read_job(obj: impl ReadJob) -> Result<(api::TrainingJob, ValidatedJob), String> {
    let tj = obj.read_job().map_err(|e| e.to_string())?;
    let job = api::validate_job(&tj).map_err(|e| e.to_string())?;
    Ok((tj, job))
}

/// What one GPU product says about the job.
struct ProductAnswer<'a> {
    product: &'a ProductCount,
    shrink: Shrink,
}

/// Judge one review against `snapshot` at `now`.
pub fn review<O: ReadJob>(req: Request<'_, O>, snapshot: &Snapshot, now: Timestamp) -> Decision {
    let is_training_job = req.kind.group == "vramguard.io" && req.kind.kind == "TrainingJob";
    if !is_training_job || !matches!(req.operation, Operation::Create | Operation::Update) {
        return allow(Reason::NotJudged, Vec::new());
    }
    let Some(obj) = req.object else {
        return deny(
            Reason::InvalidSpec,
            "the review carries no object".to_string(),
        );
    };
    let (tj, job) = match read_job(obj) {
        Ok(j) => j,
        Err(e) => {
            let msg = format!(
                "TrainingJob {} is invalid: {}",
                req.name,
                e.replace('\n', "; ")
            );
            return deny(Reason::InvalidSpec, msg);
        }
    };
    if req.operation == Operation::Update
        && let Some(old) = req.old_object
        && let Ok(old_tj) = old.read_job()
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
            return deny(Reason::Immutable, msg);
        }
    }

    let now = snapshot
        .as_of_unix
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(now);
    let products = snapshot.products();
    if products.is_empty() {
        return deny(
            Reason::NoInventory,
            "the cluster reports no GPUs: no GpuNode objects and no nodes with GPU Feature Discovery labels (nvidia.com/gpu.product, nvidia.com/gpu.memory, nvidia.com/gpu.count)".to_string(),
        );
    }
    let gpus_needed = job.spec.parallelism.gpus;
    let single_node = gpus_needed <= job.gpus_per_node;
    // What earlier runs of jobs of this shape proved the estimate misses.
    let scale = snapshot.learnt_scale(&job.spec);
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
                Err(e) => return deny(Reason::InvalidSpec, e.to_string()),
            },
        };
        let v = plan::fit_estimate(
            &est,
            job.spec.fit_policy.safety_margin,
            plan::scaled_view(p.usable_bytes, scale),
        );
        if v.fits {
            let warnings = busy_warning(&job, snapshot, now, scale)
                .into_iter()
                .collect();
            return allow(Reason::Fits, warnings);
        }
    }

    let mut answers = Vec::new();
    for p in eligible {
        let catalog = p.catalog.unwrap_or(fallback);
        match plan::shrink(&job, catalog, plan::scaled_view(p.usable_bytes, scale)) {
            Ok(shrink) => answers.push(ProductAnswer { product: p, shrink }),
            Err(e) => return deny(Reason::InvalidSpec, e.to_string()),
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
        if let Some(w) = busy_warning(&p.apply(&job), snapshot, now, scale) {
            warnings.push(w);
        }
        return allow(Reason::FitsAfterChange, warnings);
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
                plan::with_margin(
                    e.status.fit_per_gpu_bytes(),
                    job.spec.fit_policy.safety_margin,
                )
            })
        })
        .unwrap_or(0);
    let need = plan::scale_bytes(need, scale);
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
    if scale > 1.0 {
        msg.push_str(&format!(
            " (the estimate is raised ×{scale:.2}: jobs of this shape ran out of GPU memory before; kubectl get memoryprofiles)"
        ));
    }
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
    deny(Reason::NoFit, msg)
}

/// A warning when the job fits an empty GPU but no node has room now.
fn busy_warning(
    job: &ValidatedJob,
    snapshot: &Snapshot,
    now: Timestamp,
    scale: f64,
) -> Option<String> {
    match plan::place_scaled(job, &snapshot.nodes[..], &[], &[], now, scale) {
        Ok(PlaceOutcome::Placed(_)) => None,
        Ok(PlaceOutcome::Wait { reason }) => {
            Some(format!("cluster busy now, the job will wait: {reason}"))
        }
        Ok(PlaceOutcome::Reject { reason }) => Some(format!("no node can take it now: {reason}")),
        Err(_) => None,
    }
}
