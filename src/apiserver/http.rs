//! What a URL names, and the answers every handler gives: `Status` objects
//! for errors, stored objects as their JSON.

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::store::Stored;
use super::{Res, Shared};

pub(super) fn status_response(
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

pub(super) fn not_found(res: &Res, name: &str) -> Response {
    status_response(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", res.qualified()),
        Some(res),
        name,
    )
}

/// A write made against a resourceVersion that is no longer the stored one.
pub(super) fn conflict(res: &Res, name: &str) -> Response {
    status_response(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            res.qualified()
        ),
        Some(res),
        name,
    )
}

/// A write whose object validation refuses.
pub(super) fn invalid(res: &Res, name: &str, message: String) -> Response {
    status_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        message,
        Some(res),
        name,
    )
}

pub(super) fn bad_request(message: String) -> Response {
    status_response(StatusCode::BAD_REQUEST, "BadRequest", message, None, "")
}

pub(super) fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

/// A stored object as the answer: its JSON, made once per version.
pub(super) fn stored_response(code: StatusCode, v: &Stored) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.json()).into_response()
}

/// What a URL names.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) res: Res,
    /// Some for a namespaced URL.
    pub(super) ns: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

pub(super) fn parse_path(path: &str) -> Option<Target> {
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

pub(super) type AppState = (Arc<Shared>, watch::Receiver<bool>);
