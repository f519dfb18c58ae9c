//! The admission decision for the jobs teams already submit (batch/v1 Job,
//! JobSet, TrainJob, PyTorchJob; see [`crate::kinds`]): the rule TrainingJobs
//! are judged by ([`crate::decide::choose`]), on the GPU products the pods may
//! run on, with advice said in the job's own knobs. vramguard never rewrites
//! these objects: a job that would run out of memory as written is denied
//! with the change that would fit, and the user makes it.
//!
//! What is done with the verdict is the enforcement: `Deny` answers it,
//! `Warn` allows with it as warnings, `Audit` allows silently and only
//! counts it (`vramguard_workload_verdicts_total`).

use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use kube::core::Status;
use serde_json::Value;

use super::decide::{Decision, Judgement, MAX_MESSAGE, as_warnings, ascii, truncate};
use super::metrics::{Reason, Verdict};
use crate::api::{FitMode, GpuNode};
use crate::decide::{Choice, ClusterView};
use crate::estimate::GIB;
use crate::inventory::Snapshot;
use crate::kinds::{self, Kind, Reading};
use crate::plan;

/// The namespace label that sets a namespace's enforcement (the chart sends
/// its reviews to the path of that mode).
pub const ENFORCEMENT_LABEL: &str = "vramguard.io/enforcement";

/// What the webhook does with its verdict on a Job, JobSet, TrainJob or PyTorchJob.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Enforcement {
    /// Deny what does not fit (the verdict as answered).
    #[default]
    Deny,
    /// Allow, with the verdict as warnings.
    Warn,
    /// Allow silently; the verdict is counted by namespace.
    Audit,
}

impl Enforcement {
    pub const ALL: [Enforcement; 3] = [Enforcement::Deny, Enforcement::Warn, Enforcement::Audit];

    pub fn name(self) -> &'static str {
        match self {
            Enforcement::Deny => "Deny",
            Enforcement::Warn => "Warn",
            Enforcement::Audit => "Audit",
        }
    }

    /// The path a review of this mode is sent to.
    pub fn path(self) -> &'static str {
        match self {
            Enforcement::Deny => "/validate/deny",
            Enforcement::Warn => "/validate/warn",
            Enforcement::Audit => "/validate/audit",
        }
    }
}

impl FromStr for Enforcement {
    type Err = String;
    fn from_str(s: &str) -> Result<Enforcement, String> {
        Enforcement::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("{s:?} is not an enforcement; use Deny, Warn or Audit"))
    }
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / GIB)
}

fn allowed(reason: Reason, warnings: Vec<String>) -> Decision {
    Decision {
        allowed: true,
        status: Status::default(),
        // Split, not cut: a warning cut short loses the why (the not-judged reason, the
        // busy GPUs) that the user needs to act on it.
        warnings: warnings.iter().flat_map(|w| as_warnings(w)).collect(),
        verdict: Verdict::Allowed,
        reason,
    }
}

fn denied(reason: Reason, message: String) -> Decision {
    Decision {
        allowed: false,
        status: Status {
            code: 403,
            message: truncate(ascii(message), MAX_MESSAGE),
            reason: if reason == Reason::InvalidSpec {
                "Invalid".to_string()
            } else {
                "Forbidden".to_string()
            },
            ..Status::default()
        },
        warnings: Vec::new(),
        verdict: if reason == Reason::InvalidSpec {
            Verdict::Invalid
        } else {
            Verdict::Denied
        },
        reason,
    }
}

