//! An in-memory Kubernetes API server that kube's real client talks to, over
//! real HTTP on loopback ([`ApiServer::start`]) or in the same process with no
//! socket ([`ApiServer::in_process`]): watches, resourceVersions and patches
//! go through the same client code a cluster uses. The tests use it, and so
//! does `vramguard simulate`, which runs the webhook, operator and agents on
//! it under simulated time.
//!
//! It is generic over resources by URL: `/api/v1/...` (core) and
//! `/apis/{group}/{version}/...`, namespaced (`namespaces/{ns}/{plural}`) and
//! cluster-scoped (`{plural}`). Supported:
//!
//! - LIST (`resourceVersion` in the list metadata; `limit`/`continue` pages
//!   in key order, each page read from the current state and carrying the
//!   first page's resourceVersion), with `labelSelector`
//!   (`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`) and
//!   `fieldSelector` on `metadata.name` / `metadata.namespace`;
//! - WATCH (`watch=true`): newline-delimited `{"type","object"}` events after
//!   `resourceVersion`, held open until `timeoutSeconds`; with no
//!   resourceVersion, `0`, or `sendInitialEvents=true` it first sends the
//!   current objects as ADDED; BOOKMARKs when `allowWatchBookmarks=true`
//!   (after the initial events with the `k8s.io/initial-events-end`
//!   annotation, and whenever the stream is idle for a second); an ERROR 410
//!   `Expired` event for a resourceVersion older than [`ApiServer::compact`];
//!   label selectors applied per event the way the API server does (an
//!   object that stops matching is sent as DELETED);
//! - GET, CREATE (POST; 409 `AlreadyExists`; `generateName`), replace (PUT),
//!   server-side APPLY (PATCH `application/apply-patch+yaml`, creating the
//!   object when missing), merge PATCH (`application/merge-patch+json`;
//!   `strategic-merge-patch+json` is treated as a merge patch), JSON PATCH
//!   (`add`, `remove`, `replace`, `test`);
//! - the `status` subresource (GET, PUT, PATCH): writes to the main resource
//!   keep the stored status, writes to `/status` change only the status
//!   (every resource is treated as having a status subresource unless
//!   [`ApiServer::without_status_subresource`] says otherwise);
//! - optimistic concurrency: a write carrying `metadata.resourceVersion` that
//!   is not the stored one is a 409 `Conflict`;
//! - `metadata.generation` bumped when anything outside metadata and status
//!   changes; uid, creationTimestamp kept;
//! - DELETE (and DELETE on a collection): with finalizers it sets
//!   `deletionTimestamp` and the object goes when the last finalizer is
//!   removed; owner references are garbage-collected in the background
//!   (unless `propagationPolicy=Orphan`);
//! - `dryRun=All` writes that answer but store nothing;
//! - `pods/{name}/log` from text set with [`ApiServer::set_log`]
//!   (`tailLines`, `limitBytes`);
//! - errors as `Status` objects (404 `NotFound`, 409, 400, 422, 405);
//! - `Accept: ...;as=PartialObjectMetadata(List)` for the metadata API.
//!
//! Every write bumps one global resourceVersion and emits a watch event.
//! Simplification: server-side apply merges the applied object into the
//! stored one like a JSON merge patch; it keeps no managedFields, so it never
//! removes fields a manager stopped applying and never reports conflicts.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

mod patch;
mod status;
use patch::json_patch;
pub use patch::merge_patch;

/// A resource type as the URL names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Res {
    pub group: String,
    pub version: String,
    pub plural: String,
}

impl Res {
    pub fn new(group: &str, version: &str, plural: &str) -> Res {
        Res {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
        }
    }

