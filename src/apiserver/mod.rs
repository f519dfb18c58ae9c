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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::Response;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;

mod http;
mod meta;
mod patch;
mod read;
mod selector;
mod status;
mod store;
mod watches;
mod write;
pub use patch::merge_patch;

use http::{AppState, bad_request, json_response, parse_path, status_response};
use meta::keep_server_metadata;
use read::{get, list};
use store::Inner;
use watches::start_watch;
use write::{Write, create, delete, delete_collection, write};

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

/// An object's place in the store: its resource, namespace and name.
type Key = (Res, String, String);

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
