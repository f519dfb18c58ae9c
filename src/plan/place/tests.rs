use super::*;
use crate::api::{GpuNodeSpec, GpuNodeStatus, MigDevice, NodeTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const GIB_U: u64 = 1 << 30;

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("valid time")
}

fn gpu(index: u32, total_gib: u64, free_gib: u64) -> GpuStatus {
    GpuStatus {
        index,
        product: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: total_gib * GIB_U,
        free_bytes: free_gib * GIB_U,
        healthy: true,
        ..GpuStatus::default()
    }
}

fn node(name: &str, gpus: Vec<GpuStatus>) -> GpuNode {
    let mut n = GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.into(),
            ttl_seconds: 120,
            taints: Vec::new(),
        },
    );
    n.status = Some(GpuNodeStatus {
        gpu_count: u32::try_from(gpus.len()).expect("few GPUs"),
        gpus,
        probe_time: Some(Time(now())),
        ..GpuNodeStatus::default()
    });
    n
}

fn request(gpus: u64, per_node: u64) -> Request<'static> {
    Request {
        gpus,
        gpus_per_node: per_node,
        safety_margin: 0.0,
        tolerations: &[],
        now: now(),
    }
}

fn need_gib(g: u64) -> impl FnMut(Architecture) -> Option<Need> {
    move |_| {
        Some(Need {
            per_gpu_bytes: g * GIB_U,
            largest_tensor_bytes: GIB_U,
            allocator: None,
        })
    }
}

#[test]
fn best_fit_picks_the_tightest_gpu() {
    let nodes = vec![
        node("a", vec![gpu(0, 80, 70), gpu(1, 80, 30)]),
        node("b", vec![gpu(0, 80, 25)]),
    ];
    let out = place_with(&request(1, 1), &nodes, &[], &mut need_gib(20));
    let a = out.assignment().expect("placed");
    assert_eq!(a.nodes[0].node, "b");
    assert_eq!(a.nodes[0].gpus[0].index, 0);
    assert_eq!(a.headroom_bytes, 5 * GIB_U);
    assert_eq!(a.to_status().node, "b");
}

#[test]
fn reservations_count_as_used() {
    let nodes = vec![node("a", vec![gpu(0, 80, 30), gpu(1, 80, 50)])];
    let res = [Reservation {
        node: "a".into(),
        gpu_index: 0,
        mig_index: None,
        bytes: 20 * GIB_U,
    }];
    let out = place_with(&request(1, 1), &nodes, &res, &mut need_gib(20));
    assert_eq!(out.assignment().expect("placed").nodes[0].gpus[0].index, 1);
}

#[test]
fn all_ranks_of_a_node_must_fit() {
    let nodes = vec![
        node("a", vec![gpu(0, 80, 70), gpu(1, 80, 10)]),
        node("b", vec![gpu(0, 80, 40), gpu(1, 80, 40)]),
    ];
    let out = place_with(&request(2, 2), &nodes, &[], &mut need_gib(30));
    let a = out.assignment().expect("placed");
    assert_eq!(a.to_status().node, "b");
    assert_eq!(a.to_status().gpus, vec![0, 1]);
}

#[test]
fn multi_node_jobs_get_whole_nodes() {
    let nodes = vec![
        node("a", vec![gpu(0, 80, 70), gpu(1, 80, 70)]),
        node("b", vec![gpu(0, 80, 40), gpu(1, 80, 40)]),
        node("c", vec![gpu(0, 80, 40), gpu(1, 80, 10)]),
    ];
    let out = place_with(&request(4, 2), &nodes, &[], &mut need_gib(30));
    let a = out.assignment().expect("placed");
    let names: Vec<&str> = a.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, vec!["b", "a"]);
    assert_eq!(a.to_status().nodes, vec!["b", "a"]);
}

