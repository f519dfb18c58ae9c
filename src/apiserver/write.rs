//! Writes: CREATE, replace, merge, apply and JSON patches, DELETE and
//! DELETE on a collection.

use std::collections::HashMap;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::http::{
    Target, bad_request, conflict, invalid, json_response, not_found, status_response,
    stored_response,
};
use super::meta::{keep_server_metadata, metadata_problems};
use super::patch::{self, json_patch};
use super::read::{in_scope, key_of};
use super::selector::Selector;
use super::store::differs_beyond_meta_and_status;
use super::store::{Inner, Stored};
use super::{Key, Shared, status};

pub(super) fn create(shared: &Shared, t: &Target, mut body: Value, dry_run: bool) -> Response {
    if !body.is_object() {
        return bad_request("the body is not an object".into());
    }
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    if let Some(problem) = metadata_problems(&body["metadata"]) {
        return invalid(
            &t.res,
            body["metadata"]["name"].as_str().unwrap_or_default(),
            problem,
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
                return invalid(
                    &t.res,
                    "",
                    "metadata.name: Required value: name or generateName is required".into(),
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

pub(super) enum Write {
    Replace(Value),
    Apply(Value),
    Merge(Value),
    Json(Value),
}

pub(super) fn write(shared: &Shared, t: &Target, w: Write, dry_run: bool) -> Response {
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
    let (mut new, created) = match proposed(&mut inner, t, old_value.as_ref(), w, status_only) {
        Ok(p) => p,
        Err(answer) => return *answer,
    };
    if let (Some(want), Some(old)) = (&wanted_rv, &old)
        && old["metadata"]["resourceVersion"].as_str() != Some(want.as_str())
    {
        return conflict(&t.res, &name);
    }
    if !new["metadata"].is_object() {
        new["metadata"] = json!({});
    }
    if let Some(problem) = metadata_problems(&new["metadata"]) {
        return invalid(&t.res, &name, problem);
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
    keep_stored(
        &inner,
        t,
        &mut new,
        old.as_deref(),
        old_value.as_ref(),
        status_only,
    );
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

/// The object a write proposes, before the stored parts are put back, and
/// whether it creates one (an apply of a missing object); the answer when
/// the write cannot be made.
fn proposed(
    inner: &mut Inner,
    t: &Target,
    old: Option<&Value>,
    w: Write,
    status_only: bool,
) -> Result<(Value, bool), Box<Response>> {
    let name = t.name.clone().unwrap_or_default();
    let made = match (old, w) {
        (None, Write::Apply(body)) if !status_only => {
            let mut b = body;
            if !b.is_object() {
                return Err(Box::new(bad_request(
                    "the applied body is not an object".into(),
                )));
            }
            if !b["metadata"].is_object() {
                b["metadata"] = json!({});
            }
            b["metadata"]["name"] = json!(name);
            inner.init_metadata(&mut b);
            (b, true)
        }
        (None, _) => return Err(Box::new(not_found(&t.res, &name))),
        (Some(_), Write::Replace(body)) => {
            if !body.is_object() {
                return Err(Box::new(bad_request("the body is not an object".into())));
            }
            if let Some(n) = body["metadata"]["name"].as_str()
                && n != name
            {
                return Err(Box::new(bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                ))));
            }
            (body, false)
        }
        (Some(old), Write::Apply(patch) | Write::Merge(patch)) => {
            (patch::merged(old, patch), false)
        }
        (Some(old), Write::Json(ops)) => {
            let mut o = old.clone();
            if let Err(e) = json_patch(&mut o, &ops) {
                return Err(Box::new(status_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    e,
                    Some(&t.res),
                    &name,
                )));
            }
            (o, false)
        }
    };
    Ok(made)
}

/// Put back what a write cannot change: the server's metadata, and the
/// status (a write to the object) or everything but the status (a write to
/// `/status`); a created object starts with no status.
fn keep_stored(
    inner: &Inner,
    t: &Target,
    new: &mut Value,
    old: Option<&Stored>,
    old_value: Option<&Value>,
    status_only: bool,
) {
    if let Some(old) = old {
        keep_server_metadata(new, old);
        if status_only {
            // Only the status changes, through the subresource.
            let status = new.as_object_mut().and_then(|m| m.remove("status"));
            let mut o = Map::new();
            if let Some(m) = old_value.and_then(Value::as_object) {
                for (k, v) in m {
                    if k != "status" {
                        o.insert(k.clone(), v.clone());
                    }
                }
            }
            if let Some(s) = status {
                o.insert("status".into(), s);
            }
            *new = Value::Object(o);
        } else if !inner.no_status_subresource.contains(&t.res) {
            match old_value.and_then(|o| o.get("status")) {
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
}

pub(super) fn delete(
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

pub(super) fn delete_collection(
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
