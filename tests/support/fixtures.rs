//! Objects the operator and RBAC tests start from.

#![allow(dead_code)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use vramguard::api::{
    GpuNode, GpuNodeSpec, GpuNodeStatus, GpuStatus, TrainingJob, TrainingJobSpec,
};

pub const GIB: u64 = 1 << 30;

/// A node of `gpus` H100 80GB, each with `free_gib` free, probed now.
pub fn gpu_node(name: &str, gpus: usize, free_gib: u64) -> GpuNode {
    let mut g = GpuNode::new(
        name,
        GpuNodeSpec {
            node_name: name.into(),
            ttl_seconds: 3600,
            taints: Vec::new(),
        },
    );
    g.status = Some(GpuNodeStatus {
        gpus: (0..gpus)
            .map(|i| GpuStatus {
                index: i as u32,
                product: "NVIDIA H100 80GB HBM3".into(),
                total_bytes: 80 * GIB,
                free_bytes: free_gib * GIB,
                used_bytes: (80 - free_gib) * GIB,
                healthy: true,
                ..Default::default()
            })
            .collect(),
        gpu_count: gpus as u32,
        product: Some("NVIDIA H100 80GB HBM3".into()),
        probe_time: Some(Time(Timestamp::now())),
        ..Default::default()
    });
    g
}

/// A TrainingJob in `namespace` from the YAML of its spec.
pub fn training_job(namespace: &str, name: &str, spec_yaml: &str) -> TrainingJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(spec_yaml).expect("test spec parses");
    let mut tj = TrainingJob::new(name, spec);
    tj.metadata.namespace = Some(namespace.into());
    tj
}