#[test]
fn busy_gpus_mean_wait_small_ones_reject() {
    let nodes = vec![node("a", vec![gpu(0, 80, 10)])];
    match place_with(&request(1, 1), &nodes, &[], &mut need_gib(30)) {
        PlaceOutcome::Wait { reason } => {
            assert!(reason.contains("fits a once"), "{reason}");
            assert!(reason.contains("short by 20.0 GiB"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match place_with(&request(1, 1), &nodes, &[], &mut need_gib(90)) {
        PlaceOutcome::Reject { reason } => {
            assert!(reason.contains("even with its GPUs empty"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn stale_tainted_and_unhealthy_are_skipped() {
    let mut stale = node("stale", vec![gpu(0, 80, 80)]);
    if let Some(s) = stale.status.as_mut() {
        s.probe_time = Some(Time(
            Timestamp::from_second(1_800_000_000 - 121).expect("valid time"),
        ));
    }
    let mut tainted = node("tainted", vec![gpu(0, 80, 80)]);
    tainted.spec.taints.push(NodeTaint {
        key: "dedicated".into(),
        value: Some("infer".into()),
        effect: "NoSchedule".into(),
    });
    let mut sick = node("sick", vec![gpu(0, 80, 80)]);
    if let Some(s) = sick.status.as_mut() {
        s.gpus[0].healthy = false;
    }
    let nodes = vec![stale, tainted, sick];
    match place_with(&request(1, 1), &nodes, &[], &mut need_gib(10)) {
        PlaceOutcome::Reject { reason } => {
            assert!(reason.contains("1 stale (stale)"), "{reason}");
            assert!(
                reason.contains("tainted: dedicated=infer:NoSchedule"),
                "{reason}"
            );
            assert!(reason.contains("1 unhealthy GPU"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let tolerations = ["dedicated".to_string()];
    let req = Request {
        tolerations: &tolerations,
        ..request(1, 1)
    };
    let out = place_with(&req, &nodes, &[], &mut need_gib(10));
    assert_eq!(out.assignment().expect("placed").nodes[0].node, "tainted");
    // `*`: a toleration with no key and `Exists` tolerates every taint.
    let everything = ["*".to_string()];
    let req = Request {
        tolerations: &everything,
        ..request(1, 1)
    };
    let out = place_with(&req, &nodes, &[], &mut need_gib(10));
    assert_eq!(out.assignment().expect("placed").nodes[0].node, "tainted");
}

#[test]
fn a_node_not_ready_yet_makes_the_job_wait_not_fail() {
    let mut fresh = node("gpu-new", vec![gpu(0, 80, 80)]);
    fresh.spec.taints.push(NodeTaint {
        key: "node.kubernetes.io/not-ready".into(),
        value: None,
        effect: "NoSchedule".into(),
    });
    match place_with(&request(1, 1), &[fresh.clone()], &[], &mut need_gib(10)) {
        PlaceOutcome::Wait { reason } => {
            assert!(reason.contains("gpu-new"), "{reason}");
            assert!(reason.contains("node.kubernetes.io/not-ready"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Too big for the node even once ready: still a rejection.
    assert!(matches!(
        place_with(&request(1, 1), &[fresh.clone()], &[], &mut need_gib(90)),
        PlaceOutcome::Reject { .. }
    ));
    // A taint of the cluster's own making stays a rejection.
    fresh.spec.taints.push(NodeTaint {
        key: "dedicated".into(),
        value: Some("infer".into()),
        effect: "NoSchedule".into(),
    });
    assert!(matches!(
        place_with(&request(1, 1), &[fresh], &[], &mut need_gib(10)),
        PlaceOutcome::Reject { .. }
    ));
}

#[test]
fn mig_slices_take_single_gpu_jobs() {
    let mut g = gpu(0, 80, 0);
    g.product = "NVIDIA A100-SXM4-80GB".into();
    g.mig_devices = vec![
        MigDevice {
            index: 0,
            profile: "3g.40gb".into(),
            total_bytes: 39 * GIB_U,
            free_bytes: 39 * GIB_U,
            ..MigDevice::default()
        },
        MigDevice {
            index: 1,
            profile: "1g.10gb".into(),
            total_bytes: 9 * GIB_U,
            free_bytes: 9 * GIB_U,
            ..MigDevice::default()
        },
    ];
    let nodes = vec![node("mig", vec![g])];
    let out = place_with(&request(1, 1), &nodes, &[], &mut need_gib(8));
    let d = &out.assignment().expect("placed").nodes[0].gpus[0];
    assert_eq!(
        (d.mig_index, d.mig_profile.as_deref()),
        (Some(1), Some("1g.10gb"))
    );
    let out = place_with(&request(2, 2), &nodes, &[], &mut need_gib(8));
    assert!(matches!(out, PlaceOutcome::Reject { .. }), "{out:?}");
}

#[test]
fn a_wait_names_gpus_and_nodes_in_plain_words() {
    // Four nodes of one GPU each; only "a" has room now, with both its GPUs.
    let nodes = vec![
        node("a", vec![gpu(0, 80, 70), gpu(1, 80, 70)]),
        node("b", vec![gpu(0, 80, 10)]),
        node("c", vec![gpu(0, 80, 10)]),
        node("d", vec![gpu(0, 80, 10)]),
    ];
    match place_with(&request(4, 1), &nodes, &[], &mut need_gib(30)) {
        PlaceOutcome::Wait { reason } => {
            assert!(
                reason.contains("4 nodes of 1 GPU each (30.0 GiB per GPU)"),
                "{reason}"
            );
            assert!(reason.contains("(1 of 4 nodes have room)"), "{reason}");
            // The best node has more than a node needs: nothing to say of it.
            assert!(!reason.contains("the best"), "{reason}");
            assert!(!reason.contains("GPU(s)"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // One node of four GPUs wanted; the node has room on three of them.
    let nodes = vec![node(
        "a",
        vec![
            gpu(0, 80, 70),
            gpu(1, 80, 70),
            gpu(2, 80, 70),
            gpu(3, 80, 10),
        ],
    )];
    match place_with(&request(4, 4), &nodes, &[], &mut need_gib(30)) {
        PlaceOutcome::Wait { reason } => {
            assert!(
                reason.contains("4 GPUs on one node (30.0 GiB per GPU)"),
                "{reason}"
            );
            assert!(
                reason.contains("the best, a, has room on 3 of the 4 GPUs a node needs"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}
