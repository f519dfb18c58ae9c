//! A generated day: the scenario text of the bench and of the scale test, at
//! any number of jobs and GPUs.

/// The generated day of `cargo bench --bench simulate` and of the scale
/// test: `jobs` jobs arriving over ten hours on `gpus` GPUs (8 per node,
/// half H100 80GB, half A100 40GB): 60 % LoRA fine-tunes, 25 % BERT runs,
/// 10 % 4-GPU GPT-2 pre-training, 5 % a shape that needs 30 % more than
/// estimated; an operator restart at 3h and a lost node at 5h.
pub fn generated_day(jobs: u64, gpus: u64) -> String {
    use std::fmt::Write as _;
    let jobs = jobs.max(1);
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
