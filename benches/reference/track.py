"""Live storage bytes through a training step, on the meta device.

`Tracker` is a TorchDispatchMode that sees every storage an aten op creates
(forward, backward, the optimizer step) and, through a weak reference to the
storage, the moment it dies: the same mechanism as
`torch.distributed._tools.mem_tracker`. Sizes are rounded up to 512 bytes,
as the CUDA caching allocator rounds every block, so the running sum is what
`torch.cuda.memory_allocated()` would read on a GPU. Meta tensors allocate
nothing, so a 7B configuration costs only the Python time of its op count.

Each storage alive at the peak is put in one of the estimator's components
(`vramguard estimate -o json`, `estimate.breakdown`), by what it is, not by a
model of it:
- weights: parameters and buffers, and the 16-bit copies autocast makes of them
  (or of views of them, such as one expert's slice of a 3-D expert weight);
- gradients: storages that became a parameter's `.grad`;
- optimizerStates: tensors in `optimizer.state`;
- inputs: the batch (token ids, labels, masks, images);
- logits: created in forward from the output head's pre-hook to the loss, or in
  backward with the vocabulary as the last dimension (the loss's gradients);
- activations: created in forward and still alive when that forward ended
  (saved for backward);
- temporaries: everything else (forward scratch, backward gradients of
  activations, recomputed blocks under checkpointing, the optimizer's scratch).

`GpuSemantics` is a TorchFunctionMode that makes a meta run take the code path
a CUDA run takes where the meta device would differ: autocast (which does
nothing for meta tensors) with its op lists and weight-cast cache, and the
kernel PyTorch's SDPA dispatcher picks on a GPU (flash, then memory-efficient,
then math), since on meta `scaled_dot_product_attention` always takes the math
path and keeps the S x S scores.
"""

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

BLOCK = 512  # the caching allocator's rounding of every block

COMPONENTS = ("weights", "gradients", "optimizerStates", "activations", "logits", "inputs",
              "temporaries")


class Rec:
    __slots__ = ("alloc", "free", "bytes", "kind", "phase", "micro", "ref")

    def __init__(self, alloc, nbytes, kind, phase, micro):
        self.alloc, self.free, self.bytes = alloc, None, nbytes
        self.kind, self.phase, self.micro, self.ref = kind, phase, micro, None


