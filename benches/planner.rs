//! How fast the planner answers: the shrink search for one job on one GPU
//! (the webhook runs it per candidate product on every admission that does not
//! fit as written), and the placement of one job over a 10 000-GPU cluster.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use vramguard::api::{
    GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, TrainingJobSpec, ValidatedJob, validate,
};
use vramguard::estimate::{GpuProduct, gpus};
use vramguard::plan::{self, GpuView, Reservation};

const GIB: u64 = 1 << 30;

fn job(yaml: &str) -> ValidatedJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).expect("bench YAML parses");
    validate(&spec).expect("bench spec is valid")
}

fn gpu(name: &str) -> &'static GpuProduct {
    gpus::find(name).expect("catalog GPU")
}

/// Llama-3.1-8B LoRA, micro-batch 16 at 4k tokens on an A100 40GB: does not
/// fit as written; every knob allowed.
const LORA_8B: &str = "
model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 16, globalBatchSize: 64, sequenceLength: 4096,
           precision: bf16, attention: flash}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing, precision, optimizer, zeroStage, loss]}
";

/// Llama-3-70B LoRA over 8 A100 40GB with DeepSpeed: needs ZeRO-3.
const LORA_70B: &str = "
model: {preset: llama-3-70b}
training: {mode: lora, microBatchSize: 4, globalBatchSize: 64, sequenceLength: 4096,
           precision: bf16, attention: flash}
parallelism: {gpus: 8, strategy: deepspeed}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing, optimizer, zeroStage, loss]}
";

/// Llama-3.1-8B full fine-tune on one A100 80GB: fits in no allowed form; the
/// answer names bigger GPUs (the slowest path).
const FULL_8B: &str = "
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 8, sequenceLength: 4096, precision: bf16-mixed}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing, precision, optimizer, zeroStage, loss]}
";

fn bench_shrink(c: &mut Criterion) {
    let mut group = c.benchmark_group("shrink");
    for (name, yaml, product) in [
        ("llama-3.1-8b-lora-a100-40gb", LORA_8B, "a100-40gb"),
        ("llama-3-70b-lora-8xa100-40gb", LORA_70B, "a100-40gb"),
        ("llama-3.1-8b-full-a100-80gb-no-fit", FULL_8B, "a100-80gb"),
    ] {
        let j = job(yaml);
        let g = gpu(product);
        let view = GpuView::empty(g.usable_bytes());
        // Fresh: every estimate computed (a job the process has not seen);
        // remembered: the same job again, its estimates kept by `plan::memo`.
        for (memo, label) in [(false, "fresh"), (true, "remembered")] {
            group.bench_function(format!("{name} ({label})"), |b| {
                plan::memo::set_enabled(memo);
                b.iter(|| plan::shrink(black_box(&j), g, black_box(view)).expect("estimates"))
            });
        }
    }
    plan::memo::set_enabled(true);
    group.finish();
}

/// `nodes` nodes of 8 GPUs, H100 and A100 80GB, each GPU partly used, probed just now.
fn cluster(nodes: usize, now: Timestamp) -> Vec<GpuNode> {
    // A fixed linear congruential sequence: the same cluster on every run.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    (0..nodes)
        .map(|i| {
            let name = format!("gpu-node-{i:04}");
            let (product, total) = if i % 3 == 0 {
                ("NVIDIA A100-SXM4-80GB", 81_920u64 << 20)
            } else {
                ("NVIDIA H100 80GB HBM3", 81_559u64 << 20)
            };
            let gpus: Vec<GpuStatus> = (0..8u32)
                .map(|index| {
                    let used = next() % 100 * (total / 100);
                    let free = total - used;
                    GpuStatus {
                        index,
                        product: product.into(),
                        total_bytes: total,
                        free_bytes: free,
                        used_bytes: used,
                        largest_free_block_bytes: Some(free / 10 * 9),
                        healthy: true,
                        ..GpuStatus::default()
                    }
                })
                .collect();
            let mut n = GpuNode::new(
                &name,
                GpuNodeSpec {
                    node_name: name.clone(),
                    ttl_seconds: 120,
                    taints: Vec::new(),
                },
            );
            n.status = Some(GpuNodeStatus {
                gpu_count: 8,
                gpus,
                probe_time: Some(Time(now)),
                ..GpuNodeStatus::default()
            });
            n
        })
        .collect()
}

fn bench_place(c: &mut Criterion) {
    let now = Timestamp::from_second(1_800_000_000).expect("valid time");
    let nodes = cluster(1250, now);
    let reservations: Vec<Reservation> = (0..200)
        .map(|i| Reservation {
            node: format!("gpu-node-{:04}", i * 6),
            gpu_index: i % 8,
            mig_index: None,
            bytes: 10 * GIB,
        })
        .collect();
    let mut group = c.benchmark_group("place-1250x8");
    for (name, yaml) in [
        (
            "llama-3.1-8b-lora-1gpu",
            "
model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 4, sequenceLength: 4096, precision: bf16,
           gradientCheckpointing: full, attention: flash}
",
        ),
        (
            "llama-3.1-8b-full-fsdp-2x8",
            "
model: {preset: llama-3.1-8b}
training: {mode: full, microBatchSize: 1, globalBatchSize: 64, sequenceLength: 4096,
           precision: bf16-mixed, gradientCheckpointing: full, attention: flash}
parallelism: {gpus: 16, gpusPerNode: 8, zeroStage: 3, strategy: fsdp}
",
        ),
    ] {
        let j = job(yaml);
        for (memo, label) in [(false, "fresh"), (true, "remembered")] {
            group.bench_function(format!("{name} ({label})"), |b| {
                plan::memo::set_enabled(memo);
                b.iter(|| {
                    plan::place(black_box(&j), black_box(&nodes), &reservations, &[], now)
                        .expect("estimates")
                })
            });
        }
    }
    plan::memo::set_enabled(true);
    group.finish();
}

criterion_group!(benches, bench_shrink, bench_place);
criterion_main!(benches);
