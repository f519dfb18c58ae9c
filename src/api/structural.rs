//! A document checked against the CRD's own OpenAPI schema before it is
//! deserialized, so that every problem is reported at once (types, enums,
//! ranges, unknown and missing fields), each with its path and what would be
//! valid. The schema is the one `vramguard crds` prints and the API server
//! enforces, so the CLI, the webhook and the API server cannot disagree on
//! the shape of a spec.
//!
//! This walks a Kubernetes *structural* schema (what a CRD must have): `type`,
//! `properties`, `additionalProperties`, `items`, `enum`, `minimum`/`maximum`,
//! `required`, `nullable` and `x-kubernetes-preserve-unknown-fields`. A general
//! JSON Schema validator does not know `nullable` or preserve-unknown-fields,
//! and it accepts fields a schema does not list, which the API server prunes
//! and our types refuse: here they are errors that list the known names.

use std::sync::OnceLock;

use kube::CustomResourceExt;
use serde_json::{Map, Value};

use super::training_job::TrainingJob;
use super::validate::FieldError;

/// Errors collected for one document before the rest are only counted.
pub const MAX_SCHEMA_ERRORS: usize = 64;
/// Deepest nesting walked (a hostile document can nest far deeper than any schema).
const MAX_DEPTH: usize = 64;

/// The `spec` schema of the served TrainingJob version.
pub fn training_job_spec_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let crd = TrainingJob::crd();
        crd.spec
            .versions
            .first()
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok())
            .and_then(|s| s.pointer("/properties/spec").cloned())
            .unwrap_or(Value::Null)
    })
}

/// Every way `value` breaks `schema`, each under `path` (e.g. `spec`).
pub fn check(value: &Value, schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut more = 0usize;
    walk(value, schema, path, 0, &mut errs, &mut more);
    if more > 0 {
        errs.push(FieldError {
            path: path.to_string(),
            reason: format!("... and {more} more problems against the schema"),
        });
    }
    errs
}

fn push(errs: &mut Vec<FieldError>, more: &mut usize, path: &str, reason: String) {
    if errs.len() < MAX_SCHEMA_ERRORS {
        errs.push(FieldError {
            path: path.to_string(),
            reason,
        });
    } else {
        *more += 1;
    }
}

/// `value` as a user would recognise it in an error, shortened.
pub fn shown(value: &Value) -> String {
    let text = match value {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "nothing (null)".to_string(),
        Value::Object(_) => "a map".to_string(),
        Value::Array(_) => "a list".to_string(),
        other => other.to_string(),
    };
    if text.len() > 80 {
        let mut end = 77;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &text[..end])
    } else {
        text
    }
}

fn type_words(t: &str, format: Option<&str>) -> &'static str {
    match (t, format) {
        ("integer", Some(f)) if f.starts_with("uint") => "a whole number (0 or more)",
        ("integer", _) => "a whole number",
        ("number", _) => "a number",
        ("string", _) => "a string",
        ("boolean", _) => "true or false",
        ("object", _) => "a map of fields",
        ("array", _) => "a list",
        _ => "a value of another type",
    }
}

fn type_fits(value: &Value, t: &str) -> bool {
    match t {
        "integer" => match value {
            Value::Number(n) => n.is_i64() || n.is_u64(),
            _ => false,
        },
        "number" => value.is_number(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        _ => true,
    }
}

/// `value` made to pass `schema` where it can, so that the validator can still check the
/// rest of a spec the schema refused: numbers out of range are moved to the nearest bound,
/// and fields of the wrong type, unknown fields and values outside an enum are taken out.
pub fn repaired(value: &Value, schema: &Value) -> Value {
    let mut v = value.clone();
    repair(&mut v, schema, 0);
    v
}

fn repair(value: &mut Value, schema: &Value, depth: usize) {
    let Value::Object(s) = schema else { return };
    if depth > MAX_DEPTH {
        return;
    }
    if let Value::Object(map) = value {
        let props = s.get("properties").and_then(Value::as_object);
        let preserve = s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            let field = props.and_then(|p| p.get(&key));
            let Some(field) = field else {
                if !preserve && s.get("additionalProperties").is_none() && props.is_some() {
                    map.remove(&key);
                }
                continue;
            };
            let child = map.get_mut(&key).expect("the key was just listed");
            if fits_type(child, field) {
                clamp(child, field);
                repair(child, field, depth + 1);
            } else {
                map.remove(&key);
            }
        }
    }
}

fn fits_type(value: &Value, schema: &Value) -> bool {
    if value.is_null() {
        return schema.get("nullable") == Some(&Value::Bool(true));
    }
    let typed = schema
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(|t| type_fits(value, t));
    let listed = schema
        .get("enum")
        .and_then(Value::as_array)
        .is_none_or(|o| o.contains(value));
    typed && listed
}

