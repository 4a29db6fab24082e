"""A decoding process's memory, held to what the model and the limits need (docs/serve.md, "Memory").

oneDNN (PyTorch's bf16 and pre-packed products) keeps a primitive of about half a megabyte for
every product shape in two caches, its own (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`) and ideep's
(`LRU_CACHE_CAPACITY`); decoding sees new shapes with every source length and batch size (and a
bf16 step's attention every `fast.step.POSITIONS_MULTIPLE` steps), so unbounded they fill for
thousands of requests. `bound_kernel_caches` bounds both before the process's first product
(`transduce.decoding.ready.load_for_decoding` and importing `transduce.serve` call it). glibc's arenas keep
what a round freed: `release_free_memory` (`malloc_trim(0)`) gives the free pages back, and
`map_large_blocks` keeps large blocks out of them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

KERNEL_CACHE_ENV = "TRANSDUCE_KERNEL_CACHE"  # product shapes oneDNN's two caches keep

# The bound: a batch's shapes fit (a bf16 step's attention rounded up: `fast.step`); about 33 MB at most
DEFAULT_KERNEL_CACHE = 64

_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
_TRANSDUCE_DEFAULTS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16384"}  # `widen_kernel_cache`'s, for training


def widen_kernel_cache() -> None:
    """Training's many batch shapes: oneDNN's kernel cache at 16,384, not 1,024, unless the user set
    it (docs/speed.md); read at the first product, so `train.step.prepare_for_training` calls it first."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", _TRANSDUCE_DEFAULTS["ONEDNN_PRIMITIVE_CACHE_CAPACITY"])


def kernel_cache_size() -> int:
    """The bound asked for: `TRANSDUCE_KERNEL_CACHE`, else `DEFAULT_KERNEL_CACHE`."""
    value = os.environ.get(KERNEL_CACHE_ENV, "").strip()
    if not value:
        return DEFAULT_KERNEL_CACHE
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{KERNEL_CACHE_ENV} must be a whole number of shapes >= 0, not {value!r}")
    return n


def bound_kernel_caches(n: int | None = None) -> dict[str, str]:
    """Set oneDNN's primitive cache and ideep's to `n` shapes (default `kernel_cache_size()`) unless
    the user set them; returns both as they now are. Read at the process's first product only."""
    n = kernel_cache_size() if n is None else n
    for name in _CACHES:
        current = os.environ.get(name)
        if current is None or current == _TRANSDUCE_DEFAULTS.get(name) or KERNEL_CACHE_ENV in os.environ:
            os.environ[name] = str(n)
    return {name: os.environ[name] for name in _CACHES}


@functools.cache
def glibc():
    """glibc, as ctypes loads it (None elsewhere: musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc's; absent from musl and macOS
    except (OSError, AttributeError):
        return None
    return libc


def release_free_memory() -> bool:
    """Give malloc's free pages back to the system (glibc's `malloc_trim(0)`); False without it."""
    libc = glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


MAP_LARGE_FROM = 1 << 20
"""Bytes from which a decoding process's allocations are mapped on their own (`map_large_blocks`)."""


def map_large_blocks(size: int = MAP_LARGE_FROM) -> bool:
    """glibc: allocations of `size` bytes or more mapped on their own and given back when freed, at a
    fixed threshold. glibc's default threshold rises to the largest block freed (up to 32 MB), after
    which a model's freed tensors stay there: loading a model held more at its peak. For loading a
    model to decode (`ready.load_for_decoding`, which then keeps freed memory for the steps: mapping
    a step's logits afresh every step cost a third of bf16's speed); docs/speed.md, "Memory at
    OPUS-MT's size".
    Returns whether it took (elsewhere nothing changes)."""
    libc, m_mmap_threshold = glibc(), -3  # malloc.h
    return libc is not None and bool(libc.mallopt(m_mmap_threshold, size))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_stats() -> dict[str, int] | None:
    """glibc's view of the heap, in bytes (`mallinfo2`, every arena): "in_use" (allocated and
    not freed, mapped blocks included), "free" (held by malloc, not in use: what
    `release_free_memory` may return). None without glibc 2.33 or later."""
    libc = glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return {"in_use": m.uordblks + m.hblkhd, "free": m.fordblks}


class Trimmer:
    """`Batcher(after_round=...)`: free memory back to the system when no job waits, else at most
    every `interval` seconds (a trim costs the next round page faults)."""

    def __init__(self, interval: float = 1.0):
        self.interval, self.last = interval, 0.0

    def __call__(self, idle: bool) -> None:
        import time

        now = time.monotonic()
        if idle or now - self.last >= self.interval:
            release_free_memory()
            self.last = time.monotonic()


def memory_info() -> dict:
    """For /info: the kernel caches' bounds as set, and the heap as glibc sees it (MB)."""
    stats = malloc_stats()
    return {
        "kernel_cache": {name: os.environ.get(name) for name in _CACHES},
        "malloc_in_use_mb": round(stats["in_use"] / 2**20, 1) if stats else None,
        "malloc_free_mb": round(stats["free"] / 2**20, 1) if stats else None,
    }
