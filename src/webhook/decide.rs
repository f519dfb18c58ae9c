//! The admission decision for one review: a plain function of the request and
//! an inventory snapshot. The webhook keeps no state but a cache of judgements
//! keyed on everything they depend on, so any replica answers any review the
//! same.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::core::Status;
use kube::core::admission::Operation;

use super::cache::Cache;
use super::metrics::{Reason, Verdict};
use super::review::{ReadJob, Request};
use crate::api::{self, ValidatedJob};
use crate::decide::{Choice, ClusterView, fallback_product};
use crate::estimate::GIB;
use crate::inventory::{ProductCount, Snapshot};
use crate::plan::{self, Advice, Allowance, Plan};

/// Longest denial message we send (the API server shows it to the user whole).
pub const MAX_MESSAGE: usize = 1024;
/// Warnings beyond this are truncated by clients; keep each short.
pub const MAX_WARNING: usize = 120;

/// The answer to one review plus the bounded labels it is counted under.
#[derive(Clone, Debug)]
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
pub fn truncate(mut s: String, max: usize) -> String {
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

/// `text` in ASCII as warnings of at most [`MAX_WARNING`] bytes each, split at spaces, so
/// a long one reaches the user whole (only a single word longer than that is cut).
pub fn as_warnings(text: &str) -> Vec<String> {
    let text = ascii(text.to_string());
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let word = truncate(word.to_string(), MAX_WARNING);
        if !line.is_empty() && line.len() + 1 + word.len() > MAX_WARNING {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() {
        out.push(line);
    }
    out
}

/// `s` in ASCII. Warnings travel as HTTP `Warning` headers, whose values clients read as
/// ASCII: kube's client and others drop one that holds `→`. Arrows and signs become their
/// ASCII spellings; anything else outside ASCII becomes `?`.
pub fn ascii(s: String) -> String {
    if s.is_ascii() {
        return s;
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            c if c.is_ascii() => out.push(c),
            '→' => out.push_str("->"),
            '≥' => out.push_str(">="),
            '≤' => out.push_str("<="),
            '≈' => out.push('~'),
            '×' => out.push('x'),
            '–' | '—' => out.push('-'),
            '…' => out.push_str("..."),
            '·' => out.push('.'),
            _ => out.push('?'),
        }
    }
    out
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

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

/// What a TrainingJob's spec gets against one inventory at one second:
/// everything of the decision but the job's name and the immutable-field
/// check of an UPDATE, so that the same spec reviewed again is answered
/// without validating or estimating it again.
#[derive(Clone, Debug, PartialEq)]
pub enum Judgement {
    /// Allowed, with warnings already in ASCII and split to [`MAX_WARNING`] bytes each.
    Allow {
        reason: Reason,
        warnings: Vec<String>,
    },
    /// The spec does not parse or validate: `message` says which fields and why.
    Invalid { message: String },
    /// Denied; `named` messages follow `TrainingJob <name>`.
    Deny {
        reason: Reason,
        named: bool,
        message: String,
    },
}

impl Judgement {
    fn allow(reason: Reason, warnings: Vec<String>) -> Judgement {
        Judgement::Allow {
            reason,
            warnings: warnings.iter().flat_map(|w| as_warnings(w)).collect(),
        }
    }

    fn deny(reason: Reason, message: String) -> Judgement {
        Judgement::Deny {
            reason,
            named: false,
            message,
        }
    }

    /// The answer for the job called `name`.
    pub fn decision(&self, name: &str) -> Decision {
        match self {
            Judgement::Allow { reason, warnings } => Decision {
                allowed: true,
                status: Status::default(),
                warnings: warnings.clone(),
                verdict: Verdict::Allowed,
                reason: *reason,
            },
            Judgement::Invalid { message } => deny(
                Reason::InvalidSpec,
                format!("TrainingJob {name} is invalid: {message}"),
            ),
            Judgement::Deny {
                reason,
                named: false,
                message,
            } => deny(*reason, message.clone()),
            Judgement::Deny {
                reason,
                named: true,
                message,
            } => deny(*reason, format!("TrainingJob {name}{message}")),
        }
    }
}

/// Judge one review against `snapshot` at `now`.
pub fn review<O: ReadJob>(req: Request<'_, O>, snapshot: &Snapshot, now: Timestamp) -> Decision {
    review_cached(req, snapshot, now, &Cache::disabled()).0
}

/// [`review`], taking the judgement of a spec already judged against this
/// snapshot in this second from `cache`; true when it did.
pub fn review_cached<O: ReadJob>(
    req: Request<'_, O>,
    snapshot: &Snapshot,
    now: Timestamp,
    cache: &Cache<Judgement>,
) -> (Decision, bool) {
    let is_training_job = req.kind.group == "vramguard.io" && req.kind.kind == "TrainingJob";
    if !is_training_job || !matches!(req.operation, Operation::Create | Operation::Update) {
        return (
            Judgement::allow(Reason::NotJudged, Vec::new()).decision(""),
            false,
        );
    }
    let Some(obj) = req.object else {
        return (
            deny(
                Reason::InvalidSpec,
                "the review carries no object".to_string(),
            ),
            false,
        );
    };
    let tj = match obj.read_job() {
        Ok(tj) => tj,
        Err(e) => return (invalid(e.to_string()).decision(&req.name), false),
    };
    let now = snapshot
        .as_of_unix
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(now);
    let second = now.as_second();
    // Validation and the judgement depend on the spec and the preset hint,
    // the inventory and, through node staleness, the second.
    let hint = tj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(api::PRESET_HINT_ANNOTATION));
    let key = if cache.enabled() {
        serde_json::to_vec(&(hint, &tj.spec)).ok()
    } else {
        None
    };
    // In the order of old: validation, immutable fields, the judgement; a
    // spec judged before skips the first and the last.
    let hit = key.as_ref().and_then(|k| cache.get(snapshot, second, k));
    let cached = hit.is_some();
    let keep = |j: Judgement| {
        let j = Arc::new(j);
        if let Some(k) = &key {
            cache.insert(snapshot, second, k.clone(), j.clone());
        }
        j
    };
    /// A judgement (from the cache, or of an invalid spec), or a job to judge.
    enum Found {
        Judged(Arc<Judgement>),
        Valid(Box<ValidatedJob>),
    }
    let found = match hit {
        Some(j) => Found::Judged(j),
        None => match api::validate_job(&tj) {
            Ok(job) => Found::Valid(Box::new(job)),
            Err(e) => Found::Judged(keep(invalid(e.to_string()))),
        },
    };
    if let Found::Judged(j) = &found
        && matches!(**j, Judgement::Invalid { .. })
    {
        return (j.decision(&req.name), cached);
    }
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
            return (deny(Reason::Immutable, msg), false);
        }
    }
    let judgement = match found {
        Found::Judged(j) => j,
        Found::Valid(job) => keep(judge(&job, &crate::decide::tolerations(&tj), snapshot, now)),
    };
    (judgement.decision(&req.name), cached)
}

