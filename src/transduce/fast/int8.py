"""int8 decoding on the CPU (`--precision int8`, `quantize_int8`), through the packed layers of
`transduce.fast.decode`. Not in the paper, and not exact (docs/speed.md, "int8 decoding")."""

from __future__ import annotations

import contextlib
import functools
import platform

import torch
from torch import Tensor, nn

from .. import torch_ops
from ..cpu import int8_saturates, x86_64
from ..model import DecoderLayer, Embeddings, EncoderLayer, Transformer
from .decode import (
    PackedLinear,
    PackedWeight,
    fuse_relu,
    replace_linears,
    restore_linears,
    unpack_weights,
)


def can_int8() -> bool:
    """Whether `quantize_int8` applies: oneDNN's int8 linear in this torch, on an x86-64 CPU."""
    return torch_ops.has("int8") and x86_64()


def int8_needs() -> str:
    """What `can_int8` needs and what this machine is, for the errors that refuse int8."""
    return f"needs PyTorch's oneDNN int8 kernels on x86-64 (this: {platform.machine()}, torch {torch.__version__})"


@functools.cache
def _offset(zero: int) -> Tensor:
    """The zero point + 0.5 of `quantize_activations`, made once for each zero point, on first use; of
    shape (1,), not 0-d, so that the sum with bf16 activations is computed and stored in fp32 (no
    separate conversion pass)."""
    return torch.tensor([zero + 0.5])


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
    q = torch.add(_offset(zero), x, alpha=1.0 / scale)  # fp32, >= 0: truncation to int16 rounds
    return q.to(torch.int16).to(torch.uint8), scale, zero


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """W (out, in) as int8 rows and their fp32 scales, W_i ~ s_i q_i, s_i = max|W_i| / Q, Q = 127
    (63 where `int8_saturates`: 7-bit weights where pairs add in int16). Row by row in fp32 blocks,
    so that a large matrix (an embedding) is never copied whole in fp32."""
    top, n = 63 if int8_saturates() else 127, 4096
    q = torch.empty(w.shape, dtype=torch.int8)
    scales = torch.empty(w.size(0), dtype=torch.float32)
    buf = torch.empty(min(n, w.size(0)), w.size(1), dtype=torch.float32)  # one block's q_i, reused
    for i in range(0, w.size(0), n):
        block = w[i : i + n].float()
        s = torch.maximum(block.amax(dim=1), block.amin(dim=1).neg_()).clamp_min_(1e-12).div_(top)  # max|W_i| / Q
        q[i : i + n] = torch.div(block, s[:, None], out=buf[: block.size(0)]).round_().clamp_(-top, top)
        scales[i : i + n] = s
    return q, scales


def int8_kernel(dtype: torch.dtype) -> str:
    """Whose int8 product `Int8Weight` runs: FBGEMM's where the CPU adds u8 x s8 pairs in int16
    (`int8_saturates`: x86 without VNNI) and the activations are fp32, else oneDNN's. There
    FBGEMM's is as accurate (the same 7-bit weights, 8-bit activations) and much faster for the
    few rows of one sentence's beams (docs/speed.md, "int8 decoding")."""
    if dtype == torch.float32 and torch_ops.has("fbgemm") and int8_saturates():
        return "fbgemm"
    return "onednn"


_PACKER: list = []  # while `packing_behind` runs: [its thread, the weights it packs]
_AS: list = []  # while `quantize_part` runs with a dtype: [the dtype its int8 layers take and give]


@contextlib.contextmanager
def packing_behind():
    """The packing of each int8 weight for its kernel (FBGEMM's, single-threaded, or oneDNN's: the
    largest part of loading an OPUS-MT model) in a thread of its own while the model's next part is
    read and quantized; every weight packed, or its error raised, as the block ends (docs/speed.md,
    "Memory at OPUS-MT's size")."""
    from concurrent.futures import ThreadPoolExecutor

    if _PACKER:  # one already runs
        yield
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="transduce-pack")
    _PACKER[:] = [pool, []]
    try:
        yield
    finally:
        weights = _PACKER[1]
        _PACKER.clear()
        pool.shutdown(wait=True)
    for w in weights:
        w.weight  # noqa: B018 (the packed weight, or its error)