/// The range a number must fall in: `minimum`/`maximum`, and 0 at least for an unsigned
/// `format` (the API server's reading of `uint*`).
fn bounds(schema: &Value) -> (Option<f64>, Option<f64>) {
    let unsigned = schema
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| f.starts_with("uint"));
    let min = schema.get("minimum").and_then(Value::as_f64);
    let min = min.or(unsigned.then_some(0.0));
    (min, schema.get("maximum").and_then(Value::as_f64))
}

fn clamp(value: &mut Value, schema: &Value) {
    let Some(x) = value.as_f64() else { return };
    let (lo, hi) = bounds(schema);
    let y = match (lo, hi) {
        (Some(l), _) if x < l => l,
        (_, Some(h)) if x > h => h,
        _ => return,
    };
    let integer = schema.get("type").and_then(Value::as_str) == Some("integer");
    *value = if integer {
        serde_json::json!(y as i64)
    } else {
        serde_json::json!(y)
    };
}

/// What a boolean given for an on/off enum is written as.
fn boolean_hint(value: &Value, options: &[Value]) -> String {
    let has = |v: &str| options.iter().any(|o| o == v);
    match value {
        Value::Bool(true) if has("full") => " (true is written full)".into(),
        Value::Bool(false) if has("none") => " (false is written none)".into(),
        _ => String::new(),
    }
}

/// Why `value` is not one of an enum's `options`, with the values to use.
fn not_listed(value: &Value, options: &[Value]) -> String {
    format!(
        "{} is not one of the allowed values; use one of {}{}",
        shown(value),
        enum_words(options),
        boolean_hint(value, options)
    )
}

