//! What fits: the largest micro-batch and the longest sequence a job can run with on one
//! empty GPU, as written and after each change its fit policy allows. Each answer is a
//! bounded search on the estimate (doubling, then bisection), taking estimated memory not
//! to decrease as the micro-batch or the sequence grows: at most 2·log2(cap) + 1 estimates.
//! Every value returned was estimated and fits, and the next one up was estimated and does
//! not (unless the cap fits). Pure: no I/O.

use serde::Serialize;

use super::settings::{Settings, yaml_name};
use super::shrink::{Allowance, options};
use super::{GpuView, fit_estimate};
use crate::api::{AdjustableField, ResolvedModel, ValidatedJob};
use crate::estimate::{EstimateError, GpuProduct};

/// Largest micro-batch searched.
pub const MAX_MICRO_BATCH: u64 = 1 << 16;
/// Longest sequence searched, in tokens.
pub const MAX_SEQUENCE: u64 = 1 << 22;

/// The largest value of one knob that fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Largest {
    /// The largest value that fits; `None` when not even 1 does.
    pub value: Option<u64>,
    /// True when the cap itself fits (the answer is "at least `value`").
    pub capped: bool,
    /// Estimates the search made.
    pub estimates: u32,
}

/// What a job fits on one GPU with one set of settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// `as written`, or the change as `field: from → to`.
    pub change: String,
    /// The field changed (absent as written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<AdjustableField>,
    /// The largest micro-batch, at the written sequence length and accumulation.
    pub micro_batch_size: Largest,
    /// The longest sequence, at the written micro-batch (transformers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_length: Option<Largest>,
}

/// Does `job` with `settings` and `sequence` fit an empty `gpu`, with its safety margin?
pub fn fits(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    settings: &Settings,
    sequence: u64,
) -> Result<bool, EstimateError> {
    // Settings or a length the job does not take do not fit.
    let Ok(work) = job
        .with_settings(settings)
        .and_then(|j| j.with_sequence_length(sequence))
    else {
        return Ok(false);
    };
    let est = super::memo::estimate(&work, gpu)?;
    let view = GpuView::empty(gpu.usable_bytes());
    Ok(fit_estimate(&est, job.spec().fit_policy.safety_margin, view).fits)
}

