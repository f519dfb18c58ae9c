//! The operator reconciling many TrainingJobs against the in-memory test API
//! server over HTTP (kube's real client, the real controller). The API
//! server runs in a child process so the memory figures are the
//! controller's alone.
//!
//!     cargo bench --bench operator
//!
//! For each size N (VRAMGUARD_BENCH_JOBS, default "1000,10000") and each kind
//! of job (VRAMGUARD_BENCH_KINDS, default "fits,shrink": jobs that fit an H100
//! as written, and jobs that fit only after a change their fit policy allows):
//! N single-GPU TrainingJobs and N GPUs (8 per node) are created first, then
//! the operator starts; reported: the time until every job has its Job (jobs
//! placed per second), the controller process's resident memory (VmRSS) once settled
//! and when the last job was placed, its peak (VmHWM), and the bytes live on
//! its heap.

use vramguard::apiserver;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use vramguard::api::{GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, TrainingJob};
use vramguard::inventory::reflect;
use vramguard::operator::{self, Config, LeaseConfig};

const ROLE: &str = "VRAMGUARD_BENCH_ROLE";

/// The system allocator, counting the bytes live on the heap.
struct Counting;

static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
            LIVE.fetch_add(new, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_mib() -> f64 {
    LIVE.load(std::sync::atomic::Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}
const GIB: u64 = 1 << 30;

fn proc_status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn gpu_node(i: usize) -> GpuNode {
    let name = format!("gpu-{i:05}");
    let mut g = GpuNode::new(
        &name,
        GpuNodeSpec {
            node_name: name.clone(),
            ttl_seconds: 3600,
            taints: Vec::new(),
        },
    );
    g.status = Some(GpuNodeStatus {
        gpus: (0..8)
            .map(|i| GpuStatus {
                index: i,
                product: "NVIDIA H100 80GB HBM3".into(),
                total_bytes: 80 * GIB,
                free_bytes: 79 * GIB,
                used_bytes: GIB,
                healthy: true,
                ..Default::default()
            })
            .collect(),
        gpu_count: 8,
        product: Some("NVIDIA H100 80GB HBM3".into()),
        probe_time: Some(Time(Timestamp::now())),
        ..Default::default()
    });
    g
}

/// A job that fits an H100 as written.
const FITS: &str = "
model: {preset: llama-3.1-8b}
training: {mode: lora, lora: {rank: 16}, microBatchSize: 1, sequenceLength: 2048,
           precision: bf16-mixed, gradientCheckpointing: full}
template:
  spec:
    containers: [{name: trainer, image: ghcr.io/example/trainer:1.0}]
";

/// A job that fits an H100 only after a change its fit policy allows (the
/// shrunk job of `examples/admission/create-fits-after-change.json`).
const SHRINK: &str = "
model: {preset: llama-3.1-8b}
training: {mode: lora, lora: {rank: 16}, microBatchSize: 16, globalBatchSize: 32,
           sequenceLength: 4096, precision: bf16, gradientCheckpointing: none, attention: sdpa}
fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}
template:
  spec:
    containers: [{name: trainer, image: ghcr.io/example/trainer:1.0}]
";

fn training_job(i: usize, spec: &str) -> TrainingJob {
    let spec = serde_saphyr::from_str(spec).expect("bench spec");
    let mut tj = TrainingJob::new(&format!("job-{i:05}"), spec);
    tj.metadata.namespace = Some("bench".into());
    tj
}

/// The child: an API server until stdin closes.
fn serve() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let server = apiserver::ApiServer::start().await;
        println!("{}", server.url);
        std::io::stdout().flush().expect("stdout");
        // Blocks until the parent closes our stdin (or exits).
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        })
        .await;
        drop(server);
    });
}

