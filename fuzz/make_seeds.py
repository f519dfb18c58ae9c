#!/usr/bin/env python3
"""Write the fuzz targets' seed corpora under fuzz/seeds/<target>/ from the
repository's own inputs: examples/, tests/data/ and the OOM messages the
operator's unit tests read. Run from anywhere; it rewrites fuzz/seeds/."""

import json
import pathlib
import re
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"


def write(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def main():
    shutil.rmtree(SEEDS, ignore_errors=True)
    examples = ROOT / "examples"
    jobs = sorted(ROOT.glob("tests/data/calibration/jobs/*.yaml"))
    # TrainingJob documents: every example job and every calibration job.
    for p in sorted(examples.glob("*.yaml")):
        if p.name not in ("cluster.yaml", "gpus.yaml"):
            write("job_yaml", p.name, p.read_bytes())
    for p in jobs:
        write("job_yaml", p.name, p.read_bytes())
    # hfConfig objects of the model types the reader knows, as the Hub has them,
    # behind a one-byte recipe selector.
    hub = {
        "llama": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "vocab_size": 128256, "tie_word_embeddings": False, "rope_theta": 500000.0},
        "mixtral": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000},
        "gemma2": {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
                   "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                   "head_dim": 256, "vocab_size": 256000, "attn_logit_softcapping": 50.0,
                   "final_logit_softcapping": 30.0},
        "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                 "n_positions": 1024, "vocab_size": 50257},
        "bert": {"model_type": "bert", "hidden_size": 768, "intermediate_size": 3072,
                 "num_hidden_layers": 12, "num_attention_heads": 12, "vocab_size": 30522},
        "t5": {"model_type": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_layers": 6,
               "num_decoder_layers": 6, "num_heads": 8, "vocab_size": 32128,
               "feed_forward_proj": "relu"},
        "falcon": {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
                   "num_attention_heads": 71, "multi_query": True, "parallel_attn": True,
                   "vocab_size": 65024},
        "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                      "moe_intermediate_size": 1408, "num_hidden_layers": 24,
                      "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60,
                      "num_experts_per_tok": 4, "vocab_size": 151936},
    }
    for i, (name, cfg) in enumerate(hub.items()):
        write("hf_config", name + ".json", bytes([i]) + json.dumps(cfg).encode())
    # layers lists (and a model object with inputShape).
    nets = {
        "mlp": [
            {"linear": {"in": 784, "out": 256}},
            {"relu": {}},
            {"dropout": {"p": 0.5}},
            {"linear": {"in": 256, "out": 10}},
        ],
        "cnn": {
            "inputShape": [3, 32, 32],
            "head": "classification",
            "numLabels": 10,
            "layers": [
                {"conv2d": {"in": 3, "out": 16, "kernelSize": 3, "padding": 1}},
                {"batchnorm": {"features": 16}},
                {"relu": {"inplace": True}},
                {"maxpool": {"kernelSize": 2}},
                {"residual": {"layers": [{"conv2d": {"in": 16, "out": 16, "kernelSize": 3, "padding": 1}}]}},
                {"adaptiveAvgPool": {"outputSize": 1}},
                {"flatten": {}},
                {"linear": {"in": 16, "out": 10}},
            ],
        },
        "embedding": {
            "inputShape": [128],
            "layers": [
                {"embedding": {"num": 30000, "dim": 256}},
                {"layernorm": {"features": 256}},
                {"linear": {"in": 256, "out": 1024}},
                {"gelu": {}},
                {"linear": {"in": 1024, "out": 256}},
            ],
        },
    }
    for i, (name, net) in enumerate(nets.items()):
        write("layers", name + ".json", bytes([i]) + json.dumps(net).encode())
    # AdmissionReview bodies.
    for p in sorted((examples / "admission").glob("*.json")):
        write("admission", p.name, p.read_bytes())
    # GpuNode and MemoryProfile documents.
    write("inventory", "cluster.yaml", (examples / "cluster.yaml").read_bytes())
    profile = {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "MemoryProfile",
        "metadata": {"name": "mp-0123456789abcdef"},
        "spec": {"fingerprint": "0123456789abcdef", "model": "llama", "recipe": "lora"},
        "status": {"ratio": 1.25, "observationCount": 1},
    }
    write("inventory", "profile.json", json.dumps(profile))
    # Simulated node files.
    write("simulation", "gpus.yaml", (examples / "gpus.yaml").read_bytes())
    # OOM messages: every string literal of the operator's OOM parser that
    # holds one, behind a byte picking the container's reason and exit code.
    src = (ROOT / "src" / "operator" / "oom.rs").read_text()
    raw = re.findall(r'r#"(.*?)"#', src, re.S) + re.findall(r'"((?:[^"\\]|\\.)*)"', src)
    n = 0
    for s in raw:
        s = s.replace("\\n", "\n").replace('\\"', '"')
        if re.search(r"out of memory|OOM when|RESOURCE_EXHAUSTED|Out of memory", s) and len(s) > 40:
            write("oom", f"message-{n:02}.txt", bytes([n % 16]) + s.encode())
            n += 1
    # A pod-resources answer: one pod holding two GPUs, framed as gRPC sends it.
    def field(num, payload):
        out = bytes([num << 3 | 2])
        size = len(payload)
        while size >= 0x80:
            out += bytes([size & 0x7F | 0x80])
            size >>= 7
        return out + bytes([size]) + payload

    devices = field(1, b"nvidia.com/gpu") + field(2, b"GPU-0000") + field(2, b"GPU-0001::2")
    container = field(1, b"trainer") + field(2, devices)
    pod = field(1, b"job-0") + field(2, b"team-a") + field(3, container)
    msg = field(1, pod)
    write("pod_resources", "one-pod.bin", b"\0" + struct.pack(">I", len(msg)) + msg)


if __name__ == "__main__":
    main()
