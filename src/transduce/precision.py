"""Choosing the arithmetic precision from what the device has: `--precision auto` (docs/precision.md).

bf16 is fast where the hardware computes it natively and far slower than fp32 where emulated;
int8 (decoding on the CPU; not exact) pays with VNNI or AMX. `auto` and `auto-int8` look the
device up in `CPU_TABLE` (a GPU: its compute capability), rows measured with
`benchmarks/precision_table.py`; a CPU matching no row gets fp32. An explicit precision is
obeyed (emulated bf16 with a warning). The capability is an argument, so every row is testable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .defaults import DECODING_PRECISIONS, PRECISIONS
from .cpu import CPU_FLAGS, ONEDNN_ISA_FLAGS, cpu_flags, cpu_name, int8_saturates, onednn_isa_limit


@dataclass(frozen=True)
class Capability:
    """What a device offers."""

    device: str  # 'cpu' or 'cuda'
    name: str  # The processor or GPU, for messages
    # CPU: the `CPU_FLAGS` oneDNN may use (`ONEDNN_MAX_CPU_ISA` can hold it below the CPU);
    # CUDA: "bf16" from compute capability 8.0
    features: frozenset = frozenset()
    detail: str = ""  # The features in words, e.g. 'avx512_bf16, avx512_vnni' or 'compute capability 9.0'

    @property
    def native_bf16(self) -> bool:
        return bool(self.features & {"amx_bf16", "avx512_bf16", "bf16"})


@dataclass(frozen=True)
class Row:
    """One class of CPU: the flags it needs and what `auto` and `auto-int8` choose there."""

    needs: frozenset
    auto: str
    auto_int8: str
    # int8: the encoder's and decoder's linear layers in int8 too (False: the pre-softmax projection alone)
    int8_decoder: bool
    why: str  # Why `auto`, in words
    why_int8: str  # Why `auto-int8` (and `--precision int8`'s layers), in words


# Rows in order, the first whose flags the CPU has decides (docs/speed.md has the measurements)
CPU_TABLE = (
    Row(
        frozenset({"amx_bf16", "amx_int8"}),
        "bf16",
        "int8",
        False,
        "AMX: bf16 products faster than fp32",
        "int8 for the output projection alone, where bf16 beats int8 with its quantization at the decoder's sizes",
    ),
    Row(
        frozenset({"avx512_bf16", "avx512_vnni"}),
        "bf16",
        "int8",
        True,
        "bf16 products faster than fp32",
        "the decoder's int8 products faster than bf16",
    ),
    Row(frozenset({"avx512_bf16"}), "bf16", "bf16", True, "bf16 products faster than fp32", "no int8 measured"),
    Row(
        frozenset(),
        "fp32",
        "fp32",
        True,
        "no bf16 instructions: bf16 emulated, far slower",
        "int8 no faster than fp32 without VNNI",
    ),
)


@dataclass(frozen=True)
class Choice:
    """The precision to use and why, in words."""

    precision: str
    reason: str
    warning: str | None = None
    base: str = "fp32"  # int8: the dtype of all but the int8 products (bf16 where native, else fp32)
    int8_decoder: bool = True  # int8: the encoder's and decoder's linear layers too (else the output projection alone)

    def line(self) -> str:
        """One line for the user: 'precision: bf16 (...)'."""
        return f"precision: {self.precision} ({self.reason})"


def read_capability(device: torch.device | str = "cpu") -> Capability:
    """What `device` offers, as the kernel (CPU flags) or PyTorch (GPU) reports it."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return Capability(
            "cuda",
            torch.cuda.get_device_name(device),
            frozenset({"bf16"} if major >= 8 else ()),
            f"compute capability {major}.{minor}",
        )
    flags = cpu_flags()
    held = onednn_isa_limit()
    detail = ", ".join(f for f in CPU_FLAGS if f in flags) or f"{held or torch.backends.cpu.get_cpu_capability()} only"
    if held in ONEDNN_ISA_FLAGS:
        detail += f" (ONEDNN_MAX_CPU_ISA={held})"
    return Capability("cpu", cpu_name(), flags, detail)


def cpu_row(cap: Capability) -> Row:
    """The first row of `CPU_TABLE` whose flags `cap` has."""
    return next(row for row in CPU_TABLE if row.needs <= cap.features)