async fn run(jobs: usize, kind: &str, spec: &str) {
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .env(ROLE, "apiserver")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the API server process");
    let mut url = String::new();
    BufReader::new(child.stdout.take().expect("child stdout"))
        .read_line(&mut url)
        .expect("the server's URL");
    let config = kube::Config::new(url.trim().parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");

    eprintln!("server at {}", url.trim());
    let nodes = jobs.div_ceil(8);
    let gn: Api<GpuNode> = Api::all(client.clone());
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), "bench");
    let setup = Instant::now();
    futures::stream::iter(0..nodes)
        .for_each_concurrent(32, |i| {
            let gn = gn.clone();
            async move {
                let node = gpu_node(i);
                gn.create(&PostParams::default(), &node)
                    .await
                    .expect("create GpuNode");
                // A create keeps no status (it is a subresource): the agent's write.
                let status = serde_json::json!({ "status": node.status });
                gn.patch_status(
                    &node.metadata.name.clone().unwrap_or_default(),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await
                .expect("GpuNode status");
            }
        })
        .await;
    futures::stream::iter(0..jobs)
        .for_each_concurrent(32, |i| {
            let tjs = tjs.clone();
            async move {
                tjs.create(&PostParams::default(), &training_job(i, spec))
                    .await
                    .expect("create TrainingJob");
            }
        })
        .await;
    let setup = setup.elapsed();
    eprintln!("set up in {setup:?}");
    let rss_before = proc_status_kib("VmRSS:").unwrap_or(0);
    let live_before = live_mib();

    let (source, driver) = reflect::start(client.clone());
    let driver = tokio::spawn(driver);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let lease = LeaseConfig {
        lease_duration: Duration::from_secs(15),
        ..LeaseConfig::new("default", "vramguard-operator", "bench")
    };
    let start = Instant::now();
    let op = tokio::spawn(operator::run(
        client.clone(),
        Arc::new(source),
        Config::default(),
        lease,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let job_api: Api<Job> = Api::namespaced(client.clone(), "bench");
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut peak = 0;
    let elapsed = loop {
        let n = job_api
            .list_metadata(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        peak = peak.max(proc_status_kib("VmRSS:").unwrap_or(0));
        eprintln!("{n} jobs");
        if n >= jobs {
            break start.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "only {n} of {jobs} placed in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rss_done = proc_status_kib("VmRSS:").unwrap_or(0);
    // Resident once the burst is over (the operator gives freed memory back
    // every few seconds after reconciles ran).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let rss = proc_status_kib("VmRSS:").unwrap_or(0);
    let hwm = proc_status_kib("VmHWM:").unwrap_or(0);
    let live = live_mib();
    println!(
        "operator/{jobs} jobs that {kind} on {} GPUs: all placed in {:.2} s = {:.0} jobs/s; controller RSS {:.1} MiB settled, {:.1} MiB when the last was placed (peak {:.1} MiB, {:.1} MiB before it started); live heap {:.1} MiB ({:.1} MiB before); set-up {:.1} s",
        nodes * 8,
        elapsed.as_secs_f64(),
        jobs as f64 / elapsed.as_secs_f64(),
        rss as f64 / 1024.0,
        rss_done as f64 / 1024.0,
        hwm.max(peak) as f64 / 1024.0,
        rss_before as f64 / 1024.0,
        live,
        live_before,
        setup.as_secs_f64(),
    );
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), op).await;
    driver.abort();
    drop(child.stdin.take());
    let _ = child.wait();
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("apiserver") {
        serve();
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: then
    // only a small run, as a smoke test.
    let benching = std::env::args().any(|a| a == "--bench");
    let sizes = std::env::var("VRAMGUARD_BENCH_JOBS").unwrap_or_else(|_| {
        if benching {
            "1000,10000".into()
        } else {
            "20".into()
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let kinds = std::env::var("VRAMGUARD_BENCH_KINDS").unwrap_or_else(|_| "fits,shrink".into());
    for n in sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
    {
        // A fresh process image per size would be cleaner; the peak of the
        // smaller run is below the larger one's, so order keeps VmHWM honest.
        for kind in kinds.split(',').map(str::trim) {
            match kind {
                "fits" => rt.block_on(run(n, "fit as written", FITS)),
                "shrink" => rt.block_on(run(n, "need a shrink", SHRINK)),
                other => panic!("VRAMGUARD_BENCH_KINDS: unknown kind {other:?} (fits, shrink)"),
            }
        }
    }
}
