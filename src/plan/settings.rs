//! What a plan sets and how it reads: the knobs the shrink search turns, the
//! `field: from → to` lines, the effective batch a plan keeps, and the plan
//! itself with its estimate. Plain data; no I/O.

use serde::Serialize;

use super::Verdict;
use crate::api::{AdjustableField, EstimateStatus, PlanStatus, ValidatedJob, ValidationErrors};
use crate::estimate::GIB;

pub use crate::api::validate::yaml_name;
pub use crate::api::{ALL_FIELDS, Settings};

/// A way to run the job on one GPU, with its estimate there.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    #[serde(flatten)]
    pub settings: Settings,
    /// The settings as written (what `changes` start from).
    #[serde(skip)]
    pub original: Settings,
    /// Every change as `field: from → to`; empty when the job fits as written.
    pub changes: Vec<String>,
    /// Estimated step time over the step time as written (1.0: unchanged).
    pub slowdown: f64,
    /// Micro-batch × accumulation × data-parallel ranks, the same as written.
    pub effective_batch_size: u64,
    /// The estimate of the changed job (`status.estimate` of the plan).
    pub estimate: EstimateStatus,
    pub verdict: Verdict,
}

impl Plan {
    /// Fields this plan changes.
    pub fn changed_fields(&self) -> Vec<AdjustableField> {
        self.settings.changed_fields(&self.original)
    }

    /// The job with this plan applied (what the estimator and the trainer see), validated
    /// again.
    pub fn apply(&self, job: &ValidatedJob) -> Result<ValidatedJob, ValidationErrors> {
        job.with_settings(&self.settings)
    }

    /// `status.plan`.
    pub fn to_status(&self) -> PlanStatus {
        self.settings.to_status(self.changes.clone())
    }

    /// One line for people: what changes, that the batch is kept, the room left, the cost.
    pub fn summary(&self) -> String {
        let fits = format!(
            "fits with {:.1} GiB to spare",
            self.verdict.headroom_bytes as f64 / GIB
        );
        if self.changes.is_empty() {
            return format!("as written: {fits}");
        }
        let mut s = self.changes.join(", ");
        if self.settings.micro_batch_size != self.original.micro_batch_size {
            s.push_str(&format!(
                " keeps the effective batch of {} and",
                self.effective_batch_size
            ));
        }
        format!(
            "{s} {fits} (≈{:.0} % slower)",
            (self.slowdown - 1.0).max(0.0) * 100.0
        )
    }
}

/// Micro-batch × accumulation × data-parallel ranks (= `globalBatchSize` when given).
pub fn effective_batch(job: &ValidatedJob) -> u128 {
    u128::from(job.spec().training.micro_batch_size)
        * u128::from(job.gradient_accumulation_steps.max(1))
        * u128::from(job.data_parallel.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::api::Checkpointing;
    use crate::api::test_job as job;

    #[test]
    fn changes_read_field_from_to() {
        let j = job("
model: {preset: llama-3.1-8b}
training: {microBatchSize: 8, globalBatchSize: 64}
");
        let from = Settings::of(&j);
        let to = Settings {
            micro_batch_size: 2,
            gradient_accumulation_steps: 4,
            gradient_checkpointing: Checkpointing::Selective,
            ..from
        };
        assert_eq!(
            to.changes_from(&from),
            vec![
                "microBatchSize: 8 → 2",
                "gradientAccumulationSteps: 8 → 4",
                "gradientCheckpointing: none → selective"
            ]
        );
        assert_eq!(
            to.changed_fields(&from),
            vec![
                AdjustableField::MicroBatchSize,
                AdjustableField::GradientCheckpointing
            ]
        );
    }
}
