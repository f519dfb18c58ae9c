//! Custom resource types (`TrainingJob`, `GpuNode`), parsing of user YAML and
//! validation into the types the estimator consumes. No I/O.

pub mod arch;
pub mod fingerprint;
pub mod framework;
pub mod gpu_node;
pub mod gpus;
pub mod hf;
pub mod layers;
pub mod memory_profile;
pub mod params;
pub mod parse;
pub mod presets;
pub mod runtime;
mod schema;
pub mod structural;
pub mod training_job;
pub mod validate;
pub mod vision;

pub use gpu_node::*;
pub use memory_profile::*;
pub use runtime::{AllocatorConf, Batching, RuntimeFacts, RuntimeSpec};
pub use training_job::*;
pub use validate::{
    ALL_FIELDS, FieldError, PRESET_HINT_ANNOTATION, ResolvedModel, Settings, ValidatedJob,
    ValidationErrors, validate, validate_job,
};

/// The name serde gives an enum value (`bf16-mixed`), for env vars and words.
pub(crate) fn enum_name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// A spec written in YAML, validated: for unit tests across the crate.
#[cfg(test)]
pub(crate) fn test_job(yaml: &str) -> ValidatedJob {
    let spec: TrainingJobSpec = serde_saphyr::from_str(yaml).expect("test YAML parses");
    validate(&spec).expect("test spec is valid")
}
