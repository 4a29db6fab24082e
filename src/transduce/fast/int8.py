"""int8 decoding on the CPU (`--precision int8`, `quantize_int8`), through the packed layers of
`transduce.fast.decode`. Not in the paper, and not exact (docs/speed.md, "int8 decoding")."""

from __future__ import annotations

import platform

import torch
from torch import Tensor, nn

from ..model import Transformer
from . import ops
from .cpu import int8_saturates
from .decode import PackedLinear, PackedWeight, block_key, can_pack, fuse_relu, replace_linears, restore_linears, unpack_weights


def can_int8() -> bool:
    """Whether `quantize_int8` applies: oneDNN's int8 linear in this torch, on an x86-64 CPU."""
    return ops.has("int8") and platform.machine().lower() in ("x86_64", "amd64")


_OFFSETS = tuple(torch.tensor([z + 0.5]) for z in range(256))
"""The zero point + 0.5 of `quantize_activations`, made once; of shape (1,), not 0-d, so that the
sum with bf16 activations is computed and stored in fp32 (no separate conversion pass)."""

LEVELS = 254
"""Activation steps: 254, not 255, so that x / s + z + 0.5 never reaches 256 (no clamp needed)."""


def quantize_activations(x: Tensor) -> tuple[Tensor, float, int]:
    """x (any float dtype) as u8 per tensor, asymmetric: q = round(x / s) + z, s = (max - min) /
    `LEVELS` over the tensor's range widened to include 0, z = round(-min / s); returns (q, s, z).
    Through int16 because PyTorch's float -> uint8 conversion is not vectorised."""
    lo, hi = torch.aminmax(x)
    lo, hi = min(lo.item(), 0.0), max(hi.item(), 0.0)
    scale = (hi - lo) / LEVELS or 1.0
    zero = round(-lo / scale)
    q = torch.add(_OFFSETS[zero], x, alpha=1.0 / scale)  # fp32, >= 0: truncation to int16 rounds
    return q.to(torch.int16).to(torch.uint8), scale, zero


class Int8Weight:
    """W (out, in), or the block `rows` of it, for y = x W^T + b in int8: each output channel i
    quantized symmetrically, W_i ~ s_i q_i with s_i = max|W_i| / Q, Q = 127 (63 where
    `int8_saturates`); the activations quantized per tensor at every call, int32 sums rescaled and
    the bias added by oneDNN, the output in x's dtype or `out_dtype`. Usable, like `PackedWeight`,
    only while weight and bias are unchanged."""

    out_dtype: torch.dtype | None = None
    """The output's dtype where it is not x's."""

    def __init__(self, source: Tensor, rows: slice | None = None, bias: Tensor | None = None):
        self.source, self.version, self.ptr = source, source._version, source.data_ptr()
        self.bias, self.bias_version = bias, None if bias is None else bias._version
        self.dtype = source.dtype
        w = (source.detach() if rows is None else source.detach()[rows]).float()
        top = 63 if int8_saturates() else 127  # 7-bit weights where pairs add in int16
        self.scales = w.abs().amax(dim=1).clamp_min(1e-12) / top
        self.weight = ops.int8_pack(torch.round(w / self.scales[:, None]).clamp_(-top, top).to(torch.int8))
        self.zeros = torch.zeros(w.size(0), dtype=torch.long)

    def usable(self, x: Tensor) -> bool:
        """Whether this copy applies to `x` now (an empty `x` goes to F.linear)."""
        return (PackedWeight.usable(self, x) and (self.bias is None or self.bias._version == self.bias_version)
                and x.numel() > 0)

    def __call__(self, x: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
        """x W^T + b (`activation` "relu": max(0, x W^T + b), applied by oneDNN as it writes)."""
        q, scale, zero = quantize_activations(x)
        return ops.int8_linear(q, scale, zero, self.weight, self.scales, self.zeros, bias, self.out_dtype or x.dtype,
                               activation)


class Int8Linear(PackedLinear):
    """A `PackedLinear` whose products run in int8 (`Int8Weight`); `F.linear` in the weights'
    dtype where that is not usable (training, autocast, changed weights)."""

    make = Int8Weight


def quantize_int8(model: nn.Module, decoder: bool = True) -> int:
    """Replace the linear layers of every decoding step of `model` by `Int8Linear`s (the FFN's ReLU
    inside the first product): the decoder's and the pre-softmax projection (tied or not), or with
    `decoder=False` the projection alone (`transduce.precision` chooses). On the CPU, after loading,
    with the weights in fp32 or bf16, the dtype the int8 products then take and give. The source
    side (the encoder, and encoder-decoder attention's keys and values), computed once per
    sentence, stays in the float type, where `ready.make_ready` packs it (docs/RESULTS.md, "int8
    quality"). The pre-softmax projection writes fp32 logits whatever the model's dtype (bf16
    logits moved beam search's choices as much as a quantized layer does). `state_dict` is
    unchanged. Returns how many layers were replaced; `dequantize_int8` puts them back."""
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"int8 decoding runs on the CPU from fp32 or bf16 weights (this model: {p.dtype} on {p.device})")
    if not can_int8():
        raise ValueError(f"int8 decoding needs PyTorch's oneDNN int8 kernels on x86-64 (this: {platform.machine()}, "
                         f"torch {torch.__version__})")
    unpack_weights(model)  # int8 replaces what would be packed
    n = 0
    for m in [m for m in model.modules() if isinstance(m, Transformer)]:
        n += replace_linears(m.decoder, Int8Linear, output=False) if decoder else 0
        if m.output_proj is None or isinstance(m.output_proj, nn.Linear):  # None: tied to the embedding matrix
            m.output_proj, n = Int8Linear(m.output_proj, weight=m.decoder.embed.weight), n + 1
        for w in m.output_proj.packed.values():
            w.out_dtype = torch.float32  # fp32 logits (see above)
        for layer in m.decoder.layers:  # encoder-decoder attention's keys and values: once per source
            attn, key = layer.cross_attn, block_key(layer.cross_attn.kv_rows)
            if isinstance(attn.in_proj, Int8Linear):
                if can_pack(p.dtype, p.device):
                    attn.in_proj.packed[key] = PackedWeight(attn.in_proj.weight, attn.kv_rows, attn.in_proj.bias)
                else:  # F.linear
                    del attn.in_proj.packed[key]
    fuse_relu(model)
    return n


def is_int8(model: nn.Module) -> bool:
    """Whether `quantize_int8` has replaced layers of `model`."""
    return any(isinstance(m, Int8Linear) for m in model.modules())


def dequantize_int8(model: nn.Module) -> None:
    """Put back the layers `quantize_int8` replaced."""
    restore_linears(model, Int8Linear)