/// The largest n in 1..=cap with `ok(n)`, for `ok` true up to some n and false above.
pub fn largest(
    cap: u64,
    mut ok: impl FnMut(u64) -> Result<bool, EstimateError>,
) -> Result<Largest, EstimateError> {
    let mut estimates = 0;
    let mut test = |n: u64| {
        estimates += 1;
        ok(n)
    };
    if cap == 0 || !test(1)? {
        return Ok(Largest {
            value: None,
            capped: false,
            estimates,
        });
    }
    // Doubling: lo fits, hi does not (or hi is past the cap).
    let mut lo: u64 = 1;
    let mut hi = loop {
        let next = lo.saturating_mul(2).min(cap);
        if next == lo {
            return Ok(Largest {
                value: Some(lo),
                capped: true,
                estimates,
            });
        }
        if test(next)? {
            lo = next;
        } else {
            break next;
        }
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if test(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Largest {
        value: Some(lo),
        capped: false,
        estimates,
    })
}

/// Every one-field change the allowance permits (the written value left out), in the
/// planner's order of fields and values.
pub fn single_changes(
    job: &ValidatedJob,
    gpu: &GpuProduct,
    allow: Allowance,
) -> Vec<(AdjustableField, Settings)> {
    let o = options(job, gpu, allow);
    let written = Settings::of(job);
    let mut out = Vec::new();
    for p in o.precision.iter().skip(1) {
        out.push((
            AdjustableField::Precision,
            Settings {
                precision: *p,
                ..written
            },
        ));
    }
    for c in o.checkpointing.iter().skip(1) {
        out.push((
            AdjustableField::GradientCheckpointing,
            Settings {
                gradient_checkpointing: *c,
                ..written
            },
        ));
    }
    for opt in o.optimizer.iter().skip(1) {
        out.push((
            AdjustableField::Optimizer,
            Settings {
                optimizer: *opt,
                ..written
            },
        ));
    }
    for z in o.zero_stage.iter().skip(1) {
        out.push((
            AdjustableField::ZeroStage,
            Settings {
                zero_stage: *z,
                ..written
            },
        ));
    }
    for l in o.loss.iter().skip(1) {
        out.push((
            AdjustableField::Loss,
            Settings {
                loss: *l,
                ..written
            },
        ));
    }
    out
}

/// Every change the allowance permits at once, each knob at its last (most saving) value.
fn all_changes(job: &ValidatedJob, gpu: &GpuProduct, allow: Allowance) -> Settings {
    let o = options(job, gpu, allow);
    let w = Settings::of(job);
    Settings {
        precision: *o.precision.last().unwrap_or(&w.precision),
        gradient_checkpointing: *o.checkpointing.last().unwrap_or(&w.gradient_checkpointing),
        optimizer: *o.optimizer.last().unwrap_or(&w.optimizer),
        zero_stage: *o.zero_stage.last().unwrap_or(&w.zero_stage),
        loss: *o.loss.last().unwrap_or(&w.loss),
        ..w
    }
}

fn row(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    change: String,
    field: Option<AdjustableField>,
    settings: Settings,
) -> Result<Row, EstimateError> {
    let seq = job.spec().training.seq_len();
    let micro_batch_size = largest(MAX_MICRO_BATCH, |n| {
        fits(
            job,
            gpu,
            &Settings {
                micro_batch_size: n,
                ..settings
            },
            seq,
        )
    })?;
    let sequence_length = match job.model {
        // Context parallelism splits the sequence evenly: only its multiples are lengths the
        // job takes.
        ResolvedModel::Transformer(_) => {
            let step = job.spec().parallelism.context_parallel.max(1);
            let mut l = largest(MAX_SEQUENCE / step, |k| fits(job, gpu, &settings, k * step))?;
            l.value = l.value.map(|k| k * step);
            Some(l)
        }
        _ => None,
    };
    Ok(Row {
        change,
        field,
        micro_batch_size,
        sequence_length,
    })
}

/// The table of `vramguard max`: as written, each allowed change alone, and (with more
/// than one) all of them together.
pub fn table(
    job: &ValidatedJob,
    gpu: &'static GpuProduct,
    allow: Allowance,
) -> Result<Vec<Row>, EstimateError> {
    let written = Settings::of(job);
    let mut rows = vec![row(job, gpu, "as written".to_string(), None, written)?];
    let changes = single_changes(job, gpu, allow);
    for (field, s) in &changes {
        let what = s.changes_from(&written).join(", ");
        rows.push(row(job, gpu, what, Some(*field), *s)?);
    }
    if changes.len() > 1 {
        let all = all_changes(job, gpu, allow);
        let what = format!("all: {}", all.changes_from(&written).join(", "));
        rows.push(row(job, gpu, what, None, all)?);
    }
    Ok(rows)
}

/// The YAML name of a field, for tables.
pub fn field_name(f: AdjustableField) -> String {
    yaml_name(&f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_sequence_is_one_context_parallelism_splits_evenly() {
        let j = crate::api::test_job(
            "
model: {preset: llama-3.1-8b}
training: {mode: lora, sequenceLength: 3072, gradientCheckpointing: full}
parallelism: {gpus: 3, contextParallel: 3}
",
        );
        let h100 = crate::estimate::gpus::find("h100-80gb").expect("catalog GPU");
        let rows = table(&j, h100, Allowance::none()).expect("estimates");
        let longest = rows[0]
            .sequence_length
            .expect("a transformer's row has one");
        let n = longest.value.expect("some length fits");
        assert_eq!(
            n % 3,
            0,
            "{n} tokens do not split over 3 context-parallel ranks"
        );
        assert!(longest.estimates <= 2 * 22 + 1, "{longest:?}");
        // The next length the job takes does not fit (unless the cap was reached).
        let settings = Settings::of(&j);
        assert!(fits(&j, h100, &settings, n).expect("estimates"));
        assert!(longest.capped || !fits(&j, h100, &settings, n + 3).expect("estimates"));
    }

    #[test]
    fn largest_finds_the_boundary_in_few_steps() {
        for boundary in [1u64, 2, 3, 7, 8, 9, 1000, 65_535] {
            let r = largest(MAX_MICRO_BATCH, |n| Ok(n <= boundary)).expect("no error");
            assert_eq!(r.value, Some(boundary));
            assert!(!r.capped);
            assert!(r.estimates <= 2 * 16 + 1, "{boundary}: {}", r.estimates);
        }
        let none = largest(MAX_MICRO_BATCH, |_| Ok(false)).expect("no error");
        assert_eq!(none.value, None);
        let all = largest(MAX_MICRO_BATCH, |_| Ok(true)).expect("no error");
        assert_eq!((all.value, all.capped), (Some(MAX_MICRO_BATCH), true));
        let three = largest(3, |_| Ok(true)).expect("no error");
        assert_eq!((three.value, three.capped), (Some(3), true));
    }
}
