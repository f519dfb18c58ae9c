#!/usr/bin/env python3
"""Ground truth on a GPU: real PyTorch training steps, measured.

Builds models from their config with random weights (no downloads): GPT-2
small and medium, a 1B Llama-shaped decoder, BERT-base for classification and
ResNet-50 (torchvision's, when torchvision is installed). Each configuration
(micro-batch, sequence length, precision, optimizer, checkpointing, LoRA) runs
three optimizer steps in a fresh process and records
`torch.cuda.max_memory_allocated()`, `torch.cuda.max_memory_reserved()` and
the process's memory as NVML reports it. Rows are written in the calibration
format (`jobs/<id>.yaml` + `expected.json`) under benches/ground-truth/, where
`cargo test --release --test calibration -- --nocapture` reports them too.

    python3 benches/gpu_truth.py                # every configuration (needs a GPU)
    python3 benches/gpu_truth.py --only gpt2    # configurations whose id contains "gpt2"
    python3 benches/gpu_truth.py --list | cargo run --release -- estimate -f -
                                                # the TrainingJobs only (no GPU, no torch)
"""

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "ground-truth")

# Model shapes, as the TrainingJob `transformer` fields name them.
MODELS = {
    "gpt2-small": dict(kind="decoder", layers=12, hidden=768, heads=12, kv_heads=12,
                       inter=3072, vocab=50257, mlp="standard", norm="layernorm",
                       bias=True, positions=1024, tied=True),
    "gpt2-medium": dict(kind="decoder", layers=24, hidden=1024, heads=16, kv_heads=16,
                        inter=4096, vocab=50257, mlp="standard", norm="layernorm",
                        bias=True, positions=1024, tied=True),
    "llama-1b": dict(kind="decoder", layers=16, hidden=2048, heads=32, kv_heads=8,
                     inter=8192, vocab=32000, mlp="gated", norm="rmsnorm",
                     bias=False, positions=0, tied=False),
    "bert-base": dict(kind="encoder", layers=12, hidden=768, heads=12, kv_heads=12,
                      inter=3072, vocab=30522, mlp="standard", norm="layernorm",
                      bias=True, positions=512, tied=True, labels=2),
    "resnet-50": dict(kind="vision"),
}


def configurations():
    """(id, settings) for every run: one axis varied at a time around a base."""
    runs = []

    def add(model, mb, seq, precision="bf16-mixed", optimizer="adamw", ckpt="none",
            lora=False):
        rid = f"{model}-mb{mb}-s{seq}-{precision}-{optimizer}"
        if ckpt != "none":
            rid += f"-ckpt{ckpt}"
        if lora:
            rid += "-lora"
        runs.append((rid, dict(model=model, mb=mb, seq=seq, precision=precision,
                               optimizer=optimizer, ckpt=ckpt, lora=lora)))

    for model in ("gpt2-small", "gpt2-medium", "llama-1b"):
        for mb in (1, 4, 8):
            add(model, mb, 1024)
        add(model, 4, 512)
        if model == "llama-1b":  # GPT-2's learned position table has 1 024 rows
            add(model, 2, 2048)
        add(model, 4, 1024, precision="bf16")
        add(model, 4, 1024, precision="fp32")
        add(model, 4, 1024, optimizer="sgd")
        add(model, 8, 1024, ckpt="full")
        add(model, 4, 1024, lora=True)
    for mb in (8, 32):
        add("bert-base", mb, 128)
    add("bert-base", 16, 512)
    add("bert-base", 16, 512, precision="fp32")
    for mb in (32, 64):
        add("resnet-50", mb, 224)
    add("resnet-50", 64, 224, precision="fp32")
    return runs