/// The judgement of a spec that does not parse or validate.
fn invalid(error: String) -> Judgement {
    Judgement::Invalid {
        message: error.replace('\n', "; "),
    }
}

/// [`judge`] for the other kinds' door (`workload.rs`).
pub(super) fn judge_valid(
    job: &ValidatedJob,
    tolerations: &[String],
    snapshot: &Snapshot,
    now: Timestamp,
) -> Judgement {
    judge(job, tolerations, snapshot, now)
}

/// Judge a valid job against `snapshot` at `now`, by the rule the operator
/// places by ([`crate::decide::choose`], with no reservations: the webhook
/// knows only what the agents published), so that the plan a warning promises
/// is the plan the operator applies when nothing else changed.
///
/// Work grows with what differs, not with the cluster: one placement of the
/// job as written; when that does not run now, one plan search per product
/// and a placement per plan; advice only for a denial.
fn judge(
    job: &ValidatedJob,
    tolerations: &[String],
    snapshot: &Snapshot,
    now: Timestamp,
) -> Judgement {
    let products = snapshot.products();
    if products.is_empty() {
        return Judgement::deny(
            Reason::NoInventory,
            "the cluster reports no GPUs: no GpuNode objects and no nodes with GPU Feature Discovery labels (nvidia.com/gpu.product, nvidia.com/gpu.memory, nvidia.com/gpu.count)".to_string(),
        );
    }
    // What earlier runs of jobs of this shape proved the estimate misses.
    let scale = snapshot.learnt_scale(job.spec());
    let no_reservations = plan::ReservationIndex::new();
    let view = ClusterView {
        snapshot,
        reservations: &no_reservations,
        tolerations,
        now,
        scale,
    };
    let choice = match crate::decide::choose(job, &view) {
        Ok(c) => c,
        Err(e) => return Judgement::deny(Reason::InvalidSpec, e.to_string()),
    };
    let product = choice.product().unwrap_or_default().to_string();
    match choice {
        Choice::Run { plan: None, .. } => Judgement::allow(Reason::Fits, Vec::new()),
        Choice::Run {
            plan: Some(plan), ..
        } => Judgement::allow(
            Reason::FitsAfterChange,
            vec![format!(
                "vramguard will run this on {product} with {}",
                plan.changes.join(", ")
            )],
        ),
        Choice::Wait { reason } => {
            let fits = match on_empty_gpus(job, snapshot, scale) {
                Ok(e) => e.fits_as_written,
                Err(j) => return j,
            };
            Judgement::allow(
                if fits {
                    Reason::Fits
                } else {
                    Reason::FitsAfterChange
                },
                vec![format!("cluster busy now, the job will wait: {reason}")],
            )
        }
        Choice::Reject { reason, plan } => rejected(job, snapshot, scale, &reason, plan.is_some()),
    }
}

