//! `crds/vramguard.yaml` is what `vramguard crds` prints, and what it prints
//! is a CRD the API server accepts: a structural schema (every node typed, no
//! `$ref`, no typed `anyOf`/`oneOf`), the printer columns and subresources
//! `kubectl` relies on, and enums for the fields users most often misspell.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value};
use vramguard::cli::crds::crds_yaml;

const REGENERATE: &str = "cargo run -q -- crds > crds/vramguard.yaml";

fn checked_in() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/vramguard.yaml");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; generate it with `{REGENERATE}`", path.display()))
}

/// `docs/trainingjob.md`, the field reference, is what the schema generates.
#[test]
fn the_field_reference_matches_the_schema() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/trainingjob.md");
    let file = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = vramguard::cli::crds::reference_markdown();
    assert!(
        file == generated,
        "docs/trainingjob.md is out of date with the CRD schema; regenerate it with \
         `cargo run -q -- crds --reference > docs/trainingjob.md` and commit it"
    );
    for field in [
        "`spec.parallelism.sharding` | string | full-shard \\| shard-grad-op \\| no-shard",
        "`spec.training.gradientCheckpointing` | string | none \\| selective \\| op-selective \\| full | `none`",
        "`spec.training.microBatchSize` | integer | ≥ 1 | `1`",
    ] {
        assert!(generated.contains(field), "lacks {field:?}");
    }
}

#[test]
fn crds_directory_matches_generated_crds() {
    let generated = crds_yaml();
    let file = checked_in();
    if generated != file {
        let first_diff = generated
            .lines()
            .zip(file.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| generated.lines().count().min(file.lines().count()));
        panic!(
            "crds/vramguard.yaml is out of date with the Rust types (first difference at line {}:\n  \
             generated: {:?}\n  file:      {:?}).\nRegenerate it with `{REGENERATE}` and commit it.",
            first_diff + 1,
            generated.lines().nth(first_diff).unwrap_or("<end>"),
            file.lines().nth(first_diff).unwrap_or("<end>"),
        );
    }
}

/// Both CRDs, as JSON values, and each also read as the typed Kubernetes object.
fn crds() -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(&crds_yaml()).expect("the CRD YAML parses");
    assert_eq!(docs.len(), 3, "TrainingJob, GpuNode and MemoryProfile");
    for doc in &docs {
        let crd: CustomResourceDefinition = serde_json::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("not a CustomResourceDefinition: {e}"));
        assert_eq!(crd.spec.group, "vramguard.io");
        assert_eq!(crd.spec.versions.len(), 1);
    }
    docs
}

fn crd(kind: &str) -> Value {
    crds()
        .into_iter()
        .find(|d| d["spec"]["names"]["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} CRD"))
}

fn version(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]
}

fn root_schema(crd: &Value) -> &Value {
    &version(crd)["schema"]["openAPIV3Schema"]
}

/// The schema at a dotted path of properties, e.g. `spec.model.hfConfig`.
fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(schema, |s, name| {
        s.get("properties")
            .and_then(|p| p.get(name))
            .unwrap_or_else(|| panic!("no property {name} on the way to {path}"))
    })
}

#[test]
fn training_job_keeps_unknown_fields_where_it_must() {
    let tj = crd("TrainingJob");
    let root = root_schema(&tj);
    for path in ["spec.template", "spec.model.hfConfig"] {
        let s = at(root, path);
        assert_eq!(
            s["x-kubernetes-preserve-unknown-fields"], true,
            "{path} would be pruned by the API server: {s}"
        );
        assert_eq!(s["type"], "object", "{path}: {s}");
    }
    let layers = at(root, "spec.model.layers");
    assert_eq!(layers["type"], "array");
    assert_eq!(
        layers["items"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    // Nowhere else: a typo in a typed field must be pruned or rejected, not kept.
    let mut preserved = Vec::new();
    walk(root, "", &mut |path, s| {
        if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
            preserved.push(path.to_string());
        }
    });
    preserved.sort();
    assert_eq!(
        preserved,
        [
            ".spec.model.hfConfig",
            ".spec.model.layers[]",
            ".spec.template"
        ]
    );
}

#[test]
fn training_job_printer_columns_and_status_subresource() {
    let tj = crd("TrainingJob");
    let v = version(&tj);
    let columns = v["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns");
    let names: Vec<&str> = columns.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["Phase", "Model", "GPUs", "Per-GPU", "Node", "Age"]);
    assert_eq!(v["subresources"]["status"], Value::Object(Map::new()));
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert_eq!(tj["spec"]["scope"], "Namespaced");
    assert_eq!(tj["spec"]["names"]["shortNames"][0], "tj");
    assert_eq!(tj["spec"]["names"]["categories"][0], "vramguard");
}

