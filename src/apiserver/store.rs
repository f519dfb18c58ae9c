//! The store: every object's current version (its JSON and its head), the
//! event history watches read, and the one place a write is committed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use axum::body::Bytes;
use serde_json::{Map, Value, json};

use super::meta::now_time;
use super::{Key, Request, Res, Shared};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Clone, Debug)]
pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) res: Res,
    pub(super) ns: String,
    pub(super) ty: EventType,
    pub(super) old: Option<Value>,
    /// What a selector reads of the object as this event stored it.
    pub(super) view: Value,
    /// The object's JSON as this event stored it (shared with the store and
    /// every reader: no copy). Only the JSON: a version the store has moved
    /// past keeps no parsed copy in the history, a third of its size.
    pub(super) json: Bytes,
}

/// One version of an object as stored, and its JSON, written once when first
/// asked for: every GET, write answer and watch event of this version sends
/// the same bytes, so a GpuNode published and watched by several clients is
/// serialized once, not once per reader, and no reader copies the object.
#[derive(Debug)]
pub(super) struct Stored {
    /// `apiVersion`, `kind` and `metadata`: all that selectors, owner
    /// references, finalizers and preconditions read.
    pub(super) head: Value,
    pub(super) json: Bytes,
}

impl Stored {
    /// The object kept as its JSON and its head only: a parsed copy of every
    /// object would triple what a day of ten thousand jobs keeps.
    pub(super) fn new(value: Value) -> Arc<Stored> {
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        let mut head = Map::new();
        if let Value::Object(mut m) = value {
            for k in ["apiVersion", "kind", "metadata"] {
                if let Some(v) = m.remove(k) {
                    head.insert(k.into(), v);
                }
            }
        }
        Arc::new(Stored {
            head: Value::Object(head),
            json,
        })
    }

    pub(super) fn json(&self) -> Bytes {
        self.json.clone()
    }

    /// The whole object, read back from its JSON.
    pub(super) fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }
}

impl std::ops::Deref for Stored {
    type Target = Value;
    fn deref(&self) -> &Value {
        &self.head
    }
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) rv: u64,
    /// Events at or below this resourceVersion are gone (410 for watches from there).
    pub(super) compacted: u64,
    pub(super) next_uid: u64,
    pub(super) objects: BTreeMap<Key, Arc<Stored>>,
    pub(super) events: Vec<Event>,
    pub(super) kinds: HashMap<Res, String>,
    pub(super) no_status_subresource: HashSet<Res>,
    pub(super) logs: HashMap<(String, String), String>,
    pub(super) requests: Vec<Request>,
    /// Keep no request log (a long simulation makes millions of requests).
    pub(super) no_request_log: bool,
    /// Keep at most about this many events; older ones are compacted away.
    pub(super) history_limit: Option<usize>,
}

/// Do `a` and `b` differ beyond metadata and status (compared in place:
/// this runs on every write, and the objects can be large)?
pub(super) fn differs_beyond_meta_and_status(a: &Value, b: &Value) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            let rest = |m: &'_ serde_json::Map<String, Value>| {
                m.iter()
                    .filter(|(k, _)| *k != "metadata" && *k != "status")
                    .count()
            };
            rest(a) != rest(b)
                || a.iter()
                    .filter(|(k, _)| *k != "metadata" && *k != "status")
                    .any(|(k, v)| b.get(k) != Some(v))
        }
        _ => a != b,
    }
}

/// What a watch event keeps of the object before the change: only what a
/// selector reads (name, namespace, labels), not the whole object.
pub(super) fn selector_view(v: &Value) -> Value {
    let m = &v["metadata"];
    json!({"metadata": {
        "name": m["name"],
        "namespace": m["namespace"],
        "labels": m["labels"],
    }})
}

impl Inner {
    pub(super) fn init_metadata(&mut self, v: &mut Value) {
        self.next_uid += 1;
        if !v["metadata"].is_object() {
            v["metadata"] = json!({});
        }
        let m = &mut v["metadata"];
        m["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", self.next_uid));
        m["creationTimestamp"] = json!(now_time());
        m["generation"] = json!(1);
        if let Some(m) = m.as_object_mut() {
            m.remove("deletionTimestamp");
        }
    }

    /// Store (`Some`) or remove (`None`) an object, bump the resourceVersion,
    /// record the event and wake watchers. Returns what is stored now (or,
    /// on removal, the object as deleted).
    pub(super) fn commit(
        &mut self,
        shared: &Shared,
        key: &Key,
        new: Option<Value>,
        bump_generation: bool,
    ) -> Option<Arc<Stored>> {
        let old = self.objects.get(key).cloned();
        self.rv += 1;
        let rv = self.rv;
        let (ty, mut obj) = match (new, &old) {
            (Some(v), None) => (EventType::Added, v),
            (Some(v), Some(_)) => (EventType::Modified, v),
            (None, Some(o)) => (EventType::Deleted, o.value()),
            (None, None) => {
                self.rv -= 1;
                return None;
            }
        };
        // The caller has compared the objects beyond metadata and status.
        if bump_generation && let Some(o) = &old {
            let g = o["metadata"]["generation"].as_i64().unwrap_or(0);
            obj["metadata"]["generation"] = json!(g + 1);
        }
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let obj = Stored::new(obj);
        if ty == EventType::Deleted {
            self.objects.remove(key);
        } else if let Some(slot) = self.objects.get_mut(key) {
            // Replaced in place: no copy of the key, no second descent.
            *slot = obj.clone();
        } else {
            self.objects.insert(key.clone(), obj.clone());
        }
        self.events.push(Event {
            rv,
            res: key.0.clone(),
            ns: key.1.clone(),
            ty,
            old: old.as_deref().map(|o| selector_view(o)),
            view: selector_view(&obj),
            json: obj.json(),
        });
        if let Some(limit) = self.history_limit
            && self.events.len() > limit.saturating_mul(2)
        {
            let cut = self.events.len() - limit;
            self.compacted = self.events[cut - 1].rv;
            self.events.drain(..cut);
        }
        shared.changed.send_replace(rv);
        Some(obj)
    }

    /// DELETE: mark when finalizers remain, else remove and collect dependents.
    pub(super) fn delete(
        &mut self,
        shared: &Shared,
        key: &Key,
        cascade: bool,
    ) -> Option<Arc<Stored>> {
        let obj = self.objects.get(key)?.clone();
        let has_finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if obj["metadata"]["deletionTimestamp"].is_string() {
                return Some(obj);
            }
            let mut o = obj.value();
            o["metadata"]["deletionTimestamp"] = json!(now_time());
            o["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return self.commit(shared, key, Some(o), false);
        }
        let gone = self.commit(shared, key, None, false);
        if cascade && let Some(uid) = obj["metadata"]["uid"].as_str() {
            let dependents: Vec<Key> = self
                .objects
                .iter()
                .filter(|(_, v)| {
                    v["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
                })
                .map(|(k, _)| k.clone())
                .collect();
            for d in dependents {
                self.delete(shared, &d, true);
            }
        }
        gone
    }

    pub(super) fn kind_of(&self, res: &Res) -> String {
        if let Some(k) = self.kinds.get(res) {
            return k.clone();
        }
        // A guess for types never seen: "widgets" -> "Widget".
        let singular = res.plural.strip_suffix('s').unwrap_or(&res.plural);
        let mut c = singular.chars();
        match c.next() {
            Some(f) => f.to_uppercase().chain(c).collect(),
            None => String::new(),
        }
    }
}