/// The allowed values of an enum, as a user reads them: `none | full | ...`.
pub fn enum_words(options: &[Value]) -> String {
    options
        .iter()
        .map(|o| match o {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn walk(
    value: &Value,
    schema: &Value,
    path: &str,
    depth: usize,
    errs: &mut Vec<FieldError>,
    more: &mut usize,
) {
    let Value::Object(s) = schema else { return };
    if depth > MAX_DEPTH {
        push(
            errs,
            more,
            path,
            format!("nested deeper than {MAX_DEPTH} levels; no field of a TrainingJob is"),
        );
        return;
    }
    if value.is_null() {
        if s.get("nullable") == Some(&Value::Bool(true)) {
            return;
        }
        if let Some(Value::String(t)) = s.get("type") {
            let format = s.get("format").and_then(Value::as_str);
            push(
                errs,
                more,
                path,
                format!(
                    "empty (null); expected {}, or leave the field out",
                    type_words(t, format)
                ),
            );
        }
        return;
    }
    if let Some(Value::String(t)) = s.get("type")
        && !type_fits(value, t)
    {
        let format = s.get("format").and_then(Value::as_str);
        let preserved = s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let reason = match s.get("enum") {
            Some(Value::Array(options)) => not_listed(value, options),
            None if preserved && value.is_string() && t == "object" => format!(
                "{} is a name, not the object itself: paste the JSON object here \
                     (JSON is YAML), e.g. the whole of a Hugging Face config.json under this key",
                shown(value)
            ),
            _ if matches!(t.as_str(), "integer" | "number")
                && value
                    .as_str()
                    .is_some_and(|v| v.trim().parse::<f64>().is_ok_and(f64::is_finite)) =>
            {
                format!("{} is text; write the number without quotes", shown(value))
            }
            _ if t == "integer"
                && value
                    .as_f64()
                    .is_some_and(|x| x.fract() == 0.0 && x.abs() >= 1.8e19) =>
            {
                format!(
                    "{} is too large; the largest whole number is 18446744073709551615",
                    shown(value)
                )
            }
            _ => format!("{} is not {}", shown(value), type_words(t, format)),
        };
        push(errs, more, path, reason);
        return;
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && !options.contains(value)
    {
        push(errs, more, path, not_listed(value, options));
        return;
    }
    if let Some(x) = value.as_f64() {
        let (min, max) = bounds(schema);
        let range = match (min, max) {
            (Some(lo), Some(hi)) => format!("from {} to {}", num(lo), num(hi)),
            (Some(lo), None) => format!("{} or more", num(lo)),
            (None, Some(hi)) => format!("at most {}", num(hi)),
            (None, None) => String::new(),
        };
        if min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m) {
            push(
                errs,
                more,
                path,
                format!("{} is out of range; use a value {range}", shown(value)),
            );
        }
    }
    match value {
        Value::Object(map) => object(map, s, path, depth, errs, more),
        Value::Array(items) => {
            if let Some(item) = s.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(v, item, &format!("{path}[{i}]"), depth + 1, errs, more);
                }
            }
        }
        _ => {}
    }
}

/// A schema bound as a user writes it: `1`, not `1.0`.
pub fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

fn object(
    map: &Map<String, Value>,
    s: &Map<String, Value>,
    path: &str,
    depth: usize,
    errs: &mut Vec<FieldError>,
    more: &mut usize,
) {
    let preserve = s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let props = s.get("properties").and_then(Value::as_object);
    if let Some(Value::Array(required)) = s.get("required") {
        for r in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(r) {
                push(
                    errs,
                    more,
                    &format!("{path}.{r}"),
                    "missing; this field is required".into(),
                );
            }
        }
    }
    for (key, v) in map {
        let sub = format!("{path}.{key}");
        match props.and_then(|p| p.get(key)) {
            Some(field) => walk(v, field, &sub, depth + 1, errs, more),
            None => match s.get("additionalProperties") {
                Some(extra @ Value::Object(_)) => walk(v, extra, &sub, depth + 1, errs, more),
                _ if preserve || props.is_none() => {}
                _ => {
                    let known: Vec<&str> = props
                        .map(|p| p.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    let hint = closest(key, &known)
                        .map(|c| format!("did you mean {c}? "))
                        .unwrap_or_default();
                    push(
                        errs,
                        more,
                        &sub,
                        format!(
                            "unknown field; {hint}known fields here: {}",
                            known.join(", ")
                        ),
                    );
                }
            },
        }
    }
}

/// The known name within two edits of `key` (case ignored), if one is.
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let key = key.to_ascii_lowercase();
    known
        .iter()
        .map(|k| {
            let lower = k.to_ascii_lowercase();
            // `hidden` for `hiddenSize`: a known name the key begins.
            let d = if key.len() >= 4 && lower.starts_with(&key) {
                1
            } else {
                edits(&key, &lower)
            };
            (d, *k)
        })
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != b[j]))
                .min(row[j] + 1)
                .min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errs(spec: Value) -> Vec<String> {
        check(&spec, training_job_spec_schema(), "spec")
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn the_schema_is_found() {
        assert!(
            training_job_spec_schema()
                .pointer("/properties/training")
                .is_some()
        );
    }

    #[test]
    fn every_type_error_is_reported_at_once() {
        let e = errs(json!({
            "model": {"preset": "gpt2"},
            "training": {"microBatchSize": -2, "sequenceLength": "lots"},
            "parallelism": {"gpus": 0}
        }));
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e.iter()
                .any(|l| l.starts_with("spec.training.microBatchSize: -2 is out of range"))
        );
        assert!(e.iter().any(|l| {
            l.starts_with("spec.training.sequenceLength: \"lots\" is not a whole number")
        }));
        assert!(e.iter().any(|l| {
            l.contains("spec.parallelism.gpus: 0 is out of range; use a value 1 or more")
        }));
    }

    #[test]
    fn an_enum_lists_its_values_in_words() {
        let e = errs(
            json!({"model": {"preset": "gpt2"}, "training": {"gradientCheckpointing": "yes"}}),
        );
        assert_eq!(
            e,
            [
                "spec.training.gradientCheckpointing: \"yes\" is not one of the allowed values; use one of none | selective | op-selective | full"
            ]
        );
    }

    #[test]
    fn a_boolean_for_checkpointing_says_how_to_write_it() {
        let e =
            errs(json!({"model": {"preset": "gpt2"}, "training": {"gradientCheckpointing": true}}));
        assert_eq!(
            e,
            [
                "spec.training.gradientCheckpointing: true is not one of the allowed values; use one of none | selective | op-selective | full (true is written full)"
            ]
        );
    }

    #[test]
    fn a_file_name_for_hf_config_says_to_inline_it() {
        let e = errs(json!({"model": {"hfConfig": "config.json"}}));
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("spec.model.hfConfig: \"config.json\" is a name, not the object itself: paste the JSON object here"), "{e:?}");
    }

    #[test]
    fn unknown_fields_name_the_closest_known_one() {
        let e = errs(json!({"model": {"preset": "gpt2"}, "training": {"microBatchsize": 2}}));
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with(
                "spec.training.microBatchsize: unknown field; did you mean microBatchSize?"
            ),
            "{e:?}"
        );
    }

    #[test]
    fn preserved_objects_and_nullable_fields_pass() {
        let e = errs(json!({
            "model": {"hfConfig": {"model_type": "llama", "anything": [1, 2]}},
            "parallelism": {"gpusPerNode": null}
        }));
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn nesting_and_error_counts_are_bounded() {
        let mut deep = json!(1);
        for _ in 0..100 {
            deep = json!([deep]);
        }
        let unknown: Map<String, Value> =
            (0..1000).map(|i| (format!("f{i}"), deep.clone())).collect();
        let e = errs(json!({"model": {"preset": "gpt2"}, "training": unknown}));
        assert_eq!(e.len(), MAX_SCHEMA_ERRORS + 1);
        assert!(
            e[MAX_SCHEMA_ERRORS].contains(&format!("{} more problems", 1000 - MAX_SCHEMA_ERRORS))
        );
    }
}