#[test]
fn printer_columns_point_at_fields_of_their_type() {
    for kind in ["TrainingJob", "GpuNode"] {
        let c = crd(kind);
        let root = root_schema(&c);
        for col in version(&c)["additionalPrinterColumns"]
            .as_array()
            .expect("printer columns")
        {
            let name = &col["name"];
            let path = col["jsonPath"].as_str().expect("jsonPath");
            let path = path.strip_prefix('.').expect("jsonPath starts with .");
            if path.starts_with("metadata.") {
                continue;
            }
            let field = at(root, path);
            let (column, field_type) = (col["type"].as_str(), field["type"].as_str());
            let ok = match column {
                Some("date") => field_type == Some("string") && field["format"] == "date-time",
                Some("integer") => field_type == Some("integer"),
                Some("string") => field_type == Some("string"),
                other => panic!("{kind} column {name}: unexpected type {other:?}"),
            };
            assert!(ok, "{kind} column {name} ({column:?}) points at {field}");
        }
    }
}

#[test]
fn enums_list_the_allowed_values() {
    let tj = crd("TrainingJob");
    let root = root_schema(&tj);
    let cases: &[(&str, &[&str])] = &[
        (
            "spec.training.precision",
            &["fp32", "tf32", "fp16-mixed", "bf16-mixed", "fp16", "bf16"],
        ),
        (
            "spec.training.mode",
            &["full", "lora", "qlora", "adapter", "inference"],
        ),
        (
            "spec.training.gradientCheckpointing",
            &["none", "selective", "op-selective", "full"],
        ),
        ("spec.training.attention", &["eager", "sdpa", "flash"]),
        ("spec.training.weightsLoad", &["dtype", "fp32-cast"]),
        (
            "spec.training.float8",
            &["tensorwise", "rowwise", "rowwise-with-gw-hp"],
        ),
        (
            "spec.parallelism.pipelineSchedule",
            &[
                "gpipe",
                "1f1b",
                "interleaved-1f1b",
                "looped-bfs",
                "interleaved-zero-bubble",
                "zbv-zero-bubble",
                "dualpipev",
            ],
        ),
        ("spec.fitPolicy.mode", &["Reject", "Adjust"]),
        (
            "spec.training.quantization",
            &["none", "int8", "nf4", "nf4-double", "gptq", "awq"],
        ),
    ];
    for (path, values) in cases {
        let s = at(root, path);
        assert_eq!(s["type"], "string", "{path}: {s}");
        let got: Vec<&str> = s["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{path} has no enum: {s}"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(got, *values, "{path}");
    }
    assert_eq!(at(root, "spec.training.precision")["default"], "bf16-mixed");
    assert_eq!(at(root, "spec.training.microBatchSize")["minimum"], 1.0);
    assert_eq!(at(root, "spec.parallelism.zeroStage")["maximum"], 3.0);
}

/// Calls `f(path, schema)` on every schema node reachable through
/// properties, items and additionalProperties (not through anyOf & co).
fn walk(schema: &Value, path: &str, f: &mut dyn FnMut(&str, &Value)) {
    f(path, schema);
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, s) in props {
            walk(s, &format!("{path}.{name}"), f);
        }
    }
    if let Some(items) = schema.get("items") {
        walk(items, &format!("{path}[]"), f);
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        walk(extra, &format!("{path}{{}}"), f);
    }
}