    pub fn of<K: Resource<DynamicType = ()>>() -> Res {
        Res::new(&K::group(&()), &K::version(&()), &K::plural(&()))
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `gpunodes.vramguard.io`, as Status messages name it.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// One request as it reached the server.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

type Key = (Res, String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    res: Res,
    ns: String,
    ty: EventType,
    old: Option<Value>,
    /// What a selector reads of the object as this event stored it.
    view: Value,
    /// The object's JSON as this event stored it (shared with the store and
    /// every reader: no copy). Only the JSON: a version the store has moved
    /// past keeps no parsed copy in the history, a third of its size.
    json: Bytes,
}

/// One version of an object as stored, and its JSON, written once when first
/// asked for: every GET, write answer and watch event of this version sends
/// the same bytes, so a GpuNode published and watched by several clients is
/// serialized once, not once per reader, and no reader copies the object.
#[derive(Debug)]
struct Stored {
    /// `apiVersion`, `kind` and `metadata`: all that selectors, owner
    /// references, finalizers and preconditions read.
    head: Value,
    json: Bytes,
}

impl Stored {
    /// The object kept as its JSON and its head only: a parsed copy of every
    /// object would triple what a day of ten thousand jobs keeps.
    fn new(value: Value) -> Arc<Stored> {
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

    fn json(&self) -> Bytes {
        self.json.clone()
    }

    /// The whole object, read back from its JSON.
    fn value(&self) -> Value {
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
struct Inner {
    rv: u64,
    /// Events at or below this resourceVersion are gone (410 for watches from there).
    compacted: u64,
    next_uid: u64,
    objects: BTreeMap<Key, Arc<Stored>>,
    events: Vec<Event>,
    kinds: HashMap<Res, String>,
    no_status_subresource: HashSet<Res>,
    logs: HashMap<(String, String), String>,
    requests: Vec<Request>,
    /// Keep no request log (a long simulation makes millions of requests).
    no_request_log: bool,
    /// Keep at most about this many events; older ones are compacted away.
    history_limit: Option<usize>,
}

struct Shared {
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    /// Bumped to end every open watch.
    epoch: watch::Sender<u64>,
    bookmark_every: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How a server keeps its history.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Record every request for [`ApiServer::requests`].
    pub request_log: bool,
    /// Keep at most about this many watch events (None: all); a watch
    /// further behind gets 410 Expired and relists, as after compaction.
    pub history_limit: Option<usize>,
    /// An idle watch gets a BOOKMARK this often (when it asked for them).
    pub bookmark_every: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            request_log: true,
            history_limit: None,
            bookmark_every: Duration::from_secs(1),
        }
    }
}

/// The running server; dropping it ends its watches and stops it.
pub struct ApiServer {
    /// `http://127.0.0.1:PORT`, or `in-process:` when no socket is bound.
    pub url: String,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    /// The router itself, when clients call it in process.
    router: Option<Router>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl ApiServer {
    /// Serve over HTTP on a loopback port.
    pub async fn start() -> ApiServer {
        let (shared, router, shutdown) = ApiServer::parts(Options::default());
        let mut stop = shutdown.subscribe();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
        });
        ApiServer {
            url,
            shared,
            shutdown,
            router: None,
        }
    }

    /// A server that clients call in the same process, with no socket: every
    /// request still goes through kube's client and this server's HTTP
    /// handling, and nothing waits on I/O, so paused tokio time can run it.
    pub fn in_process(options: Options) -> ApiServer {
        let (shared, router, shutdown) = ApiServer::parts(options);
        ApiServer {
            url: "in-process:".into(),
            shared,
            shutdown,
            router: Some(router),
        }
    }

    fn parts(options: Options) -> (Arc<Shared>, Router, watch::Sender<bool>) {
        let (changed, _) = watch::channel(0);
        let (epoch, _) = watch::channel(0);
        let mut inner = Inner {
            no_request_log: !options.request_log,
            history_limit: options.history_limit,
            ..Inner::default()
        };
        for (g, v, p, k) in [
            ("", "v1", "nodes", "Node"),
            ("", "v1", "pods", "Pod"),
            ("", "v1", "namespaces", "Namespace"),
            ("", "v1", "services", "Service"),
            ("", "v1", "events", "Event"),
            ("", "v1", "configmaps", "ConfigMap"),
            ("", "v1", "secrets", "Secret"),
            ("batch", "v1", "jobs", "Job"),
            ("coordination.k8s.io", "v1", "leases", "Lease"),
            ("events.k8s.io", "v1", "events", "Event"),
            ("vramguard.io", "v1alpha1", "gpunodes", "GpuNode"),
            ("vramguard.io", "v1alpha1", "trainingjobs", "TrainingJob"),
            (
                "vramguard.io",
                "v1alpha1",
                "memoryprofiles",
                "MemoryProfile",
            ),
        ] {
            inner.kinds.insert(Res::new(g, v, p), k.into());
        }
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            changed,
            epoch,
            bookmark_every: options.bookmark_every,
        });
        let (shutdown, _) = watch::channel(false);
        let router = Router::new()
            .fallback(handle)
            .with_state((shared.clone(), shutdown.subscribe()));
        (shared, router, shutdown)
    }

    /// kube's real client for this server (default namespace "default").
    pub fn client(&self) -> kube::Client {
        if let Some(router) = &self.router {
            return kube::Client::new(router.clone(), "default");
        }
        let config = kube::Config::new(self.url.parse().expect("server url"));
        kube::Client::try_from(config).expect("kube client")
    }