/// `s` cut to at most `max` bytes (ASCII), ending in `...` when cut.
/// Whether a GPU product as the node reports it (`NVIDIA H100 80GB HBM3`) is
/// one a GFD label value names (`NVIDIA-H100-80GB-HBM3`).
fn same_product(reported: &str, label: &str) -> bool {
    let norm = |s: &str| {
        s.trim()
            .chars()
            .map(|c| {
                if c == ' ' || c == '_' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect::<String>()
    };
    norm(reported) == norm(label)
}

/// `snapshot` with only the GPUs of `products` (all of them when empty);
/// with `mig`, only the MIG slices of that profile on them (what a pod
/// asking `nvidia.com/mig-<profile>` gets). Without, GPUs and slices alike:
/// the device plugin's `single` MIG strategy offers slices as `nvidia.com/gpu`.
fn on_products(snapshot: &Snapshot, products: &[String], mig: Option<&str>) -> Snapshot {
    if products.is_empty() && mig.is_none() {
        return snapshot.clone();
    }
    let nodes: Vec<GpuNode> = snapshot
        .nodes
        .iter()
        .filter_map(|n| {
            let mut n = n.clone();
            let status = n.status.as_mut()?;
            status.gpus.retain(|g| {
                products.is_empty() || products.iter().any(|p| same_product(&g.product, p))
            });
            if let Some(profile) = mig {
                status.gpus.retain_mut(|g| {
                    g.mig_devices
                        .retain(|m| m.profile.eq_ignore_ascii_case(profile));
                    !g.mig_devices.is_empty()
                });
            }
            (!status.gpus.is_empty()).then_some(n)
        })
        .collect();
    let mut s = Snapshot::new(
        nodes,
        snapshot.refreshed_unix,
        snapshot.synced,
        snapshot.as_of_unix,
    );
    s.profiles = snapshot.profiles.clone();
    s
}

/// What the rule says of a job of the other kinds, before it is answered as a
/// review ([`judge`]) or as a Kueue admission check ([`crate::kueue`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Assessment {
    /// Fits as written on GPUs free now.
    Fits,
    /// Fits `product` as written, but its GPUs are not free now (`reason`).
    NotNow { product: String, reason: String },
    /// Not judged: why, and whether the user is told (the object asked to be
    /// judged, or asks for GPUs).
    NotJudged { why: String, tell: bool },
    /// No GPU the job may run on reports to vramguard.
    NoInventory(String),
    /// Would run out of memory as written, or is invalid: the verdict and its message.
    Denied { reason: Reason, message: String },
    /// The TrainingJob rule allowed it with these warnings.
    Allowed {
        reason: Reason,
        warnings: Vec<String>,
    },
}

impl Assessment {
    /// The admission answer (before enforcement).
    pub fn decision(self, kind: Kind) -> Decision {
        match self {
            Assessment::Fits => allowed(Reason::Fits, Vec::new()),
            Assessment::NotNow { product, reason } => allowed(
                Reason::Fits,
                vec![format!("fits {product} as written, but not now: {reason}")],
            ),
            Assessment::NotJudged { why, tell } => allowed(
                Reason::NotJudged,
                if tell {
                    vec![format!(
                        "vramguard did not judge this {}: {why}",
                        kind.name()
                    )]
                } else {
                    Vec::new()
                },
            ),
            Assessment::NoInventory(what) => allowed(
                Reason::NoInventory,
                vec![format!(
                    "vramguard did not judge this {}: {what}",
                    kind.name()
                )],
            ),
            Assessment::Denied { reason, message } => denied(reason, message),
            Assessment::Allowed { reason, warnings } => allowed(reason, warnings),
        }
    }
}

/// Judge the object of a CREATE review of `kind` against `snapshot` at `now`
/// (before enforcement).
pub fn judge(kind: Kind, obj: &Value, snapshot: &Snapshot, now: Timestamp) -> Decision {
    // A JobSet's Jobs, a TrainJob's JobSet, a TrainingJob's Job: judged as their owner.
    let owned = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|o| {
            o.iter()
                .any(|r| r.get("controller") == Some(&Value::Bool(true)))
        });
    if owned {
        return allowed(Reason::NotJudged, Vec::new());
    }
    assess(kind, obj, snapshot, now).decision(kind)
}

