//! Reading `TrainingJob` and `GpuNode` objects from user YAML or JSON: one
//! or several documents, each checked for apiVersion, kind and unknown
//! fields, with errors that name the field path. No I/O: callers pass text.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::gpu_node::{GpuNode, GpuNodeSpec, GpuNodeStatus};
use super::training_job::{TrainingJob, TrainingJobSpec, TrainingJobStatus};
use super::validate::FieldError;

/// The API version both resources are served at.
pub const API_VERSION: &str = "vramguard.io/v1alpha1";

/// Why a document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The text is not YAML (or JSON).
    #[error("not valid YAML: {0}")]
    Syntax(String),
    /// Valid YAML past one of the reader's limits.
    #[error("{0}")]
    TooLarge(String),
    /// No document in the input.
    #[error("the input holds no document")]
    Empty,
    /// A document has the wrong shape.
    #[error("{}", fields_to_string(.0))]
    Fields(Vec<FieldError>),
}

fn fields_to_string(f: &[FieldError]) -> String {
    super::validate::errors_to_string(f)
}

/// Split text into its YAML documents (empty ones skipped).
///
/// `.nan` and `.inf` are read as the strings `".nan"`, `".inf"`, `"-.inf"`: a JSON value
/// cannot hold them, and as strings they reach the typed step, whose error names the field
/// (`spec.fitPolicy.safetyMargin: invalid type: string ".nan", expected f64`) instead of
/// failing the whole input with a line and column.
pub fn documents(text: &str) -> Result<Vec<Value>, ParseError> {
    let options = serde_saphyr::options! {
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::AsString,
    };
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options).map_err(
        |e| match limit_reached(&e) {
            Some(why) => ParseError::TooLarge(why),
            None => ParseError::Syntax(syntax_message(&e)),
        },
    )?;
    if docs.is_empty() {
        return Err(ParseError::Empty);
    }
    Ok(docs)
}

/// The reader's own limits (serde-saphyr's default budget): valid YAML past one of them
/// is refused as too large, naming the limit, its value and what to do.
fn limit_reached(e: &serde_saphyr::Error) -> Option<String> {
    use serde_saphyr::budget::BudgetBreach as B;
    let inner = unwrapped(e);
    if inner.to_string().contains("recursion limit exceeded") {
        // The scanner's own bound on nested brackets, before the depth budget.
        return Some(format!(
            "too large: vramguard reads at most {} levels of nesting; no TrainingJob or \
             GpuNode nests that deep; check the brackets",
            serde_saphyr::Budget::default().max_depth
        ));
    }
    let serde_saphyr::Error::Budget { breach, .. } = inner else {
        return None;
    };
    // The limits as the reader applies them: the options above leave its default budget.
    let budget = serde_saphyr::Budget::default();
    let (what, limit, fix) = match breach {
        B::Documents { .. } => ("documents per file", budget.max_documents, "split the file"),
        B::Depth { .. } => (
            "levels of nesting",
            budget.max_depth,
            "no TrainingJob or GpuNode nests that deep; check the indentation",
        ),
        B::Nodes { .. } => (
            "values (maps, lists and scalars) per file",
            budget.max_nodes,
            "split the file",
        ),
        B::Events { .. } => ("YAML events per file", budget.max_events, "split the file"),
        B::Aliases { .. } => (
            "aliases (*name)",
            budget.max_aliases,
            "write the values out",
        ),
        B::Anchors { .. } => (
            "anchors (&name)",
            budget.max_anchors,
            "write the values out",
        ),
        B::AliasAnchorRatio { .. } => (
            "aliases per anchor (beyond the first 100 aliases)",
            budget.alias_anchor_ratio_multiplier,
            "write the values out instead of repeating aliases",
        ),
        B::MergeKeys { .. } => (
            "merge keys (<<)",
            budget.max_merge_keys,
            "write the values out",
        ),
        B::ScalarBytes { .. } => (
            "MiB of text in values",
            budget.max_total_scalar_bytes >> 20,
            "split the file",
        ),
        _ => {
            return Some(format!(
                "the YAML is larger than vramguard reads ({breach:?}); split the file"
            ));
        }
    };
    Some(format!(
        "too large: vramguard reads at most {} {what}; {fix}",
        thousands(limit)
    ))
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// The error under the reader's snippet and alias wrappers.
fn unwrapped(mut e: &serde_saphyr::Error) -> &serde_saphyr::Error {
    while let serde_saphyr::Error::WithSnippet { error, .. }
    | serde_saphyr::Error::AliasError { error, .. } = e
    {
        e = error;
    }
    e
}

/// One line per problem, without source snippets or advice about the library's options.
fn syntax_message(e: &serde_saphyr::Error) -> String {
    if let serde_saphyr::Error::DuplicateMappingKey { key, location } = unwrapped(e) {
        let key = key
            .as_deref()
            .map(|k| format!("{k:?}"))
            .unwrap_or_else(|| "a key".to_string());
        return super::validate::clip(format!(
            "{key} appears twice in one map (line {}, column {}); keep one of the two",
            location.line(),
            location.column()
        ));
    }
    super::validate::clip(
        e.to_string()
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
    )
}

fn field(path: &str, reason: impl Into<String>) -> FieldError {
    FieldError {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// Deserialize `value` as `T`, naming the failing field under `prefix`.
pub fn typed<T: DeserializeOwned>(value: Value, prefix: &str) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let inner = e.path().to_string();
        let path = if inner == "." {
            prefix.to_string()
        } else {
            format!("{prefix}.{inner}")
        };
        field(&path, e.into_inner().to_string())
    })
}

