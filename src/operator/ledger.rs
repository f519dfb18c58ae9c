//! The reservations of admitted jobs, held by the leader. Placement reads it
//! and writes it under one lock, so two jobs never reserve the same memory
//! even when the watch cache has not caught up with the last decision. It
//! is rebuilt from the TrainingJobs' statuses whenever a replica becomes
//! leader: status is the record, the ledger a cache of it. Holds are kept
//! indexed by node, so a placement costs nothing per job held elsewhere.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use crate::api::{GpuNode, GpuStatus, Phase, TrainingJob};
use crate::inventory::Snapshot;
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
    /// Bumped by every insert and release.
    changes: u64,
    /// Nodes whose holds changed since the last [`Ledger::reservations_in`].
    dirty: HashSet<String>,
    /// The last [`Ledger::reservations_in`], brought up to date node by node.
    adjusted: Option<Adjusted>,
}

/// Holds as placement takes them against one snapshot's nodes.
#[derive(Debug, Default)]
struct Adjusted {
    generation: u64,
    /// Weak: the reflectors may update the list in place meanwhile.
    nodes: Weak<Vec<GpuNode>>,
    changes: u64,
    index: ReservationIndex,
    /// Per node adjusted, the busy GPUs it was adjusted for: (index,
    /// assigned pod, used bytes).
    seen: HashMap<String, Vec<(u32, String, u64)>>,
}

/// A GPU whose use the agent attributes to a pod.
fn busy(g: &GpuStatus) -> Option<(&str, u64)> {
    let pod = g.assigned_pod.as_deref()?;
    (g.used_bytes > 0).then_some((pod, g.used_bytes))
}

