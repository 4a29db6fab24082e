from __future__ import annotations
"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as real software."""

import os as _os

# oneDNN (PyTorch's CPU kernels for bf16 and int8) compiles a kernel per product shape and keeps
# 1024 of them; batches of varying length give more shapes than that, and training then spends a
# fifth of its time compiling the same kernels again (parse-cpu in bf16 on AMX: 5,649 against
# 6,815 target tokens/s by update 400; docs/history/RESULTS-log-2026-11.md). A larger cache, unless the user set one;
# read by oneDNN at its first product, so set before any.
_os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")

__version__ = "0.1.0"
__all__ = ["Config", "ModelConfig", "TrainConfig", "get_preset", "PRESETS", "Transformer", "__version__"]

_EXPORTS = {"Config": "config", "ModelConfig": "config", "TrainConfig": "config", "get_preset": "config",
            "PRESETS": "config", "Transformer": "model"}


def __getattr__(name: str):
    """`transduce.Transformer` and the config names, imported when first asked for (PEP 562): so
    that `import transduce.cli` does not import torch (two seconds), and the command can treat a
    Ctrl-C during that import as every other ("interrupted", 130) instead of a traceback."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