    /// Create or replace an object directly (no HTTP, no status rules), as
    /// a cluster already holding it would; emits a watch event. Returns the
    /// stored object with its resourceVersion.
    pub fn put<K>(&self, obj: &K) -> K
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
        K::Scope: 'static,
    {
        let res = Res::of::<K>();
        let namespaced = std::any::TypeId::of::<K::Scope>()
            == std::any::TypeId::of::<k8s_openapi::NamespaceResourceScope>();
        let mut value = serde_json::to_value(obj).expect("serialize");
        let ns = if namespaced {
            obj.meta()
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into())
        } else {
            String::new()
        };
        let name = obj.meta().name.clone().expect("put needs metadata.name");
        value["metadata"]["name"] = json!(name);
        let stored = self.put_value(
            &res,
            &K::kind(&()),
            namespaced.then_some(ns.as_str()),
            value,
        );
        serde_json::from_value(stored).expect("deserialize")
    }

    /// [`ApiServer::put`] for a resource no Rust type names (Kueue's
    /// Workloads, a JobSet): `obj` stored as `kind` of `res`, in `namespace`
    /// or cluster-scoped.
    pub fn put_value(
        &self,
        res: &Res,
        kind: &str,
        namespace: Option<&str>,
        mut value: Value,
    ) -> Value {
        let ns = namespace.unwrap_or("").to_string();
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .expect("put needs metadata.name")
            .to_string();
        let mut inner = self.shared.lock();
        inner.kinds.insert(res.clone(), kind.to_string());
        value["apiVersion"] = json!(res.api_version());
        value["kind"] = json!(kind);
        if namespace.is_some() {
            value["metadata"]["namespace"] = json!(ns);
        }
        let key = (res.clone(), ns, name);
        let old = inner.objects.get(&key).cloned();
        let stored = match old {
            Some(old) => {
                keep_server_metadata(&mut value, &old);
                inner.commit(&self.shared, &key, Some(value), false)
            }
            None => {
                inner.init_metadata(&mut value);
                inner.commit(&self.shared, &key, Some(value), false)
            }
        };
        stored.expect("stored").value()
    }

    /// [`ApiServer::get`] for a resource no Rust type names.
    pub fn get_value(&self, res: &Res, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = (
            res.clone(),
            namespace.unwrap_or("").to_string(),
            name.to_string(),
        );
        self.shared.lock().objects.get(&key).map(|s| s.value())
    }

    /// The stored object, if any.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let key = (
            Res::of::<K>(),
            namespace.unwrap_or("").to_string(),
            name.to_string(),
        );
        let v = self.shared.lock().objects.get(&key).cloned()?;
        Some(serde_json::from_slice(&v.json).expect("deserialize"))
    }

    /// Delete an object as `DELETE` would (finalizers and owner references
    /// honoured); false when it did not exist.
    pub fn delete<K>(&self, namespace: Option<&str>, name: &str) -> bool
    where
        K: Resource<DynamicType = ()>,
    {
        let key = (
            Res::of::<K>(),
            namespace.unwrap_or("").to_string(),
            name.to_string(),
        );
        let mut inner = self.shared.lock();
        if !inner.objects.contains_key(&key) {
            return false;
        }
        inner.delete(&self.shared, &key, true);
        true
    }

    /// Every stored object of a type, in key order (namespace, name).
    pub fn objects<K>(&self) -> Vec<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let res = Res::of::<K>();
        self.shared
            .lock()
            .objects
            .iter()
            .filter(|((r, _, _), _)| *r == res)
            .map(|(_, v)| serde_json::from_slice(&v.json).expect("deserialize"))
            .collect()
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.lock().requests.clone()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// The log text `GET .../pods/{name}/log` returns.
    pub fn set_log(&self, namespace: &str, pod: &str, text: &str) {
        self.shared
            .lock()
            .logs
            .insert((namespace.into(), pod.into()), text.into());
    }

    /// Treat writes to this resource's main path as able to change its status.
    pub fn without_status_subresource(&self, res: Res) {
        self.shared.lock().no_status_subresource.insert(res);
    }

    /// Forget the event history: watches from an older resourceVersion get
    /// 410 Expired, as after etcd compaction.
    pub fn compact(&self) {
        let mut inner = self.shared.lock();
        inner.compacted = inner.rv;
        inner.events.clear();
        drop(inner);
        self.shared.changed.send_modify(|_| {});
    }

    /// End every open watch (clients re-watch from their last resourceVersion).
    pub fn close_watches(&self) {
        self.shared.epoch.send_modify(|e| *e += 1);
    }
}

// ---------------------------------------------------------------------------
// Storage
// ---------------------------------------------------------------------------

