#!/usr/bin/env python3
"""PyTorch as the referee: training steps measured on the meta device.

Each configuration builds a model from its config (Hugging Face `transformers`,
torchvision, `peft`; random weights, nothing downloaded) on the meta device and
runs one optimizer step (of `accum` micro-batches: forward, backward; the
optimizer's states made beforehand) under `track.Tracker`, which follows every
storage's life; in a plain loop, or for the `-trainer` ids through Transformers'
`Trainer.training_step` and its gradient clipping. The peak of live bytes, the
phase it falls in and its breakdown by component are written in the calibration
format (`jobs/<id>.yaml` + `expected.json`, metric kind `allocated`) under
benches/reference/rows/, with the measured breakdown beside the total, so that
`report.py` can set every component against `vramguard estimate -o json`.

    python3 benches/reference/sweep.py              # every configuration
    python3 benches/reference/sweep.py --subset ci  # the CI subset
    python3 benches/reference/sweep.py --only llama --list   # ids only

What a meta run cannot see (a GPU adds it): the caching allocator's block
rounding above 512 bytes and its fragmentation, the CUDA context, cuBLAS and
cuDNN workspaces, NCCL buffers, and kernels that allocate inside C++ extensions
(bitsandbytes, flash-attn's own package). `allocated` here is what
`torch.cuda.max_memory_allocated()` would report for the tensors PyTorch creates.
"""

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = os.path.join(HERE, "rows")
sys.path.insert(0, HERE)

# ------------------------------------------------------------------ models ---
# Hugging Face configs with the widths the model cards publish (Llama 3.2 1B,
# Qwen2 0.5B, Gemma 2 2B, Phi-1.5, GPT-2, BERT-base, T5-small; a small Mixtral),
# cut in depth to keep a meta run fast (its cost is Python time per op). The
# estimator reads the same config object, so any depth compares.
HF = {
    "llama": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            vocab_size=128256, tie_word_embeddings=True,
                            max_position_embeddings=131072, rms_norm_eps=1e-5)),
    "qwen2": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=8,
                            num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                            tie_word_embeddings=True, max_position_embeddings=32768)),
    "gemma2": ("gemma2", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=6,
                              num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                              vocab_size=256000, max_position_embeddings=8192)),
    "phi": ("phi", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                        num_attention_heads=32, vocab_size=51200, partial_rotary_factor=0.5,
                        max_position_embeddings=2048)),
    "gpt2": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                          n_positions=1024)),
    "mixtral": ("mixtral", dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=4,
                                num_attention_heads=16, num_key_value_heads=8,
                                num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                                max_position_embeddings=4096)),
    "bert": ("bert", dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=6,
                          num_attention_heads=12, vocab_size=30522,
                          max_position_embeddings=512, num_labels=2)),
    "t5": ("t5", dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_decoder_layers=6,
                      num_heads=8, vocab_size=32128, feed_forward_proj="relu",
                      decoder_start_token_id=0, pad_token_id=0)),
}
DECODERS = ("llama", "qwen2", "gemma2", "phi", "gpt2", "mixtral")
VISION = {"resnet-50": "resnet50", "resnet-101": "resnet101", "vgg-16": "vgg16",
          "mobilenet-v2": "mobilenet_v2", "efficientnet-b0": "efficientnet_b0",
          "vit-b-16": "vit_b_16"}
EAGER = ("gemma2", "t5")  # Transformers runs these eager (soft-capping, relative position bias)
LORA_FAMILIES = ("llama", "qwen2", "gemma2", "mixtral")
PEFT_METHODS = ("lora", "dora", "ia3", "vera", "prompt", "ln")


def hf_config(family):
    from transformers import AutoConfig

    model_type, kw = HF[family]
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager" if family in EAGER else "sdpa"
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop",
                "embd_pdrop", "attn_pdrop", "dropout_rate", "attention_dropout"):
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)  # dropout off: the estimator models no dropout masks
    return cfg


# ----------------------------------------------------------- configurations ---

