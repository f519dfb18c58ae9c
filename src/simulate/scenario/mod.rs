//! The scenario file of `vramguard simulate`: the nodes and their GPUs, the
//! jobs (when they arrive, their TrainingJob spec, how long they run, what
//! they truly need) and the faults. Read once into a [`Scenario`]; every
//! error names the field (`jobs[2].duration: ...`).
//!
//! `file.rs` is the file's shape as written (durations, defaults),
//! `parse.rs` checks it field by field into the types here,
//! `residuals.rs` the measured ratios a job's truth can be drawn from, and
//! `day.rs` the generated day of the bench and the scale test.

mod day;
mod file;
mod parse;
mod residuals;

pub use day::generated_day;
pub use file::{Secs, parse_secs};
pub use parse::{MAX_JOBS, MEMORY_PER_JOB, parse, parse_within};
pub use residuals::{CALIBRATION_RESIDUALS, Residuals};

use crate::api::TrainingJob;
use crate::estimate::gpus::GpuProduct;

/// Why a scenario cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("not valid YAML: {0}")]
    Syntax(String),
    /// A field is wrong; `path` names it.
    #[error("{path}: {reason}")]
    Field { path: String, reason: String },
}

fn field(path: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Field {
        path: path.into(),
        reason: reason.into(),
    }
}

/// One simulated node.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub product: &'static GpuProduct,
    pub gpus: u32,
}

/// What a job truly needs: a hidden factor on the estimate, or a measured
/// figure per GPU for the spec as written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TrueNeed {
    Factor(f64),
    BytesPerGpu(u64),
}

/// One job arrival.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub at: f64,
    /// The TrainingJob as submitted (name and namespace set).
    pub job: TrainingJob,
    /// Seconds it runs once started.
    pub duration: f64,
    /// None: drawn from the scenario's spread, per job shape.
    pub true_need: Option<TrueNeed>,
    /// The scenario entry it comes from.
    pub group: String,
}

/// A fault injected at a time.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The operator process dies and comes back after `down` seconds.
    OperatorRestart { down: f64 },
    /// The node's agent stops publishing (the node keeps running).
    AgentStops { node: String },
    /// The node disappears with everything on it.
    NodeLost { node: String },
}

/// A scenario, checked.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    pub horizon: f64,
    pub agent_interval: f64,
    pub agent_ttl: f64,
    pub spread: (f64, f64),
    /// Measured / estimated ratios by recipe, drawn from instead of `spread`.
    pub residuals: Option<Residuals>,
    pub oom_after: f64,
    /// Seconds from a Job's creation until its pods run.
    pub start_after: f64,
    pub sample_every: f64,
    pub nodes: Vec<NodeSpec>,
    /// In arrival order (ties keep file order).
    pub arrivals: Vec<Arrival>,
    /// In time order.
    pub faults: Vec<(f64, Fault)>,
}

impl Scenario {
    /// Total GPUs.
    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }
}
