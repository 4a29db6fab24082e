"""Speed-ups for decoding, applied to a built `transduce.model.Transformer` from the outside by
`transduce.decoding.ready.make_ready`: the same products as the paper's with less overhead
(docs/speed.md): the weights pre-packed for oneDNN (`pack_weights`). A layer that stands in for
another keeps the original's weights (and `unpack_weights` puts the original back), except in a
model made for decoding only (`keep=False`: `decoding.ready.load_for_decoding`), whose float
weights are dropped once packed or quantized, so that the model is held once, not twice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import torch_ops
from ..model import DecoderLayer, Embeddings, MultiHeadAttention, PositionwiseFeedForward, Transformer

_SWAPS = [0]


def swaps() -> int:
    """How many times layers have been replaced or put back (by `replace_linears`, `restore_linears`,
    `fuse_relu`, `int8.quantize_embeddings`): what `step.FastDecoder` reads its layers again after."""
    return _SWAPS[0]


def _swapped() -> None:
    _SWAPS[0] += 1


def can_pack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether `pack_weights` applies: CPU, oneDNN's packing operators in this torch (else one
    warning: `torch_ops.warn_missing`), fp32 or (where oneDNN computes it) bf16."""
    if torch.device(device).type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch_ops.has("packed"):
        torch_ops.warn_missing("packed")
        return False
    return dtype == torch.float32 or torch_ops.bf16_packing()


