//! `vramguard simulate` at scale: a generated scenario of N jobs on G GPUs
//! (VRAMGUARD_BENCH_JOBS, default 10000; VRAMGUARD_BENCH_GPUS, default 1000,
//! 8 per node, half H100 80GB and half A100 40GB), jobs arriving over ten
//! simulated hours (LoRA fine-tunes, BERT runs, 4-GPU GPT-2 pre-training, a
//! shape that needs 30 % more than estimated), an operator restart and a
//! lost node. Reports wall-clock seconds of the run with vramguard (webhook,
//! operator, agents, kubelet and trainers over the in-memory API server) and
//! of the baseline, and the jobs and API requests per second.
//!
//!     cargo bench --bench simulate
//!     VRAMGUARD_BENCH_JOBS=1000 VRAMGUARD_BENCH_GPUS=100 cargo bench --bench simulate

use std::fmt::Write as _;
use std::time::Instant;

use vramguard::simulate::{self, scenario};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn scenario_text(jobs: u64, gpus: u64) -> String {
    let nodes = gpus.div_ceil(8).max(2);
    let hours = 10.0;
    let every = hours * 3600.0 / jobs as f64;
    // Shares of the jobs: 60 % LoRA, 25 % BERT, 10 % GPT-2 on 4 GPUs, 5 % underestimated.
    let share = |p: f64| ((jobs as f64 * p).round() as u64).max(1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "name: bench\nseed: 1\nduration: 24h\ntruth: {{spread: [0.85, 1.0], oomAfter: 2m}}\nnodes:"
    );
    let _ = writeln!(
        s,
        "  - {{name: h100, product: h100-80gb, gpus: 8, count: {}}}",
        nodes / 2
    );
    let _ = writeln!(
        s,
        "  - {{name: a100, product: a100-40gb, gpus: 8, count: {}}}",
        nodes - nodes / 2
    );
    let _ = writeln!(s, "jobs:");
    let groups = [
        (
            "lora",
            share(0.60),
            "40m",
            "{model: {preset: llama-3.1-8b}, training: {mode: lora, microBatchSize: 4, globalBatchSize: 32, sequenceLength: 4096, precision: bf16, gradientCheckpointing: full}, parallelism: {gpus: 1}, fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}}",
            "",
        ),
        (
            "bert",
            share(0.25),
            "20m",
            "{model: {preset: bert-large, head: classification, numLabels: 3}, training: {mode: full, microBatchSize: 32, sequenceLength: 128}, parallelism: {gpus: 1}}",
            "",
        ),
        (
            "gpt2",
            share(0.10),
            "1h",
            "{model: {preset: gpt2}, training: {mode: full, microBatchSize: 16, globalBatchSize: 256, sequenceLength: 1024}, parallelism: {gpus: 4, gpusPerNode: 4}, fitPolicy: {mode: Adjust, allow: [microBatchSize], minMicroBatchSize: 4}}",
            "",
        ),
        (
            "under",
            share(0.05),
            "30m",
            "{model: {custom: {parameters: 1.3e9, activationBytesPerSample: 6.0e9}}, training: {mode: full, microBatchSize: 8}, parallelism: {gpus: 1}, fitPolicy: {mode: Adjust, allow: [microBatchSize]}}",
            "factor: 1.3, ",
        ),
    ];
    let total: u64 = groups.iter().map(|g| g.1).sum();
    let mut offset = 0.0;
    for (name, count, duration, spec, extra) in groups {
        // Interleave the groups over the same ten hours.
        let step = every * total as f64 / count as f64;
        let _ = writeln!(
            s,
            "  - {{name: {name}, count: {count}, at: {offset:.0}, every: {step:.3}, duration: {duration}, {extra}spec: {spec}}}"
        );
        offset += every;
    }
    let _ = writeln!(
        s,
        "faults:\n  - {{at: 3h, operatorRestart: {{down: 1m}}}}\n  - {{at: 5h, nodeLost: {{node: a100-0}}}}"
    );
    s
}

fn main() {
    let jobs = env("VRAMGUARD_BENCH_JOBS", 10_000);
    let gpus = env("VRAMGUARD_BENCH_GPUS", 1_000);
    let text = scenario_text(jobs, gpus);
    let s = scenario::parse(&text).expect("the generated scenario parses");
    let started = Instant::now();
    let report = simulate::run(&s).expect("the simulation runs");
    let wall = started.elapsed().as_secs_f64();
    let sum = &report.summary;
    println!(
        "simulate/{} jobs on {} GPUs: {:.1} s wall ({:.1} s with vramguard, {:.1} s baseline) for {:.1} simulated hours = {:.0} jobs/s; \
submitted {}, rejected {}, as written {}, shrunk {}, waited {}, OOMed {} (baseline {}), succeeded {} (baseline {}), failed {}, never ran {}; invariants {}",
        sum.submitted,
        s.gpus(),
        wall,
        sum.wall_seconds,
        wall - sum.wall_seconds,
        sum.simulated_seconds / 3600.0,
        sum.submitted as f64 / sum.wall_seconds.max(1e-9),
        sum.submitted,
        sum.rejected_at_admission,
        sum.admitted_as_written,
        sum.admitted_after_shrinking,
        sum.waited,
        sum.oomed,
        report.baseline.oomed,
        sum.succeeded,
        report.baseline.succeeded,
        sum.failed,
        sum.never_ran,
        if report.all_hold() {
            "all hold"
        } else {
            "SOME BROKEN"
        }
    );
    if !report.all_hold() {
        for (k, v) in &report.invariants {
            if !v.holds {
                println!("  {k}: {}", v.detail);
            }
        }
    }
}
