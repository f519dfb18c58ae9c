//! Reads: LIST (pages, selectors, the metadata API) and GET (objects, their
//! status, pod logs).

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::http::{Target, bad_request, json_response, not_found, stored_response};
use super::selector::Selector;
use super::{Key, Shared};

pub(super) fn as_metadata(v: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": v["metadata"].clone(),
    })
}

pub(super) fn in_scope(t: &Target, key: &Key) -> bool {
    key.0 == t.res && t.ns.as_ref().is_none_or(|ns| *ns == key.1)
}

pub(super) fn list(
    shared: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    accept: &str,
) -> Response {
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

pub(super) fn key_of(t: &Target) -> Key {
    (
        t.res.clone(),
        t.ns.clone().unwrap_or_default(),
        t.name.clone().unwrap_or_default(),
    )
}

pub(super) fn get(
    shared: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    accept: &str,
) -> Response {
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