const TYPES: &[&str] = &["object", "array", "string", "integer", "number", "boolean"];

/// Keywords an OpenAPI v3 schema may use in a Kubernetes CRD.
const ALLOWED: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "default",
    "nullable",
    "enum",
    "maximum",
    "minimum",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "properties",
    "additionalProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "example",
    "externalDocs",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

/// Keywords not allowed inside allOf/anyOf/oneOf/not of a structural schema.
const NOT_IN_JUNCTORS: &[&str] = &[
    "type",
    "default",
    "nullable",
    "description",
    "title",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
];

fn value_has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => false,
    }
}

/// The problems that make `schema` non-structural (Kubernetes rejects the CRD).
fn structural_problems(schema: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    walk(schema, "", &mut |path, s| {
        let path = if path.is_empty() { "<root>" } else { path };
        let Some(obj) = s.as_object() else {
            problems.push(format!("{path}: a schema must be an object, found {s}"));
            return;
        };
        for key in obj.keys() {
            if !ALLOWED.contains(&key.as_str()) {
                problems.push(format!("{path}: `{key}` is not allowed in a CRD schema"));
            }
        }
        if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
            problems.push(format!("{path}: uniqueItems: true is forbidden"));
        }
        let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        let ty = match obj.get("type") {
            Some(Value::String(t)) if TYPES.contains(&t.as_str()) => Some(t.as_str()),
            Some(other) => {
                problems.push(format!(
                    "{path}: type must be one of {TYPES:?}, found {other}"
                ));
                None
            }
            None if preserve || int_or_string => None,
            None => {
                problems.push(format!("{path}: type is missing"));
                None
            }
        };
        if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
            problems.push(format!(
                "{path}: properties and additionalProperties are exclusive"
            ));
        }
        if (obj.contains_key("properties") || obj.contains_key("additionalProperties"))
            && ty != Some("object")
        {
            problems.push(format!("{path}: properties on a non-object"));
        }
        match (ty, obj.get("items")) {
            (Some("array"), None) => problems.push(format!("{path}: an array needs items")),
            (Some("array"), Some(items)) if !items.is_object() => {
                problems.push(format!("{path}: items must be one schema"))
            }
            (Some(t), Some(_)) if t != "array" => {
                problems.push(format!("{path}: items on a non-array"))
            }
            _ => {}
        }
        if let Some(required) = obj.get("required") {
            let props = obj.get("properties").and_then(Value::as_object);
            for r in required.as_array().into_iter().flatten() {
                let name = r.as_str().unwrap_or_default();
                if !props.is_some_and(|p| p.contains_key(name)) {
                    problems.push(format!("{path}: required {r} is not a property"));
                }
            }
        }
        let nullable = obj.get("nullable") == Some(&Value::Bool(true));
        if let (Some(t), Some(values)) = (ty, obj.get("enum")) {
            match values.as_array() {
                Some(values) if !values.is_empty() => {
                    for v in values {
                        if !(value_has_type(v, t) || (v.is_null() && nullable)) {
                            problems.push(format!("{path}: enum value {v} is not a {t}"));
                        }
                    }
                }
                _ => problems.push(format!("{path}: enum must be a non-empty list")),
            }
        }
        if let (Some(t), Some(default)) = (ty, obj.get("default")) {
            if !value_has_type(default, t) {
                problems.push(format!("{path}: default {default} is not a {t}"));
            }
            if let Some(values) = obj.get("enum").and_then(Value::as_array)
                && !values.contains(default)
            {
                problems.push(format!("{path}: default {default} is not in the enum"));
            }
            let n = default.as_f64();
            if let (Some(n), Some(min)) = (n, obj.get("minimum").and_then(Value::as_f64))
                && n < min
            {
                problems.push(format!("{path}: default {n} is below the minimum {min}"));
            }
            if let (Some(n), Some(max)) = (n, obj.get("maximum").and_then(Value::as_f64))
                && n > max
            {
                problems.push(format!("{path}: default {n} is above the maximum {max}"));
            }
        }
        for junctor in ["allOf", "anyOf", "oneOf", "not"] {
            let Some(j) = obj.get(junctor) else { continue };
            let branches: Vec<&Value> = match j {
                Value::Array(a) => a.iter().collect(),
                other => vec![other],
            };
            for b in branches {
                junctor_problems(b, s, &format!("{path}.{junctor}"), &mut problems);
            }
        }
    });
    problems
}