class Int8Weight:
    """W (out, in), or the block `rows` of it, for y = x W^T + b in int8: each output channel i
    quantized symmetrically, W_i ~ s_i q_i with s_i = max|W_i| / Q, Q = 127 (63 where
    `int8_saturates`); the activations quantized per tensor at every call, int32 sums rescaled and
    the bias added by the kernel (`int8_kernel`), the output in x's dtype or `out_dtype`. Usable, like `PackedWeight`,
    only while weight and bias are unchanged."""

    out_dtype: torch.dtype | None = None
    """The output's dtype where it is not x's."""

    def __init__(self, source: Tensor, rows: slice | None = None, bias: Tensor | None = None):
        self.source, self.version, self.ptr = source, source._version, source.data_ptr()
        self.bias, self.bias_version = bias, None if bias is None else bias._version
        self.dtype = _AS[0] if _AS else source.dtype
        q, self.scales = quantize_rows(source.detach() if rows is None else source.detach()[rows])
        self._pack(q, None if bias is None else bias.detach() if rows is None else bias.detach()[rows])

    def _pack(self, q: Tensor, bias: Tensor | None) -> None:
        """The int8 rows packed for the kernel `int8_kernel` picks (FBGEMM's holds `bias`; packed in
        `packing_behind`'s thread where one is packing)."""
        self.out_features, self.kernel = q.size(0), int8_kernel(self.dtype)
        fbgemm = self.kernel == "fbgemm"
        self.zeros = None if fbgemm else torch.zeros(q.size(0), dtype=torch.long)
        if _PACKER:
            if fbgemm:
                self._packing = _PACKER[0].submit(
                    torch_ops.fbgemm_prepack, torch_ops.fbgemm_weight(q, self.scales), bias
                )
            else:
                self._packing = _PACKER[0].submit(torch_ops.int8_pack, q)
            _PACKER[1].append(self)
        else:
            self.weight = torch_ops.fbgemm_pack(q, self.scales, bias) if fbgemm else torch_ops.int8_pack(q)

    def __getattr__(self, name: str):
        if name == "weight" and "_packing" in self.__dict__:  # packed in `packing_behind`'s thread
            self.weight = self.__dict__.pop("_packing").result()
            return self.weight
        raise AttributeError(name)

    def forget_source(self) -> None:
        """Stand for the weights as they are now, without holding them (a model for decoding only)."""
        self.source = self.bias = None

    def usable(self, x: Tensor) -> bool:
        """Whether this copy applies to `x` now (an empty `x` goes to F.linear)."""
        return (
            PackedWeight.usable(self, x)
            and (self.bias is None or self.bias._version == self.bias_version)
            and x.numel() > 0
        )

    def __call__(self, x: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
        """x W^T + b (`activation` "relu": max(0, x W^T + b), applied by the kernel as it writes).
        FBGEMM adds the bias packed with the weights: `bias` itself while `usable`."""
        if self.kernel == "fbgemm":
            return torch_ops.fbgemm_linear(x, self.weight, activation)
        q, scale, zero = quantize_activations(x)
        return torch_ops.int8_linear(
            q, scale, zero, self.weight, self.scales, self.zeros, bias, self.out_dtype or x.dtype, activation
        )


FBGEMM_ROWS = 32
"""Rows per FBGEMM product of the pre-softmax projection in a beam search (`rows_per_call`): as fast as
128 rows at once, the logits and int32 sums a quarter as large (docs/speed.md, "int8 decoding")."""


class Int8Linear(PackedLinear):
    """A `PackedLinear` whose products run in int8 (`Int8Weight`); `F.linear` in the weights'
    dtype where that is not usable (training, autocast, changed weights)."""

    make = Int8Weight

    @property
    def rows_per_call(self) -> int | None:
        """`FBGEMM_ROWS` where the whole weight runs through FBGEMM (`decoding.search.projection_rows`):
        its activations are quantized per call, so a part's products depend on its rows alone."""
        w = self.packed.get(None)
        return FBGEMM_ROWS if w is not None and w.kernel == "fbgemm" else None

    @classmethod
    def from_rows(cls, q: Tensor, scales: Tensor, dtype: torch.dtype, bias: Tensor | None = None) -> "Int8Linear":
        """The tied pre-softmax projection from int8 rows already quantized (`quantize_rows`), for
        decoding only: no float weight; `bias` added by oneDNN as it writes the output."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.original, layer.__dict__["weight"], layer.bias = (None,), None, bias
        w = Int8Weight.__new__(Int8Weight)
        w.source = w.bias = w.bias_version = None
        w.version = w.ptr = None
        w.dtype, w.scales = dtype, scales
        w._pack(q, bias)
        layer.packed = {None: w}
        return layer


class Int8Embeddings(nn.Module):
    """Stands in for `model.Embeddings` (3.4) in a model made for decoding only: the matrix held as
    the int8 rows and scales of the tied pre-softmax projection (`quantize_rows`), each row looked
    up dequantized, E_i ~ s_i q_i, in the model's float type, times sqrt(d_model) as before."""

    def __init__(self, q: Tensor, scales: Tensor, scale: float, dtype: torch.dtype):
        super().__init__()
        self.q, self.scales, self.scale, self.dtype = q, scales, scale, dtype

    def forward(self, tokens: Tensor) -> Tensor:
        return (self.q[tokens].to(torch.float32) * self.scales[tokens].unsqueeze(-1)).to(self.dtype) * self.scale

    def dequantized(self) -> Tensor:
        """The whole matrix, dequantized (V, d_model)."""
        return (self.q.to(torch.float32) * self.scales[:, None]).to(self.dtype)


def quantize_int8(
    model: nn.Module,
    decoder: bool = True,
    keep: bool = True,
    embeddings: bool = False,
    dtype: torch.dtype | None = None,
) -> int:
    """Replace the linear layers of `model` by `Int8Linear`s (the FFN's ReLU inside the first
    product): every one, the source side's (the encoder, encoder-decoder attention's keys and
    values) too, as CTranslate2's int8 does, and the pre-softmax projection (tied or not); or with
    `decoder=False` the projection alone, the rest left to `ready.make_ready` to pack in the float
    type (`transduce.precision` chooses). On the CPU, after loading, with the weights in fp32 or
    bf16, the dtype the int8 products then take and give (docs/RESULTS.md, "int8 quality": at
    OPUS-MT's size the source side in fp32 was a tenth of the time and 85 MB; docs/speed.md,
    "What int8 costs in accuracy"). The pre-softmax projection writes fp32 logits whatever the model's dtype (bf16
    logits moved beam search's choices as much as a quantized layer does). `state_dict` is
    unchanged. `keep=False` (a model for decoding only): each layer's float weights dropped once
    quantized, and with `embeddings` the tied embedding matrix too, looked up from the projection's
    int8 rows (`Int8Embeddings`), and the logits bias (`ModelConfig.output_bias`) added by oneDNN as
    the projection writes the logits. What `quantize_part` did already, as the model was read, is
    kept. `dtype` (bf16, with `keep=False`): quantized from the weights as they are, the other float
    tensors cast to `dtype` after, as `quantize_part` does. Returns how many layers were replaced;
    `dequantize_int8` puts them back (where `keep`)."""
    p = next(model.parameters())
    _check(p)
    unpack_weights(model)  # int8 replaces what would be packed
    n = 0
    _AS[:] = [] if dtype is None else [dtype]
    try:
        for m in [m for m in model.modules() if isinstance(m, Transformer)]:
            for layer in (
                [*m.decoder.layers, *m.encoder.layers] if decoder else ()
            ):  # its float weights dropped before the next
                n += _quantize_layer(layer, keep)
            n += _quantize_output(m, keep, embeddings)
    finally:
        _AS.clear()
    if dtype is not None:
        model.to(dtype)
    fuse_relu(model)
    return n


def quantize_part(part: nn.Module, decoder: bool = True, dtype: torch.dtype | None = None) -> None:
    """`quantize_int8(keep=False, embeddings=True)` for one part of a model as it is read
    (`checkpoint.model_dir.build_model`'s `as_filled`): the model (its layers not read yet) gets
    its int8 embeddings and projection, a decoder or encoder layer (with `decoder`) its int8 products; each
    part's float weights are let go before the next is read, so a model made for decoding only is
    never held whole in its float type. With `dtype` (bf16), the weights are quantized as read (fp32,
    as stored: no bf16 copy made to be quantized, nor its rounding) and the part's other float
    tensors then cast to `dtype`, which its int8 products take and give. `quantize_int8` then
    finishes the model."""
    if dtype is not None and any(
        t.is_floating_point() and not t.is_meta and t.dtype not in (torch.float32, torch.bfloat16)
        for t in part.parameters()
    ):
        part.to(torch.float32)  # stored in another float type (fp16): quantized from fp32
    _AS[:] = [] if dtype is None else [dtype]
    try:
        if isinstance(part, Transformer):
            _check(part.decoder.embed.weight)
            _quantize_output(part, keep=False, embeddings=True)
        elif decoder and isinstance(part, (DecoderLayer, EncoderLayer)):
            _quantize_layer(part, keep=False)
    finally:
        _AS.clear()
    if dtype is not None:
        part.to(dtype)  # the layers not read yet are on the meta device: only their dtype changes


def _check(p: Tensor) -> None:
    if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            f"int8 decoding runs on the CPU from fp32 or bf16 weights (this model: {p.dtype} on {p.device})"
        )
    if not can_int8():
        raise ValueError(f"int8 decoding {int8_needs()}")


