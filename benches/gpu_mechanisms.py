#!/usr/bin/env python3
"""Single mechanisms of the range, measured on a GPU, each in a fresh process.

- `context`: the CUDA context and the kernel images a step loads, as NVML sees
  the process (minus what PyTorch's allocator holds), after each library's
  first kernel: the first tensor, a bf16 GEMM (cuBLAS), a convolution forward
  and backward (cuDNN), fused attention forward and backward, and an NCCL
  all-reduce (a one-rank group); under lazy module loading (the default) and
  with `CUDA_MODULE_LOADING=EAGER`. Bounds `cudaContext`.
- `cudnn`: a convolutional network's step with `torch.backends.cudnn.benchmark`
  off and on: what the algorithms' workspaces add to the peak. Bounds
  `cudnnWorkspace`.
- `varlen`: a decoder trained over 40 steps whose batches are padded to
  their longest sample (lengths drawn between 1/16 and all of the longest;
  GPT-2 at micro-batch 8 and 1 024 tokens, or `VARLEN_RUNS=llama:4:1024,…`),
  beside the same steps at the longest length, with and without
  `expandable_segments`: reserved climbs past the largest step's allocated
  bytes. Bounds `allocatorFragmentation`. Written as calibration rows
  (`mech-…` under benches/ground-truth/).

    python3 benches/gpu_mechanisms.py            # all three; prints JSON lines
    python3 benches/gpu_mechanisms.py context    # one
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
sys.path.insert(0, HERE)
OUT = os.path.join(HERE, "ground-truth")
MIB = 1 << 20


def context():
    import torch
    import torch.nn.functional as F

    from gpu_truth import nvml_used

    stages = []

    def mark(name):
        torch.cuda.synchronize()
        used = nvml_used()
        reserved = torch.cuda.memory_reserved()
        stages.append(dict(stage=name, nvml_mib=used / MIB if used else None,
                           reserved_mib=reserved / MIB,
                           context_mib=(used - reserved) / MIB if used else None))

    torch.zeros(1, device="cuda")
    mark("first tensor")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    mark("bf16 GEMM (cuBLAS)")
    x = torch.randn(32, 64, 56, 56, device="cuda", requires_grad=True)
    w = torch.randn(64, 64, 3, 3, device="cuda", requires_grad=True)
    F.conv2d(x, w, padding=1).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        F.conv2d(x, w, padding=1).sum().backward()
    mark("convolution fwd+bwd, fp32 and bf16 (cuDNN)")
    q = torch.randn(4, 16, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    mark("fused attention fwd+bwd (SDPA)")
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    t = torch.ones(64 * MIB // 4, device="cuda")
    dist.all_reduce(t)
    mark("NCCL all-reduce, one rank")
    dist.destroy_process_group()
    return dict(loading=os.environ.get("CUDA_MODULE_LOADING", "default (lazy)"),
                pytorch=torch.__version__, cuda=torch.version.cuda, stages=stages)


def cudnn(model_name, mb, precision):
    import torch
    import torch.nn.functional as F
    import torchvision

    out = {}
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        model = getattr(torchvision.models, model_name)(weights=None).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(mb, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (mb,), device="cuda")
        mixed = precision == "bf16-mixed"
        for i in range(3):
            if i == 1:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mixed):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out["benchmark" if bench else "heuristic"] = dict(
            allocated_mib=torch.cuda.max_memory_allocated() / MIB,
            reserved_mib=torch.cuda.max_memory_reserved() / MIB)
        del model, opt, x, y, loss
        torch.cuda.empty_cache()
    return dict(model=model_name, mb=mb, precision=precision, **out)


VARLEN = dict(family="gpt2", mb=8, seq=1024, precision="bf16-mixed", optimizer="adamw",
              impl="foreach", ckpt="none", loss="standard", accum=1, peft="none",
              stack="plain")
# The runs `varlen` makes: (family, micro-batch, longest sequence).
VARLEN_RUNS = [("gpt2", 8, 1024)]


def varlen(shapes, family="gpt2", mb=8, seq=1024):
    """`shapes`: "variable" or "fixed"; the allocator settings come from the environment."""
    import random

    import torch

    import sweep

    torch.manual_seed(0)
    c = dict(VARLEN, family=family, mb=mb, seq=seq)
    model, _, head, vocab, cfg = sweep.build(c, torch, device="cuda")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    rng = random.Random(0)
    peak_step = 0
    for i in range(40):
        s = c["seq"] if shapes == "fixed" else rng.randint(c["seq"] // 16, c["seq"])
        ids = torch.randint(0, vocab, (c["mb"], s), device="cuda")
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peak_step = max(peak_step, torch.cuda.max_memory_allocated())
    from gpu_truth import nvml_used

    return dict(shapes=shapes, family=family, mb=mb, seq=seq,
                conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                allocated=peak_step, reserved=torch.cuda.memory_reserved(),
                device=nvml_used(), cfg=sweep.hf_dict(cfg),
                capacity=torch.cuda.get_device_properties(0).total_memory,
                runtime={"pytorch": torch.__version__.split("+")[0], "cuda": torch.version.cuda,
                         "transformers": __import__("transformers").__version__})


def varlen_rows(results, gpu):
    """The varlen runs as calibration rows."""
    import yaml

    import sweep
    from gpu_reference import _Config

    os.makedirs(os.path.join(OUT, "jobs"), exist_ok=True)
    path = os.path.join(OUT, "expected.json")
    expected = json.load(open(path)) if os.path.exists(path) else {}
    for r in results:
        exp = "expandable" if "expandable_segments:True" in r["conf"] else "default"
        c = dict(VARLEN, family=r["family"], mb=r["mb"], seq=r["seq"], runtime=r["runtime"])
        for kind in ("allocated", "reserved", "device"):
            if r.get(kind) is None:
                continue
            row = f"mech-{r['family']}-mb{r['mb']}-s{r['seq']}-{r['shapes']}-{exp}-{kind}"
            job = sweep.job(row, c, _Config(r["cfg"]))
            job["spec"]["training"]["batching"] = "variable" if r["shapes"] == "variable" \
                else "padded"
            env = [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": r["conf"]}] if r["conf"] else []
            job["spec"]["template"] = {"spec": {"containers": [
                {"name": "trainer", "image": "trainer", "env": env}]}}
            with open(os.path.join(OUT, "jobs", f"{row}.yaml"), "w") as f:
                f.write(f"# {row}: measured on a GPU by benches/gpu_mechanisms.py varlen\n")
                yaml.safe_dump(job, f, sort_keys=False, default_flow_style=None, width=100)
            expected[row] = dict(
                metric_kind=kind, measured_bytes=r[kind], oom=False,
                gpu_capacity_bytes=r["capacity"], gpu=gpu, confidence="high",
                source_repo="vramguard benches/gpu_mechanisms.py", split="ground-truth",
                unmapped=[], assumptions=["40 steps; the allocated figure is the largest "
                                          "step's, reserved and device are at the end"])
    with open(path, "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


def child(args):
    what = args[0]
    if what == "context":
        r = context()
    elif what == "cudnn":
        r = cudnn(args[1], int(args[2]), args[3])
    else:
        r = varlen(args[1], args[2], int(args[3]), int(args[4]))
    print(json.dumps(r))


def spawn(args, env=None):
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                              text=True, env=dict(os.environ, **(env or {})), timeout=150)
    except subprocess.TimeoutExpired:
        return dict(args=args, env=env, error="did not finish in 150 s")
    if proc.returncode != 0:
        return dict(args=args, env=env, error=proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    from gpu_truth import catalog_name

    which = sys.argv[1:] or ["context", "cudnn", "varlen"]
    if "context" in which:
        print(json.dumps(spawn(["context"])), flush=True)
        print(json.dumps(spawn(["context"], {"CUDA_MODULE_LOADING": "EAGER"})), flush=True)
    if "cudnn" in which:
        for model, mb, precision in (("resnet50", 64, "fp32"), ("resnet50", 64, "bf16-mixed"),
                                     ("vgg16", 32, "fp32")):
            print(json.dumps(spawn(["cudnn", model, str(mb), precision])), flush=True)
    if "varlen" in which:
        runs = VARLEN_RUNS
        if os.environ.get("VARLEN_RUNS"):  # e.g. "llama:4:1024,qwen2:8:2048"
            runs = [(f, int(m), int(q)) for f, m, q in
                    (r.split(":") for r in os.environ["VARLEN_RUNS"].split(","))]
        jobs = [(["varlen", shapes, fam, str(mb), str(seq)],
                 {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else None)
                for fam, mb, seq in runs for shapes in ("variable", "fixed")
                for conf in ("", "expandable_segments:True")]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4) as pool:  # each run reads its own process's figures
            results = list(pool.map(lambda j: spawn(*j), jobs))
        for r in results:
            print(json.dumps({k: v for k, v in r.items() if k != "cfg"}), flush=True)
        results = [r for r in results if "error" not in r]
        product = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True,
                                 check=True).stdout.splitlines()[0]
        varlen_rows(results, catalog_name(product))


if __name__ == "__main__":
    main()