/// A branch of allOf/anyOf/oneOf/not may only restate, never introduce,
/// what the structural skeleton `parent` specifies.
fn junctor_problems(branch: &Value, parent: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(obj) = branch.as_object() else {
        problems.push(format!("{path}: a branch must be an object"));
        return;
    };
    for key in NOT_IN_JUNCTORS {
        if obj.contains_key(*key) {
            problems.push(format!("{path}: `{key}` is not allowed inside a junctor"));
        }
    }
    for key in ["$ref", "definitions", "$defs"] {
        if obj.contains_key(key) {
            problems.push(format!("{path}: `{key}` is not allowed"));
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            match parent.get("properties").and_then(|p| p.get(name)) {
                Some(p) => junctor_problems(sub, p, &format!("{path}.{name}"), problems),
                None => problems.push(format!(
                    "{path}: property {name} is not in the structural skeleton"
                )),
            }
        }
    }
    if let Some(items) = obj.get("items") {
        match parent.get("items") {
            Some(p) => junctor_problems(items, p, &format!("{path}[]"), problems),
            None => problems.push(format!("{path}: items not in the structural skeleton")),
        }
    }
}

#[test]
fn schemas_are_structural() {
    for doc in crds() {
        let kind = doc["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        for v in doc["spec"]["versions"].as_array().expect("versions") {
            let root = &v["schema"]["openAPIV3Schema"];
            assert_eq!(root["type"], "object", "{kind}: the root is an object");
            let problems = structural_problems(root);
            assert!(
                problems.is_empty(),
                "{kind} is not a structural schema; fix it in src/api (schemars attributes):\n{}",
                problems.join("\n")
            );
            for part in ["spec", "status"] {
                assert_eq!(root["properties"][part]["type"], "object", "{kind}.{part}");
            }
        }
    }
}

#[test]
fn the_structural_check_finds_problems() {
    let bad = serde_json::json!({
        "type": "object",
        "properties": {
            "untyped": {"description": "no type"},
            "listy": {"type": ["string", "null"]},
            "reffed": {"$ref": "#/definitions/X", "type": "object"},
            "either": {
                "type": "object",
                "anyOf": [{"type": "object", "properties": {"ghost": {}}}]
            },
            "array": {"type": "array"},
            "e": {"type": "string", "enum": ["a", null]},
            "d": {"type": "integer", "minimum": 1, "default": 0}
        },
        "required": ["missing"]
    });
    let problems = structural_problems(&bad);
    for needle in [
        ".untyped: type is missing",
        ".listy: type must be one of",
        ".reffed: `$ref` is not allowed",
        ".either.anyOf: `type` is not allowed inside a junctor",
        ".either.anyOf: property ghost is not in the structural skeleton",
        ".array: an array needs items",
        ".e: enum value null is not a string",
        ".d: default 0 is below the minimum 1",
        "<root>: required \"missing\" is not a property",
    ] {
        assert!(
            problems.iter().any(|p| p.contains(needle)),
            "{needle:?} not found in {problems:#?}"
        );
    }
}

#[test]
fn gpu_node_is_cluster_scoped_with_status() {
    let gn = crd("GpuNode");
    assert_eq!(gn["spec"]["scope"], "Cluster");
    let v = version(&gn);
    assert_eq!(v["subresources"]["status"], Value::Object(Map::new()));
    let names: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["Node", "GPUs", "Product", "Probed", "Age"]);
    assert_eq!(
        root_schema(&gn)["properties"]["spec"]["required"],
        serde_json::json!(["nodeName"])
    );
}
