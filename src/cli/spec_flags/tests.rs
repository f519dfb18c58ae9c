use super::*;

#[test]
fn every_flag_names_a_field_of_the_contract() {
    let schema = crate::api::structural::training_job_spec_schema();
    for f in FLAGS.iter().filter(|f| f.path.starts_with("spec.")) {
        let mut at = schema;
        for key in f.path.trim_start_matches("spec.").split('.') {
            at = at
                .pointer(&format!("/properties/{key}"))
                .unwrap_or_else(|| panic!("--{}: {} is not in the CRD's schema", f.long, f.path));
        }
    }
}

#[test]
fn flags_write_a_document_and_a_later_flag_wins() {
    let cmd = SpecFlags::augment_args(clap::Command::new("t"));
    let m = cmd
        .try_get_matches_from([
            "t",
            "--model",
            "gpt2",
            "--micro-batch",
            "2",
            "--seq",
            "512",
            "--micro-batch-size",
            "3",
            "--allow",
            "microBatchSize, precision",
            "--compile",
        ])
        .expect("flags parse");
    let flags = SpecFlags::from_arg_matches(&m).expect("read");
    let doc = flags.document().expect("a document");
    assert_eq!(
        doc.pointer("/spec/training/microBatchSize"),
        Some(&Value::from(3))
    );
    assert_eq!(
        doc.pointer("/spec/training/sequenceLength"),
        Some(&Value::from(512))
    );
    assert_eq!(
        doc.pointer("/spec/training/compile"),
        Some(&Value::Bool(true))
    );
    assert_eq!(
        doc.pointer("/spec/fitPolicy/allow"),
        Some(&serde_json::json!(["microBatchSize", "precision"]))
    );
    assert_eq!(
        doc.pointer("/metadata/name"),
        Some(&Value::from("gpt2-full"))
    );
}

#[test]
fn a_value_of_the_wrong_type_is_left_for_the_validator() {
    assert_eq!(value_of(Int, "two"), Value::from("two"));
    assert_eq!(value_of(Float, "NaN"), Value::from("NaN"));
    assert_eq!(value_of(Bool, "yes"), Value::from("yes"));
}