def configurations():
    """(id, settings) for every run."""
    runs = []

    def add(family, mb, seq, precision="bf16-mixed", optimizer="adamw", impl="foreach",
            ckpt="none", loss="standard", accum=1, peft="none", stack="plain"):
        rid = f"{family}-mb{mb}-s{seq}-{precision}-{optimizer}"
        if optimizer.startswith("adamw") or optimizer == "adam":
            rid += f"-{impl}"
        if ckpt != "none":
            rid += f"-ckpt{ckpt}"
        if loss != "standard":
            rid += f"-loss{loss}"
        if accum > 1:
            rid += f"-accum{accum}"
        if peft != "none":
            rid += f"-{peft}"
        if stack != "plain":
            rid += f"-{stack}"
        runs.append((rid, dict(family=family, mb=mb, seq=seq, precision=precision,
                               optimizer=optimizer, impl=impl, ckpt=ckpt, loss=loss,
                               accum=accum, peft=peft, stack=stack)))

    shapes = ((1, 512), (2, 1024), (4, 256))
    for fam in DECODERS:
        for mb, seq in shapes:
            add(fam, mb, seq)
            add(fam, mb, seq, precision="fp32")
            add(fam, mb, seq, precision="fp16-mixed")
            add(fam, mb, seq, precision="bf16")
            add(fam, mb, seq, impl="forloop")
            add(fam, mb, seq, impl="fused")
            add(fam, mb, seq, optimizer="sgd")
            add(fam, mb, seq, optimizer="sgd-momentum")
            add(fam, mb, seq, ckpt="full")
            add(fam, mb, seq, accum=2)
            if fam != "gpt2":
                add(fam, mb, seq, loss="chunked")
            add(fam, mb, seq, precision="bf16", ckpt="full")
        if fam != "gpt2":  # GPT-2's learned position table has 1 024 rows
            add(fam, 1, 2048)
            add(fam, 1, 2048, precision="fp32", impl="fused")
        for mb, seq in shapes[:2]:
            add(fam, mb, seq, stack="trainer")
    for fam in LORA_FAMILIES:
        for mb, seq in ((1, 512), (2, 1024)):
            for method in PEFT_METHODS:
                add(fam, mb, seq, peft=method)
            add(fam, mb, seq, peft="lora", ckpt="full")
            add(fam, mb, seq, peft="lora", precision="bf16")
    for mb, seq in ((8, 128), (16, 512), (32, 128)):
        for prec in ("bf16-mixed", "fp32", "bf16"):
            add("bert", mb, seq, precision=prec)
        add("bert", mb, seq, ckpt="full")
        add("t5", mb // 2, seq)
        add("t5", mb // 2, seq, precision="fp32")
        add("t5", mb // 2, seq, optimizer="sgd-momentum")
    for name in VISION:
        for mb in (16, 64):
            add(name, mb, 224)
            add(name, mb, 224, precision="fp32")
        add(name, 32, 224, optimizer="sgd-momentum", precision="fp32")
    return runs


# The CI subset: configurations the estimator agrees with now, across families and
# recipes (gated), and one of each known divergence (reported); ~1 minute on 2 cores.
CI = [
    "bert-mb8-s128-bf16-mixed-adamw-foreach",
    "bert-mb8-s128-fp32-adamw-foreach",
    "gemma2-mb1-s512-bf16-mixed-adamw-foreach",
    "gemma2-mb1-s512-fp32-adamw-foreach",
    "gpt2-mb1-s512-bf16-mixed-adamw-foreach-ckptfull",
    "gpt2-mb1-s512-fp32-adamw-foreach",
    "llama-mb1-s512-bf16-adamw-foreach",
    "llama-mb4-s256-bf16-mixed-adamw-foreach-losschunked",
    "llama-mb4-s256-fp16-mixed-adamw-foreach",
    "llama-mb2-s1024-bf16-mixed-adamw-foreach-ckptfull",
    "mixtral-mb1-s512-bf16-mixed-adamw-foreach-accum2",
    "mixtral-mb2-s1024-fp32-adamw-foreach",
    "mixtral-mb1-s2048-bf16-mixed-adamw-foreach",
    "phi-mb1-s512-bf16-mixed-adamw-foreach",
    "phi-mb4-s256-bf16-adamw-foreach-ckptfull",
    "phi-mb2-s1024-fp32-adamw-foreach",
    "llama-mb1-s512-bf16-mixed-adamw-foreach-trainer",
    # known-divergent, one per mechanism
    "bert-mb16-s512-bf16-adamw-foreach",
    "resnet-50-mb16-s224-bf16-mixed-adamw-foreach",
    "gemma2-mb1-s2048-bf16-mixed-adamw-foreach",
    "gemma2-mb1-s512-bf16-adamw-foreach",
    "llama-mb1-s512-bf16-mixed-adamw-foreach-lora",
    "qwen2-mb1-s512-bf16-mixed-adamw-foreach-dora",
    "llama-mb1-s512-bf16-mixed-adamw-foreach-ia3",
    "gpt2-mb2-s1024-bf16-mixed-adamw-foreach",
    "llama-mb2-s1024-fp32-adamw-foreach",
    "mixtral-mb1-s512-bf16-mixed-sgd",
    "qwen2-mb1-s512-bf16-mixed-adamw-fused",
    "t5-mb4-s128-bf16-mixed-adamw-foreach",
]


# ---------------------------------------------------------------- the job ---

def _plain(x):
    """A config value as YAML can hold it (tuples, dtypes, enums as text)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def hf_dict(cfg):
    d = cfg.to_dict()
    for key in ("id2label", "label2id", "architectures", "transformers_version", "dtype",
                "torch_dtype", "_name_or_path", "task_specific_params"):
        d.pop(key, None)
    return _plain(d)


def job(rid, c, cfg=None, trainable=None, adapted=None):
    """The TrainingJob that describes run `rid`, as a dict. `adapted`: the modules the
    PEFT method wrapped, by their leaf name, as the user's config would list them."""
    fam = c["family"]
    model = {}
    if fam in VISION:
        model["preset"] = fam
    else:
        model["hfConfig"] = hf_dict(cfg)
        if fam == "bert":
            model["head"] = "classification"
            model["numLabels"] = HF["bert"][1]["num_labels"]
        else:
            model["head"] = "lm"
    training = {}
    peft = c["peft"]
    if peft in ("lora", "dora"):
        training["mode"] = "lora"
        training["lora"] = dict(rank=16, alpha=32, dropout=0, targetModules=["q_proj", "v_proj"])
    elif peft != "none":
        training["mode"] = "adapter"
        training["trainableParameters"] = trainable
        training["peft"] = peft_spec(peft, adapted)
    else:
        training["mode"] = "full"
    if c["stack"] == "trainer":
        training["stack"] = "hf-trainer"
    if c.get("runtime"):
        training["runtime"] = dict(c["runtime"])
    training.update(
        microBatchSize=c["mb"], globalBatchSize=c["mb"] * c["accum"],
        sequenceLength=c["seq"], precision=c["precision"], optimizer=c["optimizer"],
        gradientCheckpointing=c["ckpt"],
        attention="eager" if fam in EAGER else "sdpa", loss=c["loss"])
    return {"apiVersion": "vramguard.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": rid.replace(".", "-")},
            "spec": {"model": model, "training": training, "parallelism": {"gpus": 1}}}


def peft_spec(method, adapted):
    """The contract's `training.peft` for a sweep method: what `apply_peft` configured,
    with the modules it actually wrapped (a target the model does not have, such as
    Mixtral's `w2` once its experts are one 3-D weight, is not adapted)."""
    spec = {"method": {"ia3": "ia3", "vera": "vera", "prompt": "prompt-tuning",
                       "ln": "ln-tuning"}[method]}
    if method in ("ia3", "vera"):
        spec["targetModules"] = list(adapted or [])
    if method == "vera":
        spec["rank"] = 256
    if method == "prompt":
        spec["virtualTokens"] = 20
    return spec


def adapted_modules(model, method):
    """Leaf names of the modules `method` wrapped (IA3's `ia3_l`, VeRA's `vera_lambda_b`)."""
    attr = {"ia3": "ia3_l", "vera": "vera_lambda_b"}.get(method)
    if attr is None:
        return []
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if hasattr(m, attr) and not name.endswith(attr)
                   and hasattr(m, "base_layer")})


