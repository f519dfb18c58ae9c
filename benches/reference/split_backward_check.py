"""What a stage keeps between PyTorch's input backward and its weight backward.

Two small pre-norm MLP blocks run forward under a saved-tensors hook that keeps a weak
reference to each tensor autograd saves; then the zero-bubble schedules' split backward
from torch/distributed/pipelining/_backward.py runs on them: `stage_backward_input` (I)
and `stage_backward_weight` (W). Printed: how many saved tensors (parameters left out)
are alive after forward, after I and after W.

    target/reference-venv/bin/python benches/reference/split_backward_check.py

torch 2.15.0 (git d0f2af8b): 16 after forward, 16 after I (the norms' statistics and the
GELU's input among them, which W does not read), 1 after W (the stage's input, which the
caller holds). `bounds::split_backward_held`'s point keeps the whole saved set for it.
"""

import gc
import weakref

import torch
from torch.distributed.pipelining._backward import (
    stage_backward_input,
    stage_backward_weight,
)

H, I, T = 64, 256, 32


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(H)
        self.up = torch.nn.Linear(H, I)
        self.down = torch.nn.Linear(I, H)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    saved = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    def alive():
        gc.collect()
        return sum(
            1
            for r in saved
            if r() is not None and not isinstance(r(), torch.nn.Parameter)
        )

    x = torch.randn(T, H, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    print("saved tensors alive after forward", alive())
    _, groups = stage_backward_input([y], [torch.randn_like(y)], [x], model.parameters())
    print("after the input backward (I)", alive())
    del y
    stage_backward_weight(model.parameters(), groups)
    del groups
    print("after the weight backward (W)", alive())


if __name__ == "__main__":
    main()
