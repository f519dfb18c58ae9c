//! Advice when no plan the fit policy allows fits a GPU: the cheapest plan
//! with every field allowed and the policy edits it needs, or else the catalog
//! GPUs that would hold the job. Pure: estimates only.

use super::settings::{ALL_FIELDS, yaml_name};
use super::shrink::{Allowance, search};
use super::{Binding, GpuView, Plan, Verdict, fit_estimate};
use crate::api::{AdjustableField, FitMode, ValidatedJob};
use crate::estimate::gpus::{self, Architecture};
use crate::estimate::{self, GIB, GpuProduct};
use serde::Serialize;

/// What would fit when nothing the policy allows does.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    /// For people, with the numbers.
    pub message: String,
    /// The cheapest plan on this GPU with every field allowed (micro-batch down to 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_if_allowed: Option<Plan>,
    /// Policy edits that plan needs (`fitPolicy.mode: Adjust`, `allow zeroStage`, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policy_changes: Vec<String>,
    /// When no plan fits this GPU: catalog GPUs (whole cards, smallest first) that would
    /// hold the job as written, or else its cheapest all-allowed plan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<&'static str>,
    /// Per-GPU need (with margin) on the smallest of `gpus`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_gpu_bytes: Option<u64>,
}

fn gib_ceil(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 30)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

fn field_name(f: AdjustableField) -> String {
    yaml_name(&f)
}

pub(super) fn advise(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    view: GpuView,
    allowed: Allowance,
    as_written: &Verdict,
) -> Advice {
    let policy = &job.spec().fit_policy;
    let short = match &as_written.allocator_limit {
        Some(c) if as_written.binding == Binding::AllocatorLimit => {
            c.explain(as_written.short_by_bytes)
        }
        _ if as_written.short_by_bytes > 0 => format!(
            "needs {} per GPU with the {:.0} % margin, {} free: short by {}",
            gib(as_written.need_bytes),
            policy.safety_margin * 100.0,
            gib(as_written.have_bytes),
            gib(as_written.short_by_bytes)
        ),
        _ => format!(
            "its largest tensor ({}) exceeds the largest free block ({})",
            gib(as_written.largest_tensor_bytes),
            gib(as_written.largest_block_bytes)
        ),
    };
    let why = match policy.mode {
        FitMode::Reject => format!("does not fit {} as written ({short})", gpu.name),
        FitMode::Adjust => {
            let allow: Vec<String> = ALL_FIELDS
                .iter()
                .filter(|f| allowed.allows(**f))
                .map(|f| field_name(*f))
                .collect();
            format!(
                "does not fit {} ({short}), and no change in allow [{}] with minMicroBatchSize {} fits",
                gpu.name,
                allow.join(", "),
                allowed.min_micro_batch_size
            )
        }
    };
    if let Some(plan) = search(job, gpu, view, Allowance::all()) {
        let mut policy_changes = Vec::new();
        if policy.mode == FitMode::Reject {
            policy_changes.push("fitPolicy.mode: Reject → Adjust".to_string());
        }
        for f in plan.changed_fields() {
            if policy.mode == FitMode::Reject || !allowed.allows(f) {
                let mut s = format!("allow {}", field_name(f));
                if f == AdjustableField::ZeroStage {
                    s.push_str(&format!(
                        " ({} over {} data-parallel ranks)",
                        plan.settings.zero_stage, job.data_parallel
                    ));
                }
                policy_changes.push(s);
            }
        }
        if plan.settings.micro_batch_size < allowed.min_micro_batch_size {
            policy_changes.push(format!(
                "fitPolicy.minMicroBatchSize: {} → {}",
                allowed.min_micro_batch_size, plan.settings.micro_batch_size
            ));
        }
        let message = format!(
            "{why}; with {} it would: {}",
            policy_changes.join(", "),
            plan.summary()
        );
        return Advice {
            message,
            plan_if_allowed: Some(plan),
            policy_changes,
            gpus: Vec::new(),
            min_gpu_bytes: None,
        };
    }
    let (gpus, min_gpu_bytes, how) = bigger_gpus(job);
    let message = if gpus.is_empty() {
        format!(
            "{why}; no change fits it on {}, and no GPU in the catalog holds it even with every change allowed: spread it over more GPUs (tensorParallel, pipelineParallel, or zeroStage 3 over more ranks)",
            gpu.name
        )
    } else {
        format!(
            "{why}; no change fits it on {}; needs a GPU with ≥ {} GiB{how}: {}",
            gpu.name,
            gib_ceil(min_gpu_bytes.unwrap_or(0)),
            gpus.join(", ")
        )
    };
    Advice {
        message,
        plan_if_allowed: None,
        policy_changes: Vec::new(),
        gpus,
        min_gpu_bytes,
    }
}