def job_yaml(rid, c, runtime=None):
    """The TrainingJob that describes run `rid`."""
    m = MODELS[c["model"]]
    lines = [
        "apiVersion: vramguard.io/v1alpha1",
        "kind: TrainingJob",
        "metadata:",
        f"  name: {rid}",
        "spec:",
        "  model:",
    ]
    if m["kind"] == "vision":
        lines += ["    preset: resnet-50"]
    else:
        lines += [
            "    transformer:",
            f"      kind: {m['kind']}",
            f"      layers: {m['layers']}",
            f"      hiddenSize: {m['hidden']}",
            f"      attentionHeads: {m['heads']}",
            f"      kvHeads: {m['kv_heads']}",
            f"      intermediateSize: {m['inter']}",
            f"      vocabSize: {m['vocab']}",
            f"      mlp: {m['mlp']}",
            f"      norm: {m['norm']}",
            f"      bias: {str(m['bias']).lower()}",
            f"      maxPositions: {m['positions']}",
            f"      tiedEmbeddings: {str(m['tied']).lower()}",
        ]
        if m["kind"] == "encoder":
            lines += ["    head: classification", f"    numLabels: {m['labels']}"]
        else:
            lines += ["    head: lm"]
    lines += ["  training:"]
    if c["lora"]:
        lines += [
            "    mode: lora",
            "    lora: {rank: 16, alpha: 32, dropout: 0, targetModules: [q_proj, v_proj]}",
        ]
    else:
        lines += ["    mode: full"]
    lines += [
        f"    microBatchSize: {c['mb']}",
        f"    sequenceLength: {c['seq']}",
        f"    precision: {c['precision']}",
        f"    optimizer: {c['optimizer']}",
        f"    gradientCheckpointing: {c['ckpt']}",
    ]
    if runtime:
        lines += ["    runtime:"] + [f"      {k}: \"{v}\"" for k, v in runtime.items() if v]
    lines += [
        "    attention: sdpa",
        "    loss: standard",
        "  parallelism:",
        "    gpus: 1",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the run ---

def run_one(c):
    """One configuration in this process: returns the measured bytes."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = MODELS[c["model"]]
    dev = torch.device("cuda")

    class RMSNorm(nn.Module):
        def __init__(self, n, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            dtype = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x.to(dtype)

    class LoRA(nn.Module):
        def __init__(self, base, r=16, alpha=32):
            super().__init__()
            self.base = base
            self.a = nn.Linear(base.in_features, r, bias=False)
            self.b = nn.Linear(r, base.out_features, bias=False)
            nn.init.zeros_(self.b.weight)
            self.scale = alpha / r

        def forward(self, x):
            return self.base(x) + self.b(self.a(x)) * self.scale

    def norm(n):
        return RMSNorm(n) if m["norm"] == "rmsnorm" else nn.LayerNorm(n)

    def rope(t, hd, device):
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=device).float() / hd))
        f = torch.outer(torch.arange(t, device=device).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos(), emb.sin()

    def rotate(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h, hd = m["hidden"], m["hidden"] // m["heads"]
            self.hd = hd
            self.n1, self.n2 = norm(h), norm(h)
            self.q_proj = nn.Linear(h, m["heads"] * hd, bias=m["bias"])
            self.k_proj = nn.Linear(h, m["kv_heads"] * hd, bias=m["bias"])
            self.v_proj = nn.Linear(h, m["kv_heads"] * hd, bias=m["bias"])
            self.o_proj = nn.Linear(m["heads"] * hd, h, bias=m["bias"])
            if m["mlp"] == "gated":
                self.gate_proj = nn.Linear(h, m["inter"], bias=False)
            self.up_proj = nn.Linear(h, m["inter"], bias=m["bias"])
            self.down_proj = nn.Linear(m["inter"], h, bias=m["bias"])

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            y = self.n1(x)
            q = self.q_proj(y).view(b, t, -1, self.hd).transpose(1, 2)
            k = self.k_proj(y).view(b, t, -1, self.hd).transpose(1, 2)
            v = self.v_proj(y).view(b, t, -1, self.hd).transpose(1, 2)
            if cos is not None:
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if k.shape[1] != q.shape[1]:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=m["kind"] == "decoder")
            x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
            y = self.n2(x)
            if m["mlp"] == "gated":
                y = F.silu(self.gate_proj(y)) * self.up_proj(y)
            else:
                y = F.gelu(self.up_proj(y))
            return x + self.down_proj(y)

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(m["vocab"], m["hidden"])
            self.wpe = nn.Embedding(m["positions"], m["hidden"]) if m["positions"] else None
            self.blocks = nn.ModuleList(Block() for _ in range(m["layers"]))
            self.nf = norm(m["hidden"])
            if m["kind"] == "encoder":
                self.pool = nn.Linear(m["hidden"], m["hidden"])
                self.head = nn.Linear(m["hidden"], m["labels"])
            else:
                self.head = nn.Linear(m["hidden"], m["vocab"], bias=False)
                if m["tied"]:
                    self.head.weight = self.wte.weight

        def forward(self, ids):
            t = ids.shape[1]
            x = self.wte(ids)
            cos = sin = None
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(t, device=ids.device))
            else:
                cos, sin = rope(t, m["hidden"] // m["heads"], ids.device)
            for blk in self.blocks:
                if c["ckpt"] == "full":
                    x = checkpoint(blk, x, cos, sin, use_reentrant=False)
                else:
                    x = blk(x, cos, sin)
            x = self.nf(x)
            if m["kind"] == "encoder":
                return self.head(torch.tanh(self.pool(x[:, 0])))
            return self.head(x)

    if m["kind"] == "vision":
        import torchvision

        model = torchvision.models.resnet50(weights=None)
    else:
        model = Transformer()
    if c["lora"]:
        for p in model.parameters():
            p.requires_grad_(False)
        for blk in model.blocks:
            blk.q_proj, blk.v_proj = LoRA(blk.q_proj), LoRA(blk.v_proj)
    pure = c["precision"] in ("bf16", "fp16")
    if pure:
        model = model.to(torch.bfloat16 if c["precision"] == "bf16" else torch.float16)
    model = model.to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    if c["optimizer"] == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-5)
    else:
        opt = torch.optim.SGD(params, lr=1e-5)
    mixed = c["precision"].endswith("-mixed")
    amp = torch.bfloat16 if c["precision"].startswith("bf16") else torch.float16

    b, s = c["mb"], c["seq"]
    if m["kind"] == "vision":
        x = torch.randn(b, 3, s, s, device=dev)
        if pure:
            x = x.to(amp)
        y = torch.randint(0, 1000, (b,), device=dev)
    elif m["kind"] == "encoder":
        x = torch.randint(0, m["vocab"], (b, s), device=dev)
        y = torch.randint(0, m["labels"], (b,), device=dev)
    else:
        x = torch.randint(0, m["vocab"], (b, s), device=dev)
        y = torch.randint(0, m["vocab"], (b, s), device=dev)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        for _ in range(3):
            with torch.autocast("cuda", dtype=amp, enabled=mixed):
                out = model(x)
            loss = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        return dict(oom=True, capacity=torch.cuda.get_device_properties(0).total_memory)
    allocated = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.max_memory_reserved()
    assert math.isfinite(loss.item())
    from importlib.metadata import version

    return dict(oom=False, allocated=allocated, reserved=reserved, device=nvml_used(),
                capacity=torch.cuda.get_device_properties(0).total_memory,
                runtime={"pytorch": version("torch").split("+")[0], "cuda": torch.version.cuda})


def nvml_used():
    """This process's GPU memory as NVML reports it (what nvidia-smi shows)."""
    pid = os.getpid()
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid:
                return int(p.usedGpuMemory)
    except Exception:  # pynvml missing or no per-process accounting: ask nvidia-smi
        pass
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        p, used = (f.strip() for f in line.split(","))
        if int(p) == pid:
            return int(used) * 1024 * 1024
    return None


# CUDA device names → vramguard's GPU catalog, most specific first.
GPU_NAMES = [("H100 PCIe", "h100-pcie"), ("H100 NVL", "h100-nvl"), ("H100", "h100-80gb"),
             ("H200", "h200"), ("A100-SXM4-40GB", "a100-40gb"), ("A100-PCIE-40GB", "a100-40gb"),
             ("A100", "a100-80gb"), ("A10G", "a10g"), ("L40S", "l40s"), ("L4", "l4"),
             ("T4", "t4")]


def catalog_name(product):
    for key, name in GPU_NAMES:
        if key in product:
            return name
    sys.exit(f"{product}: not in GPU_NAMES; add its vramguard catalog name")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the TrainingJobs and exit")
    ap.add_argument("--only", default="", help="run the ids that contain this text")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time on the GPU")
    args = ap.parse_args()
    runs = [(rid, c) for rid, c in configurations() if args.only in rid]
    if args.one:
        c = dict(configurations())[args.one]
        print(json.dumps(run_one(c)))
        return
    if args.list:
        print("---\n".join(job_yaml(rid, c) for rid, c in runs), end="")
        return
    product = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.splitlines()[0]
    gpu = catalog_name(product)
    os.makedirs(os.path.join(OUT, "jobs"), exist_ok=True)
    path = os.path.join(OUT, "expected.json")
    expected = json.load(open(path)) if os.path.exists(path) else {}
    runnable = []
    for rid, c in runs:
        if c["model"] == "resnet-50":
            try:
                import torchvision  # noqa: F401
            except ImportError:
                print(f"{rid}: skipped, torchvision is not installed", file=sys.stderr)
                continue
        runnable.append((rid, c))

    def measure(item):
        rid, _ = item
        return subprocess.run([sys.executable, __file__, "--one", rid],
                              capture_output=True, text=True)

    # Each run is a process of its own (its own context and allocator); several at a time
    # share the GPU, and each reads its own figures.
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        for (rid, c), proc in zip(runnable, pool.map(measure, runnable)):
            if proc.returncode != 0:
                print(f"{rid}: failed\n{proc.stderr}", file=sys.stderr)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            for kind in ("allocated", "reserved", "device"):
                if not r["oom"] and r.get(kind) is None:
                    continue  # NVML gave no per-process figure
                row = f"{rid}-{kind}"
                with open(os.path.join(OUT, "jobs", f"{row}.yaml"), "w") as f:
                    f.write(job_yaml(row, c, r.get("runtime")))
                expected[row] = dict(
                    metric_kind=kind, measured_bytes=None if r["oom"] else r[kind],
                    oom=r["oom"], gpu_capacity_bytes=r["capacity"], gpu=gpu,
                    confidence="high", source_repo="vramguard benches/gpu_truth.py",
                    split="ground-truth", unmapped=[], assumptions=[])
                if r["oom"]:
                    break
            print(f"{rid}: {'OOM' if r['oom'] else r['allocated']}", file=sys.stderr)
            with open(path, "w") as f:
                json.dump(expected, f, indent=1, sort_keys=True)
                f.write("\n")


if __name__ == "__main__":
    main()