class Tracker(TorchDispatchMode):
    """Every storage's life, in a sequence of allocation and free events.

    Backward is cut where the estimator cuts it: `backward:head` from its start (the
    loss's and the head's gradients) until the gradient of the last block's output
    exists, `backward:blocks` until the first block's input gradient exists, then
    `backward:tail` (the embeddings); `watch_blocks` installs the hooks that say so.
    """

    def __init__(self, vocab=0):
        super().__init__()
        self.records = []
        self._by_storage = WeakIdKeyDictionary()
        self.seq = 0
        self.live = 0
        self.peak = -1
        self.peak_seq = 0
        self.peak_phase = "setup"
        self.phase = "setup"
        self.micro = 0
        self.kind = None  # forced kind for storages made now (inputs, autocast copies, logits)
        self.vocab = vocab
        self.forward_end = {}  # micro-batch -> seq at the end of its forward
        self.phase_peaks = {}  # phase -> (live bytes, seq) at its highest

    # ---- registration ----
    def register(self, t, kind=None):
        if not isinstance(t, torch.Tensor):
            return None
        st = t.untyped_storage()
        rec = self._by_storage.get(st)
        if rec is not None:
            if kind is not None and rec.kind is None:
                rec.kind = kind
            return rec
        n = st.nbytes()
        if n == 0:
            return None
        n = -(-n // BLOCK) * BLOCK
        if kind is None:
            kind = self.kind
        if kind is None and self.phase.startswith("backward") and self.vocab and t.dim() >= 1 \
                and t.shape[-1] == self.vocab:
            kind = "logits"
        self.seq += 1
        rec = Rec(self.seq, n, kind, self.phase, self.micro)
        rec.ref = weakref.ref(st, lambda _, r=rec: self._free(r))
        self._by_storage[st] = rec
        self.records.append(rec)
        self.live += n
        if self.live > self.peak:
            self.peak, self.peak_seq, self.peak_phase = self.live, self.seq, self.phase
        if self.live > self.phase_peaks.get(self.phase, (-1, 0))[0]:
            self.phase_peaks[self.phase] = (self.live, self.seq)
        return rec

    def mark(self, t, kind):
        """Say what an existing storage is (a gradient, an optimizer state)."""
        rec = self.register(t, kind)
        if rec is not None:
            rec.kind = kind

    def _free(self, rec):
        if rec.free is None:
            self.seq += 1
            rec.free = self.seq
            self.live -= rec.bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self.register(t)
        return out

    # ---- phases ----
    def set_phase(self, phase, micro=None):
        """forward | backward:head | backward:blocks | backward:tail | optimizer | setup."""
        if self.phase == "forward" and phase != "forward":
            self.forward_end[self.micro] = self.seq
        self.phase = phase
        if micro is not None:
            self.micro = micro

    # ---- the answer ----
    def component(self, rec):
        if rec.kind is not None:
            return rec.kind
        if rec.phase == "forward":
            end = self.forward_end.get(rec.micro)
            if end is not None and (rec.free is None or rec.free > end):
                return "activations"
        return "temporaries"

    def breakdown_at(self, seq):
        out = dict.fromkeys(COMPONENTS, 0)
        for r in self.records:
            if r.alloc <= seq and (r.free is None or r.free > seq):
                out[self.component(r)] += r.bytes
        return out

    def result(self):
        phases = {p: dict(peak_bytes=b, breakdown=self.breakdown_at(seq))
                  for p, (b, seq) in self.phase_peaks.items() if p != "setup"}
        back = [(b, seq) for p, (b, seq) in self.phase_peaks.items() if p.startswith("backward")]
        if back:
            b, seq = max(back)
            phases["backward"] = dict(peak_bytes=b, breakdown=self.breakdown_at(seq))
        return dict(peak_bytes=self.peak, peak_phase=self.peak_phase,
                    breakdown=self.breakdown_at(self.peak_seq), phases=phases)


def watch_blocks(tracker, blocks):
    """Hooks on the transformer blocks that move the tracker through backward's parts."""

    def first_tensor(x):
        for t in tree_leaves(x):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return t
        return None

    def to(phase, order):
        def hook(_grad):
            if order.index(phase) > order.index(tracker.phase if tracker.phase in order
                                                else order[0]):
                tracker.set_phase(phase)
        return hook

    order = ["backward", "backward:head", "backward:blocks", "backward:tail"]
    state = {"first": True}

    def pre(_mod, args, kwargs):
        if tracker.phase == "forward" and state["first"]:
            state["first"] = False
            t = first_tensor((args, kwargs))
            if t is not None:
                t.register_hook(to("backward:tail", order))

    def post(_mod, _args, _kwargs, out):
        if tracker.phase == "forward":
            t = first_tensor(out)
            if t is not None:
                t.register_hook(to("backward:blocks", order))

    for b in blocks:
        b.register_forward_pre_hook(pre, with_kwargs=True)
        b.register_forward_hook(post, with_kwargs=True)
    return state


# ------------------------------------------------------------ GPU semantics ---

def _matmul_like():
    fs = [F.linear, F.bilinear, torch.matmul, torch.mm, torch.bmm, torch.baddbmm, torch.addmm,
          torch.addbmm, torch.addmv, torch.mv, torch.einsum, F.conv1d, F.conv2d, F.conv3d,
          F.conv_transpose1d, F.conv_transpose2d, torch.Tensor.matmul, torch.Tensor.__matmul__,
          torch.Tensor.__rmatmul__, torch.Tensor.mm, torch.Tensor.bmm, torch.Tensor.baddbmm,
          torch.Tensor.addmm, F.prelu]
    return set(fs)


def _fp32_ops():
    fs = [F.layer_norm, F.group_norm, F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss,
          F.smooth_l1_loss, F.huber_loss, F.kl_div, F.binary_cross_entropy_with_logits,
          F.cosine_similarity, F.softplus, torch.pow, torch.Tensor.pow, torch.rsqrt,
          torch.Tensor.rsqrt, torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log,
          torch.norm, torch.Tensor.norm, torch.logsumexp, torch.Tensor.logsumexp,
          torch.reciprocal, torch.Tensor.reciprocal, torch.cdist]
    return set(fs)


def _fp32_dtype_ops():
    return {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax,
            torch.Tensor.log_softmax, torch.cumsum, torch.Tensor.cumsum, torch.sum,
            torch.Tensor.sum, torch.prod, torch.Tensor.prod}


LOW, FP32, FP32_DTYPE = _matmul_like(), _fp32_ops(), _fp32_dtype_ops()
LOW16 = (torch.float16, torch.bfloat16)


class GpuSemantics(TorchFunctionMode):
    """Autocast as CUDA's autocast would apply it, and SDPA's GPU kernel choice."""

    def __init__(self, tracker, amp_dtype=None):
        super().__init__()
        self.tracker = tracker
        self.amp = amp_dtype
        self.cache = {}  # autocast's cache of leaf weights that require grad
        self.cache_on = True
        self.kernels = {}

    def clear_cache(self):
        self.cache = {}

    def _cast(self, x, dtype):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()) or x.dtype == dtype:
            return x
        leaf = x.is_leaf and x.requires_grad
        if leaf and self.cache_on and id(x) in self.cache:
            return self.cache[id(x)][1]
        src = self.tracker.register(x)
        prev, self.tracker.kind = self.tracker.kind, ("weights" if src is not None
                                                      and src.kind == "weights"
                                                      else self.tracker.kind)
        y = x.to(dtype)
        self.tracker.kind = prev
        if leaf and self.cache_on:
            self.cache[id(x)] = (x, y)
        return y

    def _cast_all(self, args, kwargs, dtype):
        args = tuple(self._cast(a, dtype) if isinstance(a, torch.Tensor) else
                     [self._cast(b, dtype) for b in a] if isinstance(a, (list, tuple)) and a
                     and isinstance(a[0], torch.Tensor) else a for a in args)
        kwargs = {k: self._cast(v, dtype) for k, v in kwargs.items()}
        return args, kwargs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        if self.amp is not None:
            if func in LOW:
                args, kwargs = self._cast_all(args, kwargs, self.amp)
            elif func in FP32:
                args, kwargs = self._cast_all(args, kwargs, torch.float32)
            elif func in FP32_DTYPE and kwargs.get("dtype") is None and args and isinstance(
                    args[0], torch.Tensor) and args[0].dtype in LOW16:
                kwargs["dtype"] = torch.float32
        return func(*args, **kwargs)

    def _sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        if self.amp is not None:
            q, k, v = (self._cast(t, self.amp) for t in (q, k, v))
        d = q.shape[-1]
        gqa = k.shape[-3] != q.shape[-3]
        # PyTorch's CUDA priority (sdp_utils.cpp): flash, memory-efficient, math.
        if q.dtype in LOW16 and attn_mask is None and d % 8 == 0 and d <= 256 and q.dim() == 4:
            self.kernels["flash"] = self.kernels.get("flash", 0) + 1
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, scale=scale)[0]
        if not gqa and d % 8 == 0 and q.dim() == 4 and q.dtype in (torch.float32,) + LOW16:
            self.kernels["efficient"] = self.kernels.get("efficient", 0) + 1
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device) \
                    .masked_fill_(attn_mask.logical_not(), float("-inf"))
            if attn_mask is not None:
                attn_mask = attn_mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2],
                                                         k.shape[2])
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, attn_mask, q.requires_grad or k.requires_grad, dropout_p, is_causal,
                scale=scale)[0]
        self.kernels["math"] = self.kernels.get("math", 0) + 1
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale,
                                              enable_gqa=enable_gqa)


def allow_fused_optimizers_on_meta():
    """torch.optim refuses fused=True off its device list; the fused kernels have meta
    kernels, so a meta run can take the fused path a CUDA run takes."""
    import torch.optim.optimizer as opt

    devices = opt._get_fused_kernels_supported_devices()
    if "meta" not in devices:
        opt._get_fused_kernels_supported_devices = lambda: devices + ["meta"]
