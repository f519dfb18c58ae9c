//! Judgements already made, for the inventory and the second they were made
//! in. The API server sends the same spec more than once (a dry run, then the
//! create; a controller's retries; many jobs from one template), and a spec
//! that needs a shrink costs many estimates to judge.
//!
//! An entry is only ever answered for the very snapshot it was judged
//! against: same generation (every snapshot built from a changed inventory
//! gets a new one, so a new GpuNode or MemoryProfile is a new generation),
//! same node list and learnt profiles (held here by weak references, so their
//! addresses cannot be reused while the cache remembers them, yet the
//! reflectors may still update the node list in place rather than copy every
//! node while the cache looks at it), and the same second (node staleness is
//! judged to the second).
//! Anything else empties the cache first. It holds at most `capacity`
//! entries and starts over when full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::api::GpuNode;
use crate::inventory::Snapshot;

/// Entries a webhook keeps by default (a few KiB each).
pub const DEFAULT_CAPACITY: usize = 4096;

/// Values keyed on bytes that describe what they were computed from.
pub struct Cache<V> {
    capacity: usize,
    inner: Mutex<Inner<V>>,
}

struct Inner<V> {
    /// The snapshot every entry was computed against.
    snapshot: Option<Seen>,
    second: i64,
    entries: HashMap<Vec<u8>, Arc<V>>,
}

/// What identifies a snapshot: its generation and, weakly held, its node
/// list and profiles. A strong hold would keep the reflectors' node list
/// shared, so that the next change to one GpuNode copied all of them.
struct Seen {
    generation: u64,
    nodes: Weak<Vec<GpuNode>>,
    profiles: Weak<HashMap<String, f64>>,
}

impl Seen {
    fn of(s: &Snapshot) -> Seen {
        Seen {
            generation: s.generation(),
            nodes: Arc::downgrade(&s.nodes),
            profiles: Arc::downgrade(&s.profiles),
        }
    }

    fn is(&self, s: &Snapshot) -> bool {
        self.generation == s.generation()
            && std::ptr::eq(self.nodes.as_ptr(), Arc::as_ptr(&s.nodes))
            && std::ptr::eq(self.profiles.as_ptr(), Arc::as_ptr(&s.profiles))
    }
}

impl<V> Inner<V> {
    fn holds(&self, snapshot: &Snapshot, second: i64) -> bool {
        self.second == second && self.snapshot.as_ref().is_some_and(|s| s.is(snapshot))
    }
}

impl<V> Cache<V> {
    /// A cache of at most `capacity` entries (0: keeps nothing).
    pub fn new(capacity: usize) -> Cache<V> {
        Cache {
            capacity,
            inner: Mutex::new(Inner {
                snapshot: None,
                second: 0,
                entries: HashMap::new(),
            }),
        }
    }

    /// A cache that keeps nothing: every value is computed.
    pub fn disabled() -> Cache<V> {
        Cache::new(0)
    }

    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value kept for `key` against `snapshot` at `second`, if any. A
    /// cache holding another snapshot or second is emptied and moves on to
    /// this one.
    pub fn get(&self, snapshot: &Snapshot, second: i64, key: &[u8]) -> Option<Arc<V>> {
        if !self.enabled() {
            return None;
        }
        let mut inner = self.lock();
        if !inner.holds(snapshot, second) {
            inner.entries.clear();
            inner.snapshot = Some(Seen::of(snapshot));
            inner.second = second;
            return None;
        }
        inner.entries.get(key).cloned()
    }

    /// Keep `value` for `key`, computed against `snapshot` at `second`
    /// (dropped when the cache has moved on to another snapshot or second).
    pub fn insert(&self, snapshot: &Snapshot, second: i64, key: Vec<u8>, value: Arc<V>) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.lock();
        if inner.holds(snapshot, second) {
            if inner.entries.len() >= self.capacity {
                inner.entries.clear();
            }
            inner.entries.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Look `key` up, keeping a value when it is not there; true on a hit.
    fn count(cache: &Cache<u32>, snapshot: &Snapshot, second: i64, key: &[u8]) -> bool {
        let hit = cache.get(snapshot, second, key).is_some();
        if !hit {
            cache.insert(snapshot, second, key.to_vec(), Arc::new(7));
        }
        hit
    }

    #[test]
    fn hits_only_for_the_same_snapshot_and_second() {
        let cache = Cache::new(8);
        let a = Snapshot::new(Vec::new(), None, true, None);
        assert!(!count(&cache, &a, 1, b"x"));
        assert!(count(&cache, &a, 1, b"x"));
        assert!(
            count(&cache, &a.clone(), 1, b"x"),
            "a clone is the same inventory"
        );
        assert!(!count(&cache, &a, 1, b"y"));
        assert!(!count(&cache, &a, 2, b"x"), "another second");
        let b = Snapshot::new(Vec::new(), None, true, None);
        assert_ne!(a.generation(), b.generation());
        assert!(!count(&cache, &b, 2, b"x"), "another snapshot");
        let mut c = b.clone();
        c.profiles = Arc::new([("p".to_string(), 2.0)].into());
        assert!(!count(&cache, &c, 2, b"x"), "other profiles");
    }

    #[test]
    fn keeps_the_node_list_unshared() {
        let cache = Cache::new(8);
        let a = Snapshot::new(Vec::new(), None, true, None);
        assert!(!count(&cache, &a, 1, b"x"));
        assert_eq!(
            Arc::strong_count(&a.nodes),
            1,
            "the reflectors may update the list in place"
        );
        assert!(count(&cache, &a, 1, b"x"));
        let mut other_nodes = a.clone();
        other_nodes.nodes = Arc::new(Vec::new());
        assert!(!count(&cache, &other_nodes, 1, b"x"), "another node list");
    }

    #[test]
    fn bounded_and_off_at_zero() {
        let cache = Cache::new(2);
        let a = Snapshot::new(Vec::new(), None, true, None);
        for k in [b"a", b"b", b"c"] {
            count(&cache, &a, 1, k);
        }
        assert!(cache.len() <= 2);
        let off = Cache::disabled();
        assert!(!count(&off, &a, 1, b"a"));
        assert!(!count(&off, &a, 1, b"a"));
        assert!(off.is_empty());
    }
}
