#!/usr/bin/env python3
"""The reference's training steps on a real GPU.

`benches/reference/sweep.py` measures each configuration's live tensors on the
meta device; what only a GPU shows is left out there: the caching allocator's
rounding and fragmentation (reserved), cuBLAS and cuDNN workspaces, the
kernels' own scratch, and the CUDA context with the kernel images a step
loads (what nvidia-smi shows). This script runs the same configurations (the
same models from their configs, random weights, the same recipes and
Transformers' Trainer for the `-trainer` ids) on the GPU, each in a fresh
process: one warm-up step, then three measured steps. It records for the
whole run

- `allocated`: `torch.cuda.max_memory_allocated()`;
- `reserved`: `torch.cuda.max_memory_reserved()`;
- `device`: the process's memory as NVML reports it at the end (the context,
  the kernel images loaded and what the allocator holds);

and writes them as calibration rows (`jobs/<id>.yaml` + `expected.json`) under
benches/ground-truth/, where `cargo test --release --test calibration --
--nocapture` sets them against the estimate's range. Each row's job names the
PyTorch, CUDA and Transformers releases it ran under (`training.runtime`), and a pure
16-bit run's job says its model was built at fp32 on the GPU and cast there
(`training.weightsLoad: fp32-cast`), as `sweep.build` and `sweep.prepare` do.
Mixtral routes evenly, as in the sweep and as the estimator assumes.

    python3 benches/gpu_reference.py                   # every configuration
    python3 benches/gpu_reference.py --only llama      # ids containing "llama"
    python3 benches/gpu_reference.py --deadline 300    # stop starting runs after 300 s

Runs go several at a time: a run starts when the GPU memory the meta
reference measured for it (times two, plus 2 GiB) fits beside the running ones.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
sys.path.insert(0, HERE)
OUT = os.path.join(HERE, "ground-truth")
GIB = 1 << 30


def runtime():
    """The releases this process runs, as the contract's `training.runtime` says them."""
    from importlib.metadata import version

    import torch

    return {"pytorch": version("torch").split("+")[0],
            "cuda": torch.version.cuda,
            "transformers": version("transformers")}


def run_one(c):
    """One configuration on the GPU, in this process."""
    import torch

    import sweep
    from gpu_truth import nvml_used

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    dev = "cuda"
    torch.zeros(1, device=dev)
    context = nvml_used()
    model, batch, head, vocab, cfg = sweep.build(c, torch, device=dev)
    fam = c["family"]
    amp = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(c["precision"])
    model, adapted, _, trainable, opt = sweep.prepare(model, c, torch)
    trainer = sweep.hf_trainer(model, opt, c, torch, lambda: None, device=dev) \
        if c["stack"] == "trainer" else None
    chunked = c["loss"] == "chunked"

    def step():
        for _ in range(c["accum"]):
            data = batch()
            with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                if trainer is not None:
                    trainer.training_step(model, data)
                else:
                    loss = sweep.forward(model, data, fam, chunked, torch, head)
            if trainer is None:
                (loss / c["accum"]).backward()
                del loss
            del data
        if trainer is not None:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        step()
        torch.cuda.synchronize()
        first = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        return dict(oom=True, capacity=torch.cuda.get_device_properties(0).total_memory), cfg
    steady = torch.cuda.max_memory_allocated()
    return dict(oom=False, allocated=max(first, steady), steady_allocated=steady,
                first_step_allocated=first,
                reserved=torch.cuda.max_memory_reserved(), device=nvml_used(),
                context=context, trainable=trainable, adapted=adapted,
                capacity=torch.cuda.get_device_properties(0).total_memory,
                runtime=runtime()), cfg


def meta_peaks():
    """The meta reference's measured peak per id, to size the runs that go together."""
    path = os.path.join(HERE, "reference", "rows", "expected.json")
    if not os.path.exists(path):
        return {}
    return {rid: e.get("measured_bytes") or 0 for rid, e in json.load(open(path)).items()}


class _Config:
    """A config as `sweep.job` reads it, from the dict a run printed."""

    def __init__(self, d):
        self.d = d

    def to_dict(self):
        return dict(self.d)


