//! The reservations of admitted jobs, held by the leader. Placement reads it
//! and writes it under one lock, so two jobs never reserve the same memory
//! even when the watch cache has not caught up with the last decision. It
//! is rebuilt from the TrainingJobs' statuses whenever a replica becomes
//! leader: status is the record, the ledger a cache of it.

use std::collections::HashMap;

use crate::api::{GpuNode, Phase, TrainingJob};
use crate::plan::{Reservation, reservations_of};
use kube::{Resource, ResourceExt};

/// One admitted job's hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub uid: String,
    pub attempt: u32,
    /// `namespace/jobName-`: the prefix of this attempt's pods as the agent
    /// reports them in `assignedPod`.
    pub pod_prefix: String,
    pub reservations: Vec<Reservation>,
}

/// `namespace/name` → hold.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<String, Entry>,
}

/// The ledger key of a TrainingJob.
pub fn key(tj: &TrainingJob) -> String {
    format!("{}/{}", tj.namespace().unwrap_or_default(), tj.name_any())
}

impl Ledger {
    /// From the TrainingJobs that hold memory now (Admitted or Running).
    pub fn rebuild(jobs: &[TrainingJob]) -> Ledger {
        let mut ledger = Ledger::default();
        for tj in jobs {
            if tj.meta().deletion_timestamp.is_some() {
                continue;
            }
            let Some(status) = &tj.status else { continue };
            if !matches!(status.phase, Some(Phase::Admitted | Phase::Running)) {
                continue;
            }
            let (Some(placement), Some(job_name)) = (&status.placement, &status.job_name) else {
                continue;
            };
            ledger.insert(
                key(tj),
                Entry {
                    uid: tj.uid().unwrap_or_default(),
                    attempt: status.oom_retries,
                    pod_prefix: format!("{}/{job_name}-", tj.namespace().unwrap_or_default()),
                    reservations: reservations_of(placement),
                },
            );
        }
        ledger
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn insert(&mut self, key: String, entry: Entry) {
        self.entries.insert(key, entry);
    }

    /// Drop a hold; true when there was one.
    pub fn release(&mut self, key: &str) -> bool {
        self.entries.remove(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every hold but `except`'s, as placement takes them. A GPU the agent
    /// already reports as assigned to one of the job's pods has that job's
    /// use in its probed free memory: only the rest of the hold counts.
    pub fn reservations(&self, nodes: &[GpuNode], except: &str) -> Vec<Reservation> {
        let by_node: HashMap<&str, &GpuNode> = nodes
            .iter()
            .map(|n| (n.spec.node_name.as_str(), n))
            .collect();
        let mut out = Vec::new();
        for (k, e) in &self.entries {
            if k == except {
                continue;
            }
            for r in &e.reservations {
                let used_by_job = by_node
                    .get(r.node.as_str())
                    .and_then(|n| n.status.as_ref())
                    .and_then(|s| s.gpus.iter().find(|g| g.index == r.gpu_index))
                    .filter(|g| {
                        r.mig_index.is_none()
                            && g.assigned_pod
                                .as_deref()
                                .is_some_and(|p| p.starts_with(&e.pod_prefix))
                    })
                    .map(|g| g.used_bytes)
                    .unwrap_or(0);
                let bytes = r.bytes.saturating_sub(used_by_job);
                if bytes > 0 {
                    out.push(Reservation { bytes, ..r.clone() });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuStatus};

    fn entry(node: &str, gpu: u32, bytes: u64) -> Entry {
        Entry {
            uid: "u".into(),
            attempt: 0,
            pod_prefix: "ml/train-0-".into(),
            reservations: vec![Reservation {
                node: node.into(),
                gpu_index: gpu,
                mig_index: None,
                bytes,
            }],
        }
    }

    fn node(name: &str, used: u64, pod: Option<&str>) -> GpuNode {
        let mut n = GpuNode::new(
            name,
            GpuNodeSpec {
                node_name: name.into(),
                ttl_seconds: 120,
                taints: vec![],
            },
        );
        n.status = Some(GpuNodeStatus {
            gpus: vec![GpuStatus {
                index: 0,
                product: "NVIDIA H100 80GB HBM3".into(),
                total_bytes: 80 << 30,
                free_bytes: (80 << 30) - used,
                used_bytes: used,
                assigned_pod: pod.map(str::to_string),
                healthy: true,
                ..GpuStatus::default()
            }],
            gpu_count: 1,
            ..GpuNodeStatus::default()
        });
        n
    }

    #[test]
    fn holds_count_except_the_asker_and_what_the_probe_already_sees() {
        let mut l = Ledger::default();
        l.insert("ml/train".into(), entry("a", 0, 40 << 30));
        l.insert("ml/other".into(), entry("b", 0, 10 << 30));
        assert_eq!(l.len(), 2);
        let nodes = [
            node("a", 30 << 30, Some("ml/train-0-x7k2p")),
            node("b", 0, None),
        ];
        let mut r = l.reservations(&nodes, "ml/other");
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0].bytes,
            10 << 30,
            "30 of the 40 GiB are already in the probe"
        );
        r = l.reservations(&nodes, "nobody");
        assert_eq!(r.len(), 2);
        assert!(l.release("ml/train"));
        assert!(!l.release("ml/train"));
        assert_eq!(l.reservations(&nodes, "x").len(), 1);
    }
}
