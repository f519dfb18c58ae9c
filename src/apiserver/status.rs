//! A merge or apply patch on the `status` subresource of a stored object:
//! the write every agent heartbeat and every operator status update makes.
//! Only the status can change, so the stored object is read once and its
//! status replaced in place: nothing outside the status is copied, merged or
//! compared, and the write is a no-op exactly when the merged status equals
//! the stored one. The answers (409, 422, the no-op, the finalizer rule) are
//! those of the general write path in `mod.rs`.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::http::{Target, conflict, invalid, json_response, not_found, stored_response};
use super::meta::metadata_problems;
use super::patch::merged;
use super::store::{Inner, Stored};
use super::{Key, Shared};

/// `patch` (an object) merged into the status of `old`; the caller has
/// checked that the target is `/status` and the patch is a merge or apply.
pub(super) fn write_status(
    shared: &Shared,
    inner: &mut Inner,
    t: &Target,
    key: &Key,
    old: &Arc<Stored>,
    mut patch: serde_json::Map<String, Value>,
    dry_run: bool,
) -> Response {
    let name = t.name.clone().unwrap_or_default();
    let wanted_rv = patch
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    if let Some(want) = wanted_rv
        && old["metadata"]["resourceVersion"].as_str() != Some(want)
    {
        return conflict(&t.res, &name);
    }
    // The patch's metadata is validated as a write to the object would be,
    // then dropped: a status write keeps the stored metadata.
    let metadata = match patch.remove("metadata") {
        None => None,
        Some(Value::Null) => Some(json!({})),
        Some(m) => Some(merged(&old["metadata"], m))
            .filter(Value::is_object)
            .or_else(|| Some(json!({}))),
    };
    if let Some(problem) = metadata_problems(metadata.as_ref().unwrap_or(&old["metadata"])) {
        return invalid(&t.res, &name, problem);
    }
    let kind = match patch.get("kind") {
        None => old["kind"].as_str(),
        Some(k) => k.as_str(),
    };
    if let Some(k) = kind
        && inner.kinds.get(&t.res).map(String::as_str) != Some(k)
    {
        inner.kinds.insert(t.res.clone(), k.to_string());
    }
    let mut new = old.value();
    let status = match patch.remove("status") {
        None => new.get("status").cloned(),
        Some(Value::Null) => None,
        Some(s) => Some(merged(new.get("status").unwrap_or(&Value::Null), s)),
    };
    let unchanged = new.get("status") == status.as_ref();
    if let Some(m) = new.as_object_mut() {
        match status {
            Some(s) => m.insert("status".into(), s),
            None => m.remove("status"),
        };
    }
    if dry_run {
        return json_response(StatusCode::OK, &new);
    }
    // A write that changes nothing is no change: no new resourceVersion, no
    // watch event.
    if unchanged {
        return stored_response(StatusCode::OK, old);
    }
    let stored = inner.commit(shared, key, Some(new), false);
    committed(shared, inner, t, key, stored, StatusCode::OK)
}

/// The answer to a write that stored `stored`; the last finalizer removed
/// from an object being deleted: it goes now.
pub(super) fn committed(
    shared: &Shared,
    inner: &mut Inner,
    t: &Target,
    key: &Key,
    stored: Option<Arc<Stored>>,
    code: StatusCode,
) -> Response {
    if let Some(s) = &stored
        && s["metadata"]["deletionTimestamp"].is_string()
        && s["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty())
    {
        inner.delete(shared, key, true);
    }
    match stored {
        Some(v) => stored_response(code, &v),
        None => not_found(&t.res, t.name.as_deref().unwrap_or_default()),
    }
}