# ---------------------------------------------------------------- the run ---

def build(c, torch, device="meta"):
    """(model, batch function, head module, vocabulary, config), on `device` (the meta
    device here; `benches/gpu_reference.py` builds the same on a GPU)."""
    fam = c["family"]
    if fam in VISION:
        import torchvision

        with torch.device(device):
            model = getattr(torchvision.models, VISION[fam])(weights=None)

        def batch():
            return dict(x=torch.randn(c["mb"], 3, 224, 224, device=device),
                        y=torch.randint(0, 1000, (c["mb"],), device=device))

        head = model.fc if hasattr(model, "fc") else (
            model.heads if hasattr(model, "heads") else model.classifier)
        return model, batch, head, 0, None
    import transformers

    try:
        import transformers.masking_utils as masking

        # Its packed-sequence probe reads a tensor's value (`.all()`), which the meta device
        # has not; the batches here are never packed, which is what it would find.
        masking.find_packed_sequence_indices = lambda position_ids: None
    except ImportError:  # releases before 4.53 build masks in each model
        disabled_autocast_is_a_no_op_on_meta(torch)
    if fam == "mixtral":
        even_routing(torch)
    cfg = hf_config(fam)
    with torch.device(device):
        if fam == "bert":
            model = transformers.BertForSequenceClassification(cfg)
        elif fam == "t5":
            model = transformers.T5ForConditionalGeneration(cfg)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    vocab = cfg.vocab_size
    b, s = c["mb"], c["seq"]

    def batch():
        ids = torch.randint(0, vocab, (b, s), device=device)
        if fam == "bert":
            return dict(input_ids=ids, labels=torch.randint(0, 2, (b,), device=device))
        return dict(input_ids=ids, labels=torch.randint(0, vocab, (b, s), device=device))

    head = model.classifier if fam == "bert" else model.get_output_embeddings()
    return model, batch, head, (0 if fam == "bert" else vocab), cfg


