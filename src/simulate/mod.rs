//! `vramguard simulate`: the whole system in one process, on simulated time.
//!
//! The webhook's router, the operator's controller, the inventory's
//! reflectors and the agent's prober and publisher run unchanged against the
//! in-memory API server ([`crate::apiserver`]), reached through kube's own
//! client with no socket. Around them the simulation plays the cluster: the
//! API server's admission chain (each submitted TrainingJob goes through
//! `/validate` first), the nodes' GPUs (the agent's simulated backend), a
//! kubelet that runs the Jobs the operator creates, and trainers that
//! allocate what their job truly needs ([`truth`]) and die with PyTorch's
//! out-of-memory message when they cannot. Faults come from the scenario.
//!
//! Time is tokio's paused clock on a current-thread runtime: when every task
//! waits, it jumps to the next timer, so a day of cluster time takes seconds.
//! The same scenario also runs through [`baseline`]: vramguard off.

pub mod baseline;
mod cluster;
mod live;
mod nodes;
pub mod record;
pub mod report;
pub mod scenario;
pub mod truth;

use crate::api::{self, ValidatedJob};
use crate::estimate::gpus::{DRIVER_RESERVE_BYTES, GpuProduct};

pub use report::Report;
pub use scenario::{Scenario, ScenarioError};

use scenario::{Arrival, TrueNeed};
use truth::RankNeed;

/// A job of the scenario, validated once, with its hidden truth resolved.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub arrival: Arrival,
    /// None when the spec does not validate (the webhook will deny it).
    pub validated: Option<ValidatedJob>,
    pub truth: TrueNeed,
}

impl Prepared {
    /// What one rank of `planned` (this job with some plan applied) truly
    /// needs on `product`.
    pub fn need(
        &self,
        planned: &ValidatedJob,
        written: &ValidatedJob,
        product: &'static GpuProduct,
    ) -> Result<RankNeed, String> {
        truth::rank_need(planned, written, product, self.truth)
    }
}

/// What a simulated GPU offers processes: its memory less the driver's reserve.
pub fn capacity_bytes(product: &GpuProduct) -> u64 {
    product.total_bytes.saturating_sub(DRIVER_RESERVE_BYTES)
}

/// Validate every job and resolve its truth.
pub fn prepare(scenario: &Scenario) -> Vec<Prepared> {
    scenario
        .arrivals
        .iter()
        .map(|a| {
            let validated = api::validate_job(&a.job).ok();
            let truth = match (a.true_need, &validated) {
                (Some(t), _) => t,
                (None, Some(v)) => TrueNeed::Factor(match &scenario.residuals {
                    Some(table) => truth::drawn_residual(v, scenario.seed, table),
                    None => truth::drawn_factor(v, scenario.seed, scenario.spread),
                }),
                (None, None) => TrueNeed::Factor(1.0),
            };
            Prepared {
                arrival: a.clone(),
                validated,
                truth,
            }
        })
        .collect()
}

/// Run a scenario with vramguard and without; blocks the calling thread.
pub fn run(scenario: &Scenario) -> Result<Report, String> {
    run_with_progress(scenario, &Progress::default())
}

/// How far a run has got, updated by the run and read by another thread (the CLI's
/// progress line). Updating it schedules nothing: the simulation runs the same with or
/// without a reader.
#[derive(Debug, Default)]
pub struct Progress {
    /// Simulated time reached with vramguard on, in milliseconds.
    pub simulated_ms: std::sync::atomic::AtomicU64,
    /// Jobs submitted so far.
    pub submitted: std::sync::atomic::AtomicU64,
    /// True once the run with vramguard on is over (the baseline runs next).
    pub live_done: std::sync::atomic::AtomicBool,
}

impl Progress {
    /// The run with vramguard on has reached `secs` of simulated time.
    fn seen(&self, secs: f64) {
        self.simulated_ms
            .store((secs * 1000.0) as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

/// [`run`], reporting how far it has got in `progress`.
pub fn run_with_progress(scenario: &Scenario, progress: &Progress) -> Result<Report, String> {
    let started = std::time::Instant::now();
    let prepared = prepare(scenario);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| format!("starting the simulation runtime: {e}"))?;
    let outcome = runtime.block_on(live::run(scenario, prepared.clone(), progress))?;
    progress
        .live_done
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let wall_live = started.elapsed().as_secs_f64();
    let base = baseline::run(scenario, &prepared);
    Ok(Report::build(
        scenario,
        outcome,
        base,
        wall_live,
        started.elapsed().as_secs_f64(),
    ))
}