fn now_time() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Keep uid, creationTimestamp, generation and deletionTimestamp of the stored object.
fn keep_server_metadata(new: &mut Value, old: &Value) {
    if !new["metadata"].is_object() {
        new["metadata"] = json!({});
    }
    for f in [
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        match old["metadata"].get(f) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
}

/// Do `a` and `b` differ beyond metadata and status (compared in place:
/// this runs on every write, and the objects can be large)?
fn differs_beyond_meta_and_status(a: &Value, b: &Value) -> bool {
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
fn selector_view(v: &Value) -> Value {
    let m = &v["metadata"];
    json!({"metadata": {
        "name": m["name"],
        "namespace": m["namespace"],
        "labels": m["labels"],
    }})
}

impl Inner {
    fn init_metadata(&mut self, v: &mut Value) {
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
    fn commit(
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
    fn delete(&mut self, shared: &Shared, key: &Key, cascade: bool) -> Option<Arc<Stored>> {
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

    fn kind_of(&self, res: &Res) -> String {
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

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Clone, Debug, Default)]
struct Selector {
    labels: Vec<Req>,
    name: Option<String>,
    namespace: Option<String>,
}

/// Split on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let s = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(s.split(',').map(|v| v.trim().to_string()).collect())
}

fn parse_labels(s: &str) -> Result<Vec<Req>, String> {
    let mut out = Vec::new();
    for term in split_top(s) {
        let req = if let Some(k) = term.strip_prefix('!') {
            Req::NotExists(k.trim().into())
        } else if let Some((k, v)) = term.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once("==") {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once('=') {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once(" notin ") {
            Req::NotIn(k.trim().into(), set_values(v).ok_or(term.clone())?)
        } else if let Some((k, v)) = term.split_once(" in ") {
            Req::In(k.trim().into(), set_values(v).ok_or(term.clone())?)
        } else if term.contains(char::is_whitespace) {
            return Err(term);
        } else {
            Req::Exists(term)
        };
        out.push(req);
    }
    Ok(out)
}

impl Selector {
    fn from_query(q: &HashMap<String, String>) -> Result<Selector, String> {
        let mut sel = Selector::default();
        if let Some(l) = q.get("labelSelector") {
            sel.labels =
                parse_labels(l).map_err(|t| format!("unable to parse requirement: {t}"))?;
        }
        if let Some(f) = q.get("fieldSelector") {
            for term in split_top(f) {
                let (k, v) = term
                    .split_once("==")
                    .or_else(|| term.split_once('='))
                    .ok_or_else(|| format!("invalid field selector: {term}"))?;
                match k.trim() {
                    "metadata.name" => sel.name = Some(v.trim().into()),
                    "metadata.namespace" => sel.namespace = Some(v.trim().into()),
                    other => {
                        return Err(format!(
                            "field label not supported by the test API server: {other}"
                        ));
                    }
                }
            }
        }
        Ok(sel)
    }

    fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        if let Some(n) = &self.name
            && meta["name"].as_str() != Some(n)
        {
            return false;
        }
        if let Some(n) = &self.namespace
            && meta["namespace"].as_str().unwrap_or("") != n
        {
            return false;
        }
        let label = |k: &str| meta["labels"].get(k).and_then(|v| v.as_str());
        self.labels.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v),
            Req::Ne(k, v) => label(k) != Some(v),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
            Req::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
        })
    }
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

fn status_response(
    code: StatusCode,
    reason: &str,
    message: String,
    res: Option<&Res>,
    name: &str,
) -> Response {
    let mut details = json!({});
    if let Some(r) = res {
        details = json!({"name": name, "group": r.group, "kind": r.plural});
    }
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn not_found(res: &Res, name: &str) -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", res.qualified()),
        Some(res),
        name,
    )
}

fn bad_request(message: String) -> Response {
    status_response(StatusCode::BAD_REQUEST, "BadRequest", message, None, "")
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

/// A stored object as the answer: its JSON, made once per version.
fn stored_response(code: StatusCode, v: &Stored) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.json()).into_response()
}

/// What a URL names.
#[derive(Debug)]
struct Target {
    res: Res,
    /// Some for a namespaced URL.
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, rest @ ..]
            if !(rest.is_empty() && ["status", "finalize"].contains(plural)) =>
        {
            (Some(ns.to_string()), {
                let mut v = vec![*plural];
                v.extend_from_slice(rest);
                v
            })
        }
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    if plural.is_empty() {
        return None;
    }
    Some(Target {
        res: Res::new(group, version, plural),
        ns,
        name,
        sub,
    })
}

type AppState = (Arc<Shared>, watch::Receiver<bool>);