/// The job against empty GPUs of each product with enough of them: whether
/// it fits as written, and the smallest need as written (with the margin).
struct OnEmpty<'a> {
    fits_as_written: bool,
    need: Option<u64>,
    eligible: Vec<&'a ProductCount>,
}

fn on_empty_gpus<'a>(
    job: &ValidatedJob,
    snapshot: &'a Snapshot,
    scale: f64,
) -> Result<OnEmpty<'a>, Judgement> {
    let gpus_needed = job.spec().parallelism.gpus;
    let single_node = gpus_needed <= job.gpus_per_node;
    let margin = job.spec().fit_policy.safety_margin;
    let eligible: Vec<&ProductCount> = snapshot
        .products()
        .iter()
        .filter(|p| p.gpus >= gpus_needed && (!single_node || p.max_per_node >= gpus_needed))
        .collect();
    // One estimate per GPU model.
    let mut estimates: Vec<(&'static str, crate::estimate::Estimate)> = Vec::new();
    let mut need: Option<u64> = None;
    for p in &eligible {
        let gpu = p.catalog.unwrap_or_else(fallback_product);
        let slot = match estimates.iter().position(|(n, _)| *n == gpu.name) {
            Some(i) => i,
            None => match plan::memo::estimate(job, gpu) {
                Ok(e) => {
                    estimates.push((gpu.name, e));
                    estimates.len() - 1
                }
                Err(e) => return Err(Judgement::deny(Reason::InvalidSpec, e.to_string())),
            },
        };
        let v = plan::fit_estimate(
            &estimates[slot].1,
            margin,
            plan::scaled_view(p.usable_bytes, scale),
        );
        if v.fits {
            return Ok(OnEmpty {
                fits_as_written: true,
                need: None,
                eligible,
            });
        }
        need = Some(need.map_or(v.need_bytes, |n| n.min(v.need_bytes)));
    }
    Ok(OnEmpty {
        fits_as_written: false,
        need,
        eligible,
    })
}

