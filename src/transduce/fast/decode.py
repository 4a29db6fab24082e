"""Speed-ups for decoding, applied to a built `transduce.model.Transformer` from the outside by
`transduce.decoding.ready.make_ready`: the same products and the same equation 1 as the paper's, with less
overhead (docs/speed.md): the weights pre-packed for oneDNN (`pack_weights`), `decode_attention`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import attention
from ..model import MultiHeadAttention, PositionwiseFeedForward, Transformer
from . import cpu, ops, step


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """`attention.decode_attention`, the scores as K q^T where oneDNN runs AMX (`cpu.amx_products`)."""
    return attention.decode_attention(q, k, v, mask, _keys_first())


_keys_first = functools.cache(cpu.amx_products)


def can_pack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether `pack_weights` applies: CPU, oneDNN's packing operators in this torch (else one
    warning: `ops.warn_missing`), fp32 or (where oneDNN computes it) bf16."""
    if torch.device(device).type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not ops.has("packed"):
        ops.warn_missing("packed")
        return False
    return dtype == torch.float32 or ops.bf16_packing()


class PackedWeight:
    """A weight matrix W (out, in), or the block `rows` of it, copied into oneDNN's blocked layout
    for y = x W^T + b. It stands for `source[rows]` only while that parameter is unchanged (same
    storage and version counter), without autograd, autocast, or a change of dtype or device."""

    def __init__(self, source: Tensor, rows: slice | None = None, bias: Tensor | None = None):
        self.source, self.version, self.ptr = source, source._version, source.data_ptr()
        w = source.detach() if rows is None else source.detach()[rows]
        self.dtype = w.dtype
        self.weight = ops.pack(w)

    def usable(self, x: Tensor) -> bool:
        """Whether this copy computes what F.linear would for `x` now."""
        return (not torch.is_grad_enabled() and x.dtype == self.dtype and x.device.type == "cpu"
                and self.source._version == self.version and self.source.data_ptr() == self.ptr
                and not torch.is_autocast_enabled("cpu"))

    def __call__(self, x: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
        """x W^T + b, and `activation` (`ops.linear`): bit for bit the same as a separate ReLU."""
        return ops.linear(x, self.weight, bias, activation)


def block_key(rows: slice | None):
    """A hashable key for the block `rows` of a weight (None: all of it)."""
    return None if rows is None else (rows.start, rows.stop, rows.step)


class PackedLinear(nn.Module):
    """Stands in for a linear layer: x W^T + b (or, like `StackedLinear`, the block `rows` of it)
    through a `PackedWeight` where one is usable, else `F.linear`. Holds the layer's own parameters
    under the same names; for the tied pre-softmax projection (`layer` None) it refers to the
    embedding matrix without registering it again. The replaced layer's forward hooks do not run."""

    make = PackedWeight
    """What stands for each weight block: `PackedWeight` (fp32/bf16, exact) or `int8.Int8Weight`."""

    def __init__(self, layer: nn.Linear | None, weight: Tensor | None = None, blocks: tuple[slice, ...] = ()):
        super().__init__()
        self.original = (layer,)  # a tuple: not registered as a submodule
        if layer is not None:
            self.weight, self.bias = layer.weight, layer.bias
        else:
            self.__dict__["weight"], self.bias = weight, None
        with torch.no_grad():
            self.packed = {block_key(r): self.make(self.weight, r, self.bias) for r in (None, *blocks)}

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        w, b = self.weight, self.bias
        if rows is not None:
            w, b = w[rows], None if b is None else b[rows]
        packed = self.packed_for(rows)
        return packed(x, b) if packed is not None and packed.usable(x) else F.linear(x, w, b)

    def packed_for(self, rows: slice | None = None):
        """What stands for the block `rows` (`make`'s product), or None where `forward` runs F.linear."""
        return self.packed.get(block_key(rows))

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x W^T + b), the ReLU inside the packed product where it is usable."""
        packed = self.packed[None]
        return packed(x, self.bias, "relu") if packed.usable(x) else F.relu(F.linear(x, self.weight, self.bias))


class PackedFeedForward(nn.Module):
    """Stands in for a `PositionwiseFeedForward`: equation 2, max(0, x W_1 + b_1) W_2 + b_2, with
    the max(0, .) computed by the first packed product as it writes its output (bit for bit the
    same, without a separate pass). Holds the same `w_1` and `w_2`: `state_dict` is unchanged."""

    def __init__(self, ffn: nn.Module):
        super().__init__()
        self.original = (ffn,)  # a tuple: not registered as a submodule
        self.w_1, self.w_2 = ffn.w_1, ffn.w_2

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.w_1.relu(x))


def _children(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()]


def is_packed(model: nn.Module) -> bool:
    """Whether `pack_weights` has packed `model` (int8 layers do not count)."""
    return any(type(m) is PackedLinear for m in model.modules())


def replace_linears(model: nn.Module, cls: type[PackedLinear], output: bool = True, **options) -> int:
    """Replace every `nn.Linear` of `model` (not replaced already) by a `cls` (made with `options`),
    with `output` the tied pre-softmax projection too. Returns how many were replaced."""
    n = 0
    for parent, name, layer in _children(model):
        if isinstance(layer, nn.Linear):
            blocks = (parent.q_rows, parent.kv_rows) if isinstance(parent, MultiHeadAttention) and name == "in_proj" else ()
            setattr(parent, name, cls(layer, blocks=blocks, **options))
            n += 1
    for m in model.modules():
        if output and isinstance(m, Transformer) and m.output_proj is None:
            m.output_proj = cls(None, weight=m.decoder.embed.weight, **options)
            n += 1
    return n


def restore_linears(model: nn.Module, cls: type[PackedLinear]) -> None:
    """Put back the layers (and feed-forward networks) that `cls`es stand in for."""
    for parent, name, child in _children(model):
        if type(child) is PackedFeedForward and type(child.w_1) is cls:
            setattr(parent, name, child.original[0])
    for parent, name, layer in _children(model):
        if type(layer) is cls:
            setattr(parent, name, layer.original[0])
    step.refresh(model)  # a FastStep installed on the model is rebuilt on the layers it has now


def fuse_relu(model: nn.Module) -> None:
    """Every ReLU `PositionwiseFeedForward` whose W_1 is packed (or int8) becomes a `PackedFeedForward`."""
    for parent, name, child in _children(model):
        if (isinstance(child, PositionwiseFeedForward) and isinstance(child.w_1, PackedLinear)
                and child.activation == "relu"):  # swish (not the paper) stays after W_1's packed product
            setattr(parent, name, PackedFeedForward(child))
    step.refresh(model)


def pack_weights(model: nn.Module) -> bool:
    """Replace every linear layer of `model` not replaced already (e.g. by `int8.quantize_int8`), and
    its tied pre-softmax projection, by a `PackedLinear`, after loading and casting the weights.
    Returns False, changing nothing, where it does not apply (`can_pack`) or nothing is left to
    pack. Costs one more copy of the weights (`state_dict` unchanged); `unpack_weights` frees it."""
    p = next(model.parameters())
    if not can_pack(p.dtype, p.device):
        return False
    packed = replace_linears(model, PackedLinear) > 0
    fuse_relu(model)
    return packed


def unpack_weights(model: nn.Module) -> None:
    """Put back the layers `pack_weights` replaced: every product goes through `F.linear` again."""
    restore_linears(model, PackedLinear)
