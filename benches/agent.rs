//! How fast the node agent measures: one full probe sweep of a simulated
//! 8-GPU node (target ≤ 10 ms; the agent runs one every interval), and the
//! largest-block search on a fragmented simulated 80 GB card (target ≤ 1 s,
//! the default `blockBudget`).
//!
//! The simulated backend answers each allocation attempt from its allocator
//! model, so these figures are the agent's own cost: the bisection, the model
//! and the status it builds. On a real GPU each attempt is a cuMemAlloc and
//! cuMemFree, which dominate; those figures need a GPU (`on_a_gpu` in
//! `tests/agent.rs` prints them).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use k8s_openapi::jiff::Timestamp;
use vramguard::agent::gpu::{Gpu, SearchLimits};
use vramguard::agent::probe::{Assignments, ProbeOptions, Prober};
use vramguard::agent::simulated::Simulated;

/// Eight H100 80GB: four idle, two with a trainer holding 30 GiB, two
/// fragmented (1 GiB blocks until full, every other one freed).
const NODE_8: &str = "
driverVersion: 570.124.06
cudaVersion: '12.8'
gpus:
  - {product: h100-80gb, count: 4}
  - {product: h100-80gb, count: 2, processes: [{pid: 4242, usedBytes: 30GiB}]}
  - product: h100-80gb
    count: 2
    processes: [{pid: 5151, allocations: [{fill: 1GiB}, {freeEvery: 2}]}]
";

fn simulated(yaml: &str) -> Simulated {
    Simulated::from_yaml(yaml).unwrap_or_else(|e| panic!("bench YAML: {e}\n{yaml}"))
}

/// Every GPU measured (context overhead, largest block), busy ones included.
fn options() -> ProbeOptions {
    ProbeOptions {
        probe_busy_gpus: true,
        ..ProbeOptions::default()
    }
}

fn bench_probe(c: &mut Criterion) {
    let gpu: Arc<dyn Gpu> = Arc::new(simulated(NODE_8));
    let assignments = Assignments::default();
    let mut group = c.benchmark_group("probe-sweep");
    // As the agent runs: one prober, the context overhead measured once.
    let prober = Prober::new(Arc::clone(&gpu), options());
    let status = prober.probe(&assignments, Timestamp::now()).expect("probe");
    assert_eq!(status.gpu_count, 8);
    assert!(
        status
            .gpus
            .iter()
            .all(|g| g.largest_free_block_bytes.is_some())
    );
    group.bench_function("8xh100-80gb", |b| {
        b.iter(|| {
            prober
                .probe(black_box(&assignments), Timestamp::now())
                .expect("probe")
        })
    });
    // The agent's first sweep: the context overhead measured too.
    group.bench_function("8xh100-80gb-first", |b| {
        b.iter_batched(
            || Prober::new(Arc::clone(&gpu), options()),
            |p| {
                p.probe(black_box(&assignments), Timestamp::now())
                    .expect("probe")
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn bench_largest_block(c: &mut Criterion) {
    let mut group = c.benchmark_group("largest-block");
    for (name, history) in [
        (
            "a100-80gb-1gib-every-other-freed",
            "[{fill: 1GiB}, {freeEvery: 2}]",
        ),
        (
            "a100-80gb-64mib-every-other-freed",
            "[{fill: 64MiB}, {freeEvery: 2}]",
        ),
    ] {
        let s = simulated(&format!(
            "gpus: [{{product: a100-80gb, processes: [{{pid: 7, allocations: {history}}}]}}]"
        ));
        let free = s.device(0).expect("device").memory.free_bytes;
        let budget = options().block_budget;
        let p = s
            .largest_allocatable_block(0, u64::MAX, SearchLimits::within(budget))
            .expect("search");
        assert!(p.exact, "{name}: {p:?}");
        assert!(
            p.bytes < free / 4,
            "{name}: fragmented ({p:?}, free {free})"
        );
        group.bench_function(name, |b| {
            b.iter(|| {
                s.largest_allocatable_block(black_box(0), u64::MAX, SearchLimits::within(budget))
                    .expect("search")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_probe, bench_largest_block);
criterion_main!(benches);
