"""vramguard: per-GPU memory of a training job before it runs, and whether it fits.

    >>> import vramguard
    >>> r = vramguard.estimate(model="llama-3.1-8b", mode="qlora", micro_batch=2,
    ...                        seq=4096, gpu="rtx-4090")
    >>> r["fits"], r["estimate"]["perGpuBytes"]

Each call runs the `vramguard` binary installed with this package (`vramguard estimate
-o json`, `vramguard max -o json`); an invalid job raises SpecError with every
`path: reason` in `.errors`.
"""

from ._api import SpecError, VramguardError, binary, estimate, estimate_all, fit, max

__all__ = ["SpecError", "VramguardError", "binary", "estimate", "estimate_all", "fit", "max"]