class PackedWeight:
    """A weight matrix W (out, in), or the block `rows` of it, copied into oneDNN's blocked layout
    for y = x W^T + b. It stands for `source[rows]` only while that parameter is unchanged (same
    storage and version counter), without autograd, autocast, or a change of dtype or device."""

    def __init__(self, source: Tensor, rows: slice | None = None, bias: Tensor | None = None):
        self.source, self.version, self.ptr = source, source._version, source.data_ptr()
        w = source.detach() if rows is None else source.detach()[rows]
        self.dtype, self.out_features = w.dtype, w.size(0)
        self.weight = torch_ops.pack(w)

    def forget_source(self) -> None:
        """Stand for the weights as they are now, without holding them (a model for decoding only)."""
        self.source = None

    def usable(self, x: Tensor) -> bool:
        """Whether this copy computes what F.linear would for `x` now."""
        return (
            not torch.is_grad_enabled()
            and x.dtype == self.dtype
            and x.device.type == "cpu"
            and (self.source is None or (self.source._version == self.version and self.source.data_ptr() == self.ptr))
            and not torch.is_autocast_enabled("cpu")
        )

    def __call__(self, x: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
        """x W^T + b, and `activation` (`torch_ops.linear`): bit for bit the same as a separate ReLU."""
        return torch_ops.linear(x, self.weight, bias, activation)


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

    def __init__(
        self, layer: nn.Linear | None, weight: Tensor | None = None, blocks: tuple[slice, ...] = (), whole: bool = True
    ):
        super().__init__()
        self.original = (layer,)  # a tuple: not registered as a submodule
        if layer is not None:
            self.weight, self.bias = layer.weight, layer.bias
        else:
            self.__dict__["weight"], self.bias = weight, None
        with torch.no_grad():  # `whole` False: only the blocks are multiplied by (encoder-decoder attention's)
            self.packed = {
                block_key(r): self.make(self.weight, r, self.bias) for r in ((None,) if whole else ()) + blocks
            }

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        b = self.bias if rows is None or self.bias is None else self.bias[rows]
        packed = self.packed_for(rows)
        if packed is not None and packed.usable(x):
            return packed(x, b)
        if packed is not None and self.weight is None and x.numel() == 0:
            return x.new_empty(*x.shape[:-1], packed.out_features)
        return F.linear(x, self._weight(rows), b)

    def _weight(self, rows: slice | None) -> Tensor:
        if self.weight is None:
            raise RuntimeError(
                "this layer was made for decoding only (its float weights dropped once packed): "
                "it runs in inference mode, without autocast, in the dtype it was packed in"
            )
        return self.weight if rows is None else self.weight[rows]

    def drop_weight(self) -> None:
        """Keep only what stands for the weight (`keep=False` in `replace_linears`): no original, no
        float weight (the tied projection's, the embedding matrix, stays the embedding's)."""
        for packed in self.packed.values():
            packed.forget_source()
        self.original = (None,)
        if "weight" in self._parameters:
            self._parameters["weight"] = None
        else:
            self.__dict__["weight"] = None

    def packed_for(self, rows: slice | None = None):
        """What stands for the block `rows` (`make`'s product), or None where `forward` runs F.linear."""
        return self.packed.get(block_key(rows))

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x W^T + b), the ReLU inside the packed product where it is usable."""
        packed = self.packed[None]
        return packed(x, self.bias, "relu") if packed.usable(x) else F.relu(F.linear(x, self._weight(None), self.bias))


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


def replace_linears(
    model: nn.Module, cls: type[PackedLinear], output: bool = True, keep: bool = True, **options
) -> int:
    """Replace every `nn.Linear` of `model` (not replaced already) by a `cls` (made with `options`),
    with `output` the tied pre-softmax projection too; `keep=False`: each layer's float weights
    dropped as soon as it is replaced (`PackedLinear.drop_weight`). Returns how many were replaced."""
    n = 0
    found = [(parent, name) for parent, name, layer in _children(model) if isinstance(layer, nn.Linear)]
    cross = {id(m.cross_attn) for m in model.modules() if isinstance(m, DecoderLayer)}
    for parent, name in found:  # by name, so that a replaced layer is held by nothing once dropped
        # encoder-decoder attention multiplies by W^Q's block and [W^K; W^V]'s, self-attention by all three at once
        split = isinstance(parent, MultiHeadAttention) and name == "in_proj" and id(parent) in cross
        new = cls(
            getattr(parent, name), blocks=(parent.q_rows, parent.kv_rows) if split else (), whole=not split, **options
        )
        setattr(parent, name, new)
        if not keep:
            new.drop_weight()
        n += 1
    for m in model.modules():
        if output and isinstance(m, Transformer) and m.output_proj is None:
            m.output_proj = cls(None, weight=embedding_matrix(m), **options)
            if not keep:
                m.output_proj.drop_weight()
            n += 1
    _swapped()
    return n


def embedding_matrix(model: Transformer) -> Tensor:
    """The target embedding matrix E (3.4's tied projection), in the float type (an int8 embedding dequantized)."""
    embed = model.decoder.embed
    return embed.weight if isinstance(embed, Embeddings) else embed.dequantized()


def restore_linears(model: nn.Module, cls: type[PackedLinear]) -> None:
    """Put back the layers (and feed-forward networks) that `cls`es stand in for."""
    for parent, name, child in _children(model):
        if type(child) is PackedFeedForward and type(child.w_1) is cls:
            setattr(parent, name, child.original[0])
    for parent, name, layer in _children(model):
        if type(layer) is cls:
            if layer.original[0] is None and layer.weight is None:
                raise ValueError("layers made for decoding only (keep=False) cannot be put back")
            setattr(parent, name, layer.original[0])
    _swapped()


def fuse_relu(model: nn.Module) -> None:
    """Every ReLU `PositionwiseFeedForward` whose W_1 is packed (or int8) becomes a `PackedFeedForward`."""
    for parent, name, child in _children(model):
        if (
            isinstance(child, PositionwiseFeedForward)
            and isinstance(child.w_1, PackedLinear)
            and child.activation == "relu"
        ):  # swish (not the paper) stays after W_1's packed product
            setattr(parent, name, PackedFeedForward(child))
    _swapped()


def pack_weights(model: nn.Module, keep: bool = True) -> bool:
    """Replace every linear layer of `model` not replaced already (e.g. by `int8.quantize_int8`), and
    its tied pre-softmax projection, by a `PackedLinear`, after loading and casting the weights.
    Returns False, changing nothing, where it does not apply (`can_pack`) or nothing is left to
    pack. Costs one more copy of the weights (`state_dict` unchanged; `unpack_weights` frees it),
    or with `keep=False` none: the float weights are dropped (the model then decodes only)."""
    p = next(model.parameters())
    if not can_pack(p.dtype, p.device):
        return False
    packed = replace_linears(model, PackedLinear, keep=keep) > 0
    fuse_relu(model)
    return packed


def unpack_weights(model: nn.Module) -> None:
    """Put back the layers `pack_weights` replaced: every product goes through `F.linear` again."""
    restore_linears(model, PackedLinear)
