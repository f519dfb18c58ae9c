"""The Python wheel, as a user gets it: built with maturin from this tree (into the repo's
target/, reusing the release build), installed into a fresh virtual environment, then
used there: both binaries on the venv's PATH, the CLI on an example, the Python API on a
dict, on a bad dict (SpecError with every path), on flags alone, `max`, and
`kubectl vramguard estimate` through kubectl's own plugin lookup.

Run by .ci/run with the tools' interpreter (maturin and kubectl come from .ci/tools.py):
    target/ci-tools/venv/bin/python -m unittest -v tests/wheel/test_wheel.py
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import venv

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "target" / "ci-tools"
MATURIN = pathlib.Path(sys.executable).parent / "maturin"
KUBECTL = TOOLS / "bin" / "kubectl"
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-lora-h100.yaml"

# Three problems in three fields: the exception must carry all three paths.
BAD_JOB = {
    "apiVersion": "vramguard.io/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "bad"},
    "spec": {
        "model": {"preset": "no-such-model"},
        "training": {
            "mode": "lorax",
            "microBatchSize": 0,
            "sequenceLength": 4096,
            "precision": "bf16",
        },
    },
}
BAD_PATHS = {"spec.model.preset", "spec.training.mode", "spec.training.microBatchSize"}

FLAGS = {"model": "llama-3.1-8b", "mode": "qlora", "micro_batch": 2, "seq": 4096}
FLAG_ARGS = ["--model", "llama-3.1-8b", "--mode", "qlora", "--micro-batch", "2", "--seq", "4096"]


def run(args, env=None, stdin=None, cwd=None, timeout=300):
    done = subprocess.run(
        [str(a) for a in args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    return done


class Wheel(unittest.TestCase):
    tmp: tempfile.TemporaryDirectory
    venv: pathlib.Path
    env: dict

    @classmethod
    def setUpClass(cls):
        if not MATURIN.is_file():
            raise AssertionError(f"{MATURIN}: missing; run python3 .ci/tools.py first")
        if not KUBECTL.is_file():
            raise AssertionError(f"{KUBECTL}: missing; run python3 .ci/tools.py first")
        cls.tmp = tempfile.TemporaryDirectory(prefix="vramguard-wheel-")
        tmp = pathlib.Path(cls.tmp.name)
        wheels = tmp / "wheels"
        # The same target/ and release profile as `cargo build --release`: warm, it links nothing.
        built = run([MATURIN, "build", "--out", wheels], cwd=ROOT, timeout=3600)
        assert built.returncode == 0, built.stderr
        (wheel,) = wheels.glob("vramguard-*.whl")
        cls.wheel = wheel
        cls.venv = tmp / "venv"
        venv.EnvBuilder(with_pip=True).create(cls.venv)
        installed = run(
            [cls.venv / "bin" / "pip", "install", "--no-index", "--no-deps",
             "--disable-pip-version-check", "-q", wheel]
        )
        assert installed.returncode == 0, installed.stderr
        # A user's shell: the venv's bin first, no VRAMGUARD_* settings, no kubeconfig.
        cls.home = tmp / "home"
        cls.home.mkdir()
        cls.env = {
            k: v for k, v in os.environ.items()
            if not k.startswith("VRAMGUARD_") and k not in ("KUBECONFIG", "VIRTUAL_ENV")
        }
        cls.env["HOME"] = str(cls.home)
        cls.env["PATH"] = f"{cls.venv / 'bin'}:{KUBECTL.parent}:/usr/bin:/bin"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def py(self, code, env=None):
        """Run `code` in the venv's Python; it prints one JSON value, returned decoded."""
        done = run([self.venv / "bin" / "python", "-c", textwrap.dedent(code)],
                   env=env or self.env, cwd=self.home)
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout)

    def cli_json(self, *args):
        done = run(["vramguard", *args, "-o", "json"], env=self.env, cwd=self.home)
        self.assertIn(done.returncode, (0, 1), done.stderr)
        return json.loads(done.stdout)

    def test_wheel_is_manylinux_x86_64_with_both_binaries_and_the_package(self):
        self.assertRegex(self.wheel.name, r"-py3-none-manylinux_2_\d+_x86_64\.whl$")
        for name in ("vramguard", "kubectl-vramguard"):
            path = shutil.which(name, path=self.env["PATH"])
            self.assertEqual(pathlib.Path(path).parent, self.venv / "bin", name)
            done = run([name, "--help"], env=self.env)
            self.assertEqual(done.returncode, 0, done.stderr)
        site = self.py("import vramguard, json; print(json.dumps(vramguard.__file__))")
        pkg = pathlib.Path(site).parent
        for name in ("__init__.pyi", "py.typed"):
            self.assertTrue((pkg / name).is_file(), name)

    def test_cli_on_an_example(self):
        done = run(["vramguard", "estimate", "-f", EXAMPLE], env=self.env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("h100-80gb", done.stdout)
        self.assertIn("fits with", done.stdout)
        report = self.cli_json("estimate", "-f", EXAMPLE)
        self.assertTrue(report["fits"])
        self.assertGreater(report["estimate"]["perGpuBytes"], 10 * 2**30)

    def test_api_on_a_dict_gives_what_the_cli_gives_on_the_file(self):
        import yaml  # in the tools' venv (the test's interpreter), not in the fresh one

        doc = yaml.safe_load(EXAMPLE.read_text())
        # The estimate is the first GPU's: the same list on both sides.
        want = self.cli_json("estimate", "-f", EXAMPLE, "--gpus", "a100-40gb,h100-80gb")
        got = self.py(f"""
            import json, vramguard
            print(json.dumps(vramguard.estimate({json.dumps(doc)},
                                                gpus=["a100-40gb", "h100-80gb"])))
        """)
        self.assertEqual([v["gpu"] for v in got["verdicts"]], ["a100-40gb", "h100-80gb"])
        self.assertEqual(got["estimate"], want["estimate"])
        self.assertEqual(got["name"], doc["metadata"]["name"])
        # The same file as a path (str and PathLike) and as YAML text.
        for spec in (repr(str(EXAMPLE)), f"pathlib.Path({str(EXAMPLE)!r})",
                     repr(EXAMPLE.read_text())):
            same = self.py(f"""
                import json, pathlib, vramguard
                print(json.dumps(vramguard.estimate({spec}, gpus=["a100-40gb", "h100-80gb"])))
            """)
            self.assertEqual(same["estimate"], want["estimate"])

    def test_api_on_a_bad_dict_raises_spec_error_with_every_path(self):
        got = self.py(f"""
            import json, vramguard
            try:
                vramguard.estimate({json.dumps(BAD_JOB)})
            except vramguard.SpecError as e:
                print(json.dumps({{"errors": e.errors, "problems": e.problems,
                                  "value_error": isinstance(e, ValueError),
                                  "exit": e.exit_code}}))
            else:
                print(json.dumps(None))
        """)
        self.assertIsNotNone(got, "no SpecError")
        self.assertTrue(got["value_error"])
        self.assertEqual(got["exit"], 2)
        paths = {e.split(": ", 1)[0] for e in got["errors"]}
        self.assertTrue(BAD_PATHS <= paths, got["errors"])
        self.assertEqual({p["path"] for p in got["problems"]} & BAD_PATHS, BAD_PATHS)

    def test_flags_only_estimate_matches_the_cli(self):
        got = self.py(f"""
            import json, vramguard
            print(json.dumps(vramguard.estimate(gpu="rtx-4090", **{FLAGS!r})))
        """)
        want = self.cli_json("estimate", *FLAG_ARGS, "--gpu", "rtx-4090")
        self.assertEqual(got["model"], "llama-3.1-8b")
        self.assertEqual(got["estimate"], want["estimate"])
        self.assertEqual(got["verdicts"][0]["gpu"], "rtx-4090")
        # A bad flag value names the field and the flag.
        bad = self.py("""
            import json, vramguard
            try:
                vramguard.estimate(model="llama-3.1-8b", mode="lorax")
            except vramguard.SpecError as e:
                print(json.dumps([e.errors, e.problems]))
        """)
        self.assertIn("spec.training.mode", bad[0][0])
        self.assertEqual(bad[1][0]["flag"], "--mode")

    def test_max_from_the_cli_and_the_api(self):
        cli = run(["vramguard", "max", "--gpu", "a100-40gb", *FLAG_ARGS], env=self.env)
        self.assertIn(cli.returncode, (0, 1), cli.stderr)
        self.assertIn("micro-batch", cli.stdout)
        got = self.py(f"""
            import json, vramguard
            print(json.dumps(vramguard.max(gpu="a100-40gb", all_changes=True, **{FLAGS!r})))
        """)
        self.assertEqual(got["gpu"], "a100-40gb")
        self.assertEqual(got["rows"][0]["change"], "as written")
        self.assertGreater(len(got["rows"]), 1)
        fits = self.py(f"""
            import json, vramguard
            print(json.dumps(vramguard.fit({str(EXAMPLE)!r})))
        """)
        self.assertIs(fits, True)

    def test_api_runs_its_own_binary_not_one_on_the_path(self):
        impostor = pathlib.Path(self.tmp.name) / "impostor"
        impostor.mkdir(exist_ok=True)
        fake = impostor / "vramguard"
        fake.write_text("#!/bin/sh\necho impostor >&2\nexit 97\n")
        fake.chmod(0o755)
        env = dict(self.env, PATH=f"{impostor}:{self.env['PATH']}")
        got = self.py("""
            import json, vramguard
            r = vramguard.estimate(model="gpt2", mode="full", micro_batch=1, seq=128)
            print(json.dumps([str(vramguard.binary()), r["model"]]))
        """, env=env)
        self.assertEqual(pathlib.Path(got[0]), self.venv / "bin" / "vramguard")
        self.assertEqual(got[1], "gpt2")

    def test_kubectl_finds_the_plugin_and_runs_estimate(self):
        plugins = run([KUBECTL, "plugin", "list"], env=self.env)
        self.assertIn(str(self.venv / "bin" / "kubectl-vramguard"), plugins.stdout, plugins.stderr)
        done = run([KUBECTL, "vramguard", "estimate", "-f", EXAMPLE, "-o", "json"], env=self.env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(json.loads(done.stdout)["estimate"],
                         self.cli_json("estimate", "-f", EXAMPLE)["estimate"])
        flags = run([KUBECTL, "vramguard", "estimate", *FLAG_ARGS, "--gpu", "rtx-4090"],
                    env=self.env)
        self.assertIn(flags.returncode, (0, 1), flags.stderr)
        self.assertIn("rtx-4090", flags.stdout)

    def test_output_in_a_pipe_has_no_escape_codes(self):
        done = run(["vramguard", "estimate", "-f", EXAMPLE, "--color", "auto"], env=self.env)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertNotIn("\x1b[", done.stdout)


if __name__ == "__main__":
    unittest.main()
