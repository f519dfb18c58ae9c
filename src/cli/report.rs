//! What `vramguard estimate` says about each job (the `-o json` object): the types the
//! estimate builds and the table renders.

use serde::Serialize;

use crate::api::{EstimateStatus, ValidatedJob};
use crate::kinds;
use crate::plan::{Advice, PlaceOutcome, Plan, Verdict};

/// One GPU's verdict for a job.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuVerdict {
    pub gpu: String,
    pub product: String,
    pub usable_bytes: u64,
    pub per_gpu_bytes: u64,
    pub verdict: Verdict,
    pub message: String,
    /// The cheapest plan the job's fit policy allows on this GPU, when it does not fit as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// What would fit, when no allowed plan fits this GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<Advice>,
}

/// The plan vramguard would apply (`status.plan`) and the GPU it is for.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChosenPlan {
    pub gpu: String,
    #[serde(flatten)]
    pub plan: Plan,
}

/// Per-phase allocated bytes, for the explanation.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseReport {
    pub phase: String,
    pub allocated_bytes: u64,
}

/// A contributor to the peak.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Contributor {
    pub component: String,
    pub bytes: u64,
}

/// Why the number is what it is.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub peak_phase: String,
    pub top_contributors: Vec<Contributor>,
    pub summary: String,
    /// Why the estimate is a range, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}

/// Everything `estimate` says about one job (the `-o json` object).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub model: String,
    /// The estimate on the first GPU asked about (`status.estimate`).
    pub estimate: EstimateStatus,
    pub phases: Vec<PhaseReport>,
    pub explanation: Explanation,
    pub verdicts: Vec<GpuVerdict>,
    /// True when the job fits at least one GPU asked about as written.
    pub fits: bool,
    /// As written on the first GPU it fits; else the cheapest allowed plan over the GPUs
    /// asked about; absent when none fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<ChosenPlan>,
    /// With `--cluster`: what the webhook and the operator would do with it on
    /// that inventory (decision placed | wait | reject), by their one rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlaceOutcome>,
    /// With `--cluster`, when it is placed only after changes: the plan it runs with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placed_with: Option<Plan>,
    /// For a Job, JobSet, TrainJob or PyTorchJob: its kind, where the model
    /// and recipe were read from, and where each field came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_from: Option<ReadFrom>,
    #[serde(skip)]
    pub job: Option<ValidatedJob>,
}

/// How a Job, JobSet, TrainJob or PyTorchJob was read.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFrom {
    pub kind: String,
    /// `the vramguard.io/training annotation` or `the <trainer> command line`.
    pub origin: String,
    pub sources: Vec<kinds::Source>,
    /// GPU products the pods are held to by a node selector or affinity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub products: Vec<String>,
}