def even_routing(torch):
    """Mixtral's experts pick their tokens with `nonzero`, whose result the meta device
    cannot know. Route evenly instead, as the estimator assumes: each expert takes
    tokens x top-k / experts rows, through the same ops as Transformers' loop."""
    from transformers.models.mixtral import modeling_mixtral as mm

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        n, k = top_k_index.shape
        rows = n * k // self.num_experts
        for e in range(self.num_experts):
            token_idx = torch.arange(rows, device=hidden_states.device) % n
            top_k_pos = torch.zeros_like(token_idx)
            current = hidden_states[token_idx]
            gate, up = torch.nn.functional.linear(current, self.gate_up_proj[e]).chunk(2, dim=-1)
            current = self.act_fn(gate) * up
            current = torch.nn.functional.linear(current, self.down_proj[e])
            current = current * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, current.to(final.dtype))
        return final

    mm.MixtralExperts.forward = forward


def apply_peft(model, method, fam):
    import peft

    targets = ["q_proj", "v_proj"]
    if method in ("lora", "dora"):
        pc = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets,
                             use_dora=method == "dora", task_type="CAUSAL_LM")
    elif method == "ia3":
        ff = ["down_proj"] if fam != "mixtral" else ["w2"]
        pc = peft.IA3Config(target_modules=["k_proj", "v_proj"] + ff, feedforward_modules=ff,
                            task_type="CAUSAL_LM")
    elif method == "vera":
        pc = peft.VeraConfig(r=256, target_modules=targets, vera_dropout=0.0,
                             task_type="CAUSAL_LM")
    elif method == "prompt":
        pc = peft.PromptTuningConfig(num_virtual_tokens=20, task_type="CAUSAL_LM")
    else:
        norms = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if "norm" in type(m).__name__.lower()})
        pc = peft.LNTuningConfig(target_modules=norms, task_type="CAUSAL_LM")
    return peft.get_peft_model(model, pc)


