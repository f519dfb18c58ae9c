//! Object metadata as the API server keeps and checks it: the server's own
//! fields a write cannot change, and the label rules a write must follow.

use serde_json::{Value, json};

pub(super) fn now_time() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Keep uid, creationTimestamp, generation and deletionTimestamp of the stored object.
pub(super) fn keep_server_metadata(new: &mut Value, old: &Value) {
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

/// What the API server's object-metadata validation refuses: label keys and values
/// that are not qualified names / label values (a value at most 63 characters,
/// alphanumerics at both ends, `-`, `_`, `.` inside).
pub(super) fn metadata_problems(meta: &Value) -> Option<String> {
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

pub(super) fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}
