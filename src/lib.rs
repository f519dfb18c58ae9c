//! vramguard: estimate the GPU memory of training jobs before they run, fit
//! and place them, and reject what cannot fit with numbers and a fix.
//!
//! `api` and `estimate` are pure; the command line lives in `cli`.

pub mod agent;
pub mod api;
/// The in-memory API server of `vramguard simulate` and the tests (feature `simulate`).
#[cfg(feature = "simulate")]
pub mod apiserver;
pub mod cli;
pub mod decide;
pub mod estimate;
pub mod inventory;
pub mod kinds;
pub mod kueue;
pub mod metrics;
pub mod operator;
pub mod plan;
#[cfg(feature = "simulate")]
pub mod simulate;
pub mod webhook;