def prepare(model, c, torch, sem=None):
    """The configuration's recipe applied to a built model: the PEFT method, 16-bit weights,
    checkpointing (its recompute under the tracker's semantics when `sem` is given, on the
    meta device) and the optimizer. Returns the model, the adapted modules, the trainable
    parameters, their count and the optimizer; the meta-device sweep and the GPU reference
    (benches/gpu_reference.py) both run a configuration through it."""
    fam = c["family"]
    adapted = []
    if c["peft"] != "none":
        model = apply_peft(model, c["peft"], fam)
        adapted = adapted_modules(model, c["peft"])
    if c["precision"] in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if c["precision"] == "bf16" else torch.float16)
    if c["ckpt"] == "full":
        if fam in VISION:
            raise ValueError("checkpointing of torchvision models is not in the sweep")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if sem is not None:
            recompute_under(model, sem, torch)
        if c["peft"] != "none":
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() for p in params)
    opt_name, impl = c["optimizer"], c["impl"]
    if opt_name == "adamw":
        kw = dict(foreach=impl == "foreach", fused=True if impl == "fused" else None)
        opt = torch.optim.AdamW(params, lr=1e-5, **kw)
    elif opt_name in ("sgd", "sgd-momentum"):
        opt = torch.optim.SGD(params, lr=1e-5, momentum=0.9 if opt_name == "sgd-momentum" else 0,
                              foreach=True)
    else:
        raise ValueError(f"optimizer {opt_name}")
    return model, adapted, params, trainable, opt


def run_one(c):
    """One configuration: the tracker's result and the job's facts."""
    import torch

    from track import GpuSemantics, Tracker, allow_fused_optimizers_on_meta, watch_blocks

    warnings.filterwarnings("ignore")
    allow_fused_optimizers_on_meta()
    torch.manual_seed(0)
    t0 = time.time()
    model, batch, head, vocab, cfg = build(c, torch)
    fam = c["family"]
    amp = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(c["precision"])
    tracker = Tracker(vocab=vocab)
    sem = GpuSemantics(tracker, amp)
    model, adapted, params, trainable, opt = prepare(model, c, torch, sem)
    for t in list(model.parameters()) + list(model.buffers()):
        tracker.mark(t, "weights")
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: tracker.mark(p.grad, "gradients"))

    def head_pre(_mod, _args):
        tracker.kind = "logits"

    if vocab:
        head.register_forward_pre_hook(head_pre)
    blocks = [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList)
              and len(lst) > 1 and len({type(b) for b in lst}) == 1 for m in lst]
    watched = watch_blocks(tracker, blocks)
    chunked = c["loss"] == "chunked"
    # The optimizer's states exist from its first step on: make them before measuring, so
    # that the one step measured is a steady-state step (a second step is the same).
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for state in opt.state.values():
        for v in state.values():
            tracker.mark(v, "optimizerStates")
    trainer = hf_trainer(model, opt, c, torch, lambda: to_backward()) \
        if c["stack"] == "trainer" else None
    with tracker, sem:
        for m in range(c["accum"]):
            tracker.set_phase("setup", m)
            tracker.kind = "inputs"
            data = batch()
            tracker.kind = None
            tracker.set_phase("forward", m)
            watched["first"] = True
            sem.cache_on = True

            def to_backward(m=m):
                tracker.kind = None
                sem.clear_cache()
                sem.cache_on = False  # a recompute in backward enters autocast anew
                tracker.set_phase("backward:head" if blocks else "backward", m)

            if trainer is not None:
                trainer.training_step(model, data)
            else:
                loss = forward(model, data, fam, chunked, torch, head)
                to_backward()
                (loss / c["accum"]).backward()
                del loss
            del data
        tracker.set_phase("optimizer")
        if trainer is not None:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        opt.step()
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    tracker.mark(v, "optimizerStates")
        opt.zero_grad(set_to_none=True)
    r = tracker.result()
    r["kernels"] = sem.kernels
    r["trainable"] = trainable
    r["adapted"] = adapted
    r["seconds"] = round(time.time() - t0, 2)
    return r, cfg


