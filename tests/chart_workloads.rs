//! The chart's webhooks for Jobs, JobSets, TrainJobs and PyTorchJobs: one per
//! enforcement mode, chosen by the namespace label, and `matchConditions`
//! (evaluated here with a CEL interpreter) that let through only CREATEs of
//! GPU-requesting or annotated objects no controller owns. Needs `helm` (on
//! PATH, in $VRAMGUARD_HELM, or `target/ci-tools/bin/helm`); skips without it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn helm() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("VRAMGUARD_HELM") {
        return Some(PathBuf::from(p));
    }
    let local = root().join("target/ci-tools/bin/helm");
    if local.exists() {
        return Some(local);
    }
    Command::new("helm")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("helm"))
}

/// The workload webhooks of the chart rendered with `sets`.
fn webhooks(helm: &Path, sets: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(helm);
    cmd.args([
        "template",
        "vg",
        "--kube-version",
        "1.33.0",
        "--set",
        "tls.mode=generated",
    ])
    .arg(root().join("charts/vramguard"));
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
    docs.into_iter()
        .filter(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .flat_map(|d| d["webhooks"].as_array().cloned().unwrap_or_default())
        .filter(|w| {
            w["name"]
                .as_str()
                .unwrap()
                .ends_with(".workloads.vramguard.io")
        })
        .collect()
}

/// Whether every matchCondition of `webhook` holds for `object`; an error
/// (which the API server would treat by the failure policy) fails the test.
fn matches(webhook: &Value, kind: &str, object: &Value) -> bool {
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("object", cel::to_value(object).unwrap());
    ctx.add_variable_from_value(
        "request",
        cel::to_value(json!({"kind": {"kind": kind}, "operation": "CREATE"})).unwrap(),
    );
    webhook["matchConditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| {
            let expr = c["expression"].as_str().unwrap();
            let program =
                cel::Program::compile(expr).unwrap_or_else(|e| panic!("{}: {e:?}", c["name"]));
            match program.execute(&ctx) {
                Ok(cel::Value::Bool(b)) => b,
                other => panic!("{} on {object}: {other:?}", c["name"]),
            }
        })
}

fn example(name: &str) -> Value {
    let text = std::fs::read_to_string(root().join("examples").join(name)).unwrap();
    vramguard::api::parse::documents(&text).unwrap().remove(0)
}

#[test]
fn only_gpu_requesting_or_annotated_objects_no_controller_owns_reach_the_webhook() {
    let Some(helm) = helm() else {
        eprintln!("helm not found: the workload webhooks are not checked");
        return;
    };
    let hooks = webhooks(&helm, &[]);
    assert_eq!(hooks.len(), 3, "one per enforcement mode");
    let warn = &hooks[1];
    for (file, kind) in [
        ("job-trl-sft-llama-3.1-8b.yaml", "Job"),
        ("job-annotated-llama-3.1-8b-lora.yaml", "Job"),
        ("jobset-torchtune-llama-3.1-8b-lora.yaml", "JobSet"),
        ("jobset-annotated-qwen2.5-7b-full.yaml", "JobSet"),
        ("trainjob-litgpt-llama-3.2-1b-lora.yaml", "TrainJob"),
        ("trainjob-annotated-llama-3.1-70b-qlora.yaml", "TrainJob"),
        ("pytorchjob-run-clm-gpt2.yaml", "PyTorchJob"),
        ("pytorchjob-annotated-mistral-7b-lora.yaml", "PyTorchJob"),
    ] {
        let obj = example(file);
        assert!(matches(warn, kind, &obj), "{file}");
        // Without GPUs or the annotation, none reaches it.
        let mut text = serde_json::to_string(&obj).unwrap();
        text = text.replace("nvidia.com/gpu\"", "example.com/fpga\"");
        let mut cpu: Value = serde_json::from_str(&text).unwrap();
        if let Some(a) = cpu.pointer_mut("/metadata/annotations") {
            a.as_object_mut().unwrap().remove("vramguard.io/training");
        }
        assert!(!matches(warn, kind, &cpu), "{file} without GPUs");
        // Made by a controller: judged as its owner.
        let mut owned = obj.clone();
        owned["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u", "controller": true}]);
        assert!(!matches(warn, kind, &owned), "{file} owned");
    }
    // MIG slices ask for GPUs too; a TrainJob that leaves resources to its runtime does not.
    let mut mig = example("job-trl-sft-llama-3.1-8b.yaml");
    mig["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/mig-1g.10gb": 1}});
    assert!(matches(warn, "Job", &mig));
    let mut bare = example("trainjob-litgpt-llama-3.2-1b-lora.yaml");
    bare["spec"]["trainer"]
        .as_object_mut()
        .unwrap()
        .remove("resourcesPerNode");
    assert!(!matches(warn, "TrainJob", &bare));
}

#[test]
fn the_namespace_label_picks_the_enforcement_and_the_chart_sets_the_default() {
    let Some(helm) = helm() else {
        eprintln!("helm not found: the workload webhooks are not checked");
        return;
    };
    for default in ["Deny", "Warn", "Audit"] {
        let hooks = webhooks(&helm, &[&format!("workloads.enforcement={default}")]);
        for hook in &hooks {
            let mode = hook["name"].as_str().unwrap().split('.').next().unwrap();
            assert_eq!(
                hook["clientConfig"]["service"]["path"],
                format!("/validate/{mode}")
            );
            let expr = &hook["namespaceSelector"]["matchExpressions"][0];
            assert_eq!(expr["key"], "vramguard.io/enforcement");
            if mode.eq_ignore_ascii_case(default) {
                // Every namespace not labelled with another mode (no label included).
                assert_eq!(expr["operator"], "NotIn", "{hook}");
                let values = expr["values"].as_array().unwrap();
                assert_eq!(values.len(), 2);
                assert!(!values.iter().any(|v| v == default));
            } else {
                assert_eq!(expr["operator"], "In", "{hook}");
                assert_eq!(expr["values"][0].as_str().unwrap().to_lowercase(), mode);
            }
        }
    }
    assert!(webhooks(&helm, &["workloads.enabled=false"]).is_empty());
}
