#!/usr/bin/env python3
"""What a compiled block saves for backward: the partitioner's cut, traced on the meta device.

`torch.compile` hands a block's joint forward-backward graph to AOTAutograd, whose
`min_cut_rematerialization_partition` (torch/_functorch/partitioners.py) picks the tensors
the forward keeps for backward. This runs that partition (with TorchInductor's
decompositions, as `torch.compile` does) on one Llama and one GPT-2 block on the meta
device, prints every saved tensor, and the bytes per token of those that are not
parameters or views of them. `activations::compiled_block` in src/estimate is written from
this listing.

On the meta device SDPA decomposes to PyTorch's math path, so the listing's attention also
holds that path's fp32 probabilities and q/k/v copies (Llama's `where_1` and `permute_30`-`32`,
GPT-2's `bmm` and `permute_12`-`15`); on a GPU the flash or memory-efficient kernel stays one
op that keeps its output and log-sum-exp instead. GPT-2 trains with dropout 0.1 here, hence
its boolean masks.

    target/reference-venv/bin/python benches/reference/compiled_cut.py
"""

import functools
import warnings
from importlib import import_module

import torch
import transformers
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

warnings.filterwarnings("ignore")
TOKENS = (2, 512)


def backend(listing):
    def forward_compiler(gm, _inputs):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        params = {n.name for n in gm.graph.nodes if n.op == "placeholder"}
        for node in out.args[0]:
            val = getattr(node, "meta", {}).get("val")
            if isinstance(val, torch.Tensor):
                listing.append((node.name, tuple(val.shape), val.dtype,
                                val.numel() * val.element_size(), node.name in params))
        return gm.forward

    return aot_autograd(
        fw_compiler=forward_compiler, bw_compiler=lambda gm, _: gm.forward,
        decompositions=lambda: import_module("torch._inductor.compile_fx").select_decomp_table(),
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"))


def trace(name, model, blocks, base):
    listing = []
    model.train()
    blocks[0] = torch.compile(blocks[0], backend=backend(listing))
    x = torch.randint(0, 1000, TOKENS, device="meta")
    base(input_ids=x)
    tokens = TOKENS[0] * TOKENS[1]
    print(f"{name}: saved by the compiled block's forward")
    kept = 0
    for node, shape, dtype, nbytes, placeholder in listing:
        # Parameters and their transposes (2-D, no token dimension) cost nothing new.
        weight_like = placeholder and len(shape) <= 2 and tokens not in shape
        weight_like |= len(shape) == 2 and tokens not in shape and TOKENS[1] not in shape
        note = "parameter or its view" if weight_like else ""
        if not weight_like:
            kept += nbytes
        print(f"  {node:<14} {str(shape):<22} {str(dtype):<16} {nbytes / tokens:>8.0f} B/token {note}")
    print(f"  kept: {kept / tokens:.0f} bytes per token\n")


def main():
    llama = transformers.LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=1,
                                     num_attention_heads=16, num_key_value_heads=4,
                                     vocab_size=1000, attn_implementation="sdpa")
    with torch.device("meta"):
        m = transformers.LlamaForCausalLM(llama).to(torch.bfloat16)
    trace("llama (hidden 1024, 16 heads over 4 K/V heads, MLP 4096, bf16)", m, m.model.layers,
          m.model)
    gpt2 = transformers.GPT2Config(n_embd=768, n_layer=1, n_head=12, vocab_size=1000,
                                   n_positions=1024, attn_implementation="sdpa")
    with torch.device("meta"):
        m = transformers.GPT2LMHeadModel(gpt2).to(torch.bfloat16)
    trace("gpt2 (hidden 768, 12 heads, MLP 3072, bf16, dropout 0.1)", m, m.transformer.h,
          m.transformer)


if __name__ == "__main__":
    main()