def _quantize_layer(layer: nn.Module, keep: bool) -> int:
    """An encoder or decoder layer's linear layers in int8 (nothing where that is done; encoder-decoder
    attention's [W^Q; W^K; W^V] as `replace_linears` splits it: its query block, every step, and its
    key/value block, once per source); returns how many. Without `keep`, each one's float weights dropped."""
    return replace_linears(layer, Int8Linear, output=False, keep=keep)


def _quantize_output(m: Transformer, keep: bool, embeddings: bool) -> int:
    """The pre-softmax projection in int8, with `embeddings` (and not `keep`) the tied matrix held
    as its int8 rows; returns 1, or 0 where that is done."""
    n, tied = 0, m.output_proj is None
    if tied and embeddings and not keep and isinstance(m.decoder.embed, Embeddings):
        embed = m.decoder.embed
        q, scales = quantize_rows(embed.weight.detach())
        small = Int8Embeddings(q, scales, embed.scale, _AS[0] if _AS else embed.weight.dtype)
        for parent in (m.encoder, m.decoder):
            if parent.embed is embed:
                parent.embed = small
        del embed  # the float matrix let go before its int8 rows are packed: never both at once
        bias = None if m.output_bias is None else m.output_bias.detach().float()
        m.output_proj = Int8Linear.from_rows(q, scales, small.dtype, bias)
        m.output_bias = None  # the logits bias inside the projection's product: no second pass over the logits
        n = 1
    elif tied or isinstance(m.output_proj, nn.Linear):  # tied: the embedding matrix
        m.output_proj, n = Int8Linear(m.output_proj, weight=m.decoder.embed.weight), 1
        if not keep:
            m.output_proj.drop_weight()
    for w in m.output_proj.packed.values():
        w.out_dtype = torch.float32  # fp32 logits (see above)
    return n


def is_int8(model: nn.Module) -> bool:
    """Whether `quantize_int8` has replaced layers of `model`."""
    return any(isinstance(m, Int8Linear) for m in model.modules())


def dequantize_int8(model: nn.Module) -> None:
    """Put back the layers `quantize_int8` replaced."""
    restore_linears(model, Int8Linear)
