"""What this CPU can do, read in one place for `transduce.precision`, the fast paths, the tests and
the benchmarks: its flags (/proc/cpuinfo, else PyTorch's), as far as `ONEDNN_MAX_CPU_ISA` leaves
them to oneDNN, and what follows: bf16, AMX, VNNI, int8 pairs saturating in int16."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path

import torch

from . import torch_ops

CPU_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni")
VNNI = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # int8 pairs added in int32 (else int16, saturating)

_VNNI, _BF16 = ("avx512_vnni", "avx_vnni"), ("avx512_vnni", "avx_vnni", "avx512_bf16")
ONEDNN_ISA_FLAGS = {
    "SSE41": (),
    "AVX": (),
    "AVX2": (),
    "AVX2_VNNI": ("avx_vnni",),
    "AVX2_VNNI_2": ("avx_vnni",),
    "AVX512_CORE": (),
    "AVX512_CORE_VNNI": _VNNI,
    "AVX512_CORE_BF16": _BF16,
    "AVX512_CORE_FP16": _BF16,
    "AVX10_1_512": _BF16,
}
"""The `CPU_FLAGS` an `ONEDNN_MAX_CPU_ISA` value leaves to oneDNN (AVX2: to imitate a CPU without
bf16); any other value (unset, ALL, the AMX ones) leaves all."""


def onednn_isa_limit() -> str:
    """`ONEDNN_MAX_CPU_ISA` (or its old name), upper case; "" where unset."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()


def cpuinfo() -> dict[str, str]:
    """The first value of each key of /proc/cpuinfo ({} where it cannot be read)."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return info


def x86_64() -> bool:
    """Whether this is an x86-64 machine (x86_64, or AMD64 as Windows names it): the one test of it."""
    return platform.machine().lower() in ("x86_64", "amd64")


def cpu_name() -> str:
    info = cpuinfo()
    names = (info.get("model name"), info.get("Model"), info.get("Hardware"), platform.processor(), platform.machine())
    return next((n for n in names if n), "unknown CPU")


def proc_flags() -> frozenset:
    """All the CPU's flags, whatever oneDNN is held to (off Linux on x86-64: `CPU_FLAGS` as PyTorch sees them)."""
    info = cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return frozenset(flags or (torch_ops.cpu_features() if x86_64() else ()))


def cpu_flags() -> frozenset:
    """The `CPU_FLAGS` this CPU has and `ONEDNN_MAX_CPU_ISA` leaves to oneDNN."""
    allowed = ONEDNN_ISA_FLAGS.get(onednn_isa_limit(), CPU_FLAGS)
    return frozenset(f for f in CPU_FLAGS if f in proc_flags() and f in allowed)


def amx_products() -> bool:
    """Whether oneDNN multiplies bf16 on AMX tiles here (not held below them, e.g. to AVX2)."""
    return "amx_bf16" in cpu_flags()


def has_vnni() -> bool:
    """Whether int8 products add pairs in int32 here (VNNI or AMX, as oneDNN is held)."""
    return bool(cpu_flags() & VNNI)


@functools.cache
def int8_saturates() -> bool:
    """Whether oneDNN's int8 products add u8 x s8 pairs in int16 with saturation here (no VNNI or
    AMX, or held below them): then `fast.int8` takes 7-bit weights. A feature test, one product
    whose pairs overflow int16 with 8-bit weights."""
    qw = torch_ops.int8_pack(torch.full((1, 64), 127, dtype=torch.int8))
    y = torch_ops.int8_linear(
        torch.full((1, 64), 255, dtype=torch.uint8),
        1.0,
        0,
        qw,
        torch.ones(1),
        torch.zeros(1, dtype=torch.long),
        None,
        torch.float32,
    )
    return y.item() != 255 * 127 * 64