async fn handle(
    State((shared, shutdown)): State<AppState>,
    method: Method,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let parsed_body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            // Apply bodies are YAML; kube sends JSON, which is YAML too.
            Err(_) => match std::str::from_utf8(&body)
                .ok()
                .and_then(|s| serde_saphyr::from_str::<Value>(s).ok())
            {
                Some(v) => v,
                None => return bad_request("the body is neither JSON nor YAML".into()),
            },
        }
    };
    {
        let mut inner = shared.lock();
        if !inner.no_request_log {
            inner.requests.push(Request {
                method: method.clone(),
                path: uri.path().to_string(),
                query: uri.query().unwrap_or("").to_string(),
                content_type: content_type.clone(),
                body: parsed_body.clone(),
            });
        }
    }
    if uri.path() == "/version" {
        return json_response(
            StatusCode::OK,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-vramguard-test", "platform": "linux/amd64"}),
        );
    }
    let Some(t) = parse_path(uri.path()) else {
        return status_response(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({})",
                uri.path()
            ),
            None,
            "",
        );
    };
    let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    match (&method, &t.name) {
        (&Method::GET, None) if watch => start_watch(&shared, shutdown, &t, &q),
        (&Method::GET, None) => list(&shared, &t, &q, &accept),
        (&Method::GET, Some(_)) => get(&shared, &t, &q, &accept),
        (&Method::POST, None) => create(&shared, &t, parsed_body, dry_run),
        (&Method::PUT, Some(_)) => write(&shared, &t, Write::Replace(parsed_body), dry_run),
        (&Method::PATCH, Some(_)) => {
            let ct = content_type.split(';').next().unwrap_or("").trim();
            let w = match ct {
                "application/apply-patch+yaml" => {
                    if !q.contains_key("fieldManager") {
                        return bad_request(
                            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
                        );
                    }
                    Write::Apply(parsed_body)
                }
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    Write::Merge(parsed_body)
                }
                "application/json-patch+json" => Write::Json(parsed_body),
                other => {
                    return status_response(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format: {other}"),
                        None,
                        "",
                    );
                }
            };
            write(&shared, &t, w, dry_run)
        }
        (&Method::DELETE, Some(_)) => delete(&shared, &t, &q, &parsed_body, dry_run),
        (&Method::DELETE, None) => delete_collection(&shared, &t, &q, dry_run),
        _ => status_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {})",
                uri.path()
            ),
            None,
            "",
        ),
    }
}

fn as_metadata(v: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": v["metadata"].clone(),
    })
}

fn in_scope(t: &Target, key: &Key) -> bool {
    key.0 == t.res && t.ns.as_ref().is_none_or(|ns| *ns == key.1)
}

fn list(shared: &Shared, t: &Target, q: &HashMap<String, String>, accept: &str) -> Response {
    let sel = match Selector::from_query(q) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    let inner = shared.lock();
    let metadata_only = accept.contains("as=PartialObjectMetadataList");
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    // `continue`: "<resourceVersion of the first page> <namespace>/<name> of the last item".
    let (list_rv, after) = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => match c.split_once(' ') {
            Some((rv, key)) => (rv.to_string(), Some(key.to_string())),
            None => return bad_request(format!("invalid continue token {c:?}")),
        },
        None => (inner.rv.to_string(), None),
    };
    let mut last = None;
    let mut more = false;
    // Each item's JSON as stored (made once per version), not a copy of it.
    let mut items: Vec<Bytes> = Vec::new();
    for (k, v) in inner.objects.iter() {
        if !in_scope(t, k) || !sel.matches(v) {
            continue;
        }
        let key = format!("{}/{}", k.1, k.2);
        if after.as_ref().is_some_and(|a| key.as_str() <= a.as_str()) {
            continue;
        }
        if items.len() == limit {
            more = true;
            break;
        }
        items.push(if metadata_only {
            Bytes::from(as_metadata(v).to_string())
        } else {
            v.json()
        });
        last = Some(key);
    }
    let mut metadata = json!({"resourceVersion": list_rv});
    if more && let Some(last) = last {
        metadata["continue"] = json!(format!("{list_rv} {last}"));
    }
    let (api_version, kind) = if metadata_only {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (
            t.res.api_version(),
            format!("{}List", inner.kind_of(&t.res)),
        )
    };
    let head = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": metadata,
    })
    .to_string();
    // `{"apiVersion":…,"metadata":{…},"items":[…]}`, the items' JSON as stored.
    let mut body =
        Vec::with_capacity(head.len() + 16 + items.iter().map(Bytes::len).sum::<usize>());
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(item);
    }
    body.extend_from_slice(b"]}");
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn key_of(t: &Target) -> Key {
    (
        t.res.clone(),
        t.ns.clone().unwrap_or_default(),
        t.name.clone().unwrap_or_default(),
    )
}

fn get(shared: &Shared, t: &Target, q: &HashMap<String, String>, accept: &str) -> Response {
    let name = t.name.clone().unwrap_or_default();
    let inner = shared.lock();
    let Some(obj) = inner.objects.get(&key_of(t)) else {
        return not_found(&t.res, &name);
    };
    match t.sub.as_deref() {
        None | Some("status") => {
            if accept.contains("as=PartialObjectMetadata") {
                json_response(StatusCode::OK, &as_metadata(obj))
            } else {
                stored_response(StatusCode::OK, obj)
            }
        }
        Some("log") if t.res.plural == "pods" => {
            let text = inner
                .logs
                .get(&(t.ns.clone().unwrap_or_default(), name))
                .cloned()
                .unwrap_or_default();
            let mut text = text.as_str();
            if let Some(n) = q.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
                let lines: Vec<&str> = text.split_inclusive('\n').collect();
                let skip = lines.len().saturating_sub(n);
                let start: usize = lines[..skip].iter().map(|l| l.len()).sum();
                text = &text[start..];
            }
            let mut out = text.to_string();
            if let Some(n) = q.get("limitBytes").and_then(|n| n.parse::<usize>().ok()) {
                let mut end = n.min(out.len());
                while !out.is_char_boundary(end) {
                    end -= 1;
                }
                out.truncate(end);
            }
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], out).into_response()
        }
        Some(other) => not_found(&t.res, &format!("{name}/{other}")),
    }
}