/// What the rule says of `obj`, a `kind`, against `snapshot` at `now`.
pub fn assess(kind: Kind, obj: &Value, snapshot: &Snapshot, now: Timestamp) -> Assessment {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let who = format!("{} {name}", kind.name());
    let asked = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(kinds::TRAINING_ANNOTATION))
        .is_some();
    let denied = |reason: Reason, message: String| Assessment::Denied { reason, message };
    let j = match kinds::read(kind, obj) {
        Reading::Judge(j) => j,
        Reading::NotJudged(why) => {
            let gpus = kinds::pod_sets(kind, obj)
                .map(|s| s.iter().any(|p| p.gpus_per_pod > 0 || p.mig.is_some()))
                .unwrap_or(true);
            // Silent only for what asked nothing: no annotation, no GPU.
            return Assessment::NotJudged {
                why,
                tell: asked || gpus,
            };
        }
        Reading::Invalid(errs) => {
            let list: Vec<String> = errs.iter().map(ToString::to_string).collect();
            return denied(
                Reason::InvalidSpec,
                format!("{who} is invalid: {}", list.join("; ")),
            );
        }
    };
    let now = snapshot
        .as_of_unix
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(now);
    let snapshot = on_products(snapshot, &j.products, j.mig.as_deref());
    if snapshot.products().is_empty() {
        return Assessment::NoInventory(no_inventory(&j));
    }
    // Advice may propose the changes the fit policy allows (the trainer's
    // knobs for a command line); nothing is applied: the job runs as written.
    let job = j.validated.with_fit_mode(FitMode::Adjust);
    let scale = snapshot.learnt_scale(job.spec());
    let none = plan::ReservationIndex::new();
    let view = ClusterView {
        snapshot: &snapshot,
        reservations: &none,
        tolerations: &j.tolerations,
        now,
        scale,
    };
    let choice = match crate::decide::choose(&job, &view) {
        Ok(c) => c,
        Err(e) => return denied(Reason::InvalidSpec, format!("{who}: {e}")),
    };
    if let Choice::Run { plan: None, .. } = choice {
        return Assessment::Fits;
    }
    // Does it fit as written on empty GPUs of some product it may run on?
    let margin = job.spec().fit_policy.safety_margin;
    let mut need: Option<(u64, String, u64)> = None;
    for p in snapshot.products() {
        if p.gpus < job.spec().parallelism.gpus {
            continue;
        }
        let gpu = p.catalog.unwrap_or_else(crate::decide::fallback_product);
        let est = match crate::estimate::estimate(&job, gpu) {
            Ok(e) => e,
            Err(e) => return denied(Reason::InvalidSpec, format!("{who}: {e}")),
        };
        let v = plan::fit_estimate(&est, margin, plan::scaled_view(p.usable_bytes, scale));
        if v.fits {
            let reason = match &choice {
                Choice::Wait { reason } | Choice::Reject { reason, .. } => reason.clone(),
                Choice::Run { .. } => "its GPUs are in use now".to_string(),
            };
            return Assessment::NotNow {
                product: p.product.clone(),
                reason,
            };
        }
        if need.as_ref().is_none_or(|(n, _, _)| v.need_bytes < *n) {
            need = Some((v.need_bytes, p.product.clone(), p.usable_bytes));
        }
    }
    let read_from = read_from(&j);
    // The cheapest change that fits, in the job's knobs.
    // (Only where some product has the GPUs: else the denial below says so.)
    if let Some((n, product, usable)) = need
        && let Some(p) = crate::decide::cheapest_plan(&job, &snapshot, scale)
    {
        let knobs = kinds::knobs::phrase(j.origin.knobs(), &p.original, &p.settings);
        return denied(
            Reason::FitsAfterChange,
            format!(
                "{who} would run out of GPU memory as written: it needs {} per GPU (with the {:.0} % margin) on {product} with {} usable. It fits with {} (same effective batch; est. step time x{:.2}). vramguard does not change the job: change it and apply again. {read_from}",
                gib(plan::scale_bytes(n, scale)),
                margin * 100.0,
                gib(usable),
                knobs.join(", "),
                p.slowdown,
            ),
        );
    }
    // Nothing the knobs allow fits: the TrainingJob denial's numbers and advice.
    let j2 = super::decide::judge_valid(&job, &j.tolerations, &snapshot, now);
    match j2 {
        Judgement::Deny {
            reason, message, ..
        } => denied(reason, format!("{who}{} {read_from}", sentence(message))),
        Judgement::Allow { reason, warnings } => Assessment::Allowed { reason, warnings },
        Judgement::Invalid { message } => {
            denied(Reason::InvalidSpec, format!("{who} is invalid: {message}"))
        }
    }
}

