//! Patches: RFC 7386 merge patches and RFC 6902 JSON patches on stored
//! objects.

use serde_json::{Map, Value};

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn pointer_parts(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("bad JSON pointer {path}"))?;
    Ok(rest
        .split('/')
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect())
}

pub(super) fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("a JSON patch is an array")?;
    for op in ops {
        let path = op["path"].as_str().ok_or("op without path")?;
        let mut parts = pointer_parts(path)?;
        let last = parts.pop().ok_or("op on the whole document")?;
        let parent_path = parts
            .iter()
            .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
            .collect::<String>();
        let parent = target
            .pointer_mut(&parent_path)
            .ok_or_else(|| format!("path {path} does not exist"))?;
        match op["op"].as_str() {
            Some("add") | Some("replace") => {
                let value = op["value"].clone();
                match parent {
                    Value::Object(m) => {
                        if op["op"] == "replace" && !m.contains_key(&last) {
                            return Err(format!("path {path} does not exist"));
                        }
                        m.insert(last, value);
                    }
                    Value::Array(a) => {
                        if last == "-" {
                            a.push(value);
                        } else {
                            let i: usize = last.parse().map_err(|_| format!("bad index {last}"))?;
                            if op["op"] == "replace" {
                                *a.get_mut(i).ok_or("index out of range")? = value;
                            } else if i <= a.len() {
                                a.insert(i, value);
                            } else {
                                return Err("index out of range".into());
                            }
                        }
                    }
                    _ => return Err(format!("path {path} is not in a container")),
                }
            }
            Some("remove") => match parent {
                Value::Object(m) => {
                    m.remove(&last)
                        .ok_or_else(|| format!("path {path} does not exist"))?;
                }
                Value::Array(a) => {
                    let i: usize = last.parse().map_err(|_| format!("bad index {last}"))?;
                    if i >= a.len() {
                        return Err("index out of range".into());
                    }
                    a.remove(i);
                }
                _ => return Err(format!("path {path} is not in a container")),
            },
            Some("test") => {
                let cur = match parent {
                    Value::Object(m) => m.get(&last),
                    Value::Array(a) => last.parse::<usize>().ok().and_then(|i| a.get(i)),
                    _ => None,
                };
                if cur != Some(&op["value"]) {
                    return Err(format!("test failed at {path}"));
                }
            }
            other => return Err(format!("unsupported JSON patch op {other:?}")),
        }
    }
    Ok(())
}

/// `patch` merged into a copy of `target` (RFC 7386), without copying what
/// the patch replaces: an agent's status write replaces nearly the whole
/// stored status, which a copy of the stored object then merged would copy
/// first and throw away.
pub(super) fn merged(target: &Value, patch: Value) -> Value {
    let Value::Object(p) = patch else {
        return patch;
    };
    let old = target.as_object();
    let mut out = Map::new();
    if let Some(o) = old {
        for (k, v) in o {
            if !p.contains_key(k) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    for (k, v) in p {
        if v.is_null() {
            continue;
        }
        let base = old.and_then(|o| o.get(&k)).unwrap_or(&Value::Null);
        let v = merged(base, v);
        out.insert(k, v);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `merged` is `merge_patch` on a copy: objects merged key by key,
    /// nulls removing, anything else replacing, a non-object target or
    /// patch replaced whole.
    #[test]
    fn merged_is_a_merge_patch_on_a_copy() {
        let target = json!({
            "a": 1, "b": {"c": [1, 2], "d": "x", "e": {"f": true}}, "g": "keep", "h": [3],
        });
        let patches = [
            json!({"a": null, "b": {"c": [9], "e": {"f": null, "n": 2}}, "z": {"y": null}}),
            json!({"g": {"now": "object"}, "h": null, "b": "flat"}),
            json!(["not", "an", "object"]),
            json!({}),
        ];
        for patch in patches {
            let mut want = target.clone();
            merge_patch(&mut want, &patch);
            assert_eq!(merged(&target, patch.clone()), want, "{patch}");
        }
        assert_eq!(
            merged(&json!(7), json!({"a": null, "b": 1})),
            json!({"b": 1})
        );
    }
}
