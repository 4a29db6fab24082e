"""int8 decoding on the CPU (`--precision int8`), applied to a built `transduce.model.Transformer`
from the outside, like the speed-ups of `transduce.kernels`, whose packed layers it reuses. Not in
the paper, and not exact (docs/speed.md, "int8 decoding"; docs/RESULTS.md, "int8 quality").

`quantize_int8(model)` (`--precision int8`): every linear layer of a decoding step (the
decoder's; the source side with `source=True`), and by default the pre-softmax projection
(its logits in fp32), replaced by an `Int8Linear`: the weight quantized to int8 per output
channel, the activations quantized on the fly at every call, the products in int8 through
PyTorch's oneDNN int8 linear (`torch.ops.onednn.qlinear_pointwise`, what Inductor's x86
quantization runs), the FFN's ReLU inside the first. Everything else (embeddings, LayerNorm,
equation 1, the cache) stays in the weights' dtype (fp32, or bf16 where that is faster), the
search's log-softmax and scores in fp32. Not exact: measured in docs/RESULTS.md ("int8 quality"). It
composes with `kernels.apply`: the layers left in the float type (the encoder; the projection with
`output=False`) are packed.
"""

from __future__ import annotations

import functools
import platform

import torch
from torch import Tensor, nn

from .kernels import (PackedLinear, PackedWeight, block_key, can_pack, fuse_relu, linear_layers, replace_linears,
                      restore_linears, unpack_weights)
from .model import MultiHeadAttention, Transformer