def recompute_under(model, sem, torch):
    """Checkpointed blocks recompute in backward, where the autograd engine does not
    carry torch-function modes: enter `sem` again there, as a CUDA run re-enters the
    autocast state that `torch.utils.checkpoint` saved."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils.checkpoint import checkpoint

    def under_sem(fn):
        def run(*a, **k):
            if any(m is sem for m in _get_current_function_mode_stack()):
                return fn(*a, **k)
            with sem:
                return fn(*a, **k)
        return run

    def ckpt(fn, *args, **kwargs):
        return checkpoint(under_sem(fn), *args, use_reentrant=False, **kwargs)

    for m in model.modules():
        if hasattr(m, "_gradient_checkpointing_func"):
            m._gradient_checkpointing_func = ckpt


def hf_trainer(model, opt, c, torch, before_backward, device="meta"):
    """Transformers' Trainer around the model, for its `training_step` (compute_loss,
    accelerate's backward) and gradient clipping, with the recipe's optimizer. Its device
    moves are skipped (the model and the batch stay on `device`)."""
    import transformers

    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="trainer-"), per_device_train_batch_size=c["mb"],
        gradient_accumulation_steps=c["accum"], max_grad_norm=1.0, report_to=[],
        use_cpu=device == "meta", save_strategy="no", logging_strategy="no")
    model.hf_device_map = {"": device}  # the Trainer leaves a placed model where it is
    trainer = transformers.Trainer(model=model, args=args, optimizers=(opt, None))
    trainer._prepare_inputs = lambda inputs: inputs
    trainer.current_gradient_accumulation_steps = c["accum"]
    backward = trainer.accelerator.backward

    def phased(loss, **kwargs):
        before_backward()
        return backward(loss, **kwargs)

    trainer.accelerator.backward = phased
    return trainer


def forward(model, data, fam, chunked, torch, head):
    import torch.nn.functional as F

    if fam in VISION:
        return F.cross_entropy(model(data["x"]), data["y"])
    if not chunked:
        return model(**data).loss
    # LitGPT's chunked loss: the head runs per 128-token chunk and each chunk's
    # cross-entropy keeps its own log-softmax; no full fp32 copy of the logits.
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = base(input_ids=data["input_ids"]).last_hidden_state
    labels = data["labels"]
    chunks = [head(h) for h in hidden.split(128, dim=1)]
    losses = [F.cross_entropy(x.reshape(-1, x.shape[-1]), y.reshape(-1), reduction="sum")
              for x, y in zip(chunks, labels.split(128, dim=1))]
    return torch.stack(losses).sum() / labels.numel()


def worker(item):
    rid, c = item
    try:
        r, cfg = run_one(c)
    except Exception as e:  # reported, and the sweep goes on
        return rid, None, f"{type(e).__name__}: {e}"
    return rid, dict(result=r, job=job(rid, c, cfg, r["trainable"], r["adapted"])), None


def progress_wanted(choice, stream, environ):
    """`--progress auto`: on a terminal only, and not in CI (`CI` set) or with `TERM=dumb`."""
    if choice != "auto":
        return choice == "always"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and not environ.get("CI") and environ.get("TERM") != "dumb"


class Progress:
    """One line on a terminal, rewritten after each configuration: done of total, failed,
    elapsed and the time left at the pace so far. Off: writes nothing."""

    def __init__(self, total, stream, on, clock=time.monotonic):
        self.total, self.stream, self.on, self.clock = total, stream, on, clock
        self.done = self.failed = 0
        self.t0 = clock()

    def step(self, rid, failed=False):
        self.done += 1
        self.failed += int(failed)
        if not self.on:
            return
        spent = self.clock() - self.t0
        left = spent / self.done * (self.total - self.done)
        self.stream.write(f"\r\x1b[K[{self.done}/{self.total}] {self.failed} failed, "
                          f"{spent:.0f} s, ~{left:.0f} s left: {rid}")
        self.stream.flush()

    def clear(self):
        """Erase the line, so that what is printed next starts at the left margin."""
        if self.on and self.done:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    close = clear


def disabled_autocast_is_a_no_op_on_meta(torch):
    """Older Transformers releases enter `torch.autocast(device_type, enabled=False)` around
    the rotary embedding, which the meta device refuses; disabling autocast where none is on
    changes nothing (later releases skip it: `utils/generic.py` `maybe_autocast`)."""
    import contextlib

    real = torch.autocast
    if getattr(real, "meta_aware", False):
        return

    def autocast(device_type, *args, **kwargs):
        if device_type == "meta" and kwargs.get("enabled", True) is False:
            return contextlib.nullcontext()
        return real(device_type, *args, **kwargs)

    autocast.meta_aware = True
    torch.autocast = autocast


def release_pins():
    """The releases requirements.txt pins, by package name."""
    pins = {}
    with open(os.path.join(HERE, "requirements.txt")) as f:
        for line in f:
            name, sep, version = line.strip().partition("==")
            if sep:
                pins[name] = version
    return pins


def other_release():
    """The runtime a sweep runs when its Transformers is not the pinned one (an older release
    put first on PYTHONPATH, see README), for the ids' suffix and the jobs' `runtime`; None
    when it runs the pins."""
    from importlib.metadata import version

    tf, torch_version = version("transformers"), version("torch").split("+")[0]
    if tf == release_pins().get("transformers"):
        return None
    return {"pytorch": torch_version, "transformers": tf}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the ids that contain this text")
    ap.add_argument("--subset", choices=["all", "ci"], default="all")
    ap.add_argument("--list", action="store_true", help="print the ids and exit")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=ROWS, help="where jobs/ and expected.json go")
    ap.add_argument("--progress", choices=["auto", "always", "never"], default="auto",
                    help="a progress line on stderr (auto: on a terminal, not in CI); "
                         "without it, one line per configuration")
    args = ap.parse_args()
    runs = configurations()
    runtime = other_release()
    if runtime is not None:
        tf = ".".join(runtime["transformers"].split(".")[:2])
        runs = [(f"{rid}-tf{tf}", dict(c, runtime=runtime)) for rid, c in runs]
    runs = [(rid, c) for rid, c in runs if args.only in rid]
    if args.subset == "ci":
        runs = [(rid, c) for rid, c in runs if rid in CI]
    if args.list:
        print("\n".join(rid for rid, _ in runs))
        print(f"{len(runs)} configurations", file=sys.stderr)
        return
    import yaml

    os.makedirs(os.path.join(args.out, "jobs"), exist_ok=True)
    path = os.path.join(args.out, "expected.json")
    expected = json.load(open(path)) if os.path.exists(path) else {}
    failed = 0
    t0 = time.time()
    progress = Progress(len(runs), sys.stderr,
                        progress_wanted(args.progress, sys.stderr, os.environ))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs) as pool:
        for rid, row, err in pool.imap_unordered(worker, runs):
            progress.step(rid, failed=bool(err))
            if err:
                failed += 1
                # A failure is kept on screen above the progress line.
                progress.clear()
                print(f"{rid}: failed: {err}", file=sys.stderr)
                continue
            r = row["result"]
            with open(os.path.join(args.out, "jobs", f"{rid}.yaml"), "w") as f:
                f.write(f"# {rid}: measured on the meta device by benches/reference/sweep.py\n")
                yaml.safe_dump(row["job"], f, sort_keys=False, default_flow_style=None,
                               width=100)
            expected[rid] = dict(
                metric_kind="allocated", measured_bytes=r["peak_bytes"], oom=False,
                gpu_capacity_bytes=None, gpu=None, confidence="high",
                source_repo="vramguard benches/reference/sweep.py", split="reference",
                unmapped=[], assumptions=[
                    "meta device: allocator rounding to 512 bytes only; no CUDA context, "
                    "library workspaces or NCCL buffers"],
                peak_phase=r["peak_phase"], breakdown=r["breakdown"],
                phases=r["phases"], attention_kernels=r["kernels"],
                trainable_parameters=r["trainable"])
            if not progress.on:
                print(f"{rid}: {r['peak_bytes'] / 2**30:.3f} GiB at {r['peak_phase']} "
                      f"({r['seconds']} s)", file=sys.stderr)
    progress.close()
    with open(path, "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(runs) - failed} measured, {failed} failed, {time.time() - t0:.0f} s",
          file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