/// No node can take the job now, in any allowed form. When it would fit
/// empty GPUs of a product (its nodes are cordoned, tainted or not reporting),
/// it is admitted with that said; else denied with the numbers and a fix.
///
/// `any_plan`: whether some product has an allowed plan on empty GPUs (what
/// `choose` found); without one the products are not searched again.
fn rejected(
    job: &ValidatedJob,
    snapshot: &Snapshot,
    scale: f64,
    reason: &str,
    any_plan: bool,
) -> Judgement {
    let empty = match on_empty_gpus(job, snapshot, scale) {
        Ok(e) => e,
        Err(j) => return j,
    };
    let now_note = format!("no node can take it now: {reason}");
    if empty.fits_as_written {
        return Judgement::allow(Reason::Fits, vec![now_note]);
    }
    let catalog = |p: &ProductCount| p.catalog.unwrap_or_else(fallback_product);
    let view = |p: &ProductCount| plan::scaled_view(p.usable_bytes, scale);
    // The cheapest plan over the products with enough GPUs, the first by
    // name winning a tie: each is searched only for a plan strictly cheaper
    // than the best so far.
    let allowed = Allowance::from_policy(&job.spec().fit_policy);
    if any_plan && !allowed.is_empty() {
        let mut by_name = empty.eligible.clone();
        by_name.sort_by(|a, b| a.product.cmp(&b.product));
        let mut best: Option<(&ProductCount, Plan)> = None;
        for p in by_name {
            let limit = best.as_ref().map_or(f64::INFINITY, |(_, b)| b.slowdown);
            if let Some(found) = plan::search_below(job, catalog(p), view(p), allowed, limit) {
                best = Some((p, found));
            }
        }
        if let Some((p, plan)) = best {
            return Judgement::allow(
                Reason::FitsAfterChange,
                vec![
                    format!(
                        "vramguard will run this on {} with {}",
                        p.product,
                        plan.changes.join(", ")
                    ),
                    now_note,
                ],
            );
        }
    }
    let products = snapshot.products();
    let gpus_needed = job.spec().parallelism.gpus;
    let single_node = gpus_needed <= job.gpus_per_node;
    let margin = job.spec().fit_policy.safety_margin;
    let eligible = empty.eligible;
    let need = empty.need;

    // Nothing fits: say why in numbers and what would.
    let biggest = &products[0];
    let need = need
        .or_else(|| {
            plan::memo::estimate(job, catalog(biggest))
                .ok()
                .map(|e| plan::with_margin(e.status.fit_per_gpu_bytes(), margin))
        })
        .unwrap_or(0);
    let need = plan::scale_bytes(need, scale);
    let mut msg = format!(
        " needs {} per GPU (with the {:.0} % safety margin) on {} GPU{}; the biggest GPU in this cluster is {} with {} usable",
        gib(need),
        margin * 100.0,
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
    if eligible.is_empty() {
        msg.push_str(&format!(
            "; no GPU product here has {gpus_needed} GPUs{}",
            if single_node { " on one node" } else { "" }
        ));
    }
    // The first product's advice that names an allowed plan, else the first advice.
    let mut advice: Option<Advice> = None;
    for p in &eligible {
        let found = match plan::shrink(job, catalog(p), view(p)) {
            Ok(s) => s.advice,
            Err(e) => return Judgement::deny(Reason::InvalidSpec, e.to_string()),
        };
        if let Some(a) = found {
            let done = a.plan_if_allowed.is_some();
            if done || advice.is_none() {
                advice = Some(a);
            }
            if done {
                break;
            }
        }
    }
    if let Some(adv) = advice {
        // The advice is a sentence of its own here: it starts with a capital.
        msg.push_str(". ");
        let mut chars = adv.message.chars();
        if let Some(first) = chars.next() {
            msg.extend(first.to_uppercase());
            msg.push_str(chars.as_str());
        }
    }
    Judgement::Deny {
        reason: Reason::NoFit,
        named: true,
        message: msg,
    }
}