/// What the API server's object-metadata validation refuses: label keys and values
/// that are not qualified names / label values (a value at most 63 characters,
/// alphanumerics at both ends, `-`, `_`, `.` inside).
fn metadata_problems(meta: &Value) -> Option<String> {
    let labels = meta["labels"].as_object()?;
    for (k, v) in labels {
        let Some(v) = v.as_str() else {
            return Some(format!(
                "metadata.labels: Invalid value: {k}: must be a string"
            ));
        };
        let (prefix, name) = k.rsplit_once('/').unwrap_or(("", k));
        if !label_value_ok(name) || name.is_empty() || prefix.len() > 253 {
            return Some(format!(
                "metadata.labels: Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters"
            ));
        }
        if !label_value_ok(v) {
            return Some(format!(
                "metadata.labels: Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, must be no more than 63 characters"
            ));
        }
    }
    None
}

fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

fn create(shared: &Shared, t: &Target, mut body: Value, dry_run: bool) -> Response {
    if !body.is_object() {
        return bad_request("the body is not an object".into());
    }
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    if let Some(problem) = metadata_problems(&body["metadata"]) {
        return status_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            problem,
            Some(&t.res),
            body["metadata"]["name"].as_str().unwrap_or_default(),
        );
    }
    let mut inner = shared.lock();
    if body["metadata"]["name"]
        .as_str()
        .is_none_or(|n| n.is_empty())
    {
        match body["metadata"]["generateName"].as_str() {
            Some(prefix) => {
                let name = format!("{prefix}{:05x}", inner.next_uid + 1);
                body["metadata"]["name"] = json!(name);
            }
            None => {
                return status_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required".into(),
                    Some(&t.res),
                    "",
                );
            }
        }
    }
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(ns) = &t.ns {
        body["metadata"]["namespace"] = json!(ns);
    }
    let key = (
        t.res.clone(),
        t.ns.clone().unwrap_or_default(),
        name.clone(),
    );
    if inner.objects.contains_key(&key) {
        return status_response(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.res.qualified()),
            Some(&t.res),
            &name,
        );
    }
    if let Some(k) = body["kind"].as_str() {
        inner.kinds.insert(t.res.clone(), k.to_string());
    }
    body["apiVersion"] = json!(t.res.api_version());
    body["kind"] = json!(inner.kind_of(&t.res));
    if !inner.no_status_subresource.contains(&t.res)
        && let Some(m) = body.as_object_mut()
    {
        m.remove("status");
    }
    inner.init_metadata(&mut body);
    if dry_run {
        return json_response(StatusCode::CREATED, &body);
    }
    match inner.commit(shared, &key, Some(body), false) {
        Some(v) => stored_response(StatusCode::CREATED, &v),
        None => bad_request("nothing stored".into()),
    }
}

enum Write {
    Replace(Value),
    Apply(Value),
    Merge(Value),
    Json(Value),
}

