"""The Python API: runs the `vramguard` binary this wheel installed and reads its JSON.

The binary is found through this distribution's own record of the files pip installed
(then the scripts directory of the install scheme this package lies in), never through
PATH, so another vramguard on the PATH is never the one that answers.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sysconfig
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

Spec = Union[Mapping[str, Any], str, "os.PathLike[str]", None]

_EXIT_FITS = 0
_EXIT_DOES_NOT_FIT = 1
_EXIT_BAD_INPUT = 2


class VramguardError(RuntimeError):
    """vramguard could not answer (bad input, or the binary failed).

    `errors` holds one `path: reason` string per problem (a sentence where a problem names
    no field); `problems` the structured form (source, document, path, reason, flag,
    message) where the binary gave one."""

    def __init__(self, errors: List[str], problems: Optional[List[Dict[str, Any]]] = None,
                 exit_code: Optional[int] = None) -> None:
        self.errors = list(errors)
        self.problems = list(problems or [])
        self.exit_code = exit_code
        super().__init__("\n".join(self.errors) or "vramguard failed")


class SpecError(VramguardError, ValueError):
    """The job is invalid: `errors` lists every `path: reason` (e.g.
    `spec.training.microBatchSize: must be at least 1`)."""


def _package_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent


def _from_record(name: str) -> Optional[pathlib.Path]:
    """The script `name` that pip installed with this very copy of the package."""
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    here = _package_dir()
    for dist in metadata.distributions():
        if (dist.metadata.get("Name") or "").lower() != "vramguard":
            continue
        files = dist.files or []
        ours = any(
            f.parts[-2:] == ("vramguard", "__init__.py")
            and pathlib.Path(str(dist.locate_file(f))).resolve().parent == here
            for f in files
        )
        if not ours:
            continue
        for f in files:
            if f.name == name:
                path = pathlib.Path(str(dist.locate_file(f))).resolve()
                if path.is_file():
                    return path
    return None


def _from_scheme(name: str) -> Optional[pathlib.Path]:
    """The scripts directory of the install scheme whose site-packages holds this package."""
    site = _package_dir().parent
    for scheme in sysconfig.get_scheme_names():
        try:
            paths = sysconfig.get_paths(scheme)
        except KeyError:  # pragma: no cover - a scheme this interpreter cannot expand
            continue
        libs = {paths.get("purelib"), paths.get("platlib")}
        if any(lib and pathlib.Path(lib).resolve() == site for lib in libs):
            path = pathlib.Path(paths["scripts"]) / name
            if path.is_file():
                return path
    return None


def binary(name: str = "vramguard") -> pathlib.Path:
    """The path of the `vramguard` (or `kubectl-vramguard`) binary installed with this package."""
    found = _from_record(name) or _from_scheme(name)
    if found is None:
        raise VramguardError(
            [f"the {name} binary of this vramguard package is not installed next to it "
             f"({_package_dir()}); reinstall with `pip install --force-reinstall vramguard`"])
    return found


def _flag_args(flags: Mapping[str, Any]) -> Tuple[List[str], List[tempfile.TemporaryDirectory]]:  # type: ignore[type-arg]
    """`micro_batch=2` -> `--micro-batch=2`; lists comma-joined; booleans true/false;
    `set={"spec.a.b": 1}` -> `--set=spec.a.b=1`; `hf_config` a dict -> a temporary file."""
    args: List[str] = []
    keep: List[tempfile.TemporaryDirectory] = []  # type: ignore[type-arg]
    for key, value in flags.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key == "set":
            items = value.items() if isinstance(value, Mapping) else (
                tuple(str(v).split("=", 1)) for v in value)
            for path, v in items:
                args.append(f"--set={path}={json.dumps(v) if not isinstance(v, str) else v}")
            continue
        if key == "hf_config" and isinstance(value, Mapping):
            tmp = tempfile.TemporaryDirectory(prefix="vramguard-")
            keep.append(tmp)
            path = pathlib.Path(tmp.name) / "config.json"
            path.write_text(json.dumps(value))
            value = path
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(v) for v in value)
        else:
            text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        args.append(f"{flag}={text}")
    return args, keep


def _spec_args(spec: Spec) -> Tuple[List[str], Optional[bytes]]:
    """How `spec` reaches the binary: a dict as JSON on stdin, YAML text on stdin, a path
    as `-f PATH`; None: the job is given by flags alone."""
    if spec is None:
        return [], None
    if isinstance(spec, Mapping):
        return ["-f", "-"], json.dumps(spec).encode()
    if isinstance(spec, os.PathLike):
        return ["-f", os.fspath(spec)], None
    if isinstance(spec, str):
        # YAML or JSON text has a newline, a `key: value` or a `{`; else it is a path.
        if "\n" in spec or ": " in spec or spec.lstrip().startswith("{"):
            return ["-f", "-"], spec.encode()
        return ["-f", spec], None
    raise TypeError(
        f"spec: expected a dict, YAML text or a path, got {type(spec).__name__}")


def _gpu_args(gpu: Optional[str], gpus: Optional[Sequence[str]]) -> List[str]:
    if gpu is not None and gpus is not None:
        raise TypeError("give gpu or gpus, not both")
    if isinstance(gpus, str):
        gpus = [gpus]
    if gpus is not None:
        return ["--gpus", ",".join(gpus)]
    if gpu is not None:
        return ["--gpu", gpu]
    return []


def _errors(stderr: str, code: int) -> VramguardError:
    problems: List[Dict[str, Any]] = []
    for line in stderr.splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("errors"), list):
            problems.extend(p for p in parsed["errors"] if isinstance(p, dict))
    if problems:
        errors = [f"{p['path']}: {p['reason']}" if p.get("path") else str(p.get("reason"))
                  for p in problems]
        return SpecError(errors, problems, code)
    lines = [line.removeprefix("error: ") for line in stderr.splitlines() if line.strip()]
    cls = SpecError if code == _EXIT_BAD_INPUT else VramguardError
    return cls(lines or [f"vramguard exited with {code}"], None, code)


def _run(command: str, spec: Spec, extra: List[str], flags: Mapping[str, Any]) -> Tuple[int, Any]:
    spec_args, stdin = _spec_args(spec)
    flag_args, keep = _flag_args(flags)
    argv = [str(binary()), command, "-o", "json", "--error-format", "json",
            *spec_args, *extra, *flag_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMGUARD_")}
    env["NO_COLOR"] = "1"
    try:
        done = subprocess.run(argv, input=stdin if stdin is not None else b"",
                              capture_output=True, env=env, check=False)
    finally:
        for tmp in keep:
            tmp.cleanup()
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode not in (_EXIT_FITS, _EXIT_DOES_NOT_FIT):
        raise _errors(stderr, done.returncode)
    try:
        return done.returncode, json.loads(done.stdout)
    except ValueError as e:
        raise VramguardError([f"vramguard printed no JSON: {e}: {stderr.strip()}"],
                             None, done.returncode) from e


def estimate_all(spec: Spec = None, gpu: Optional[str] = None,
                 gpus: Optional[Sequence[str]] = None, **flags: Any) -> List[Dict[str, Any]]:
    """`estimate` for a spec of one or several documents: one report per job."""
    _, out = _run("estimate", spec, _gpu_args(gpu, gpus), flags)
    return out if isinstance(out, list) else [out]


def estimate(spec: Spec = None, gpu: Optional[str] = None,
             gpus: Optional[Sequence[str]] = None, **flags: Any) -> Dict[str, Any]:
    """Estimate one job: what `vramguard estimate -o json` prints, as a dict.

    `spec`: a TrainingJob (dict), its YAML text, or a path to a YAML file; or None and the
    job by flags. `flags`: any spec flag of the CLI with `_` for `-` (`model="llama-3.1-8b",
    mode="qlora", micro_batch=2, seq=4096`), applied over `spec` when both are given.
    Raises SpecError (its `errors`: every `path: reason`) when the job is invalid."""
    reports = estimate_all(spec, gpu, gpus, **flags)
    if len(reports) != 1:
        raise TypeError(
            f"spec holds {len(reports)} jobs; estimate() takes one, estimate_all() several")
    return reports[0]


def fit(spec: Spec = None, gpu: Optional[str] = None,
        gpus: Optional[Sequence[str]] = None, **flags: Any) -> bool:
    """True when the job fits, as written, on at least one of the GPUs asked about (every
    job, for several); the plan that would make it fit is `estimate(...)["plan"]`."""
    return all(r["fits"] for r in estimate_all(spec, gpu, gpus, **flags))


def max(spec: Spec = None, gpu: Optional[str] = None, all_changes: bool = False,  # noqa: A001
        **flags: Any) -> Dict[str, Any]:
    """The largest micro-batch and longest sequence that fit on `gpu`, as written and after
    each allowed change: what `vramguard max -o json` prints, as a dict (one job)."""
    extra = ["--gpu", gpu] if gpu is not None else []
    if all_changes:
        extra.append("--all-changes")
    _, out = _run("max", spec, extra, flags)
    if isinstance(out, list):
        raise TypeError(f"spec holds {len(out)} jobs; max() takes one")
    return out  # type: ignore[no-any-return]
