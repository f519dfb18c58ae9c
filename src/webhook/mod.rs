//! The admission webhook: axum over rustls. `/validate` answers AdmissionReview
//! v1 for TrainingJobs with the planner's verdict; `/healthz`, `/readyz`
//! (ready once the inventory has synced) and `/metrics`.

pub mod audit;
pub mod cache;
pub mod decide;
pub mod listen;
pub mod metrics;
pub mod review;
pub mod server;
pub mod tls;
pub mod workload;

pub use listen::{Connections, serve};
pub use server::{AppState, Limits, Totals, log_summaries, router, router_with};
pub use workload::Enforcement;