fn write(shared: &Shared, t: &Target, w: Write, dry_run: bool) -> Response {
    let name = t.name.clone().unwrap_or_default();
    let key = key_of(t);
    let status_only = match t.sub.as_deref() {
        None => false,
        Some("status") => true,
        Some(other) => return not_found(&t.res, &format!("{name}/{other}")),
    };
    let mut inner = shared.lock();
    let old = inner.objects.get(&key).cloned();
    let w = match (status_only, &old, w) {
        (true, Some(old), Write::Apply(Value::Object(p)) | Write::Merge(Value::Object(p))) => {
            return status::write_status(shared, &mut inner, t, &key, old, p, dry_run);
        }
        (_, _, w) => w,
    };
    let old_value = old.as_ref().map(|o| o.value());
    // The precondition a body may carry.
    let wanted_rv = match &w {
        Write::Replace(b) | Write::Apply(b) | Write::Merge(b) => b["metadata"]["resourceVersion"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        Write::Json(_) => None,
    };
    let (mut new, created) = match (old_value.as_ref(), w) {
        (None, Write::Apply(body)) if !status_only => {
            let mut b = body;
            if !b.is_object() {
                return bad_request("the applied body is not an object".into());
            }
            if !b["metadata"].is_object() {
                b["metadata"] = json!({});
            }
            b["metadata"]["name"] = json!(name);
            inner.init_metadata(&mut b);
            (b, true)
        }
        (None, _) => return not_found(&t.res, &name),
        (Some(_), Write::Replace(body)) => {
            if !body.is_object() {
                return bad_request("the body is not an object".into());
            }
            if let Some(n) = body["metadata"]["name"].as_str()
                && n != name
            {
                return bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                ));
            }
            (body, false)
        }
        (Some(old), Write::Apply(patch) | Write::Merge(patch)) => {
            (patch::merged(old, patch), false)
        }
        (Some(old), Write::Json(ops)) => {
            let mut o = old.clone();
            if let Err(e) = json_patch(&mut o, &ops) {
                return status_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    e,
                    Some(&t.res),
                    &name,
                );
            }
            (o, false)
        }
    };
    if let (Some(want), Some(old)) = (&wanted_rv, &old)
        && old["metadata"]["resourceVersion"].as_str() != Some(want.as_str())
    {
        return status_response(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                t.res.qualified()
            ),
            Some(&t.res),
            &name,
        );
    }
    if !new["metadata"].is_object() {
        new["metadata"] = json!({});
    }
    if let Some(problem) = metadata_problems(&new["metadata"]) {
        return status_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            problem,
            Some(&t.res),
            &name,
        );
    }
    new["metadata"]["name"] = json!(name);
    if let Some(ns) = &t.ns {
        new["metadata"]["namespace"] = json!(ns);
    }
    if let Some(k) = new["kind"].as_str()
        && inner.kinds.get(&t.res).map(String::as_str) != Some(k)
    {
        inner.kinds.insert(t.res.clone(), k.to_string());
    }
    new["apiVersion"] = json!(t.res.api_version());
    new["kind"] = json!(inner.kind_of(&t.res));
    if let Some(old) = &old {
        keep_server_metadata(&mut new, old);
        if status_only {
            // Only the status changes, through the subresource.
            let status = new.as_object_mut().and_then(|m| m.remove("status"));
            let mut o = Map::new();
            if let Some(m) = old_value.as_ref().and_then(Value::as_object) {
                for (k, v) in m {
                    if k != "status" {
                        o.insert(k.clone(), v.clone());
                    }
                }
            }
            if let Some(s) = status {
                o.insert("status".into(), s);
            }
            new = Value::Object(o);
        } else if !inner.no_status_subresource.contains(&t.res) {
            match old_value.as_ref().and_then(|o| o.get("status")) {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
    } else if !inner.no_status_subresource.contains(&t.res)
        && let Some(m) = new.as_object_mut()
    {
        m.remove("status");
    }
    if dry_run {
        return json_response(StatusCode::OK, &new);
    }
    // A write that changes nothing is no change: no new resourceVersion, no
    // watch event (as the API server does; an agent re-applying the same
    // spec every interval must not wake every watcher).
    if let Some(old) = &old {
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if Some(&new) == old_value.as_ref() {
            return stored_response(StatusCode::OK, old);
        }
    }
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let bump = matches!(&old_value, Some(o) if differs_beyond_meta_and_status(o, &new));
    let stored = inner.commit(shared, &key, Some(new), bump);
    status::committed(shared, &mut inner, t, &key, stored, code)
}

fn delete(
    shared: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    body: &Value,
    dry_run: bool,
) -> Response {
    let name = t.name.clone().unwrap_or_default();
    if t.sub.is_some() {
        return not_found(&t.res, &name);
    }
    let key = key_of(t);
    let mut inner = shared.lock();
    let Some(obj) = inner.objects.get(&key).cloned() else {
        return not_found(&t.res, &name);
    };
    if let Some(want) = body["preconditions"]["resourceVersion"].as_str()
        && obj["metadata"]["resourceVersion"].as_str() != Some(want)
    {
        return status_response(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Precondition failed for {} \"{name}\"", t.res.qualified()),
            Some(&t.res),
            &name,
        );
    }
    if dry_run {
        return stored_response(StatusCode::OK, &obj);
    }
    let policy = q
        .get("propagationPolicy")
        .cloned()
        .or_else(|| body["propagationPolicy"].as_str().map(str::to_string));
    let cascade = policy.as_deref() != Some("Orphan");
    match inner.delete(shared, &key, cascade) {
        Some(v) => stored_response(StatusCode::OK, &v),
        None => not_found(&t.res, &name),
    }
}

fn delete_collection(
    shared: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    dry_run: bool,
) -> Response {
    let sel = match Selector::from_query(q) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    let mut inner = shared.lock();
    let keys: Vec<Key> = inner
        .objects
        .iter()
        .filter(|(k, v)| in_scope(t, k) && sel.matches(v))
        .map(|(k, _)| k.clone())
        .collect();
    let mut items = Vec::new();
    for k in keys {
        let v = if dry_run {
            inner.objects.get(&k).cloned()
        } else {
            inner.delete(shared, &k, true)
        };
        items.extend(v.map(|s| s.value()));
    }
    let kind = format!("{}List", inner.kind_of(&t.res));
    json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": t.res.api_version(),
            "kind": kind,
            "metadata": {"resourceVersion": inner.rv.to_string()},
            "items": items,
        }),
    )
}

// ---------------------------------------------------------------------------
// Watch
// ---------------------------------------------------------------------------

