//! The node agent across its parts: the real NVML backend against a stub
//! libnvidia-ml built here from `tests/support/nvml_stub.c`, the simulated
//! backend's fragmentation, missing and stale data and MIG, the published data
//! through placement, the publishing loop against an in-process API server
//! (a minimal fake, and the in-memory one in `src/apiserver` over HTTP), and
//! `vramguard agent --once` through the real binary.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::routing::{get, patch};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use support::apiserver::ApiServer;
use vramguard::agent::Agent;
use vramguard::agent::check::{CheckRequest, check};
use vramguard::agent::gpu::{Gpu, GpuError, MigMode, SearchLimits};
use vramguard::agent::nvidia::Nvidia;
use vramguard::agent::nvml::NvmlGpu;
use vramguard::agent::probe::{Assignments, ProbeOptions, Prober};
use vramguard::agent::publish::{self, FIELD_MANAGER, PublishConfig};
use vramguard::agent::simulated::Simulated;
use vramguard::api::{GpuNode, GpuNodeSpec, GpuNodeStatus};
use vramguard::plan::{self, Binding, GpuView, Need, PlaceOutcome, Request};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

// ---------------------------------------------------------------------------
// The NVML stub
// ---------------------------------------------------------------------------

/// A C compiler, if the machine has one.
fn c_compiler() -> Option<String> {
    let candidates = std::env::var("CC")
        .ok()
        .into_iter()
        .chain(["cc", "gcc", "clang"].map(String::from));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Build `libnvidia-ml.so.1` from the stub with `defines`, in a directory of
/// its own (`tag` keeps concurrent tests apart). `None` only without a C compiler.
fn stub(tag: &str, defines: &[&str]) -> Option<PathBuf> {
    let Some(cc) = c_compiler() else {
        eprintln!("SKIPPED: no C compiler (cc, gcc, clang or $CC) to build the NVML stub");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("vramguard-nvml-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lib = dir.join("libnvidia-ml.so.1");
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(repo("tests/support/nvml_stub.c"))
        .args(defines)
        .output()
        .expect("running the C compiler");
    assert!(
        out.status.success(),
        "{cc} failed on the NVML stub: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(lib)
}

#[test]
fn nvml_backend_reads_the_stub() {
    let Some(lib) = stub("full", &[]) else { return };
    let nvml = NvmlGpu::load(Some(&lib)).expect("the stub loads");
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(
        nvml.driver_version().unwrap().as_deref(),
        Some("570.124.06")
    );
    assert_eq!(nvml.cuda_version().unwrap().as_deref(), Some("12.8"));

    let d = nvml.device(0).unwrap();
    assert_eq!(d.product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(
        d.uuid.as_deref(),
        Some("GPU-00000000-1111-2222-3333-000000000000")
    );
    assert_eq!(d.memory.total_bytes, 81_559 * MIB);
    assert_eq!(d.memory.reserved_bytes, Some(453 * MIB));
    assert_eq!(d.memory.used_bytes, GIB);
    assert_eq!(d.memory.free_bytes, 81_559 * MIB - 453 * MIB - GIB);
    let procs = d.processes.as_ref().expect("listed");
    assert_eq!(procs.len(), 1);
    assert_eq!((procs[0].pid, procs[0].used_bytes), (4242, Some(GIB)));
    // What the stub lacks is missing, not fatal.
    assert_eq!(d.architecture, None);
    assert_eq!(d.mig_mode, MigMode::Unsupported);
    assert!(
        d.missing
            .iter()
            .any(|m| m.contains("architecture") && m.contains("nvmlDeviceGetArchitecture")),
        "{:?}",
        d.missing
    );
    assert_eq!(nvml.device(1).unwrap().processes, Some(vec![]));
    assert!(matches!(
        nvml.device(2),
        Err(GpuError::NoSuchDevice { index: 2, count: 2 })
    ));
    // NVML cannot allocate.
    assert!(matches!(
        nvml.context_overhead_bytes(0),
        Err(GpuError::Unsupported { .. })
    ));
}

#[test]
fn nvml_backend_probe_publishes_what_it_read() {
    let Some(lib) = stub("probe", &[]) else {
        return;
    };
    let gpu = Nvidia::load(Some(&lib), false).expect("the stub loads");
    assert_eq!(gpu.backend(), "nvml");
    let prober = Prober::new(Arc::new(gpu), ProbeOptions::default());
    let s = prober
        .probe(&Assignments::default(), Timestamp::now())
        .unwrap();
    assert_eq!(s.gpu_count, 2);
    assert_eq!(s.product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(s.cuda_version.as_deref(), Some("12.8"));
    assert!(s.gpus.iter().all(|g| g.healthy));
    assert_eq!(s.gpus[0].processes[0].pid, 4242);
    assert_eq!(s.gpus[1].reserved_bytes, 453 * MIB);
    // Without CUDA nothing is measured; consumers fall back to free memory.
    assert_eq!(s.gpus[1].largest_free_block_bytes, None);
    assert_eq!(s.gpus[1].context_overhead_bytes, None);
}

#[test]
fn nvml_falls_back_to_the_v1_memory_query() {
    let Some(lib) = stub("v1", &["-DNO_MEMORY_V2"]) else {
        return;
    };
    let nvml = NvmlGpu::load(Some(&lib)).unwrap();
    let m = nvml.device(1).unwrap().memory;
    assert_eq!(m.reserved_bytes, None);
    assert_eq!(m.used_bytes, 453 * MIB, "v1 counts the reserve as used");
    assert_eq!(m.free_bytes + m.used_bytes, m.total_bytes);
}

#[test]
fn nvml_missing_uuid_is_optional_data() {
    let Some(lib) = stub("nouuid", &["-DNO_UUID"]) else {
        return;
    };
    let nvml = NvmlGpu::load(Some(&lib)).unwrap();
    let d = nvml.device(0).unwrap();
    assert_eq!(d.uuid, None);
    assert!(
        d.missing.iter().any(|m| m.contains("nvmlDeviceGetUUID")),
        "{:?}",
        d.missing
    );
}

#[test]
fn nvml_missing_memory_symbol_is_an_error_not_a_panic() {
    let Some(lib) = stub("nomem", &["-DNO_MEMORY"]) else {
        return;
    };
    let nvml = NvmlGpu::load(Some(&lib)).unwrap();
    match nvml.device(0) {
        Err(GpuError::MissingSymbol { symbol, library }) => {
            assert_eq!(symbol, "nvmlDeviceGetMemoryInfo");
            assert_eq!(library, lib.display().to_string());
        }
        other => panic!("{other:?}"),
    }
    // The probe lists both GPUs, unhealthy, with the reason.
    let prober = Prober::new(Arc::new(nvml), ProbeOptions::default());
    let s = prober
        .probe(&Assignments::default(), Timestamp::now())
        .unwrap();
    assert_eq!(s.gpus.len(), 2);
    let msg = s.gpus[0].health_message.as_deref().unwrap();
    assert!(
        !s.gpus[0].healthy && msg.contains("nvmlDeviceGetMemoryInfo"),
        "{msg}"
    );
}

#[test]
fn nvml_missing_count_symbol_fails_the_probe() {
    let Some(lib) = stub("nocount", &["-DNO_COUNT"]) else {
        return;
    };
    let nvml = NvmlGpu::load(Some(&lib)).unwrap();
    let e = nvml.device_count().unwrap_err();
    assert!(
        matches!(&e, GpuError::MissingSymbol { symbol, .. } if symbol == "nvmlDeviceGetCount_v2"),
        "{e:?}"
    );
    assert!(e.to_string().contains("older than this call needs"), "{e}");
    let prober = Prober::new(Arc::new(nvml), ProbeOptions::default());
    let e = prober
        .probe(&Assignments::default(), Timestamp::now())
        .unwrap_err();
    assert!(e.to_string().starts_with("counting GPUs: "), "{e}");
}

#[test]
fn nvml_error_code_marks_one_gpu() {
    let Some(lib) = stub("lost", &["-DLOST_GPU=1"]) else {
        return;
    };
    let nvml = NvmlGpu::load(Some(&lib)).unwrap();
    let e = nvml.device(1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "nvmlDeviceGetMemoryInfo_v2 (GPU 1): the GPU has fallen off the bus or is otherwise inaccessible"
    );
    let prober = Prober::new(Arc::new(nvml), ProbeOptions::default());
    let s = prober
        .probe(&Assignments::default(), Timestamp::now())
        .unwrap();
    assert!(s.gpus[0].healthy);
    assert!(!s.gpus[1].healthy);
    assert_eq!(s.gpus[1].free_bytes, 0);
}

#[test]
fn nvml_init_failure_says_what_is_wrong() {
    let Some(lib) = stub("noinit", &["-DINIT_FAILS"]) else {
        return;
    };
    let e = NvmlGpu::load(Some(&lib)).unwrap_err();
    assert!(e.to_string().contains("kernel driver is not loaded"), "{e}");
}

#[test]
fn nvml_without_the_library_names_it() {
    let missing = std::env::temp_dir().join("vramguard-no-such-dir/libnvidia-ml.so.1");
    match NvmlGpu::load(Some(&missing)) {
        Err(GpuError::LibraryMissing { library, .. }) => {
            assert_eq!(library, missing.display().to_string())
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------
// The simulated backend
// ---------------------------------------------------------------------------

fn sim(yaml: &str) -> Simulated {
    Simulated::from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn probe_sim(s: Simulated) -> GpuNodeStatus {
    let prober = Prober::new(
        Arc::new(s),
        ProbeOptions {
            probe_busy_gpus: true,
            ..ProbeOptions::default()
        },
    );
    prober
        .probe(&Assignments::default(), Timestamp::now())
        .unwrap()
}

/// Histories where the GPU has more free memory than a job needs in total,
/// but no block as large as its largest tensor.
#[test]
fn fragmentation_free_memory_suffices_but_the_largest_block_does_not() {
    struct Case {
        name: &'static str,
        history: &'static str,
        need: u64,
        block: u64,
    }
    let cases = [
        Case {
            name: "1 GiB blocks, every other freed",
            history: "[{fill: 1GiB}, {freeEvery: 2}]",
            need: 30 * GIB,
            block: 2 * GIB,
        },
        Case {
            name: "2 GiB blocks, every third freed",
            // The last block is freed too and joins the tail: a 3 GiB hole.
            history: "[{fill: 2GiB}, {freeEvery: 3}]",
            need: 20 * GIB,
            block: 4 * GIB,
        },
        Case {
            name: "small blocks, the last ones freed, then every other",
            history: "[{fill: 256MiB}, {freeLast: 8}, {freeEvery: 2}]",
            need: 16 * GIB,
            block: 4 * GIB,
        },
    ];
    for c in cases {
        let yaml = format!(
            "gpus: [{{product: h100-80gb, processes: [{{pid: 7, allocations: {}}}]}}]",
            c.history
        );
        let s = sim(&yaml);
        let model_largest = s.allocator(0).unwrap().largest_hole();
        let status = probe_sim(s);
        let g = &status.gpus[0];
        let block = g.largest_free_block_bytes.expect("measured");
        assert!(g.free_bytes >= c.need, "{}: free {}", c.name, g.free_bytes);
        assert!(block < c.block, "{}: block {block}", c.name);
        assert!(block <= model_largest, "{}", c.name);
        let v = plan::fit(
            c.need,
            c.block,
            0.0,
            GpuView {
                total_bytes: g.total_bytes,
                free_bytes: g.free_bytes,
                largest_block_bytes: block,
            },
        );
        assert!(!v.fits, "{}", c.name);
        assert_eq!(v.binding, Binding::LargestBlock, "{}", c.name);
        let answer = check(
            &status,
            &CheckRequest {
                gpus: 1,
                bytes: c.need,
                block_bytes: c.block,
                safety_margin: 0.0,
            },
        );
        assert!(!answer.fits, "{}: {}", c.name, answer.message);
        let why = answer.devices[0].reason.as_deref().unwrap();
        assert!(why.starts_with("largest free block"), "{}: {why}", c.name);
    }
}

/// The search finds the model's true largest block (after the new process's
/// context) within one 2 MiB granule, in few steps.
#[test]
fn largest_block_search_is_exact_within_a_granule() {
    for history in [
        "[{fill: 1GiB}, {freeEvery: 2}]",
        "[{alloc: 3GiB, count: 5}, {alloc: 100MiB, count: 7}, {freeEvery: 2}]",
        "[{fill: 777MiB}, {freeEvery: 4}]",
    ] {
        let s = sim(&format!(
            "gpus: [{{product: h100-80gb, contextOverheadBytes: 500MiB, processes: [{{pid: 1, allocations: {history}}}]}}]"
        ));
        let mut model = s.allocator(0).unwrap().clone();
        model.alloc(500 * MIB, u32::MAX).expect("context fits");
        let truth = model.largest_hole();
        let p = s
            .largest_allocatable_block(0, u64::MAX, SearchLimits::within(Duration::from_secs(5)))
            .unwrap();
        assert!(p.exact, "{history}: {p:?}");
        assert!(
            p.bytes <= truth && truth < p.bytes + 2 * MIB,
            "{history}: {p:?} vs {truth}"
        );
        // One try of the maximum, the gallop down from it, 16 halvings.
        assert!(
            p.steps <= 17 + vramguard::agent::gpu::GALLOP_STEPS,
            "{history}: {p:?}"
        );
    }
}

#[test]
fn missing_data_is_left_out_not_invented() {
    let s = sim(
        "gpus:\n- {product: l40s, unreadable: [uuid, architecture, processes, reserved, health, cuda], processes: [{pid: 3, usedBytes: 4GiB}]}\n- {product: l40s, error: 'NVML: GPU is lost'}",
    );
    let status = probe_sim(s);
    let g = &status.gpus[0];
    assert!(g.healthy);
    assert_eq!(g.uuid, "");
    assert_eq!(g.architecture, None);
    assert!(g.processes.is_empty());
    assert_eq!(g.reserved_bytes, 0);
    assert_eq!(g.largest_free_block_bytes, None, "no libcuda: not measured");
    assert_eq!(g.context_overhead_bytes, None);
    assert!(
        g.used_bytes >= 4 * GIB + 640 * MIB,
        "v1: the reserve counts as used"
    );
    let lost = &status.gpus[1];
    assert!(!lost.healthy);
    assert_eq!(lost.product, "unknown");
    assert!(
        lost.health_message
            .as_deref()
            .unwrap()
            .contains("GPU is lost")
    );
    // A check never counts an unreadable GPU.
    let a = check(
        &status,
        &CheckRequest {
            gpus: 2,
            bytes: GIB,
            block_bytes: 0,
            safety_margin: 0.0,
        },
    );
    assert!(!a.fits);
    assert_eq!(a.gpus_fitting, 1);
}

#[test]
fn unhealthy_gpus_from_health_data() {
    let s = sim(
        "gpus:\n- {product: h100-80gb, health: {xids: [13, 79]}}\n- {product: h100-80gb, health: {eccUncorrected: 3}}\n- {product: h100-80gb, health: {xids: [13]}}",
    );
    let status = probe_sim(s);
    assert!(!status.gpus[0].healthy);
    assert_eq!(status.gpus[0].health_message.as_deref(), Some("XID 79"));
    assert!(!status.gpus[1].healthy);
    assert!(status.gpus[2].healthy, "XID 13 is an application fault");
    assert_eq!(
        status.gpus[0].largest_free_block_bytes, None,
        "not allocated on"
    );
}

#[test]
fn a_memory_check_that_reads_back_wrong_marks_the_gpu() {
    let s = sim("gpus:\n- {product: l4, health: {badMemory: true}}\n- {product: l4}");
    let prober = Prober::new(
        Arc::new(s),
        ProbeOptions {
            verify_bytes: 64 * MIB,
            ..ProbeOptions::default()
        },
    );
    let status = prober
        .probe(&Assignments::default(), Timestamp::now())
        .unwrap();
    let msg = status.gpus[0].health_message.as_deref().unwrap_or("");
    assert!(
        !status.gpus[0].healthy && msg.starts_with("memory check: "),
        "{msg}"
    );
    assert!(status.gpus[1].healthy);
}

#[test]
fn mig_node() {
    let s = sim(&std::fs::read_to_string(repo("examples/gpus.yaml")).unwrap());
    let d = s.device(3).unwrap();
    assert_eq!(d.mig_mode, MigMode::Enabled);
    let status = probe_sim(s);
    let g = &status.gpus[3];
    let profiles: Vec<&str> = g.mig_devices.iter().map(|m| m.profile.as_str()).collect();
    assert_eq!(profiles, ["3g.40gb", "2g.20gb", "1g.10gb"]);
    assert_eq!(g.mig_devices[0].total_bytes, 40_192 * MIB);
    assert_eq!(g.mig_devices[1].free_bytes, 19_968 * MIB - 10 * GIB);
    assert_eq!(
        g.largest_free_block_bytes, None,
        "MIG GPUs are not probed whole"
    );
    // A 15 GiB single-GPU job fits only the 3g slice of GPU 3, or the idle GPUs.
    let a = check(
        &status,
        &CheckRequest {
            gpus: 1,
            bytes: 15 * GIB,
            block_bytes: 0,
            safety_margin: 0.0,
        },
    );
    let mig_fits: Vec<_> = a
        .devices
        .iter()
        .filter(|d| d.mig_index.is_some() && d.fits)
        .map(|d| d.mig_profile.clone().unwrap_or_default())
        .collect();
    assert_eq!(mig_fits, ["3g.40gb"]);
}

fn gpu_node(name: &str, status: GpuNodeStatus) -> GpuNode {
    let mut n = GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.into(),
            ttl_seconds: 120,
            taints: vec![],
        },
    );
    n.status = Some(status);
    n
}

/// Published data drives placement: fresh data places the job on a GPU whose
/// largest block holds its largest tensor; data older than the TTL is not trusted.
#[test]
fn published_probe_through_placement_fresh_and_stale() {
    let yaml = std::fs::read_to_string(repo("examples/gpus.yaml")).unwrap();
    let now = Timestamp::now();
    let fresh = probe_sim(sim(&yaml));
    let tolerations: Vec<String> = vec![];
    let need = Need {
        per_gpu_bytes: 20 * GIB,
        largest_tensor_bytes: 4 * GIB,
        allocator: None,
    };
    let request = Request {
        gpus: 1,
        gpus_per_node: 1,
        safety_margin: 0.0,
        tolerations: &tolerations,
        now,
    };
    let nodes = [gpu_node("sim", fresh.clone())];
    match plan::place_with(&request, &nodes, &[], &mut |_| Some(need)) {
        PlaceOutcome::Placed(a) => {
            let gpu = a.nodes[0].gpus[0].index;
            assert_ne!(gpu, 2, "GPU 2 has the memory but not the block");
        }
        other => panic!("{other:?}"),
    }
    // Only GPU 2 left: free memory is there, the block is not.
    let mut only_fragmented = fresh.clone();
    only_fragmented.gpus.retain(|g| g.index == 2);
    let nodes = [gpu_node("sim", only_fragmented)];
    assert!(
        !matches!(
            plan::place_with(&request, &nodes, &[], &mut |_| Some(need)),
            PlaceOutcome::Placed(_)
        ),
        "a fragmented GPU must not take a 4 GiB tensor"
    );
    // The same data, probed 10 minutes ago with a 2-minute TTL.
    let mut stale = fresh;
    stale.probe_time = Some(Time(Timestamp::from_second(now.as_second() - 600).unwrap()));
    let nodes = [gpu_node("sim", stale)];
    assert!(
        !matches!(
            plan::place_with(&request, &nodes, &[], &mut |_| Some(need)),
            PlaceOutcome::Placed(_)
        ),
        "stale data is not trusted"
    );
}

#[test]
fn sim_file_errors_name_the_field() {
    for (yaml, want) in [
        (
            "gpus: [{product: a100-40gb, processes: [{pid: 1, allocations: [{alloc: 50GiB}]}]}]",
            "gpus[0].processes[0].allocations[0]: 50.00 GiB does not fit",
        ),
        (
            "gpus: [{product: a100-40gb, totalBytes: 12 parsecs}]",
            "gpus[0].totalBytes",
        ),
        (
            "gpus: [{product: l4, mig: [{profile: 9g.99gb}]}]",
            "gpus[0].mig[0].totalBytes",
        ),
        ("gpus: [{product: l4, count: 0}]", "gpus[0].count"),
        ("nodes: []", "nodes"),
    ] {
        let e = Simulated::from_yaml(yaml).unwrap_err().to_string();
        assert!(e.contains(want), "{yaml}\n{e}");
    }
}

// ---------------------------------------------------------------------------
// Publishing against an in-process API server
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Recorded {
    method: Method,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

#[derive(Clone, Default)]
struct FakeApi {
    requests: Arc<Mutex<Vec<Recorded>>>,
    object: Arc<Mutex<Value>>,
}

impl FakeApi {
    fn record(
        &self,
        method: Method,
        path: String,
        query: Option<String>,
        headers: &HeaderMap,
        body: &Bytes,
    ) {
        let body = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.requests.lock().unwrap().push(Recorded {
            method,
            path,
            query: query.unwrap_or_default(),
            content_type: headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            body,
        });
    }
}

/// Apply a patch body onto the stored object: the top-level fields it names.
fn merge(object: &mut Value, patch: &Value) {
    if !object.is_object() {
        *object = json!({});
    }
    if let (Some(o), Some(p)) = (object.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            o.insert(k.clone(), v.clone());
        }
    }
}

fn fake_api_server(api: FakeApi) -> Router {
    async fn apply(
        State(api): State<FakeApi>,
        UrlPath(name): UrlPath<String>,
        RawQuery(q): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> axum::Json<Value> {
        api.record(
            Method::PATCH,
            format!("/apis/vramguard.io/v1alpha1/gpunodes/{name}"),
            q,
            &headers,
            &body,
        );
        let mut o = api.object.lock().unwrap();
        let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        merge(
            &mut o,
            &json!({"spec": patch["spec"].clone(), "metadata": {"name": name}, "apiVersion": "vramguard.io/v1alpha1", "kind": "GpuNode"}),
        );
        axum::Json(o.clone())
    }
    async fn apply_status(
        State(api): State<FakeApi>,
        UrlPath(name): UrlPath<String>,
        RawQuery(q): RawQuery,
        headers: HeaderMap,
        body: Bytes,
    ) -> axum::Json<Value> {
        api.record(
            Method::PATCH,
            format!("/apis/vramguard.io/v1alpha1/gpunodes/{name}/status"),
            q,
            &headers,
            &body,
        );
        let mut o = api.object.lock().unwrap();
        let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        merge(&mut o, &json!({"status": patch["status"].clone()}));
        axum::Json(o.clone())
    }
    async fn node(UrlPath(name): UrlPath<String>) -> axum::Json<Value> {
        axum::Json(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
        }))
    }
    Router::new()
        .route("/apis/vramguard.io/v1alpha1/gpunodes/{name}", patch(apply))
        .route(
            "/apis/vramguard.io/v1alpha1/gpunodes/{name}/status",
            patch(apply_status),
        )
        .route("/api/v1/nodes/{name}", get(node))
        .with_state(api)
}

// The API is an in-process router: the intervals run on paused time.
#[tokio::test(start_paused = true)]
async fn publishing_loop_applies_spec_and_status_every_interval() {
    let api = FakeApi::default();
    let client = kube::Client::new(fake_api_server(api.clone()), "default");
    let s = sim(&std::fs::read_to_string(repo("examples/gpus.yaml")).unwrap());
    let options = ProbeOptions {
        probe_busy_gpus: true,
        ..ProbeOptions::default()
    };
    let agent = Agent::new(Arc::new(s), options, None);
    let config = PublishConfig {
        node_name: "gpu-node-7".into(),
        interval: Duration::from_millis(50),
        ttl_seconds: 90,
        copy_taints: true,
        heartbeat: Duration::ZERO,
    };
    let status_patches = || {
        api.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path.ends_with("/status"))
            .count()
    };
    let wait = async {
        while status_patches() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        () = publish::run(&agent, client, config) => panic!("the loop ended"),
        r = tokio::time::timeout(Duration::from_secs(20), wait) => r.expect("three rounds published"),
    }
    let requests = api.requests.lock().unwrap().clone();
    let spec = requests
        .iter()
        .find(|r| r.path == "/apis/vramguard.io/v1alpha1/gpunodes/gpu-node-7")
        .expect("spec applied");
    assert_eq!(spec.method, Method::PATCH);
    assert_eq!(spec.content_type, "application/apply-patch+yaml");
    assert!(
        spec.query
            .contains(&format!("fieldManager={FIELD_MANAGER}")),
        "{}",
        spec.query
    );
    assert!(spec.query.contains("force=true"), "{}", spec.query);
    assert_eq!(spec.body["kind"], "GpuNode");
    assert_eq!(spec.body["spec"]["nodeName"], "gpu-node-7");
    assert_eq!(spec.body["spec"]["ttlSeconds"], 90);
    assert_eq!(spec.body["spec"]["taints"][0]["key"], "nvidia.com/gpu");
    let statuses: Vec<&Recorded> = requests
        .iter()
        .filter(|r| r.path.ends_with("/status"))
        .collect();
    for s in &statuses {
        assert_eq!(s.content_type, "application/apply-patch+yaml");
        assert!(s.query.contains("force=true"));
        assert_eq!(s.body["apiVersion"], "vramguard.io/v1alpha1");
        assert_eq!(s.body["status"]["gpuCount"], 4);
        assert!(s.body["status"]["probeTime"].is_string());
        assert_eq!(s.body["status"]["agentVersion"], env!("CARGO_PKG_VERSION"));
    }
    // What was stored reads back as a GpuNode the webhook can use.
    let stored: GpuNode = serde_json::from_value(api.object.lock().unwrap().clone()).unwrap();
    assert_eq!(stored.spec.node_name, "gpu-node-7");
    let status = stored.status.expect("status");
    assert_eq!(status.gpus.len(), 4);
    assert!(status.gpus[2].largest_free_block_bytes.unwrap() <= GIB);
}

// ---------------------------------------------------------------------------
// Publishing against the in-memory API server, over HTTP
// ---------------------------------------------------------------------------

/// Run the agent's real publish loop until `done` holds (polled every 10 ms),
/// then stop it; fails after 20 s.
async fn publish_until(
    agent: &Agent,
    client: kube::Client,
    config: PublishConfig,
    done: impl Fn() -> bool,
) {
    let wait = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        () = publish::run(agent, client, config) => panic!("the loop ended"),
        r = tokio::time::timeout(Duration::from_secs(20), wait) => r.expect("published in time"),
    }
}

/// Wait until no request has reached the server for one poll: a write the
/// stopped loop had already sent lands before anything is compared.
async fn settle(server: &ApiServer) {
    let quiet = async {
        loop {
            let n = server.requests().len();
            tokio::time::sleep(Duration::from_millis(20)).await;
            if server.requests().len() == n {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), quiet)
        .await
        .expect("the server went quiet");
}

fn resource_version(g: &GpuNode) -> u64 {
    g.metadata
        .resource_version
        .as_deref()
        .expect("resourceVersion")
        .parse()
        .expect("numeric resourceVersion")
}

fn probe_time(g: &GpuNode) -> Timestamp {
    g.status
        .as_ref()
        .and_then(|s| s.probe_time.as_ref())
        .expect("probeTime")
        .0
}

#[tokio::test]
async fn publishing_loop_over_http_creates_and_updates_its_own_gpu_node() {
    const GPU_NODES: &str = "/apis/vramguard.io/v1alpha1/gpunodes";
    let server = ApiServer::start().await;
    server.put(&Node {
        metadata: ObjectMeta {
            name: Some("gpu-node-a".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "nvidia.com/gpu".into(),
                value: Some("present".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    let example = std::fs::read_to_string(repo("examples/gpus.yaml")).unwrap();
    let options = ProbeOptions {
        probe_busy_gpus: true,
        ..ProbeOptions::default()
    };
    let config = |node: &str| PublishConfig {
        node_name: node.into(),
        interval: Duration::from_millis(50),
        ttl_seconds: 90,
        copy_taints: true,
        heartbeat: Duration::ZERO,
    };
    let get = |node: &str| server.get::<GpuNode>(None, node);

    // Agent A: the first interval creates its GpuNode and writes its status
    // (kept as `first`); a later interval of the same loop applies spec and
    // status again (two more writes, and only A writes).
    let agent_a = Agent::new(Arc::new(sim(&example)), options, None);
    let first: Mutex<Option<GpuNode>> = Mutex::new(None);
    publish_until(&agent_a, server.client(), config("gpu-node-a"), || {
        let Some(now) = get("gpu-node-a").filter(|g| g.status.is_some()) else {
            return false;
        };
        let mut first = first.lock().unwrap();
        let first = first.get_or_insert_with(|| now.clone());
        resource_version(&now) >= resource_version(first) + 2
    })
    .await;
    settle(&server).await;
    let first = first.into_inner().unwrap().expect("a status was published");
    let requests = server.requests();
    let writes: Vec<_> = requests
        .iter()
        .filter(|r| r.path.starts_with(GPU_NODES) && r.method != Method::GET)
        .collect();
    assert!(writes.len() >= 2, "{writes:?}");
    // Created by server-side apply: every write (no POST, no PUT) is a forced
    // apply as `vramguard-agent`, the first of the spec, then of the status.
    let a_spec = format!("{GPU_NODES}/gpu-node-a");
    let a_status = format!("{GPU_NODES}/gpu-node-a/status");
    assert_eq!(writes[0].path, a_spec);
    assert_eq!(writes[1].path, a_status);
    for w in &writes {
        assert!(w.path == a_spec || w.path == a_status, "{w:?}");
        assert_eq!(w.method, Method::PATCH, "{w:?}");
        assert_eq!(w.content_type, "application/apply-patch+yaml", "{w:?}");
        let query: Vec<&str> = w.query.split('&').collect();
        assert!(query.contains(&"fieldManager=vramguard-agent"), "{w:?}");
        assert!(query.contains(&"force=true"), "{w:?}");
    }
    assert_eq!(FIELD_MANAGER, "vramguard-agent");
    // What the server stored: the spec with the Node's taints, and the probe.
    assert_eq!(first.metadata.name.as_deref(), Some("gpu-node-a"));
    assert_eq!(first.metadata.generation, Some(1));
    assert_eq!(first.spec.node_name, "gpu-node-a");
    assert_eq!(first.spec.ttl_seconds, 90);
    assert_eq!(first.spec.taints.len(), 1);
    assert_eq!(first.spec.taints[0].key, "nvidia.com/gpu");
    assert_eq!(first.spec.taints[0].effect, "NoSchedule");
    let status = first.status.clone().unwrap();
    let expected = probe_sim(sim(&example));
    assert_eq!(status.gpu_count, 4);
    assert_eq!(status.gpus, expected.gpus, "the probed GPUs, as probed");
    assert!(status.gpus[2].largest_free_block_bytes.unwrap() <= GIB);
    assert_eq!(status.product.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
    assert_eq!(
        status.agent_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let (rv1, t1) = (resource_version(&first), probe_time(&first));

    // The later interval updated it.
    let second = get("gpu-node-a").unwrap();
    assert!(resource_version(&second) > rv1);
    assert!(probe_time(&second) >= t1, "probeTime went back");
    assert_eq!(
        second.metadata.uid, first.metadata.uid,
        "updated, not recreated"
    );
    assert_eq!(second.status.as_ref().unwrap().gpus, expected.gpus);
    let status_writes = server
        .requests()
        .iter()
        .filter(|r| r.method == Method::PATCH && r.path == a_status)
        .count();
    assert!(status_writes >= 2, "{status_writes} status writes");

    // Agent B, for another node (no Node object: no taints), leaves A's alone.
    let seen = server.requests().len();
    let agent_b = Agent::new(
        Arc::new(sim("gpus: [{product: h100-80gb, count: 2}]")),
        options,
        None,
    );
    let b_writes = || {
        server.requests()[seen..]
            .iter()
            .filter(|r| r.path == format!("{GPU_NODES}/gpu-node-b/status"))
            .count()
    };
    publish_until(&agent_b, server.client(), config("gpu-node-b"), || {
        b_writes() >= 2 && get("gpu-node-b").is_some_and(|g| g.status.is_some())
    })
    .await;
    settle(&server).await;
    let by_b = &server.requests()[seen..];
    assert!(
        by_b.iter()
            .filter(|r| r.path.starts_with(GPU_NODES))
            .all(|r| r.path.starts_with(&format!("{GPU_NODES}/gpu-node-b"))),
        "{by_b:?}"
    );
    assert!(
        by_b.iter().all(|r| !r.path.contains("gpu-node-a")),
        "{by_b:?}"
    );
    assert_eq!(
        serde_json::to_value(get("gpu-node-a").unwrap()).unwrap(),
        serde_json::to_value(&second).unwrap(),
        "A's object is untouched"
    );
    let b = get("gpu-node-b").unwrap();
    assert_eq!(b.spec.node_name, "gpu-node-b");
    assert!(b.spec.taints.is_empty());
    let b_status = b.status.unwrap();
    assert_eq!(b_status.gpu_count, 2);
    assert_eq!(b_status.product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    let names: Vec<String> = server
        .objects::<GpuNode>()
        .into_iter()
        .filter_map(|g| g.metadata.name)
        .collect();
    assert_eq!(names, ["gpu-node-a", "gpu-node-b"]);
}

/// An idle agent writes its status only at the heartbeat (refreshing
/// `probeTime` so the node never looks stale), and a change at the interval
/// that measured it: rounds every 30 s, TTL 120 s, the default heartbeat.
#[tokio::test]
async fn an_idle_agent_writes_only_its_heartbeats_and_a_change_at_once() {
    const STATUS: &str = "/apis/vramguard.io/v1alpha1/gpunodes/gpu-node-h/status";
    let server = ApiServer::start().await;
    let config = PublishConfig {
        node_name: "gpu-node-h".into(),
        interval: Duration::from_secs(30),
        ttl_seconds: 120,
        copy_taints: false,
        heartbeat: publish::default_heartbeat(120),
    };
    assert_eq!(config.heartbeat, Duration::from_secs(60));
    let example = std::fs::read_to_string(repo("examples/gpus.yaml")).unwrap();
    let probed = probe_sim(sim(&example));
    let t0 = Timestamp::from_second(1_800_000_000).unwrap();
    let at = |round: i64| Time(t0 + k8s_openapi::jiff::SignedDuration::from_secs(30 * round));
    let status_writes = || {
        server
            .requests()
            .iter()
            .filter(|r| r.method == Method::PATCH && r.path == STATUS)
            .count()
    };
    let mut publisher = publish::Publisher::default();
    let mut written_at = Vec::new();
    let mut status = probed.clone();
    for round in 0..=13 {
        status.probe_time = Some(at(round));
        if round == 11 {
            // A job starts on GPU 0: its free bytes drop.
            status.gpus[0].free_bytes -= 10 * GIB;
            status.gpus[0].used_bytes += 10 * GIB;
        }
        let before = status_writes();
        let wrote = publisher
            .publish(&server.client(), &config, &status)
            .await
            .expect("published");
        assert_eq!(
            wrote.is_some(),
            status_writes() == before + 1,
            "round {round}"
        );
        if wrote.is_some() {
            written_at.push(round);
        }
        // What consumers read is never older than the heartbeat: never stale.
        let stored = server.get::<GpuNode>(None, "gpu-node-h").expect("stored");
        let age = at(round).0.duration_since(probe_time(&stored));
        assert!(age.as_secs() < 60 + 30, "round {round}: {age:?}");
        assert!(age.as_secs() < i64::try_from(config.ttl_seconds).unwrap());
        let stored_status = stored.status.expect("status");
        assert_eq!(
            stored_status.gpus, status.gpus,
            "round {round}: the latest measurement"
        );
    }
    // Idle: every second round (60 s); the change at round 11 at once, and
    // the heartbeat counted from it.
    assert_eq!(written_at, [0, 2, 4, 6, 8, 10, 11, 13]);
    assert_eq!(status_writes(), written_at.len());
}

// ---------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------

fn vramguard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vramguard"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("running vramguard")
}

#[test]
fn agent_once_json_with_the_example_simulation() {
    let out = vramguard(&[
        "agent",
        "--once",
        "-o",
        "json",
        "--simulate",
        "examples/gpus.yaml",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let status: GpuNodeStatus = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(status.gpu_count, 4);
    assert_eq!(status.product.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
    assert_eq!(status.driver_version.as_deref(), Some("570.124.06"));
    assert_eq!(
        status.agent_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(status.probe_time.is_some());
    let idle = &status.gpus[0];
    assert_eq!(
        idle.largest_free_block_bytes,
        Some(idle.free_bytes - idle.context_overhead_bytes.unwrap())
    );
    assert_eq!(status.gpus[1].processes[0].pid, 4242);
    let frag = &status.gpus[2];
    assert!(frag.free_bytes > 38 * GIB, "{}", frag.free_bytes);
    assert!(frag.largest_free_block_bytes.unwrap() <= GIB);
    assert_eq!(status.gpus[3].mig_devices.len(), 3);
    // The published JSON uses the CRD's names.
    let raw: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(raw["gpus"][2]["largestFreeBlockBytes"].is_u64());
    assert!(raw["gpus"][0]["contextOverheadBytes"].is_u64());

    let table = vramguard(&["agent", "--once", "--simulate", "examples/gpus.yaml"]);
    assert!(table.status.success());
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(
        t.contains("LARGEST BLOCK") && t.contains("MIG 0 3g.40gb"),
        "{t}"
    );
}

#[test]
fn agent_once_with_the_nvml_stub() {
    let Some(lib) = stub("binary", &[]) else {
        return;
    };
    let lib = lib.display().to_string();
    let out = vramguard(&[
        "agent",
        "--once",
        "-o",
        "json",
        "--nvml-library",
        &lib,
        "--no-cuda",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: GpuNodeStatus = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status.gpu_count, 2);
    assert_eq!(status.gpus[0].product, "NVIDIA H100 80GB HBM3");
}

#[test]
fn agent_without_nvidia_libraries_says_what_is_missing() {
    let out = vramguard(&[
        "agent",
        "--once",
        "--nvml-library",
        "/nonexistent/libnvidia-ml.so.1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not load /nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(stderr.contains("--simulate"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = vramguard(&["agent", "--once", "--simulate", "examples/nope.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("examples/nope.yaml"));

    let out = vramguard(&["agent", "--simulate", "examples/gpus.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NODE_NAME"));
}

// ---------------------------------------------------------------------------
// On a GPU (skipped in CI)
// ---------------------------------------------------------------------------

/// NVML's numbers agree with CUDA's; the context overhead is measured; after
/// fragmenting the device (1 GiB blocks until full, every other one freed) the
/// largest-block probe finds the true largest block within 2 MiB — its size
/// allocates from a fresh context, 2 MiB more does not — and leaves nothing
/// allocated; the kernels verify memory. Prints the figures for the note.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn on_a_gpu() {
    use cudarc::driver::{result, sys};

    /// Does `bytes` allocate from a context of its own (as a new process would)?
    fn allocates_fresh(bytes: u64) -> bool {
        let dev = result::device::get(0).unwrap();
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        unsafe { sys::cuCtxCreate_v2(&mut ctx, 0, dev) }
            .result()
            .unwrap();
        let ok = match unsafe { result::malloc_sync(bytes as usize) } {
            Ok(p) => {
                unsafe { result::free_sync(p) }.unwrap();
                true
            }
            Err(_) => false,
        };
        let _ = unsafe { sys::cuCtxDestroy_v2(ctx) };
        ok
    }

    let gpu = Nvidia::load(None, true).expect("NVML and CUDA on a GPU machine");
    assert_eq!(gpu.backend(), "nvml+cuda");
    let before = gpu.device(0).unwrap().memory;
    let overhead = gpu.context_overhead_bytes(0).unwrap();
    eprintln!("context overhead: {} MiB", overhead / MIB);
    assert!(overhead > 16 * MIB);

    let started = std::time::Instant::now();
    let idle = gpu
        .largest_allocatable_block(0, u64::MAX, SearchLimits::within(Duration::from_secs(10)))
        .unwrap();
    eprintln!(
        "idle: free {} MiB, largest block {} MiB in {} steps, {:?}",
        before.free_bytes / MIB,
        idle.bytes / MIB,
        idle.steps,
        started.elapsed()
    );

    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let (cuda_free, cuda_total) = result::mem_get_info().unwrap();
    let nvml = gpu.device(0).unwrap().memory;
    eprintln!(
        "NVML total {} free {} / CUDA total {cuda_total} free {cuda_free}",
        nvml.total_bytes, nvml.free_bytes
    );
    assert!(nvml.total_bytes >= cuda_total as u64);
    assert!(nvml.free_bytes.abs_diff(cuda_free as u64) < 64 * MIB);
    let mut blocks = Vec::new();
    while let Ok(p) = unsafe { result::malloc_sync(1 << 30) } {
        blocks.push(p);
    }
    for (i, p) in blocks.iter().enumerate() {
        if i % 2 == 1 {
            unsafe { result::free_sync(*p) }.unwrap();
        }
    }
    let started = std::time::Instant::now();
    let probe = gpu
        .largest_allocatable_block(0, u64::MAX, SearchLimits::within(Duration::from_secs(10)))
        .unwrap();
    eprintln!(
        "fragmented ({} x 1 GiB, every other freed): largest block {} MiB in {} steps, {:?}",
        blocks.len(),
        probe.bytes / MIB,
        probe.steps,
        started.elapsed()
    );
    assert!(probe.exact);
    assert!(allocates_fresh(probe.bytes.max(1)));
    assert!(!allocates_fresh(probe.bytes + 2 * MIB));
    ctx.bind_to_thread().unwrap();
    for (i, p) in blocks.iter().enumerate() {
        if i % 2 == 0 {
            unsafe { result::free_sync(*p) }.unwrap();
        }
    }
    drop(ctx);
    let after = gpu.device(0).unwrap().memory;
    assert!(
        after.free_bytes + 64 * MIB >= before.free_bytes,
        "the probes left memory allocated: {} -> {}",
        before.free_bytes,
        after.free_bytes
    );
    let check = gpu.verify_block(0, 4 * GIB).unwrap();
    eprintln!("memory check: {check:?}");
    assert_eq!(check.mismatched_words, 0);
}
