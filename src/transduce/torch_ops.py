"""The private PyTorch functions transduce calls, in one place: oneDNN's packed and int8 products,
FBGEMM's int8 product, the CPU features PyTorch reports, log-softmax's backward. Not public API: `has` says whether this
torch build has the operators; where one is missing the callers take the public path (`F.linear`;
int8 refuses in one line), and `warn_missing` says so once per process."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

_WARNED: set[str] = set()


def has(what: str) -> bool:
    """Whether this torch build has the operators of `what`: "packed" (oneDNN-packed fp32/bf16
    products), "int8" (oneDNN's int8 linear) or "fbgemm" (FBGEMM's int8 linear)."""
    if what == "fbgemm":
        return "fbgemm" in torch.backends.quantized.supported_engines and all(
            hasattr(torch.ops.quantized, op) for op in ("linear_prepack", "linear_dynamic", "linear_relu_dynamic")
        )
    if not torch.backends.mkldnn.is_available():
        return False
    if what == "packed":
        return all(hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight"))
    if what == "int8":
        return all(hasattr(torch.ops.onednn, op) for op in ("qlinear_prepack", "qlinear_pointwise"))
    raise ValueError(what)


def warn_missing(what: str) -> None:
    """One warning per process that `what`'s private operators are missing from this torch."""
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(
            f"torch {torch.__version__} lacks oneDNN's {what} operators: decoding takes PyTorch's public "
            "path (correct, slower)",
            RuntimeWarning,
            stacklevel=3,
        )


def bf16_packing() -> bool:
    """Whether oneDNN computes bf16 products on this CPU (what bf16 packing needs)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_features() -> set[str]:
    """The CPU's AMX, bf16 and VNNI flags as PyTorch reports them (where /proc/cpuinfo is not)."""
    tests = {
        "amx_bf16": "_is_amx_tile_supported",
        "amx_int8": "_is_amx_tile_supported",
        "avx512_bf16": "_is_avx512_bf16_supported",
        "avx512_vnni": "_is_vnni_supported",
    }
    return {f for f, test in tests.items() if getattr(torch.cpu, test, lambda: False)()}


def log_softmax_backward(g: Tensor, z: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """dL/dx through z = log_softmax(x) given g = dL/dz: PyTorch's kernel, else g - exp(z) sum(g)."""
    if hasattr(torch, "_log_softmax_backward_data"):
        return torch._log_softmax_backward_data(g, z, dim, dtype)
    return (g - z.exp() * g.sum(dim, keepdim=True)).to(dtype)


def pack(w: Tensor) -> Tensor:
    """W (out, in) in oneDNN's blocked layout, for `linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous())


def linear(x: Tensor, packed: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
    """x W^T + b with W packed by `pack`; `activation` "relu": max(0, .), applied as oneDNN writes."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, activation, [], "")


def int8_pack(q: Tensor) -> object:
    """An int8 weight (out, in) packed for `int8_linear`."""
    return torch.ops.onednn.qlinear_prepack(q, None)


def int8_linear(
    q: Tensor,
    scale: float,
    zero: int,
    packed,
    w_scales: Tensor,
    w_zeros: Tensor,
    bias: Tensor | None,
    out_dtype: torch.dtype,
    activation: str = "none",
) -> Tensor:
    """(q - zero) * scale times the int8 weight (per-row `w_scales`) plus bias, in `out_dtype`."""
    return torch.ops.onednn.qlinear_pointwise(
        q, scale, zero, packed, w_scales, w_zeros, bias, 1.0, 0, out_dtype, activation, [], ""
    )


def fbgemm_pack(q: Tensor, w_scales: Tensor, bias: Tensor | None) -> object:
    """An int8 weight (out, in) with its per-row scales and fp32 bias, packed for `fbgemm_linear`:
    `fbgemm_prepack(fbgemm_weight(...))`."""
    return fbgemm_prepack(fbgemm_weight(q, w_scales), bias)


def fbgemm_weight(q: Tensor, w_scales: Tensor) -> Tensor:
    """The quantized tensor FBGEMM takes its weights as, whose creation torch 2.13 announces as
    deprecated: made here, under that warning alone (in the thread that filters warnings: Python's
    filters are the process's), to be held only inside the packed weight (`fbgemm_prepack`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*quantized tensor creation functions.*deprecated", category=UserWarning
        )
        return torch._make_per_channel_quantized_tensor(
            q, w_scales.double(), torch.zeros(q.size(0), dtype=torch.long), 0
        )


def fbgemm_prepack(w: Tensor, bias: Tensor | None) -> object:
    """`fbgemm_weight`'s tensor and an fp32 bias packed for `fbgemm_linear` (FBGEMM's packing is
    single-threaded; it lets go of Python's lock: `fast.int8.packing_behind` runs it in a thread)."""
    engine = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = "fbgemm"
        return torch.ops.quantized.linear_prepack(w, None if bias is None else bias.float().contiguous())
    finally:
        torch.backends.quantized.engine = engine


def fbgemm_linear(x: Tensor, packed, activation: str = "none") -> Tensor:
    """fp32 x times the weight packed by `fbgemm_pack`, plus its bias (`activation` "relu": max(0, .),
    as FBGEMM writes): x quantized per tensor to u8 by FBGEMM as it reads it, 8 bits (no reduced range)."""
    op = torch.ops.quantized.linear_relu_dynamic if activation == "relu" else torch.ops.quantized.linear_dynamic
    return op(x, packed, False)