def loaded_as_run(job):
    """The job with `training.weightsLoad` as the run loaded its weights: `sweep.build` makes
    the model at fp32 on the GPU and `sweep.prepare` casts a pure 16-bit one there, so the
    cast's freed fp32 blocks stay in the caching allocator (`fp32-cast`); mixed and fp32 runs
    train the fp32 weights as built. Placed after `precision`, which it goes with."""
    training = job["spec"]["training"]
    if training["precision"] not in ("bf16", "fp16"):
        return job
    declared = {}
    for k, v in training.items():
        declared[k] = v
        if k == "precision":
            declared["weightsLoad"] = "fp32-cast"
    job["spec"]["training"] = declared
    return job


def write_rows(rid, c, r, gpu, expected, out):
    import yaml

    import sweep

    c = dict(c, runtime=r["runtime"])
    for kind in ("allocated", "reserved", "device"):
        if r.get(kind) is None:
            continue  # NVML gave no per-process figure
        row = f"ref-{rid}-{kind}"
        job = loaded_as_run(sweep.job(row, c, _Config(r["cfg"]) if r["cfg"] else None,
                                      r["trainable"], r["adapted"]))
        with open(os.path.join(out, "jobs", f"{row}.yaml"), "w") as f:
            f.write(f"# {row}: measured on a GPU by benches/gpu_reference.py\n")
            yaml.safe_dump(job, f, sort_keys=False, default_flow_style=None, width=100)
        expected[row] = dict(
            metric_kind=kind, measured_bytes=r[kind], oom=False,
            gpu_capacity_bytes=r["capacity"], gpu=gpu, confidence="high",
            source_repo="vramguard benches/gpu_reference.py", split="ground-truth",
            unmapped=[], assumptions=["Mixtral routes evenly, as the estimator assumes"]
            if c["family"] == "mixtral" else [],
            context_bytes=r["context"], steady_allocated_bytes=r["steady_allocated"],
            first_step_allocated_bytes=r["first_step_allocated"])


def main():
    import sweep
    from gpu_truth import catalog_name

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the ids that contain this text")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=OUT, help="where jobs/ and expected.json go")
    ap.add_argument("--parallel", type=int, default=8, help="runs at a time, at most")
    ap.add_argument("--budget-gib", type=float, default=110.0,
                    help="GPU memory the runs that go together may take")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="seconds after which no run starts (0: none)")
    args = ap.parse_args()
    configs = dict(sweep.configurations())
    if args.one:
        r, cfg = run_one(configs[args.one])
        r["cfg"] = sweep.hf_dict(cfg) if cfg is not None else None
        print(json.dumps(r))
        return
    product = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.splitlines()[0]
    gpu = catalog_name(product)
    os.makedirs(os.path.join(args.out, "jobs"), exist_ok=True)
    path = os.path.join(args.out, "expected.json")
    expected = json.load(open(path)) if os.path.exists(path) else {}
    # Configurations measured already are kept, not run again.
    runs = [rid for rid in configs if args.only in rid and f"ref-{rid}-allocated" not in expected]
    random.Random(0).shuffle(runs)  # a run cut short by the deadline still spans the axes
    peaks = meta_peaks()
    need = {rid: 2 * peaks.get(rid, 4 * GIB) + 2 * GIB for rid in runs}
    t0, running, done, failed = time.time(), {}, 0, 0
    budget = args.budget_gib * GIB
    while runs or running:
        late = args.deadline and time.time() - t0 > args.deadline
        while runs and not late and len(running) < args.parallel and (
                not running or sum(need[r] for r in running) + need[runs[0]] <= budget):
            rid = runs.pop(0)
            running[rid] = subprocess.Popen(
                [sys.executable, __file__, "--one", rid], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        if late:
            runs = []
        time.sleep(0.2)
        for rid, proc in list(running.items()):
            if proc.poll() is None:
                continue
            out, err = proc.communicate()
            del running[rid]
            if proc.returncode != 0:
                failed += 1
                print(f"{rid}: failed\n{err[-2000:]}", file=sys.stderr)
                continue
            r = json.loads(out.strip().splitlines()[-1])
            if r["oom"]:
                failed += 1
                print(f"{rid}: OOM beside other runs", file=sys.stderr)
                continue
            write_rows(rid, configs[rid], r, gpu, expected, args.out)
            done += 1
            print(f"{rid}: allocated {r['allocated'] / GIB:.3f} reserved "
                  f"{r['reserved'] / GIB:.3f} device {(r['device'] or 0) / GIB:.3f} GiB",
                  file=sys.stderr)
            with open(path, "w") as f:
                json.dump(expected, f, indent=1, sort_keys=True)
                f.write("\n")
    print(f"{done} measured, {failed} failed, {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
