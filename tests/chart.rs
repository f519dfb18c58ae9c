//! The Helm chart: its CRDs are the generated ones, its values parse, and,
//! where a `helm` binary is available (on PATH or in $VRAMGUARD_HELM), it
//! lints strictly and renders.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn chart_crds_are_the_generated_ones() {
    // A link to crds/vramguard.yaml, which the CRD templates read.
    let chart = std::fs::read_to_string(root().join("charts/vramguard/files/crds.yaml")).unwrap();
    assert_eq!(
        chart,
        vramguard::cli::crds::crds_yaml(),
        "charts/vramguard/files/crds.yaml is stale: regenerate with `cargo run -q -- crds > crds/vramguard.yaml`"
    );
}

#[test]
fn values_parse_and_name_what_the_templates_use() {
    let text = std::fs::read_to_string(root().join("charts/vramguard/values.yaml")).unwrap();
    let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    for path in [
        "/image/repository",
        "/webhook/port",
        "/webhook/failurePolicy",
        "/tls/mode",
        "/crds/keep",
        "/monitoring/serviceMonitor/enabled",
        "/agent/enabled",
        "/operator/enabled",
    ] {
        assert!(v.pointer(path).is_some(), "values.yaml lacks {path}");
    }
}

fn helm() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("VRAMGUARD_HELM") {
        return Some(PathBuf::from(p));
    }
    Command::new("helm")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("helm"))
}

#[test]
fn helm_lints_and_renders() {
    let Some(helm) = helm() else {
        eprintln!("helm not found (PATH or VRAMGUARD_HELM): lint and render not checked");
        return;
    };
    let chart = root().join("charts/vramguard");
    let lint = Command::new(&helm)
        .args(["lint", "--strict"])
        .arg(&chart)
        .output()
        .unwrap();
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let out = Command::new(&helm)
        .args([
            "template",
            "vg",
            "--kube-version",
            "1.33.0",
            "--include-crds",
        ])
        .arg(&chart)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for kind in [
        "kind: Deployment",
        "kind: ValidatingWebhookConfiguration",
        "kind: CustomResourceDefinition",
        "kind: ClusterRole",
        "kind: Role",
    ] {
        assert!(text.contains(kind), "rendered chart lacks {kind}");
    }
    // What the operator reads and writes.
    for resource in [
        "trainingjobs/status",
        "memoryprofiles",
        "jobs",
        "pods/log",
        "leases",
    ] {
        assert!(text.contains(resource), "the chart's RBAC lacks {resource}");
    }
}
