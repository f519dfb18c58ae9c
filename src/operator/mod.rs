//! The operator: runs admitted TrainingJobs where they fit, recognises GPU
//! out-of-memory deaths, learns from them and retries smaller.
//!
//! `oom` is pure: a failed container's reason, exit code and message in, a
//! typed classification out.

pub mod oom;