def can_int8() -> bool:
    """Whether `quantize_int8` applies: PyTorch's oneDNN int8 linear (`torch.ops.onednn.qlinear_*`,
    the kernels Inductor's x86 quantization lowers to) on an x86-64 CPU."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")
            and platform.machine().lower() in ("x86_64", "amd64"))


@functools.cache
def int8_saturates() -> bool:
    """Whether oneDNN's int8 products here add u8 x s8 pairs in int16 with saturation (x86 without
    VNNI or AMX, e.g. AVX2 only, or with ONEDNN_MAX_CPU_ISA holding it to such an ISA): then the
    weights are quantized to 7 bits (q in [-63, 63] per output channel) and the activations keep
    8 bits, so that no pair overflows (254 * 63 * 2 = 32,004 <= 32,767). Taking the bit from the
    weights, each row with a scale of its own, rather than from the activations, one scale per
    tensor (what PyTorch's fbgemm engine does there: `reduce_range`), halves int8's error: the
    main job's model held to AVX2, Multi30k val, mean KL to fp32 per target token 0.00077 against
    0.00164, the same speed (docs/speed.md). A feature test, not a guess from the CPU's name: one
    product whose pairs overflow int16 with 8-bit activations and weights (255 * 127 * 2 > 32767)."""
    qw = torch.ops.onednn.qlinear_prepack(torch.full((1, 64), 127, dtype=torch.int8), None)
    y = torch.ops.onednn.qlinear_pointwise(torch.full((1, 64), 255, dtype=torch.uint8), 1.0, 0, qw, torch.ones(1),
                                           torch.zeros(1, dtype=torch.long), None, 1.0, 0, torch.float32, "none", [], "")
    return y.item() != 255 * 127 * 64


_OFFSETS = tuple(torch.tensor([z + 0.5]) for z in range(256))
"""The zero point + 0.5 of `quantize_activations`, made once; of shape (1,), not 0-d, so that the
sum with bf16 activations is computed and stored in fp32 (no separate conversion pass)."""


def quantize_activations(x: Tensor, levels: int = 254) -> tuple[Tensor, float, int]:
    """x (any float dtype) as u8 per tensor, asymmetric: q = round(x / s) + z, s = (max - min) /
    `levels` over the tensor's range widened to include 0, z = round(-min / s); returns (q, s, z).
    `levels` 254 (not 255: x / s + z + 0.5 then never reaches 256, so no clamp is needed); 126 for
    7-bit activations (an experiment's; `Int8Weight` takes the bit from the weights). Through int16 because PyTorch's float -> uint8 conversion is not vectorised
    (several times slower than float -> int16 -> uint8 on the CPU)."""
    lo, hi = torch.aminmax(x)
    lo, hi = min(lo.item(), 0.0), max(hi.item(), 0.0)
    scale = (hi - lo) / levels or 1.0
    zero = round(-lo / scale)
    q = torch.add(_OFFSETS[zero], x, alpha=1.0 / scale)  # fp32, >= 0: truncation to int16 rounds
    return q.to(torch.int16).to(torch.uint8), scale, zero


class Int8Weight:
    """W (out, in), or the block `rows` of it, for y = x W^T + b in int8: each output channel
    (row) i quantized symmetrically, W_i ~ s_i q_i with s_i = max|W_i| / Q and q_i in [-Q, Q],
    Q = 127 (63 where `int8_saturates`: 7-bit weights), packed by oneDNN
    (`torch.ops.onednn.qlinear_prepack`); at every call the activations are quantized per tensor
    to 8 bits (`quantize_activations`),
    multiplied in int8 with int32 sums, rescaled and the bias added by oneDNN
    (`torch.ops.onednn.qlinear_pointwise`), the output in x's dtype (fp32, or bf16 for a model
    in bf16), or in `out_dtype` where one is set (the pre-softmax projection: fp32 logits,
    `quantize_int8`). Usable, like `PackedWeight`, only while weight and bias are unchanged, for
    input in the model's dtype on the CPU without autograd or autocast."""

    out_dtype: torch.dtype | None = None
    """The output's dtype where it is not x's."""

    def __init__(self, source: Tensor, rows: slice | None = None, bias: Tensor | None = None):
        self.source, self.version, self.ptr = source, source._version, source.data_ptr()
        self.bias = bias
        self.bias_version = None if bias is None else bias._version
        self.dtype = source.dtype
        w = (source.detach() if rows is None else source.detach()[rows]).float()
        top = 63 if int8_saturates() else 127  # 7-bit weights where pairs add in int16
        self.scales = w.abs().amax(dim=1).clamp_min(1e-12) / top
        q = torch.round(w / self.scales[:, None]).clamp_(-top, top).to(torch.int8)
        self.weight = torch.ops.onednn.qlinear_prepack(q, None)
        self.zeros = torch.zeros(w.size(0), dtype=torch.long)
        self.levels = 254

    def usable(self, x: Tensor) -> bool:
        return (not torch.is_grad_enabled() and x.dtype == self.dtype and x.device.type == "cpu"
                and self.source._version == self.version and self.source.data_ptr() == self.ptr
                and (self.bias is None or self.bias._version == self.bias_version)
                and not torch.is_autocast_enabled("cpu") and x.numel() > 0)

    def __call__(self, x: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
        """x W^T + b (`activation` "relu": max(0, x W^T + b), applied by oneDNN as it writes)."""
        q, scale, zero = quantize_activations(x, self.levels)
        return torch.ops.onednn.qlinear_pointwise(q, scale, zero, self.weight, self.scales, self.zeros, bias,
                                                  1.0, 0, self.out_dtype or x.dtype, activation, [], "")


def block_shape(source: Tensor, rows: slice | None) -> tuple[int, int]:
    """(out, in) of the weight block `rows` of `source` (all of it for None)."""
    return (source.size(0) if rows is None else len(range(*rows.indices(source.size(0)))), source.size(1))


class Int8Linear(PackedLinear):
    """A `PackedLinear` whose products run in int8 (`Int8Weight`); `F.linear` in the weights'
    dtype where that is not usable (training, autocast, changed weights). With `only` (a set of
    (out, in) shapes), only the weight blocks of those shapes are in int8; the others are packed
    in the weights' own dtype (`PackedWeight`, exact): where a product is too small for int8 to
    pay for quantizing its input, it stays in the float type (`transduce.precision.probe_int8`)."""

    def __init__(self, layer: nn.Linear | None, weight: Tensor | None = None, blocks: tuple[slice, ...] = (),
                 only: frozenset | None = None):
        self.__dict__["only"] = only  # read by `make` during PackedLinear's __init__
        super().__init__(layer, weight=weight, blocks=blocks)

    def make(self, source: Tensor, rows: slice | None, bias: Tensor | None):
        if self.only is None or block_shape(source, rows) in self.only:
            return Int8Weight(source, rows, bias)
        return PackedWeight(source, rows, bias)


def int8_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """The distinct (out, in) shapes of the weight blocks `quantize_int8` would put in int8: the
    linear layers, the blocks of the stacked [W^Q; W^K; W^V] that cross-attention uses, and the
    tied pre-softmax projection."""
    shapes: dict[tuple[int, int], None] = {}
    for parent, name, layer in linear_layers(model):
        w = layer.weight
        blocks = (parent.q_rows, parent.kv_rows) if isinstance(parent, MultiHeadAttention) and name == "in_proj" else ()
        for rows in (None, *blocks):
            shapes[block_shape(w, rows)] = None
    for m in model.modules():
        if isinstance(m, Transformer) and m.output_proj is None:
            shapes[tuple(m.decoder.embed.weight.shape)] = None
    return list(shapes)


def quantize_int8(model: nn.Module, output: bool = True, only: frozenset | set | None = None,
                  source: bool = False, decoder: bool = True) -> int:
    """Replace the linear layers of `model` by `Int8Linear`s (and the FFN by a `PackedFeedForward`:
    the ReLU in the int8 product) and, with `output`, the tied pre-softmax projection too (an
    untied one is a linear layer: always). On the CPU, after loading, with the weights in fp32 or
    bf16: the int8 products then take and give that dtype, and everything else (embeddings,
    LayerNorm, equation 1, the cache) stays in it. The parameters and `state_dict` are unchanged
    (the int8 copies come beside them).

    Which layers: by default those of every decoding step, the decoder's and the pre-softmax
    projection; the source side, computed once per sentence (the encoder, and the keys and values
    of encoder-decoder attention, `MultiHeadAttention.project_kv`), stays in the float type, where
    `kernels.apply` packs it. It costs little (one pass over the source against one per output
    token) and takes a third of int8's error away: main job's model, Multi30k val, mean KL to fp32
    per target token 0.00055 against 0.00087 with the source side in int8 too (`source=True`);
    docs/RESULTS.md, "int8 quality". `only`: the (out, in) weight shapes to put in int8
    (`int8_shapes` lists them; `transduce.precision.probe_int8` measures which pay); the blocks of
    other shapes are packed in the weights' dtype instead. `decoder=False`: the pre-softmax
    projection alone in int8, the decoder's layers left in the float type (with AMX, where bf16
    products beat int8 ones with their quantization at every size but the vocabulary's:
    `transduce.precision.int8_mode`). The pre-softmax projection, where it is
    in int8, writes its logits in fp32 whatever the model's dtype: oneDNN rescales the int32 sums
    in fp32 anyway, the search's log-softmax reads fp32, and bf16 logits (8 bits of mantissa:
    steps of 1/16 at a logit of 10) moved beam search's choices as much as a quantized layer does
    (Multi30k val, the main job's model, every layer in int8: 889 of 1,014 outputs the same as
    fp32's against 877 with bf16 logits; the speed the same). Returns how many layers were
    replaced; `dequantize_int8` puts the layers back."""
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"int8 decoding runs on the CPU from fp32 or bf16 weights (this model: {p.dtype} on {p.device})")
    if not can_int8():
        raise ValueError(f"int8 decoding needs PyTorch's oneDNN int8 kernels on x86-64 (this: {platform.machine()}, "
                         f"torch {torch.__version__})")
    unpack_weights(model)  # int8 replaces what would be packed
    options = dict(only=None if only is None else frozenset(only))
    models = [m for m in model.modules() if isinstance(m, Transformer)]
    if source or not models:
        n = replace_linears(model, Int8Linear, output=output, **options)
    else:  # the decoder, then the pre-softmax projection (tied: the embedding matrix; untied: its own layer)
        n = sum(replace_linears(m.decoder, Int8Linear, output=False, **options) for m in models) if decoder else 0
        for m in models:
            if isinstance(m.output_proj, nn.Linear):
                m.output_proj, n = Int8Linear(m.output_proj, **options), n + 1
            elif output and m.output_proj is None:
                m.output_proj, n = Int8Linear(None, weight=m.decoder.embed.weight, **options), n + 1
            for layer in m.decoder.layers:  # encoder-decoder attention's keys and values: once per source
                attn, key = layer.cross_attn, block_key(layer.cross_attn.kv_rows)
                if isinstance(attn.in_proj, Int8Linear) and isinstance(attn.in_proj.packed.get(key), Int8Weight):
                    if can_pack(p.dtype, p.device):
                        attn.in_proj.packed[key] = PackedWeight(attn.in_proj.weight, attn.kv_rows, attn.in_proj.bias)
                    else:  # F.linear
                        del attn.in_proj.packed[key]
    fuse_relu(model)
    for m in model.modules():  # fp32 logits (see above)
        if isinstance(m, Transformer) and isinstance(m.output_proj, Int8Linear):
            for w in m.output_proj.packed.values():
                if isinstance(w, Int8Weight):
                    w.out_dtype = torch.float32
    return n


def is_int8(model: nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())


def dequantize_int8(model: nn.Module) -> None:
    """Put back the layers `quantize_int8` replaced."""
    restore_linears(model, Int8Linear)
