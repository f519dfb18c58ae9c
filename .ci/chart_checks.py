#!/usr/bin/env python3
"""The chart and image checks CI runs (after `python3 .ci/tools.py`, in its virtual env).

1. `helm lint --strict` and `helm template` of charts/vramguard for each value set below;
   each rendered document is validated against the Kubernetes 1.33 OpenAPI schemas with
   unknown fields rejected (kubernetes-validate --strict), and each value set's expectations
   (what it must and must not render) are checked.
2. Value sets the chart must refuse, each with the message its guard or schema gives.
3. The TrainingJobs and GpuNodes in examples/ against the CRD schemas in crds/vramguard.yaml,
   with unknown fields rejected (`kubectl apply`'s default field validation is strict).
4. hadolint over the Dockerfile.
5. charts/vramguard/README.md is what .ci/chart_readme.py generates from values.yaml.

Kueue's AdmissionCheck (kueue.admissionCheck.enabled) is validated against Kueue's own CRD as
vendored under tests/data/kueue/ (v0.17.0), unknown fields rejected.

Documents of kinds whose schemas no registry we reach ships (cert-manager's Certificate and
Issuer, the Prometheus Operator's ServiceMonitor) are checked for the fields we rely on only.
"""

import base64
import copy
import functools
import pathlib
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "vramguard"
TOOLS = ROOT / "target" / "ci-tools"
HELM = str(TOOLS / "bin" / "helm")
HADOLINT = str(TOOLS / "venv" / "bin" / "hadolint")
KUBE = "1.33.0"
NS = "vramguard-system"
EXTERNAL = {"cert-manager.io/v1", "monitoring.coreos.com/v1"}

failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)
    print(f"FAIL {msg}")


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HELM, *args], capture_output=True, text=True)