def choose_precision(
    requested: str, device: torch.device | str = "cpu", *, capability: Capability | None = None
) -> Choice:
    """The precision to train (or evaluate a loss) in: `requested` itself (with a warning where
    bf16 is emulated), or for 'auto' the table's choice."""
    if requested not in PRECISIONS + ("int8",):
        raise ValueError(f"unknown precision {requested!r} ({', '.join(PRECISIONS + ('int8',))})")
    device = torch.device(device)
    if requested == "int8":
        return int8_choice(device, capability)
    if requested in ("fp32", "fp16"):
        return Choice(requested, "as asked")
    cap = capability or read_capability(device)
    where = f"{cap.name}: {cap.detail}"
    if requested == "bf16":
        emulated = cap.device == "cpu" and not cap.native_bf16
        warning = (
            (f"bf16 is emulated on this CPU ({where}): many times slower than fp32; --precision auto would use fp32")
            if emulated
            else None
        )
        return Choice("bf16", f"as asked; {where}", warning=warning)
    if cap.device == "cuda":
        if cap.native_bf16:
            return Choice("bf16", f"auto: {where} computes bf16 natively")
        return Choice("fp32", f"auto: {where} has no bf16 (fp16 is never chosen silently)")
    row = cpu_row(cap)
    return Choice(row.auto, f"auto: {where}: {row.why}")


def int8_choice(
    device: torch.device | str = "cpu", capability: Capability | None = None, why: str = "as asked"
) -> Choice:
    """`--precision int8`: where it runs and how, or a ValueError off the CPU (or without oneDNN's
    int8 kernels). Everything but the products in bf16 where the CPU computes bf16 natively, else
    fp32; the decoder's layers in int8 as the CPU's row of `CPU_TABLE` says."""
    if torch.device(device).type != "cpu":
        raise ValueError(f"--precision int8 runs on the CPU only (not {device}); use --device cpu, or bf16 on a GPU")
    from .fast.int8 import can_int8, int8_kernel, int8_needs

    if not can_int8():
        raise ValueError(f"--precision int8 {int8_needs()}")
    cap = capability or read_capability("cpu")
    row = cpu_row(cap)
    base = "bf16" if cap.native_bf16 else "fp32"
    bits = (
        "7-bit weights, 8-bit activations: this CPU's int8 products add pairs in int16"
        if int8_saturates()
        else "8-bit activations"
    )
    layers = (
        "every linear layer in int8 (the encoder's, the decoder's, the output projection)"
        if row.int8_decoder
        else f"the output projection in int8, the other linear layers in {base} ({row.why_int8})"
    )
    kernel = "FBGEMM" if int8_kernel(torch.bfloat16 if base == "bf16" else torch.float32) == "fbgemm" else "oneDNN"
    return Choice(
        "int8",
        f"{why}; {cap.name}: {layers} through {kernel} ({bits}), the rest in {base} ({cap.detail}); the search in fp32",
        base=base,
        int8_decoder=row.int8_decoder,
    )


def choose_decoding_precision(
    requested: str, device: torch.device | str = "cpu", *, capability: Capability | None = None
) -> Choice:
    """The precision `translate`, `evaluate`, `serve` and `parse` decode in: fp32, bf16, int8 as
    asked; `auto` the table's float type for the device; `auto-int8` on the CPU the table's
    choice among fp32, bf16 and int8 (elsewhere `auto`'s)."""
    if requested not in DECODING_PRECISIONS:
        raise ValueError(f"unknown decoding precision {requested!r} ({', '.join(DECODING_PRECISIONS)})")
    device = torch.device(device)
    if requested == "int8":
        return int8_choice(device, capability)
    if requested != "auto-int8" or device.type != "cpu":
        return choose_precision("auto" if requested == "auto-int8" else requested, device, capability=capability)
    from .fast.int8 import can_int8

    cap = capability or read_capability(device)
    row = cpu_row(cap)
    why = f"auto-int8: {cap.name}: {cap.detail}: {row.why}; {row.why_int8}"
    if row.auto_int8 == "int8" and can_int8():
        return int8_choice(device, cap, why)
    return Choice(row.auto, why)