struct Watching {
    shared: Arc<Shared>,
    t: Target,
    sel: Selector,
    cursor: u64,
    /// Lines ready to send.
    pending: VecDeque<Bytes>,
    changed: watch::Receiver<u64>,
    epoch: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    deadline: Option<tokio::time::Instant>,
    bookmarks: bool,
    kind: String,
    done: bool,
}

fn line(v: &Value) -> Bytes {
    let mut s = serde_json::to_vec(v).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

/// `{"type": ty, "object": object}` and a newline, around the stored
/// object's JSON (made once per version, whatever the number of watches).
fn event_line(ty: &str, json: &Bytes) -> Bytes {
    let mut s = Vec::with_capacity(json.len() + ty.len() + 24);
    s.extend_from_slice(b"{\"type\":\"");
    s.extend_from_slice(ty.as_bytes());
    s.extend_from_slice(b"\",\"object\":");
    s.extend_from_slice(json);
    s.extend_from_slice(b"}\n");
    Bytes::from(s)
}

fn expired(rv: u64, oldest: u64) -> Value {
    json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {rv} ({oldest})"),
        "reason": "Expired", "code": 410,
    }})
}

impl Watching {
    fn bookmark(&self, initial_end: bool) -> Value {
        let mut meta = json!({"resourceVersion": self.cursor.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"type": "BOOKMARK", "object": {
            "apiVersion": self.t.res.api_version(), "kind": self.kind, "metadata": meta,
        }})
    }

    /// Queue the events after the cursor that this watch sees.
    fn collect(&mut self) {
        let inner = self.shared.lock();
        if self.cursor < inner.compacted {
            self.pending
                .push_back(line(&expired(self.cursor, inner.compacted)));
            self.done = true;
            return;
        }
        let start = inner.events.partition_point(|e| e.rv <= self.cursor);
        for e in &inner.events[start..] {
            if e.res != self.t.res || self.t.ns.as_ref().is_some_and(|ns| *ns != e.ns) {
                continue;
            }
            let was = e.old.as_ref().is_some_and(|o| self.sel.matches(o));
            let is = self.sel.matches(&e.view);
            let ty = match (e.ty, was, is) {
                (EventType::Deleted, true, _) => "DELETED",
                (EventType::Deleted, false, _) => continue,
                (_, false, true) => "ADDED",
                (_, true, true) => "MODIFIED",
                (_, true, false) => "DELETED",
                (_, false, false) => continue,
            };
            self.pending.push_back(event_line(ty, &e.json));
        }
        self.cursor = inner.rv;
    }

    async fn next(mut self) -> Option<(Bytes, Watching)> {
        loop {
            if let Some(l) = self.pending.pop_front() {
                return Some((l, self));
            }
            if self.done || *self.shutdown.borrow() {
                return None;
            }
            self.collect();
            if !self.pending.is_empty() {
                continue;
            }
            let deadline = self.deadline;
            let until_deadline = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.changed.changed() => if r.is_err() { return None },
                _ = self.epoch.changed() => return None,
                _ = self.shutdown.changed() => return None,
                () = until_deadline => return None,
                () = tokio::time::sleep(self.shared.bookmark_every) => {
                    if self.bookmarks {
                        let b = self.bookmark(false);
                        self.pending.push_back(line(&b));
                    }
                }
            }
        }
    }
}

fn start_watch(
    shared: &Arc<Shared>,
    shutdown: watch::Receiver<bool>,
    t: &Target,
    q: &HashMap<String, String>,
) -> Response {
    let sel = match Selector::from_query(q) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let send_initial = q.get("sendInitialEvents").is_some_and(|s| s == "true");
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|s| s == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let mut pending = VecDeque::new();
    let inner = shared.lock();
    let kind = inner.kind_of(&t.res);
    let cursor = if rv.is_empty() || rv == "0" || send_initial {
        for (k, v) in &inner.objects {
            if in_scope(t, k) && sel.matches(v) {
                pending.push_back(event_line("ADDED", &v.json()));
            }
        }
        inner.rv
    } else {
        match rv.parse::<u64>() {
            Ok(n) => n,
            Err(_) => return bad_request(format!("invalid resourceVersion {rv}")),
        }
    };
    drop(inner);
    let target = Target {
        res: t.res.clone(),
        ns: t.ns.clone(),
        name: None,
        sub: None,
    };
    let mut w = Watching {
        shared: shared.clone(),
        t: target,
        sel,
        cursor,
        pending,
        changed: shared.changed.subscribe(),
        epoch: shared.epoch.subscribe(),
        shutdown,
        deadline: timeout,
        bookmarks,
        kind,
        done: false,
    };
    if send_initial && bookmarks {
        let b = w.bookmark(true);
        w.pending.push_back(line(&b));
    }
    let stream = futures::stream::unfold(w, Watching::next).map(Ok::<Bytes, Infallible>);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

use futures::StreamExt;