def sets(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        flag = "--set-string" if isinstance(value, str) else "--set"
        out += [flag, f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return out


def render(values: dict) -> list[dict]:
    r = helm("template", "vg", str(CHART), "-n", NS, "--kube-version", KUBE, *sets(values))
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def kinds(docs: list[dict]) -> list[str]:
    return [d["kind"] for d in docs]


def find(docs: list[dict], kind: str, suffix: str = "") -> list[dict]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]


def rules(docs: list[dict], kind: str, suffix: str) -> list[tuple[str, str, str]]:
    out = []
    for role in find(docs, kind, suffix):
        for rule in role.get("rules", []):
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        out.append((g, r, v))
    return out


def webhook_config(docs: list[dict]) -> dict:
    return find(docs, "ValidatingWebhookConfiguration")[0]["webhooks"][0]


def pem_ok(b64: str) -> bool:
    try:
        return base64.b64decode(b64, validate=True).startswith(b"-----BEGIN CERTIFICATE-----")
    except ValueError:
        return False


def expect_default(docs):
    expect_no_kueue(docs)
    assert "Certificate" in kinds(docs) and "Issuer" in kinds(docs)
    assert "caBundle" not in webhook_config(docs)["clientConfig"]
    assert len(find(docs, "CustomResourceDefinition")) == 3
    crd = find(docs, "CustomResourceDefinition")[0]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/name"] == "vramguard"
    assert find(docs, "PodDisruptionBudget"), "a PDB"
    assert ("batch", "jobs", "create") in rules(docs, "ClusterRole", "vg-vramguard")
    assert find(docs, "Role", "-leader")
    editor = find(docs, "ClusterRole", "-trainingjob-editor")[0]["metadata"]["labels"]
    assert editor["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    viewer = find(docs, "ClusterRole", "-trainingjob-viewer")[0]["metadata"]["labels"]
    assert viewer["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert webhook_config(docs)["matchConditions"], "matchConditions"
    agent = find(docs, "DaemonSet")[0]["spec"]["template"]["spec"]
    c = agent["containers"][0]
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agent["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["livenessProbe"] and c["readinessProbe"]
    assert "ServiceMonitor" not in kinds(docs) and "ConfigMap" in kinds(docs)  # the test's
    assert find(docs, "Pod", "-test"), "the helm test pod"
    tsc = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert tsc[0]["topologyKey"] == "kubernetes.io/hostname"


def expect_generated(docs):
    secret = find(docs, "Secret", "-webhook-tls")[0]
    ca = webhook_config(docs)["clientConfig"]["caBundle"]
    assert secret["data"]["ca.crt"] == ca and pem_ok(ca), "caBundle is the generated CA"
    assert "Certificate" not in kinds(docs)


def expect_secret(docs):
    assert webhook_config(docs)["clientConfig"]["caBundle"] == CA_B64
    assert not find(docs, "Secret") and "Certificate" not in kinds(docs)
    vol = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"][0]
    assert vol["secret"]["secretName"] == "my-webhook-tls"


def expect_issuer(docs):
    assert "Issuer" not in kinds(docs)
    cert = find(docs, "Certificate")[0]
    assert cert["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def expect_no_agent(docs):
    assert "DaemonSet" not in kinds(docs)
    assert not find(docs, "ClusterRole", "-agent")


def expect_no_operator(docs):
    assert not find(docs, "Role", "-leader")
    granted = rules(docs, "ClusterRole", "vg-vramguard")
    # Reads, and the Events of enforcement Audit.
    assert all(v in ("list", "watch") or (g, r) == ("events.k8s.io", "events")
               for g, r, v in granted), granted
    args = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-operator" in args


def expect_monitoring(docs):
    monitors = find(docs, "ServiceMonitor")
    assert len(monitors) == 2, kinds(docs)
    for m in monitors:
        for e in m["spec"]["endpoints"]:
            assert e["path"] == "/metrics"
    board = find(docs, "ConfigMap", "-dashboard")[0]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    import json

    dashboard = json.loads(board["data"]["vramguard.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6, exprs
    for expr in exprs:
        assert "vramguard_" in expr, expr


def expect_restricted_agent(docs):
    agent = find(docs, "DaemonSet")[0]["spec"]["template"]["spec"]
    assert "volumes" not in agent
    assert agent["securityContext"]["runAsNonRoot"] is True


def expect_nvrtc(docs):
    agent = find(docs, "DaemonSet")[0]["spec"]["template"]["spec"]
    assert any(v["name"] == "nvrtc" for v in agent["volumes"])
    assert "--verify-mib=256" in agent["containers"][0]["args"]


def expect_keep_off(docs):
    for crd in find(docs, "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def expect_kueue(docs):
    check = find(docs, "AdmissionCheck")
    assert len(check) == 1, kinds(docs)
    assert check[0]["spec"]["controllerName"] == "vramguard.io/vram-fit"
    assert check[0]["metadata"]["name"] == "vramguard-vram-fit"
    granted = rules(docs, "ClusterRole", "vg-vramguard")
    for need in (("kueue.x-k8s.io", "workloads/status", "patch"),
                 ("kueue.x-k8s.io", "admissionchecks/status", "patch"),
                 ("kueue.x-k8s.io", "resourceflavors", "get")):
        assert need in granted, need
    env = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "VRAMGUARD_KUEUE_ADMISSION_CHECK", "value": "true"} in env, env
    assert {"name": "VRAMGUARD_KUEUE_RETRY_AFTER_SECS", "value": "120"} in env, env
    assert find(docs, "Role", "-leader"), "the controller leads by a Lease"


def expect_no_kueue(docs):
    assert not find(docs, "AdmissionCheck")
    assert not [r for r in rules(docs, "ClusterRole", "vg-vramguard") if r[0] == "kueue.x-k8s.io"]


def expect_no_crds(docs):
    assert not find(docs, "CustomResourceDefinition")


CA_B64 = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()

VALUE_SETS = [
    ("defaults", {}, expect_default),
    ("kueue admission check", {"kueue.admissionCheck.enabled": True,
                               "kueue.admissionCheck.retryAfterSeconds": 120}, expect_kueue),
    ("kueue admission check, operator off", {"kueue.admissionCheck.enabled": True,
                                             "operator.enabled": False}, None),
    ("tls generated", {"tls.mode": "generated"}, expect_generated),
    ("tls secret", {"tls.mode": "secret", "tls.secret.name": "my-webhook-tls",
                    "tls.secret.caBundle": CA_B64}, expect_secret),
    ("tls cert-manager issuer", {"tls.certManager.issuerRef.name": "corp-ca",
                                 "tls.certManager.issuerRef.kind": "ClusterIssuer"}, expect_issuer),
    ("agent off", {"agent.enabled": False}, expect_no_agent),
    ("operator off", {"operator.enabled": False}, expect_no_operator),
    ("monitoring on", {"monitoring.serviceMonitor.enabled": True,
                       "monitoring.dashboard.enabled": True,
                       "monitoring.serviceMonitor.labels.release": "prometheus"}, expect_monitoring),
    ("agent restricted", {"agent.podResources": False}, expect_restricted_agent),
    ("agent memory check", {"agent.verifyMiB": 256,
                            "agent.nvrtcHostPath": "/usr/local/cuda/lib64"}, expect_nvrtc),
    ("crds not kept", {"crds.keep": False}, expect_keep_off),
    ("crds not installed", {"crds.install": False}, expect_no_crds),
    ("single replica, Ignore", {"webhook.replicas": 1, "webhook.failurePolicy": "Ignore",
                                "webhook.podDisruptionBudget.enabled": False}, None),
]

REFUSED = [
    ({"tls.mode": "secret"}, "tls.mode=secret needs tls.secret.name"),
    ({"tls.mode": "secret", "tls.secret.name": "x"}, "needs tls.secret.caBundle"),
    ({"tls.mode": "generated", "tls.secret.name": "x"}, "only read with tls.mode=secret"),
    ({"tls.mode": "generated", "tls.certManager.issuerRef.name": "x"},
     "only read with tls.mode=certManager"),
    ({"tls.mode": "self"}, "at '/tls/mode': value must be one of"),
    ({"webhook.replicas": 1}, "would block every node drain"),
    ({"webhook.replicas": 1, "webhook.podDisruptionBudget.enabled": False},
     "failurePolicy=Fail with webhook.replicas=1"),
    ({"agent.verifyMiB": 64}, "needs NVRTC"),
    ({"agent.nvrtcHostPath": "/opt/cuda"}, "only used by the memory check"),
    ({"webhook.failurePolicy": "Sometimes"}, "failurePolicy"),
    ({"webhook.unknown": 1}, "additional properties 'unknown' not allowed"),
    ({"tls.secret.caBundle": "not base64!"}, "caBundle"),
    ({"kueue.admissionCheck.retryAfterSeconds": 7200}, "retryAfterSeconds"),
]


def check_external(doc: dict) -> None:
    """Fields we rely on in kinds whose schemas we cannot fetch."""
    spec = doc.get("spec", {})
    kind = doc["kind"]
    if kind == "Certificate":
        assert spec["secretName"] and spec["dnsNames"] and spec["issuerRef"]["name"]
    elif kind == "Issuer":
        assert spec == {"selfSigned": {}}
    elif kind == "ServiceMonitor":
        assert spec["selector"]["matchLabels"] and spec["endpoints"]
    else:
        raise AssertionError(f"no check for {doc['apiVersion']} {kind}")


@functools.cache
def kueue_schemas() -> dict:
    """Kueue's CRDs as tests/data/kueue/ vendors them (sigs.k8s.io/kueue v0.17.0)."""
    schemas = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in sorted((ROOT / "tests" / "data" / "kueue").glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=loader)
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def validate(name: str, docs: list[dict]) -> int:
    n = 0
    for doc in docs:
        what = f"{name}: {doc['kind']} {doc['metadata']['name']}"
        try:
            if doc["apiVersion"].startswith("kueue.x-k8s.io/"):
                schema = kueue_schemas()[(doc["apiVersion"], doc["kind"])]
                errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
                assert not errors, errors
            elif doc["apiVersion"] in EXTERNAL:
                check_external(doc)
            else:
                kubernetes_validate.validate(doc, KUBE, strict=True)
            n += 1
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
                AssertionError, KeyError) as e:
            fail(f"{what}: {e}")
    return n


def check_chart() -> None:
    r = helm("lint", "--strict", str(CHART), "--kube-version", KUBE)
    if r.returncode != 0:
        fail(f"helm lint --strict:\n{r.stdout}{r.stderr}")
    for name, values, expect in VALUE_SETS:
        r = helm("lint", "--strict", str(CHART), "--kube-version", KUBE, *sets(values))
        if r.returncode != 0:
            fail(f"helm lint --strict ({name}):\n{r.stdout}{r.stderr}")
        try:
            docs = render(values)
        except RuntimeError as e:
            fail(f"helm template ({name}): {e}")
            continue
        n = validate(name, docs)
        if expect is not None:
            try:
                expect(docs)
            except (AssertionError, KeyError, IndexError) as e:
                fail(f"{name}: expectation failed: {e!r}")
        print(f"ok   {name}: {n} of {len(docs)} documents valid against Kubernetes {KUBE}")
    for values, message in REFUSED:
        try:
            render(values)
            fail(f"{values}: rendered, but should be refused with '{message}'")
        except RuntimeError as e:
            if message not in str(e):
                fail(f"{values}: refused, but without '{message}': {e}")
            else:
                print(f"ok   refused {values}")


def strict(schema: dict) -> dict:
    """The CRD schema as the API server applies it with strict field validation: an object
    with `properties` and no preserve-unknown-fields takes no other field."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")
                    and "additionalProperties" not in node):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    s["properties"].update({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                            "metadata": {"type": "object"}})
    return s


def crd_schemas() -> dict:
    crds = [d for d in yaml.safe_load_all((ROOT / "crds" / "vramguard.yaml").read_text()) if d]
    schemas = {}
    for crd in crds:
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def check_the_checks() -> None:
    """Each validator rejects what it must: an unknown field in a rendered Deployment and in
    a TrainingJob, a wrong type in a TrainingJob."""
    deployment = find(render({}), "Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    try:
        kubernetes_validate.validate(deployment, KUBE, strict=True)
        fail("kubernetes-validate --strict accepted an unknown container field")
    except kubernetes_validate.ValidationError:
        pass
    schema = crd_schemas()[("vramguard.io/v1alpha1", "TrainingJob")]
    job = yaml.safe_load((ROOT / "examples" / "llama-3.1-8b-lora-h100.yaml").read_text())
    assert not list(jsonschema.Draft7Validator(schema).iter_errors(job))
    for path, value in ((("spec", "training", "microBatchSizes"), 4),
                        (("spec", "training", "microBatchSize"), "four")):
        bad = copy.deepcopy(job)
        bad[path[0]][path[1]][path[2]] = value
        if not list(jsonschema.Draft7Validator(schema).iter_errors(bad)):
            fail(f"the CRD schema accepted {'.'.join(path)}: {value!r}")
    print("ok   the validators reject an unknown field and a wrong type")


def check_examples() -> None:
    schemas = crd_schemas()
    seen = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for i, doc in enumerate(d for d in yaml.safe_load_all(path.read_text()) if d):
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key not in schemas:
                continue
            errors = sorted(jsonschema.Draft7Validator(schemas[key]).iter_errors(doc),
                            key=lambda e: list(e.absolute_path))
            for e in errors:
                where = ".".join(str(p) for p in e.absolute_path)
                fail(f"examples/{path.name} document {i + 1} ({key[1]}): {where}: {e.message}")
            seen += 1
    if seen < 10:
        fail(f"only {seen} example TrainingJobs/GpuNodes found")
    print(f"ok   {seen} example objects valid against the CRD schemas")


def check_dockerfile() -> None:
    r = subprocess.run([HADOLINT, "--failure-threshold", "info", "Dockerfile"], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"hadolint Dockerfile:\n{r.stdout}{r.stderr}")
    else:
        print("ok   hadolint Dockerfile")


def check_readme() -> None:
    r = subprocess.run([sys.executable, str(ROOT / ".ci" / "chart_readme.py"), "--check"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(r.stdout + r.stderr)
    else:
        print("ok   charts/vramguard/README.md is up to date")


def main() -> None:
    check_the_checks()
    check_chart()
    check_examples()
    check_dockerfile()
    check_readme()
    if failures:
        sys.exit(f"{len(failures)} chart check(s) failed")
    print("chart checks passed")


if __name__ == "__main__":
    main()
