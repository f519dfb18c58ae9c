//! WATCH: the events after a resourceVersion, filtered by the watch's
//! resource, namespace and selector, with bookmarks, timeouts and 410 Expired.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::Shared;
use super::http::{Target, bad_request};
use super::read::in_scope;
use super::selector::Selector;
use super::store::EventType;

pub(super) struct Watching {
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

pub(super) fn line(v: &Value) -> Bytes {
    let mut s = serde_json::to_vec(v).unwrap_or_default();
    s.push(b'\n');
    Bytes::from(s)
}

/// `{"type": ty, "object": object}` and a newline, around the stored
/// object's JSON (made once per version, whatever the number of watches).
pub(super) fn event_line(ty: &str, json: &Bytes) -> Bytes {
    let mut s = Vec::with_capacity(json.len() + ty.len() + 24);
    s.extend_from_slice(b"{\"type\":\"");
    s.extend_from_slice(ty.as_bytes());
    s.extend_from_slice(b"\",\"object\":");
    s.extend_from_slice(json);
    s.extend_from_slice(b"}\n");
    Bytes::from(s)
}

pub(super) fn expired(rv: u64, oldest: u64) -> Value {
    json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {rv} ({oldest})"),
        "reason": "Expired", "code": 410,
    }})
}

impl Watching {
    pub(super) fn bookmark(&self, initial_end: bool) -> Value {
        let mut meta = json!({"resourceVersion": self.cursor.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"type": "BOOKMARK", "object": {
            "apiVersion": self.t.res.api_version(), "kind": self.kind, "metadata": meta,
        }})
    }

    /// Queue the events after the cursor that this watch sees.
    pub(super) fn collect(&mut self) {
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

    pub(super) async fn next(mut self) -> Option<(Bytes, Watching)> {
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

pub(super) fn start_watch(
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
