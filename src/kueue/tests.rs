use super::*;

fn workload(checks: Value, admission: Value) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": "job-a-1", "namespace": "ml", "resourceVersion": "7",
                     "ownerReferences": [
                         {"apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": "u", "controller": true}]},
        "spec": {"podSets": [{"name": "main", "count": 2, "template": {"spec": {
            "containers": [{"name": "t", "image": "i",
                            "resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}}]},
        "status": {"admissionChecks": checks, "admission": admission},
    })
}

/// Our check and another, both Pending, before quota is reserved.
fn both_pending() -> Value {
    workload(
        json!([
            {"name": "vram", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""},
            {"name": "prov", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""},
        ]),
        Value::Null,
    )
}

fn ours() -> BTreeSet<String> {
    BTreeSet::from(["vram".to_string()])
}

#[test]
fn only_our_pending_checks_are_ours_to_decide() {
    let wl = both_pending();
    assert_eq!(pending_checks(&wl, &ours()), vec!["vram".to_string()]);
    assert!(!quota_reserved(&wl));
    let done = workload(
        json!([{"name": "vram", "state": "Ready", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""}]),
        Value::Null,
    );
    assert!(pending_checks(&done, &ours()).is_empty());
    // Deactivated by Kueue (its checks reset to Pending while quota is released): not judged.
    assert!(active(&wl));
    let mut off = wl.clone();
    off["spec"]["active"] = json!(false);
    assert!(!active(&off));
    off["spec"]["active"] = json!(true);
    assert!(active(&off));
}

#[test]
fn the_gpu_flavor_of_each_pod_set_names_the_product() {
    let wl = workload(
        json!([]),
        json!({"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "flavors": {"cpu": "default", "nvidia.com/gpu": "h100"}},
            {"name": "mig", "flavors": {"cpu": "default", "nvidia.com/mig-1g.10gb": "a100-mig"}},
            {"name": "cpu", "flavors": {"cpu": "default"}},
        ]}),
    );
    assert!(quota_reserved(&wl));
    let f = assigned_flavors(&wl);
    assert_eq!(f["main"], "h100");
    assert_eq!(f["mig"], "a100-mig");
    assert_eq!(f["cpu"], "default");
    let flavor =
        json!({"spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}});
    assert_eq!(
        flavor_product(&flavor).as_deref(),
        Some("NVIDIA-H100-80GB-HBM3")
    );
    assert_eq!(flavor_product(&json!({"spec": {}})), None);
    assert_eq!(
        owner(&wl),
        Some(("batch/v1".into(), "Job".into(), "a".into()))
    );
    assert_eq!(owner_resource("ray.io/v1", "RayJob"), Some("rayjobs"));
    assert_eq!(owner_resource("example.com/v1", "Job"), None);
}

#[test]
fn the_workload_is_read_with_its_owners_annotation_and_flavor_product() {
    let wl = workload(json!([]), Value::Null);
    let owner = json!({"metadata": {"name": "a", "annotations": {
        "vramguard.io/training": "model: {preset: llama-3.1-8b}", "other": "x"}}});
    let products = BTreeMap::from([("main".to_string(), "NVIDIA-H100-80GB-HBM3".to_string())]);
    let doc = as_read(&wl, Some(&owner), &products);
    assert_eq!(doc["metadata"]["name"], "a");
    assert_eq!(
        doc["metadata"]["annotations"]["vramguard.io/training"],
        "model: {preset: llama-3.1-8b}"
    );
    assert!(doc["metadata"]["annotations"].get("other").is_none());
    let sets = kinds::pod_sets(Kind::Workload, &doc).unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].pods, 2);
    assert_eq!(sets[0].gpus_per_pod, 4);
    assert_eq!(sets[0].products, vec!["NVIDIA-H100-80GB-HBM3".to_string()]);
}

#[test]
fn the_patch_sets_ours_keeps_the_others_and_carries_the_version() {
    let wl = workload(
        json!([
            {"name": "vram", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""},
            {"name": "prov", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": "waiting"},
        ]),
        Value::Null,
    );
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let verdicts = BTreeMap::from([(
        "vram".to_string(),
        Verdict {
            state: CheckState::Retry,
            message: "not now".into(),
        },
    )]);
    let p = status_patch(&wl, &verdicts, now, Some(30));
    assert_eq!(p["metadata"]["resourceVersion"], "7");
    let checks = p["status"]["admissionChecks"].as_array().unwrap();
    assert_eq!(checks[0]["state"], "Retry");
    assert_eq!(checks[0]["message"], "not now");
    assert_eq!(checks[0]["requeueAfterSeconds"], 30);
    assert_eq!(checks[0]["lastTransitionTime"], "2027-01-15T08:00:00Z");
    assert_eq!(checks[1], wl["status"]["admissionChecks"][1]);
}

#[test]
fn an_admission_check_of_ours_is_marked_active_once_per_generation() {
    let ac = json!({"spec": {"controllerName": CONTROLLER_NAME}});
    assert!(is_ours(&ac));
    assert!(!is_ours(
        &json!({"spec": {"controllerName": "kueue.x-k8s.io/provisioning-request"}})
    ));
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let p = active_patch(&ac, 1, now).unwrap();
    assert_eq!(p["status"]["conditions"][0]["type"], "Active");
    assert_eq!(p["status"]["conditions"][0]["status"], "True");
    let marked = json!({"spec": ac["spec"], "status": p["status"]});
    assert_eq!(active_patch(&marked, 1, now), None);
    assert!(active_patch(&marked, 2, now).is_some());
}

#[test]
fn verdicts_map_to_check_states() {
    let v = verdict(Assessment::Fits, "NVIDIA-H100-80GB-HBM3");
    assert_eq!(v.state, CheckState::Ready);
    let v = verdict(
        Assessment::NotNow {
            product: "H100".into(),
            reason: "busy".into(),
        },
        "",
    );
    assert_eq!(v.state, CheckState::Retry);
    assert!(v.message.contains("busy"));
    let v = verdict(
        Assessment::NotJudged {
            why: "no command".into(),
            tell: true,
        },
        "",
    );
    assert_eq!(v.state, CheckState::Ready);
    let v = verdict(
        Assessment::Denied {
            reason: Reason::FitsAfterChange,
            message: "x".repeat(10_000),
        },
        "",
    );
    assert_eq!(v.state, CheckState::Rejected);
    assert!(v.message.len() <= MAX_MESSAGE);
}

#[test]
fn status_is_written_in_v1beta2_where_served() {
    assert_eq!(status_version(["v1beta2", "v1beta1"]), "v1beta2");
    assert_eq!(status_version(["v1beta1"]), "v1beta1");
    assert_eq!(status_version([]), "v1beta1");
}

#[test]
fn a_check_whose_state_changes_is_recorded_as_an_event_of_its_verdict() {
    let pending = both_pending();
    let cases = [
        (CheckState::Ready, false, "VramFit"),
        (CheckState::Retry, true, "VramRetry"),
        (CheckState::Rejected, true, "VramRejected"),
    ];
    for (state, warning, reason) in cases {
        let message = format!("vramguard: 93.4 GiB per GPU > 79.6 GiB; {}", state.name());
        let verdicts = BTreeMap::from([(
            "vram".to_string(),
            Verdict {
                state,
                message: message.clone(),
            },
        )]);
        assert_eq!(
            verdict_events(&pending, &verdicts),
            vec![VerdictEvent {
                warning,
                reason,
                note: message,
            }],
            "{state:?}"
        );
    }
}

#[test]
fn no_event_when_no_check_changes_state() {
    let verdict = |state| Verdict {
        state,
        message: "vramguard: fits NVIDIA-H100-80GB-HBM3 as written".into(),
    };
    for state in [CheckState::Ready, CheckState::Retry, CheckState::Rejected] {
        let decided = workload(
            json!([{"name": "vram", "state": state.name(), "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "message": "said before"}]),
            Value::Null,
        );
        let verdicts = BTreeMap::from([("vram".to_string(), verdict(state))]);
        assert_eq!(verdict_events(&decided, &verdicts), vec![], "{state:?}");
    }
    // Nothing decided (a check the Workload does not list, or no verdict), nothing recorded.
    let pending = workload(
        json!([{"name": "prov", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""}]),
        Value::Null,
    );
    let verdicts = BTreeMap::from([("vram".to_string(), verdict(CheckState::Ready))]);
    assert!(verdict_events(&pending, &verdicts).is_empty());
    assert!(verdict_events(&pending, &BTreeMap::new()).is_empty());
    // Two checks of ours set alike: one Event.
    let two = workload(
        json!([
            {"name": "vram", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""},
            {"name": "vram-2", "state": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""},
        ]),
        Value::Null,
    );
    let verdicts = BTreeMap::from([
        ("vram".to_string(), verdict(CheckState::Ready)),
        ("vram-2".to_string(), verdict(CheckState::Ready)),
    ]);
    assert_eq!(verdict_events(&two, &verdicts).len(), 1);
}
