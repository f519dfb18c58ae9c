//! The reservations of admitted jobs, held by the leader. Placement reads it
//! and writes it under one lock, so two jobs never reserve the same memory
//! even when the watch cache has not caught up with the last decision. It
//! is rebuilt from the TrainingJobs' statuses whenever a replica becomes
//! leader: status is the record, the ledger a cache of it. Holds are kept
//! indexed by node, so a placement costs nothing per job held elsewhere.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::api::{GpuNode, Phase, TrainingJob};
use crate::plan::{Reservation, ReservationIndex, reservations_of};
use kube::{Resource, ResourceExt};

/// One admitted job's hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub uid: String,
    pub attempt: u32,
    /// `namespace/jobName`: this attempt's pods are `jobName-…`, as the
    /// agent reports them in `assignedPod`.
    pub job: String,
    pub reservations: Vec<Reservation>,
}

/// `namespace/name` → hold, and every hold by node.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<String, Entry>,
    /// `namespace/jobName` → key.
    jobs: HashMap<String, String>,
    index: ReservationIndex,
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
            ledger.absorb(tj);
        }
        ledger
    }

    /// Take `tj`'s hold from its status, if it holds memory now.
    pub fn absorb(&mut self, tj: &TrainingJob) {
        if tj.meta().deletion_timestamp.is_some() {
            return;
        }
        let Some(status) = &tj.status else { return };
        if !matches!(status.phase, Some(Phase::Admitted | Phase::Running)) {
            return;
        }
        let (Some(placement), Some(job_name)) = (&status.placement, &status.job_name) else {
            return;
        };
        self.insert(
            key(tj),
            Entry {
                uid: tj.uid().unwrap_or_default(),
                attempt: status.oom_retries,
                job: format!("{}/{job_name}", tj.namespace().unwrap_or_default()),
                reservations: reservations_of(placement),
            },
        );
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn insert(&mut self, key: String, entry: Entry) {
        self.release(&key);
        for r in &entry.reservations {
            self.index
                .entry(r.node.clone())
                .or_default()
                .push(r.clone());
        }
        self.jobs.insert(entry.job.clone(), key.clone());
        self.entries.insert(key, entry);
    }

    /// Drop a hold; true when there was one.
    pub fn release(&mut self, key: &str) -> bool {
        let Some(entry) = self.entries.remove(key) else {
            return false;
        };
        self.jobs.remove(&entry.job);
        for r in &entry.reservations {
            if let Some(held) = self.index.get_mut(&r.node) {
                if let Some(i) = held.iter().position(|h| h == r) {
                    held.swap_remove(i);
                }
                if held.is_empty() {
                    self.index.remove(&r.node);
                }
            }
        }
        true
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The hold a pod (`namespace/pod`) belongs to: its name is the Job's
    /// name, a dash and more.
    fn owner_of(&self, pod: &str) -> Option<&Entry> {
        let mut end = pod.len();
        while let Some(i) = pod[..end].rfind('-') {
            if let Some(key) = self.jobs.get(&pod[..i]) {
                return self.entries.get(key);
            }
            end = i;
        }
        None
    }

    /// Every hold, as placement takes them. A GPU the agent already reports
    /// as assigned to one of a job's pods has that job's use in its probed
    /// free memory: only the rest of that job's hold counts there.
    pub fn reservations(&self, nodes: &[GpuNode]) -> Cow<'_, ReservationIndex> {
        let mut adjusted: Option<ReservationIndex> = None;
        for n in nodes {
            let Some(status) = &n.status else { continue };
            let node = n.spec.node_name.as_str();
            if !self.index.contains_key(node) {
                continue;
            }
            for g in &status.gpus {
                let Some(pod) = g.assigned_pod.as_deref() else {
                    continue;
                };
                if g.used_bytes == 0 {
                    continue;
                }
                let Some(owner) = self.owner_of(pod) else {
                    continue;
                };
                let Some(held) = owner
                    .reservations
                    .iter()
                    .find(|r| r.node == node && r.gpu_index == g.index && r.mig_index.is_none())
                else {
                    continue;
                };
                let index = adjusted.get_or_insert_with(|| self.index.clone());
                if let Some(list) = index.get_mut(node)
                    && let Some(r) = list.iter_mut().find(|r| *r == held)
                {
                    r.bytes = r.bytes.saturating_sub(g.used_bytes);
                }
            }
        }
        match adjusted {
            Some(index) => Cow::Owned(index),
            None => Cow::Borrowed(&self.index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuNodeSpec, GpuNodeStatus, GpuStatus};
    use crate::plan::held_in;

    fn entry(job: &str, node: &str, gpu: u32, bytes: u64) -> Entry {
        Entry {
            uid: "u".into(),
            attempt: 0,
            job: job.into(),
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
    fn holds_count_once_and_what_the_probe_already_sees_is_not_held_twice() {
        let mut l = Ledger::default();
        l.insert("ml/train".into(), entry("ml/train-0", "a", 0, 40 << 30));
        l.insert("ml/other".into(), entry("ml/other-0", "b", 0, 10 << 30));
        assert_eq!(l.len(), 2);
        let nodes = [
            node("a", 30 << 30, Some("ml/train-0-x7k2p")),
            node("b", 0, None),
        ];
        let r = l.reservations(&nodes);
        assert_eq!(
            held_in(&r, "a", 0, None),
            10 << 30,
            "30 of the 40 GiB are in the probe"
        );
        assert_eq!(held_in(&r, "b", 0, None), 10 << 30);
        // Without the agent's view, the whole hold counts, from the index itself.
        let plain = l.reservations(&[]);
        assert!(matches!(plain, Cow::Borrowed(_)));
        assert_eq!(held_in(&plain, "a", 0, None), 40 << 30);
        // Replacing a hold does not count it twice; releasing frees it.
        l.insert("ml/train".into(), entry("ml/train-1", "a", 0, 50 << 30));
        assert_eq!(held_in(&l.reservations(&[]), "a", 0, None), 50 << 30);
        assert!(l.release("ml/train"));
        assert!(!l.release("ml/train"));
        assert_eq!(held_in(&l.reservations(&[]), "a", 0, None), 0);
        assert_eq!(l.len(), 1);
    }
}