/// Are `gpus`' busy GPUs those of `seen`?
fn same_busy(seen: &[(u32, String, u64)], gpus: &[GpuStatus]) -> bool {
    let mut was = seen.iter();
    for g in gpus {
        let Some((pod, used)) = busy(g) else { continue };
        match was.next() {
            Some((i, p, u)) if *i == g.index && *u == used && p == pod => {}
            _ => return false,
        }
    }
    was.next().is_none()
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
        self.changes += 1;
        for r in &entry.reservations {
            self.dirty.insert(r.node.clone());
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
        self.changes += 1;
        self.jobs.remove(&entry.job);
        for r in &entry.reservations {
            self.dirty.insert(r.node.clone());
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
            if let Some(list) = self.adjusted_on(node, &status.gpus) {
                adjusted
                    .get_or_insert_with(|| self.index.clone())
                    .insert(node.to_string(), list);
            }
        }
        match adjusted {
            Some(index) => Cow::Owned(index),
            None => Cow::Borrowed(&self.index),
        }
    }

    /// The hold of `pod`'s job on a whole GPU, if it holds one there.
    fn hold_of(&self, pod: &str, node: &str, gpu: u32) -> Option<&Reservation> {
        self.owner_of(pod)?
            .reservations
            .iter()
            .find(|r| r.node == node && r.gpu_index == gpu && r.mig_index.is_none())
    }

    /// The holds on `node` less what its busy GPUs already show of their
    /// owners' use; None when no hold there is in the probe.
    fn adjusted_on(&self, node: &str, gpus: &[GpuStatus]) -> Option<Vec<Reservation>> {
        let holds = self.index.get(node)?;
        let mut list: Option<Vec<Reservation>> = None;
        for g in gpus {
            let Some((pod, used)) = busy(g) else { continue };
            let Some(held) = self.hold_of(pod, node, g.index) else {
                continue;
            };
            let list = list.get_or_insert_with(|| holds.clone());
            if let Some(r) = list.iter_mut().find(|r| *r == held) {
                r.bytes = r.bytes.saturating_sub(used);
            }
        }
        list
    }

    /// [`Ledger::reservations`] against `snapshot`'s nodes, kept from one
    /// call to the next and brought up to date node by node: only a node
    /// whose busy GPUs changed, or whose holds changed, is worked out again
    /// (every reconcile of a waiting job reads the holds, and the snapshot
    /// changes with every agent's publish).
    pub fn reservations_in(&mut self, snapshot: &Snapshot) -> &ReservationIndex {
        let mut a = self.adjusted.take().unwrap_or_default();
        let same = snapshot.generation() != 0
            && a.generation == snapshot.generation()
            && a.changes == self.changes
            && std::ptr::eq(a.nodes.as_ptr(), Arc::as_ptr(&snapshot.nodes));
        if !same {
            self.bring_up_to_date(&mut a, &snapshot.nodes);
            a.generation = snapshot.generation();
            a.nodes = Arc::downgrade(&snapshot.nodes);
            a.changes = self.changes;
        }
        &self.adjusted.insert(a).index
    }

    fn bring_up_to_date(&mut self, a: &mut Adjusted, nodes: &[GpuNode]) {
        let dirty = std::mem::take(&mut self.dirty);
        let mut read: HashSet<&str> = HashSet::with_capacity(a.seen.len());
        for n in nodes {
            let node = n.spec.node_name.as_str();
            let gpus = n.status.as_ref().map_or(&[][..], |s| &s.gpus[..]);
            if !self.index.contains_key(node) && !a.index.contains_key(node) {
                continue;
            }
            read.insert(node);
            let unchanged =
                !dirty.contains(node) && a.seen.get(node).is_some_and(|seen| same_busy(seen, gpus));
            if unchanged {
                continue;
            }
            self.adjust(a, node, gpus);
        }
        // Nodes gone from the snapshot, or with holds changed but not in it:
        // their holds count whole.
        let left: Vec<String> = a
            .seen
            .keys()
            .chain(dirty.iter())
            .filter(|n| !read.contains(n.as_str()))
            .cloned()
            .collect();
        for node in left {
            match self.index.get(&node) {
                Some(holds) => a.index.insert(node.clone(), holds.clone()),
                None => a.index.remove(&node),
            };
            a.seen.remove(&node);
        }
    }

    /// `a`'s entry for `node` worked out again from its busy `gpus` (those
    /// of the snapshot's GpuNode of that node: one per node).
    fn adjust(&self, a: &mut Adjusted, node: &str, gpus: &[GpuStatus]) {
        let seen = gpus
            .iter()
            .filter_map(|g| busy(g).map(|(pod, used)| (g.index, pod.to_string(), used)))
            .collect();
        match self.index.get(node) {
            Some(holds) => {
                let list = self
                    .adjusted_on(node, gpus)
                    .unwrap_or_else(|| holds.clone());
                a.index.insert(node.to_string(), list);
                a.seen.insert(node.to_string(), seen);
            }
            None => {
                a.index.remove(node);
                a.seen.remove(node);
            }
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

    #[test]
    fn remembered_holds_follow_the_ledger_and_the_snapshot() {
        let mut l = Ledger::default();
        l.insert("ml/train".into(), entry("ml/train-0", "a", 0, 40 << 30));
        let probed = Snapshot::new(
            vec![node("a", 30 << 30, Some("ml/train-0-x7k2p"))],
            None,
            true,
            None,
        );
        assert_eq!(held_in(l.reservations_in(&probed), "a", 0, None), 10 << 30);
        assert_eq!(
            held_in(l.reservations_in(&probed.clone()), "a", 0, None),
            10 << 30
        );
        l.insert("ml/more".into(), entry("ml/more-0", "a", 0, 5 << 30));
        assert_eq!(
            held_in(l.reservations_in(&probed), "a", 0, None),
            15 << 30,
            "a new hold counts at once"
        );
        let idle = Snapshot::new(vec![node("a", 0, None)], None, true, None);
        assert_eq!(
            held_in(l.reservations_in(&idle), "a", 0, None),
            45 << 30,
            "another snapshot is read again"
        );
        assert!(l.release("ml/train"));
        assert_eq!(held_in(l.reservations_in(&idle), "a", 0, None), 5 << 30);
    }

    /// Holds as `reservations` works them out and as `reservations_in`
    /// keeps them, compared over many changes of the ledger and the nodes.
    #[test]
    fn kept_holds_are_the_holds_worked_out_afresh() {
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let names = ["a", "b", "c", "d"];
        let mut l = Ledger::default();
        for step in 0..400 {
            let job = next(6);
            let key = format!("ml/j{job}");
            match next(3) {
                0 => {
                    let node = names[next(4) as usize];
                    let gpu = next(2) as u32;
                    l.insert(
                        key,
                        entry(
                            &format!("ml/j{job}-{step}"),
                            node,
                            gpu,
                            (8 + next(40)) << 30,
                        ),
                    );
                }
                1 => {
                    l.release(&key);
                }
                _ => {}
            }
            // Each node's GPUs, some used by pods of jobs held (or not).
            let mut nodes = Vec::new();
            for name in names {
                if next(8) == 0 {
                    continue; // not in this snapshot
                }
                let mut gpus = Vec::new();
                for i in 0..2 {
                    let used = next(3) * (4 << 30);
                    let pod = l
                        .entries
                        .values()
                        .nth(next(4) as usize)
                        .map(|e| format!("{}-x{i}", e.job));
                    gpus.push(GpuStatus {
                        index: i,
                        used_bytes: used,
                        assigned_pod: pod,
                        ..GpuStatus::default()
                    });
                }
                let mut n = node(name, 0, None);
                if let Some(st) = n.status.as_mut() {
                    st.gpus = gpus;
                }
                nodes.push(n);
            }
            let snapshot = Snapshot::new(nodes, None, true, None);
            let fresh = l.reservations(&snapshot.nodes).into_owned();
            let kept = l.reservations_in(&snapshot).clone();
            let sorted = |mut i: ReservationIndex| {
                for v in i.values_mut() {
                    v.sort_by_key(|r| (r.gpu_index, r.bytes));
                }
                i.into_iter().collect::<std::collections::BTreeMap<_, _>>()
            };
            assert_eq!(sorted(kept), sorted(fresh), "step {step}");
        }
    }
}
