//! The key of a `MemoryProfile`: a stable hash of what sets a job's memory
//! apart from its plan. Covered: the model (every field as written), the
//! training mode, adapters, quantization, trainable parameters, sequence
//! length, attention, framework, compilation, data kept on the GPU,
//! activation offloading, optimizer-in-backward, float8 training (where
//! set), and the parallel layout
//! (GPUs, tensor/pipeline/context/sequence parallelism, strategy, offload).
//! Left out on purpose: what the planner may change (micro-batch size,
//! precision, checkpointing, optimizer, ZeRO stage, loss) and the global
//! batch, so what one attempt proved carries over to the smaller plans of
//! the next.

use serde_json::{Value, json};

use super::TrainingJobSpec;

/// FNV-1a, 64 bits: stable across builds and platforms (unlike `std`'s hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The fields the fingerprint covers, as one canonical JSON value (object
/// keys sorted: serde_json's maps are ordered).
fn covered(spec: &TrainingJobSpec) -> Value {
    let t = &spec.training;
    let p = &spec.parallelism;
    let mut v = json!({
        "model": spec.model,
        "mode": t.mode,
        "lora": t.lora,
        "quantization": t.quantization,
        "trainableParameters": t.trainable_parameters,
        "sequenceLength": t.seq_len(),
        "attention": t.attention,
        "framework": t.framework,
        "compile": t.compile,
        "dataOnGpuBytes": t.data_on_gpu_bytes,
        "activationOffloading": t.activation_offloading,
        "optimizerInBackward": t.optimizer_in_backward,
        "parallelism": {
            "gpus": p.gpus,
            "gpusPerNode": p.gpus_per_node,
            "strategy": p.strategy,
            "tensorParallel": p.tensor_parallel,
            "sequenceParallel": p.sequence_parallel,
            "pipelineParallel": p.pipeline_parallel,
            "pipelineSchedule": p.pipeline_schedule,
            "virtualStages": p.virtual_stages,
            "contextParallel": p.context_parallel,
            "offload": p.offload,
        },
    });
    // Float8 training changes what the step holds; written only where set,
    // so the fingerprints of jobs without it stay as they were.
    if let Some(recipe) = t.float8 {
        v["float8"] = json!(recipe);
        v["float8AllGather"] = json!(t.float8_all_gather);
    }
    v
}

/// 16 hex digits.
pub fn fingerprint(spec: &TrainingJobSpec) -> String {
    format!("{:016x}", fnv1a(covered(spec).to_string().as_bytes()))
}

/// The `MemoryProfile` object's name for a fingerprint.
pub fn profile_name(fingerprint: &str) -> String {
    format!("mp-{fingerprint}")
}

/// What the fingerprint covers, in words, for the profile's spec.
pub fn recipe_words(spec: &TrainingJobSpec) -> String {
    let t = &spec.training;
    let p = &spec.parallelism;
    let mut words = vec![
        super::enum_name(&t.mode),
        format!("seq {}", t.seq_len()),
        format!("{} GPU{}", p.gpus, if p.gpus == 1 { "" } else { "s" }),
    ];
    if let Some(l) = &t.lora {
        words.push(format!("LoRA r{}", l.rank));
    }
    if let Some(q) = &t.quantization {
        words.push(super::enum_name(q));
    }
    if p.tensor_parallel > 1 {
        words.push(format!("TP {}", p.tensor_parallel));
    }
    if p.pipeline_parallel > 1 {
        words.push(format!("PP {}", p.pipeline_parallel));
    }
    if p.context_parallel > 1 {
        words.push(format!("CP {}", p.context_parallel));
    }
    words.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TrainingJobSpec {
        serde_saphyr::from_str(yaml).expect("test YAML")
    }

    const BASE: &str = "
model: {preset: llama-3.1-8b}
training: {mode: lora, microBatchSize: 4, sequenceLength: 2048, lora: {rank: 16}}
";

    #[test]
    fn plan_fields_do_not_change_it_shape_fields_do() {
        let a = fingerprint(&spec(BASE));
        assert_eq!(a.len(), 16);
        let smaller = BASE.replace(
            "microBatchSize: 4",
            "microBatchSize: 1, precision: fp16-mixed, gradientCheckpointing: full",
        );
        assert_eq!(a, fingerprint(&spec(&smaller)));
        let longer = BASE.replace("sequenceLength: 2048", "sequenceLength: 4096");
        assert_ne!(a, fingerprint(&spec(&longer)));
        let other_model = BASE.replace("llama-3.1-8b", "llama-3.1-70b");
        assert_ne!(a, fingerprint(&spec(&other_model)));
        assert_eq!(profile_name(&a), format!("mp-{a}"));
    }

    #[test]
    fn float8_sets_a_job_apart_and_leaves_others_as_they_were() {
        let a = fingerprint(&spec(BASE));
        // The canonical value of a job without float8 holds no float8 key.
        assert!(!covered(&spec(BASE)).to_string().contains("float8"));
        let float8 = BASE.replace("mode: lora,", "mode: lora, float8: tensorwise,");
        let gathered = BASE.replace(
            "mode: lora,",
            "mode: lora, float8: tensorwise, float8AllGather: true,",
        );
        let (f, g) = (fingerprint(&spec(&float8)), fingerprint(&spec(&gathered)));
        assert!(a != f && a != g && f != g, "{a} {f} {g}");
    }

    #[test]
    fn fnv_is_the_published_function() {
        // Test vectors of FNV-1a 64.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }
}