/// Whole-card catalog GPUs (smallest first) that hold the job as written on an
/// empty card, else with the cheapest all-allowed plan; the smallest need; how.
fn bigger_gpus(job: &ValidatedJob) -> (Vec<&'static str>, Option<u64>, &'static str) {
    let margin = job.spec().fit_policy.safety_margin;
    let mut cards: Vec<&'static GpuProduct> = gpus::GPUS.iter().filter(|g| !g.mig).collect();
    cards.sort_by(|a, b| {
        a.usable_bytes()
            .cmp(&b.usable_bytes())
            .then(a.name.cmp(b.name))
    });
    // The estimate depends on the GPU only through its architecture.
    let mut by_arch: Vec<(Architecture, Option<estimate::Estimate>)> = Vec::new();
    let mut fitting = Vec::new();
    let mut min_need: Option<u64> = None;
    for card in &cards {
        let slot = match by_arch.iter().position(|(a, _)| *a == card.architecture) {
            Some(i) => i,
            None => {
                by_arch.push((card.architecture, super::memo::estimate(job, card).ok()));
                by_arch.len() - 1
            }
        };
        let Some(est) = &by_arch[slot].1 else {
            continue;
        };
        let v = fit_estimate(est, margin, GpuView::empty(card.usable_bytes()));
        if v.fits {
            fitting.push(card.name);
            min_need = Some(min_need.map_or(v.need_bytes, |m| m.min(v.need_bytes)));
        }
    }
    if !fitting.is_empty() {
        return (fitting, min_need, " as written");
    }
    // Largest card of each architecture first: if it fails, the smaller ones do too.
    let mut planned: Vec<(u64, &'static str)> = Vec::new();
    for arch in Architecture::ALL {
        for card in cards.iter().rev().filter(|c| c.architecture == arch) {
            match search(
                job,
                card,
                GpuView::empty(card.usable_bytes()),
                Allowance::all(),
            ) {
                Some(plan) => {
                    planned.push((card.usable_bytes(), card.name));
                    let need = plan.verdict.need_bytes;
                    min_need = Some(min_need.map_or(need, |m| m.min(need)));
                }
                None => break,
            }
        }
    }
    planned.sort_unstable();
    (
        planned.into_iter().map(|(_, n)| n).collect(),
        min_need,
        " with every change allowed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::shrink;

    use crate::api::test_job as job;

    fn gpu(name: &str) -> &'static GpuProduct {
        gpus::find(name).expect("catalog GPU")
    }

    fn empty(g: &GpuProduct) -> GpuView {
        GpuView::empty(g.usable_bytes())
    }

    #[test]
    fn too_big_for_one_gpu_names_bigger_gpus() {
        // 70B full fine-tune on one GPU: nothing fits anywhere.
        let j = job("
model: {preset: llama-3-70b}
training: {mode: full, microBatchSize: 1, sequenceLength: 4096}
fitPolicy: {mode: Adjust}
");
        let g = gpu("a100-80gb");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        let a = s.advice.expect("advice");
        assert!(a.plan_if_allowed.is_none());
        assert!(a.gpus.is_empty(), "{:?}", a.gpus);
        assert!(a.message.contains("more GPUs"), "{}", a.message);

        // A 13B LoRA at a long sequence on a T4: a bigger card holds it.
        let j = job("
model: {preset: llama-2-13b}
training: {mode: lora, microBatchSize: 1, sequenceLength: 2048, precision: fp16-mixed}
fitPolicy: {mode: Adjust}
");
        let g = gpu("t4");
        let s = shrink(&j, g, empty(g)).expect("estimates");
        let a = s.advice.expect("advice");
        assert!(!a.gpus.is_empty());
        assert!(!a.gpus.contains(&"t4"));
        assert!(a.message.contains("needs a GPU with ≥"), "{}", a.message);
        let min = a.min_gpu_bytes.expect("a need");
        for name in &a.gpus {
            assert!(gpu(name).usable_bytes() >= min, "{name}");
        }
    }
}
