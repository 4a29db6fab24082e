"""What this CPU can do, read in one place: its flags (/proc/cpuinfo, else what PyTorch reports),
the ISA limit `ONEDNN_MAX_CPU_ISA` puts on oneDNN, and what follows for the products: bf16, AMX,
VNNI, int8 pairs added in int16. `transduce.precision` chooses from it; the speed-ups of
`transduce.fast`, the tests and the benchmarks ask it. The private PyTorch functions it calls go
through `transduce.fast.ops`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path

import torch

from . import ops

CPU_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni")
"""The flags the precision table and the speed-ups look at."""

VNNI = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""Flags with which oneDNN adds u8 x s8 products in int32 (without them: in int16, saturating)."""

ONEDNN_ISA_FLAGS = {
    "SSE41": (), "AVX": (), "AVX2": (), "AVX2_VNNI": ("avx_vnni",), "AVX2_VNNI_2": ("avx_vnni",),
    "AVX512_CORE": (), "AVX512_CORE_VNNI": ("avx512_vnni", "avx_vnni"),
    "AVX512_CORE_BF16": ("avx512_vnni", "avx_vnni", "avx512_bf16"),
    "AVX512_CORE_FP16": ("avx512_vnni", "avx_vnni", "avx512_bf16"),
    "AVX10_1_512": ("avx512_vnni", "avx_vnni", "avx512_bf16"),
}
"""`ONEDNN_MAX_CPU_ISA` values that hold oneDNN below some of `CPU_FLAGS`: the flags left to it
(e.g. AVX2, to imitate a CPU without bf16). Any other value (unset, ALL, the AMX ones) leaves all."""


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


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` says."""
    info = cpuinfo()
    return (info.get("model name") or info.get("Model") or info.get("Hardware") or platform.processor()
            or platform.machine() or "unknown CPU")


def proc_flags() -> frozenset:
    """All the flags the CPU has (/proc/cpuinfo's; off Linux on x86-64, `CPU_FLAGS` as PyTorch
    reports them), whatever oneDNN is held to."""
    info = cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    if not flags and platform.machine().lower() in ("x86_64", "amd64"):
        flags = ops.cpu_features()
    return frozenset(flags)


def cpu_flags() -> frozenset:
    """The `CPU_FLAGS` this CPU has and that `ONEDNN_MAX_CPU_ISA` leaves to oneDNN."""
    allowed = set(ONEDNN_ISA_FLAGS.get(onednn_isa_limit(), CPU_FLAGS))
    return frozenset(f for f in CPU_FLAGS if f in proc_flags() and f in allowed)


def amx_products() -> bool:
    """Whether oneDNN multiplies bf16 on AMX tiles here: the CPU has AMX and `ONEDNN_MAX_CPU_ISA`
    does not hold oneDNN below it (e.g. AVX2, to imitate a laptop CPU)."""
    return "amx_bf16" in cpu_flags()


def has_vnni() -> bool:
    """Whether oneDNN's int8 products add pairs in int32 here (VNNI or AMX, as held)."""
    return bool(cpu_flags() & VNNI)


def bf16_products() -> bool:
    """Whether oneDNN computes bf16 products on this CPU (what bf16 packing needs)."""
    return ops.has("packed") and ops.bf16_packing()


@functools.cache
def int8_saturates() -> bool:
    """Whether oneDNN's int8 products here add u8 x s8 pairs in int16 with saturation (x86 without
    VNNI or AMX, or oneDNN held below them). A feature test, not the flags: one product whose pairs
    overflow int16 with 8-bit weights (`transduce.fast.int8` then quantizes weights to 7 bits)."""
    qw = ops.int8_pack(torch.full((1, 64), 127, dtype=torch.int8))
    y = ops.int8_linear(torch.full((1, 64), 255, dtype=torch.uint8), 1.0, 0, qw, torch.ones(1),
                        torch.zeros(1, dtype=torch.long), None, torch.float32)
    return y.item() != 255 * 127 * 64
