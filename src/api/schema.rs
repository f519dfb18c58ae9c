//! Schema overrides for fields whose content Kubernetes should keep as-is.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An object the API server stores without pruning (pod templates, HF configs).
pub fn preserve_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A list of such objects (the `layers` of an MLP/CNN).
pub fn preserve_object_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true
        }
    })
}
