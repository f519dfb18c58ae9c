//! What a plan sets and how it reads: the knobs the shrink search turns, the
//! `field: from → to` lines, the effective batch a plan keeps, and the plan
//! itself with its estimate. Plain data; no I/O.

use serde::Serialize;

use super::Verdict;
use crate::api::{
    AdjustableField, Checkpointing, EstimateStatus, Loss, Optimizer, PlanStatus, Precision,
    ValidatedJob,
};
use crate::estimate::GIB;

/// Every field a fit policy can allow, in the order changes are listed.
pub const ALL_FIELDS: [AdjustableField; 6] = [
    AdjustableField::MicroBatchSize,
    AdjustableField::GradientCheckpointing,
    AdjustableField::Precision,
    AdjustableField::Optimizer,
    AdjustableField::ZeroStage,
    AdjustableField::Loss,
];

/// The knobs a plan sets (the `status.plan` fields, plus the loss).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub micro_batch_size: u64,
    pub gradient_accumulation_steps: u64,
    pub precision: Precision,
    pub gradient_checkpointing: Checkpointing,
    pub optimizer: Optimizer,
    pub zero_stage: u8,
    pub loss: Loss,
}

impl Settings {
    /// The job's settings as written.
    pub fn of(job: &ValidatedJob) -> Settings {
        let t = &job.spec.training;
        Settings {
            micro_batch_size: t.micro_batch_size,
            gradient_accumulation_steps: job.gradient_accumulation_steps,
            precision: t.precision,
            gradient_checkpointing: t.gradient_checkpointing,
            optimizer: t.optimizer,
            zero_stage: job.spec.parallelism.zero(),
            loss: t.loss,
        }
    }

    /// Write these settings into `job` (what the estimator reads).
    pub fn apply_to(&self, job: &mut ValidatedJob) {
        let t = &mut job.spec.training;
        t.micro_batch_size = self.micro_batch_size;
        t.precision = self.precision;
        t.gradient_checkpointing = self.gradient_checkpointing;
        t.optimizer = self.optimizer;
        t.loss = self.loss;
        job.spec.parallelism.zero_stage = Some(self.zero_stage);
        job.gradient_accumulation_steps = self.gradient_accumulation_steps;
    }

    /// Fields whose value differs from `other`.
    /// `status.plan` for these settings, with the changes that led to them.
    pub fn to_status(&self, changes: Vec<String>) -> PlanStatus {
        PlanStatus {
            micro_batch_size: self.micro_batch_size,
            gradient_accumulation_steps: self.gradient_accumulation_steps,
            precision: self.precision,
            gradient_checkpointing: self.gradient_checkpointing,
            optimizer: self.optimizer,
            zero_stage: self.zero_stage,
            loss: self.loss,
            expandable_segments: false,
            changes,
        }
    }

    pub fn changed_fields(&self, other: &Settings) -> Vec<AdjustableField> {
        ALL_FIELDS
            .iter()
            .copied()
            .filter(|f| match f {
                AdjustableField::MicroBatchSize => {
                    self.micro_batch_size != other.micro_batch_size
                        || self.gradient_accumulation_steps != other.gradient_accumulation_steps
                }
                AdjustableField::GradientCheckpointing => {
                    self.gradient_checkpointing != other.gradient_checkpointing
                }
                AdjustableField::Precision => self.precision != other.precision,
                AdjustableField::Optimizer => self.optimizer != other.optimizer,
                AdjustableField::ZeroStage => self.zero_stage != other.zero_stage,
                AdjustableField::Loss => self.loss != other.loss,
            })
            .collect()
    }

    /// `field: from → to` for every change from `from`, in [`ALL_FIELDS`] order.
    pub fn changes_from(&self, from: &Settings) -> Vec<String> {
        let mut out = Vec::new();
        let mut push = |field: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{field}: {a} → {b}"));
            }
        };
        push(
            "microBatchSize",
            from.micro_batch_size.to_string(),
            self.micro_batch_size.to_string(),
        );
        push(
            "gradientAccumulationSteps",
            from.gradient_accumulation_steps.to_string(),
            self.gradient_accumulation_steps.to_string(),
        );
        push(
            "gradientCheckpointing",
            yaml_name(&from.gradient_checkpointing),
            yaml_name(&self.gradient_checkpointing),
        );
        push(
            "precision",
            yaml_name(&from.precision),
            yaml_name(&self.precision),
        );
        push(
            "optimizer",
            yaml_name(&from.optimizer),
            yaml_name(&self.optimizer),
        );
        push(
            "zeroStage",
            from.zero_stage.to_string(),
            self.zero_stage.to_string(),
        );
        push("loss", yaml_name(&from.loss), yaml_name(&self.loss));
        out
    }
}

/// The YAML spelling of an enum value.
pub(super) fn yaml_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

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

    /// The job with this plan applied (what the estimator and the trainer see).
    pub fn apply(&self, job: &ValidatedJob) -> ValidatedJob {
        let mut out = job.clone();
        self.settings.apply_to(&mut out);
        out
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
    u128::from(job.spec.training.micro_batch_size)
        * u128::from(job.gradient_accumulation_steps.max(1))
        * u128::from(job.data_parallel.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

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
