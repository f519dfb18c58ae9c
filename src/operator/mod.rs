//! The operator: runs admitted TrainingJobs where they fit, recognises GPU
//! out-of-memory deaths, learns from them and retries smaller.
//!
//! Pure parts: `step` (what is done with a job: the job as read and what was
//! observed in, the status to write and the effects around it out), `oom` (a
//! failed container's reason, exit code and message in, a typed
//! classification out), `admit` (where and how a job runs now), `render` (the
//! Job and Service of one attempt), `learn` (what an OOM proves),
//! `fingerprint`, `conditions`, `ledger`. At the edge: `controller` (the
//! kube-runtime controller: reads, calls `step`, applies the effects),
//! `observe` (the reads beyond the watch cache), `leader` (Lease election),
//! `events` and `profiles` (MemoryProfile objects).

pub mod admit;
pub mod conditions;
pub mod controller;
pub mod events;
pub use crate::api::fingerprint;
pub mod leader;
pub mod learn;
pub mod ledger;
pub mod metrics;
pub mod observe;
pub mod oom;
pub mod profiles;
pub mod render;
pub mod step;

pub use controller::{Config, run, run_controller};
pub use leader::LeaseConfig;
pub use metrics::OperatorMetrics;
pub use step::FINALIZER;

pub(crate) use crate::api::enum_name;
