//! Estimates remembered. An estimate is a pure function of the validated job
//! and the GPU, and a cluster's jobs come in few shapes: the webhook, the
//! operator's placement and every plan the shrink search tries ask for the
//! same (job, GPU) pairs again and again (a day of 10 000 jobs of four
//! shapes asks for the same few hundred). Each is computed once and kept,
//! at most [`CAPACITY`] of them (all are dropped when that is reached, so
//! memory stays bounded whatever the jobs). A hit is checked for equality
//! with the job it was made for, not just its hash.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::api::ValidatedJob;
use crate::estimate::{self, Estimate, EstimateError, GpuProduct};

/// The most estimates kept.
pub const CAPACITY: usize = 2048;

type Entry = (
    ValidatedJob,
    &'static GpuProduct,
    Result<Estimate, EstimateError>,
);

#[derive(Default)]
struct Memo {
    by_hash: HashMap<u64, Vec<Entry>>,
    len: usize,
}

fn memo() -> MutexGuard<'static, Memo> {
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    MEMO.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Feeds what `Debug` writes to a hasher, without building the string.
struct Hashing(DefaultHasher);

impl std::fmt::Write for Hashing {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

fn hash(job: &ValidatedJob, gpu: &'static GpuProduct) -> u64 {
    let mut h = Hashing(DefaultHasher::new());
    // Equal jobs print alike; a job that prints alike but differs is told
    // apart by the equality check on a hit.
    let _ = write!(h, "{job:?}");
    std::ptr::from_ref(gpu).hash(&mut h.0);
    h.0.finish()
}

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns remembering on or off for the whole process (on by default). Off,
/// every call estimates afresh: for measurements of what an unseen job
/// costs (`benches/webhook_load.rs`, its `uncached` server).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// [`estimate::estimate`], computed once per (job, GPU).
pub fn estimate(job: &ValidatedJob, gpu: &'static GpuProduct) -> Result<Estimate, EstimateError> {
    if !ENABLED.load(Ordering::Relaxed) {
        return estimate::estimate(job, gpu);
    }
    let key = hash(job, gpu);
    let hit = memo().by_hash.get(&key).and_then(|entries| {
        entries
            .iter()
            .find(|(j, g, _)| std::ptr::eq(*g, gpu) && j == job)
            .map(|e| e.2.clone())
    });
    if let Some(hit) = hit {
        return hit;
    }
    let made = estimate::estimate(job, gpu);
    let mut m = memo();
    if m.len >= CAPACITY {
        m.by_hash.clear();
        m.len = 0;
    }
    m.by_hash
        .entry(key)
        .or_default()
        .push((job.clone(), gpu, made.clone()));
    m.len += 1;
    made
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::gpus;
    use crate::plan::Settings;

    use crate::api::test_job as job;

    #[test]
    fn remembered_estimates_are_the_estimates_of_each_job_and_gpu() {
        let base = job("
model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 4, globalBatchSize: 32, sequenceLength: 4096,
           precision: bf16, gradientCheckpointing: full}
");
        let h100 = gpus::find("h100-80gb").expect("catalog GPU");
        let a100 = gpus::find("a100-40gb").expect("catalog GPU");
        let mut jobs = Vec::new();
        for micro in [1, 2, 4] {
            let mut s = Settings::of(&base);
            s.micro_batch_size = micro;
            s.gradient_accumulation_steps = 32 / micro;
            jobs.push(base.with_settings(&s).expect("a valid micro-batch"));
        }
        // Twice over, in either order: each answer is that job's on that GPU.
        for _ in 0..2 {
            for j in &jobs {
                for g in [h100, a100] {
                    assert_eq!(estimate(j, g), estimate::estimate(j, g));
                }
            }
        }
        let small = estimate(&jobs[0], h100).unwrap().status.per_gpu_bytes;
        let big = estimate(&jobs[2], h100).unwrap().status.per_gpu_bytes;
        assert!(small < big, "{small} {big}");
        // An invalid pairing's error is remembered as the error.
        let bf16_on_v100 = gpus::find("v100-32gb").expect("catalog GPU");
        assert_eq!(
            estimate(&jobs[0], bf16_on_v100).is_ok(),
            estimate::estimate(&jobs[0], bf16_on_v100).is_ok()
        );
    }
}