/// `message` ending in a full stop, so that the next sentence ("Read from ...") starts
/// as one.
fn sentence(mut message: String) -> String {
    let end = message.trim_end().len();
    message.truncate(end);
    if !message.ends_with(['.', '!', '?']) {
        message.push('.');
    }
    message
}

/// Why no GPU can take the job: none of its products or MIG slice reports to vramguard.
fn no_inventory(j: &kinds::Judged) -> String {
    match (&j.mig, j.products.is_empty()) {
        (Some(m), true) => format!("no MIG slice {m} reports to vramguard"),
        (Some(m), false) => format!(
            "no MIG slice {m} of {} reports to vramguard",
            j.products.join(" or ")
        ),
        (None, true) => "the cluster reports no GPUs".to_string(),
        (None, false) => format!("no GPU of {} reports to vramguard", j.products.join(" or ")),
    }
}

/// Where the figures a denial quotes were read: the batch size and the model.
fn read_from(j: &kinds::Judged) -> String {
    let sources: Vec<String> = j
        .sources
        .iter()
        .filter(|s| s.field == "training.microBatchSize" || s.field == "model.preset")
        .map(|s| s.from.clone())
        .collect();
    if sources.is_empty() {
        // The annotation says the whole recipe in one place: nothing more to name.
        return format!("Read from {}.", j.origin.describe());
    }
    format!("Read from {}: {}.", j.origin.describe(), sources.join("; "))
}

/// `decision` under `enforcement`.
pub fn enforce(decision: Decision, enforcement: Enforcement) -> Decision {
    match enforcement {
        Enforcement::Deny => decision,
        Enforcement::Warn if !decision.allowed => Decision {
            allowed: true,
            status: Status::default(),
            warnings: as_warnings(&format!(
                "vramguard would deny this (enforcement Warn): {}",
                decision.status.message
            )),
            verdict: Verdict::Allowed,
            reason: decision.reason,
        },
        Enforcement::Warn => decision,
        Enforcement::Audit => Decision {
            allowed: true,
            status: Status::default(),
            warnings: Vec::new(),
            verdict: Verdict::Allowed,
            reason: decision.reason,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::decide::MAX_WARNING;

    #[test]
    fn warnings_are_cut_at_spaces_under_the_limit() {
        let text = "word ".repeat(100);
        let w = as_warnings(&text);
        assert!(w.len() > 1);
        assert!(w.iter().all(|l| l.len() <= MAX_WARNING && l.is_ascii()));
        assert_eq!(w.join(" ").split_whitespace().count(), 100);
    }

    #[test]
    fn a_long_warning_is_split_whole_not_cut() {
        let why = "no vramguard.io/training annotation and no trainer command vramguard reads \
                   (accelerate launch or torchrun with a Transformers or TRL script, tune run, \
                   litgpt finetune): add the annotation with the model and the recipe";
        let d = Assessment::NotJudged {
            why: why.to_string(),
            tell: true,
        }
        .decision(Kind::Job);
        assert!(d.allowed);
        assert!(d.warnings.len() > 1, "{:?}", d.warnings);
        assert!(
            d.warnings
                .iter()
                .all(|w| w.len() <= MAX_WARNING && !w.ends_with("...")),
            "{:?}",
            d.warnings
        );
        assert_eq!(
            d.warnings.join(" "),
            format!("vramguard did not judge this Job: {why}")
        );
    }

    #[test]
    fn a_denial_ends_its_sentence_before_saying_where_it_read() {
        assert_eq!(
            sentence("no GPU product here has 8 GPUs".into()),
            "no GPU product here has 8 GPUs."
        );
        assert_eq!(sentence("over more ranks) ".into()), "over more ranks).");
        assert_eq!(sentence("already ended.".into()), "already ended.");
    }

    #[test]
    fn products_match_as_gfd_spells_them() {
        assert!(same_product(
            "NVIDIA H100 80GB HBM3",
            "NVIDIA-H100-80GB-HBM3"
        ));
        assert!(!same_product(
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA-A100-SXM4-80GB"
        ));
    }

    #[test]
    fn enforcement_reads_its_names() {
        assert_eq!("audit".parse::<Enforcement>(), Ok(Enforcement::Audit));
        assert!("off".parse::<Enforcement>().is_err());
    }
}