/// Check apiVersion, kind and the top-level keys; return the object's map.
fn envelope(doc: Value, kind: &str) -> Result<serde_json::Map<String, Value>, Vec<FieldError>> {
    let Value::Object(map) = doc else {
        return Err(vec![field(
            ".",
            format!("expected a {kind} object, found {}", type_name(&doc)),
        )]);
    };
    let mut errs = Vec::new();
    match map.get("apiVersion") {
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(v) => errs.push(field(
            "apiVersion",
            format!("{v} is not served; use {API_VERSION}"),
        )),
        None => errs.push(field("apiVersion", format!("missing; use {API_VERSION}"))),
    }
    match map.get("kind") {
        Some(Value::String(k)) if k == kind => {}
        Some(v) => errs.push(field("kind", format!("{v} is not a {kind}"))),
        None => errs.push(field("kind", format!("missing; use {kind}"))),
    }
    for key in map.keys() {
        if !matches!(
            key.as_str(),
            "apiVersion" | "kind" | "metadata" | "spec" | "status"
        ) {
            errs.push(field(
                key,
                "unknown field; expected apiVersion, kind, metadata, spec, status",
            ));
        }
    }
    if errs.is_empty() { Ok(map) } else { Err(errs) }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The object's metadata.name, for messages about a document.
pub fn document_name(doc: &Value) -> Option<String> {
    doc.get("metadata")?
        .get("name")?
        .as_str()
        .map(str::to_string)
}

/// Read one document as a `TrainingJob`.
pub fn training_job(doc: Value) -> Result<TrainingJob, ParseError> {
    let mut map = envelope(doc, "TrainingJob").map_err(ParseError::Fields)?;
    let mut errs = Vec::new();
    let metadata: ObjectMeta = match map.remove("metadata") {
        None => ObjectMeta::default(),
        Some(v) => typed(v, "metadata").unwrap_or_else(|e| {
            errs.push(e);
            ObjectMeta::default()
        }),
    };
    let spec: Option<TrainingJobSpec> = match map.remove("spec") {
        None => {
            errs.push(field("spec", "missing; a TrainingJob needs spec.model"));
            None
        }
        Some(v) => {
            // Every problem against the CRD's schema at once; serde would stop at the first.
            let schema = super::structural::training_job_spec_schema();
            let found = super::structural::check(&v, schema, "spec");
            if found.is_empty() {
                typed(v, "spec").map_err(|e| errs.push(e)).ok()
            } else {
                // The rest of the spec, without the values the schema refused, still gets
                // the validator's checks, so that one run reports every problem.
                let rest = super::structural::repaired(&v, schema);
                let more = typed::<TrainingJobSpec>(rest, "spec")
                    .ok()
                    .and_then(|spec| super::validate::validate(&spec).err())
                    .map(|e| e.0)
                    .unwrap_or_default();
                let refused = |p: &str| found.iter().any(|f| p.starts_with(f.path.as_str()));
                let more: Vec<FieldError> =
                    more.into_iter().filter(|m| !refused(&m.path)).collect();
                errs.extend(found);
                errs.extend(more);
                None
            }
        }
    };
    let status: Option<TrainingJobStatus> = match map.remove("status") {
        None | Some(Value::Null) => None,
        Some(v) => typed(v, "status").map_err(|e| errs.push(e)).ok(),
    };
    match spec {
        Some(spec) if errs.is_empty() => Ok(TrainingJob {
            metadata,
            spec,
            status,
        }),
        _ => Err(ParseError::Fields(errs)),
    }
}

/// Read one document as a `GpuNode`.
pub fn gpu_node(doc: Value) -> Result<GpuNode, ParseError> {
    let mut map = envelope(doc, "GpuNode").map_err(ParseError::Fields)?;
    let mut errs = Vec::new();
    let metadata: ObjectMeta = match map.remove("metadata") {
        None => ObjectMeta::default(),
        Some(v) => typed(v, "metadata").unwrap_or_else(|e| {
            errs.push(e);
            ObjectMeta::default()
        }),
    };
    let spec: Option<GpuNodeSpec> = match map.remove("spec") {
        None => {
            errs.push(field("spec", "missing; a GpuNode needs spec.nodeName"));
            None
        }
        Some(v) => typed(v, "spec").map_err(|e| errs.push(e)).ok(),
    };
    let status: Option<GpuNodeStatus> = match map.remove("status") {
        None | Some(Value::Null) => None,
        Some(v) => typed(v, "status").map_err(|e| errs.push(e)).ok(),
    };
    match spec {
        Some(spec) if errs.is_empty() => Ok(GpuNode {
            metadata,
            spec,
            status,
        }),
        _ => Err(ParseError::Fields(errs)),
    }
}
