"""CPU speed-ups, applied to a built `transduce.model.Transformer` from the outside.

None of this is in the paper: the same products, the same equation 1 and the same dropout,
computed faster on the CPU (measured in docs/history/RESULTS-log-2026-11.md). `transduce.model` works without any of
it.

* `pack_weights(model)` replaces every linear layer (`nn.Linear`, the stacked [W^Q; W^K; W^V] of
  `transduce.model.StackedLinear`, the pre-softmax projection with the shared embedding matrix)
  by a `PackedLinear`: the same parameters, plus a copy of each weight matrix in oneDNN's blocked
  layout, so that no product re-lays out its weight at every call. `unpack_weights` puts the
  original layers back.
* `decode_attention`: equation 1 for the few queries of a decoding step as plain products, for
  `MultiHeadAttention.step_attention`.
* `apply(model)`: both (what `transduce.translate` does); it returns the function that undoes
  exactly what it did. `apply(model, pack=False)`: the attention alone.
* int8 decoding (`--precision int8`) lives in `transduce.int8`: its layers are `PackedLinear`s
  whose weight blocks are int8 (`int8.Int8Weight`), packed and replaced by the functions here.
* For training, `fast_dropout(model)` replaces every `nn.Dropout` by a `BitDropout`, which draws
  a quarter of the random numbers on the CPU (what the trainer and `transduce.synthetic` do: the
  random stream of a seeded run is BitDropout's).
* For bf16 training on the CPU, `fast_attention(model)` sets `autocast_attention` as every
  attention layer's `MultiHeadAttention.sequence_attention`: equation 1 with the scores and the
  softmax in fp32 and the second product in bf16, in place of PyTorch's math kernel, which upcasts
  both products to fp32 (what the trainer does).

Parameters keep their names (`state_dict` is unchanged) and stay shared: an optimizer step or
`load_state_dict` on a packed model retires the stale copies, which are then ignored.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import MultiHeadAttention, PositionwiseFeedForward, Transformer


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Equation 1 (3.2.1) for the few queries of one decoding step (3.1: the decoder is
    auto-regressive): `product_attention`, except one query per row with no mask (self-attention
    over the cache) on one thread, as every `--workers` process decodes. There PyTorch's fused
    kernel (`scaled_dot_product_attention`, what the model itself calls) beats the products,
    which pay per matrix of the B * h tiny ones and per short softmax row; with two threads in one
    process the products were as fast or faster. Measured in docs/speed.md ("One query on one
    thread")."""
    if q.size(2) == 1 and mask is None and torch.get_num_threads() == 1:
        return F.scaled_dot_product_attention(q, k, v)
    return product_attention(q, k, v, mask)


def product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Equation 1 written as plain matrix products: softmax(Q K^T / sqrt(d_k)) V, the softmax (and
    the scaling before it) in fp32.

    Same shapes and mask convention as `transduce.model.attention_reference`; no dropout. On the
    CPU several times faster than `scaled_dot_product_attention` for 1-8 queries on older PyTorch
    (docs/history/RESULTS-log-2026-11.md). The scores as Q K^T, so that the softmax runs along contiguous rows; for
    one query in bf16 (self-attention) on a CPU with AMX as K q^T instead, which reads the keys in
    their stored layout (what AMX's bf16 products need to be fast; in fp32, and in bf16 without
    AMX, it is the slower one: `_keys_first`) and is, in memory, the same row q K^T.
    """
    B, h, Tq, d = q.shape
    Tk = k.size(2)
    # 3-d batched products over B*h: a view for the cache's buffers, where a 4-d matmul copies them
    k3, v3, q3 = k.reshape(B * h, Tk, d), v.reshape(B * h, Tk, v.size(-1)), q.reshape(B * h, Tq, d)
    if Tq == 1 and k.dtype == torch.bfloat16 and _keys_first():
        scores = torch.bmm(k3, q3.transpose(1, 2))
    else:
        scores = torch.bmm(q3, k3.transpose(1, 2))
    scores = scores.view(B, h, Tq, Tk).to(torch.float32).mul_(d**-0.5)  # a fresh tensor: in place is safe
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    weights = scores.softmax(dim=-1).to(v.dtype).view(B * h, Tq, Tk)
    return torch.bmm(weights, v3).view(B, h, Tq, -1)


ONEDNN_AMX_ISAS = {"", "ALL", "DEFAULT", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX",
                   "AVX10_1_512_AMX_FP16", "AVX10_2_512_AMX_2"}
"""Values of `ONEDNN_MAX_CPU_ISA` (unset included) that leave oneDNN its AMX kernels."""


def amx_products() -> bool:
    """Whether oneDNN multiplies on AMX tiles here: the CPU has AMX (as PyTorch reports it) and
    `ONEDNN_MAX_CPU_ISA` does not hold oneDNN below it (e.g. AVX2, to imitate a laptop CPU)."""
    if not bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()):
        return False
    held = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return held.strip().upper() in ONEDNN_AMX_ISAS


@functools.cache
def _keys_first() -> bool:
    """Whether one bf16 query's scores are computed as K q^T (AMX: Sapphire Rapids and newer)
    rather than q K^T. Measured, 128 hypotheses x h heads over 40 cached positions, d_k 64: on a
    Xeon with AMX K q^T was the faster (docs/history/RESULTS-log-2026-11.md, session 15); on a
    Zen 4 (avx512_bf16, no AMX) q K^T took 190 us against K q^T's 317 (2 threads; 182 against
    312 on one), so the choice follows whether oneDNN runs AMX here (`amx_products`): not the
    CPU's flag alone, which a CPU held to AVX2 by ONEDNN_MAX_CPU_ISA still reports."""
    return amx_products()


def can_pack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether `pack_weights` applies: CPU, oneDNN, fp32 or (where oneDNN supports it) bf16."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedWeight:
    """A weight matrix W (out, in), or the block `rows` of it, copied into oneDNN's blocked layout
    for y = x W^T + b.

    It stands for `source[rows]` only while that parameter is unchanged (same storage, same
    version counter: an optimizer step or `load_state_dict` retires it), and only without
    autograd, autocast, or a change of dtype or device (`usable`)."""

    def __init__(self, source: Tensor, rows: slice | None = None, bias: Tensor | None = None):
        self.source, self.version, self.ptr = source, source._version, source.data_ptr()
        w = source.detach() if rows is None else source.detach()[rows]
        self.dtype = w.dtype
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w.contiguous())

    def usable(self, x: Tensor) -> bool:
        return (not torch.is_grad_enabled() and x.dtype == self.dtype and x.device.type == "cpu"
                and self.source._version == self.version and self.source.data_ptr() == self.ptr
                and not torch.is_autocast_enabled("cpu"))

    def __call__(self, x: Tensor, bias: Tensor | None, activation: str = "none") -> Tensor:
        """x W^T + b; `activation` "relu": max(0, x W^T + b), applied by oneDNN as it writes the
        product (bit for bit the same as a separate ReLU)."""
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, bias, activation, [], "")


def block_key(rows: slice | None):
    return None if rows is None else (rows.start, rows.stop, rows.step)


class PackedLinear(nn.Module):
    """Stands in for a linear layer: x W^T + b (or, like `StackedLinear`, the block `rows` of it)
    through a `PackedWeight` where one is usable, else `F.linear`: the same computation as the
    layer it replaces. Holds the layer's own parameters under the same names; for the tied
    pre-softmax projection (`layer` None) it refers to the embedding matrix without registering it
    a second time. The replaced layer's forward hooks do not run while it stands in."""

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
        packed = self.packed.get(block_key(rows))
        return packed(x, b) if packed is not None and packed.usable(x) else F.linear(x, w, b)

    def packed_for(self, rows: slice | None = None):
        """What stands for the block `rows` (`make`'s product), or None where `forward` runs F.linear."""
        return self.packed.get(block_key(rows))

    def relu(self, x: Tensor) -> Tensor:
        """max(0, x W^T + b), the ReLU inside the packed product where it is usable."""
        packed = self.packed[None]
        if packed.usable(x):
            return packed(x, self.bias, "relu")
        return F.relu(F.linear(x, self.weight, self.bias))


class PackedFeedForward(nn.Module):
    """Stands in for a `PositionwiseFeedForward`: equation 2, max(0, x W_1 + b_1) W_2 + b_2, with
    the max(0, .) computed by the first packed product as it writes its output, instead of by a
    separate pass over the (rows, d_ff) activations (bit for bit the same; in bf16, where a
    separate ReLU is slow on the CPU, about a third of the first product's time; see
    docs/history/RESULTS-log-2026-11.md). Holds the same `w_1` and `w_2` (`PackedLinear`s): `state_dict` is
    unchanged."""

    def __init__(self, ffn: nn.Module):
        super().__init__()
        self.original = (ffn,)  # a tuple: not registered as a submodule
        self.w_1, self.w_2 = ffn.w_1, ffn.w_2

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.w_1.relu(x))


def linear_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, (nn.Linear, PackedLinear))]


def is_packed(model: nn.Module) -> bool:
    """Whether `pack_weights` has packed `model` (int8 layers do not count)."""
    return any(type(m) is PackedLinear for m in model.modules())


def replace_linears(model: nn.Module, cls: type[PackedLinear], output: bool = True, **options) -> int:
    """Replace every `nn.Linear` of `model` (the layers not replaced already) by a `cls` (made with
    `options`), and with `output` the tied pre-softmax projection too. Returns how many were
    replaced."""
    n = 0
    for parent, name, layer in linear_layers(model):
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
    for parent, name, child in [(p, n, c) for p in model.modules() for n, c in p.named_children()]:
        if type(child) is PackedFeedForward and type(child.w_1) is cls:
            setattr(parent, name, child.original[0])
    for parent, name, layer in linear_layers(model):
        if type(layer) is cls:
            setattr(parent, name, layer.original[0])
    _refresh_step(model)


def _refresh_step(model: nn.Module) -> None:
    """A `fast_step.FastStep` installed on the model is rebuilt on the layers it has now."""
    from . import fast_step

    fast_step.refresh(model)


def fuse_relu(model: nn.Module) -> None:
    """Every `PositionwiseFeedForward` whose W_1 is packed (fp32/bf16) or int8 becomes a
    `PackedFeedForward`."""
    for parent, name, child in [(p, n, c) for p in model.modules() for n, c in p.named_children()]:
        if isinstance(child, PositionwiseFeedForward) and isinstance(child.w_1, PackedLinear):
            setattr(parent, name, PackedFeedForward(child))
    _refresh_step(model)


def pack_weights(model: nn.Module) -> bool:
    """Replace every linear layer of `model` and its tied pre-softmax projection by a
    `PackedLinear` (those not replaced already, e.g. by `int8.quantize_int8`). Call it after loading
    and casting the weights. Returns False, changing nothing, where it does not apply
    (`can_pack`) or nothing is left to pack. Costs one more copy of the weights;
    `unpack_weights` frees it."""
    p = next(model.parameters())
    if not can_pack(p.dtype, p.device):
        return False
    packed = replace_linears(model, PackedLinear) > 0
    fuse_relu(model)
    return packed


def unpack_weights(model: nn.Module) -> None:
    """Put back the layers `pack_weights` replaced: every product goes through `F.linear` again."""
    restore_linears(model, PackedLinear)


def apply(model: Transformer, pack: bool = True) -> Callable[[], None]:
    """For inference: on the CPU, every attention layer's decoding steps through `decode_attention`
    (`MultiHeadAttention.step_attention`) and, with `pack`, the weights packed (`pack_weights`; on a
    model quantized by `int8.quantize_int8`, the layers it left in fp32); on every device, the decoding
    step as one function (`transduce.fast_step.FastStep`, the same operations without the module
    layers). Returns the function that undoes exactly this, leaving what the caller had set as it was."""
    cpu = next(model.parameters()).device.type == "cpu"
    unset = [m for m in model.modules() if isinstance(m, MultiHeadAttention) and m.step_attention is None] if cpu else []
    for m in unset:
        m.step_attention = decode_attention
    packed_here = pack and pack_weights(model)
    from . import fast_step

    stepped = (isinstance(model, Transformer) and not isinstance(model.__dict__.get("decode_step"), fast_step.FastStep)
               and fast_step.install(model))

    def undo() -> None:
        if stepped:
            fast_step.uninstall(model)
        if packed_here:
            unpack_weights(model)
        for m in unset:
            m.step_attention = None

    return undo


# -- Training: dropout (5.4) from fewer random numbers -----------------------------------------


class BitDropout(nn.Module):
    """Dropout (5.4, Srivastava et al. 2014): in training, each element is zeroed with probability
    p and the rest scaled by 1 / (1 - p); the identity in eval mode.

    On the CPU the mask comes from 15 random bits per element, four elements per 64-bit draw of
    the default generator (`random_`), instead of `bernoulli_`'s one draw per element: a quarter
    of the random numbers, for faster training steps (see docs/history/RESULTS-log-2026-11.md). p is thereby rounded
    to a multiple of 2^-15 (0.1 becomes 0.1000061). Elsewhere (CUDA) `torch.nn.functional.dropout`,
    as `nn.Dropout`. It draws another random stream than `nn.Dropout`: a seeded run repeats bit
    for bit only with the same choice.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), not {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # 63 random bits each
        r = bits.view(torch.int16)[:n].view(x.shape) & 0x7FFF  # 15 random bits an element: 0..32767
        # keep = r >= threshold, as 1/0 in int16: r - threshold is negative exactly where the element
        # is dropped, and its arithmetic shift by 15 is then -1, else 0. The same mask as a comparison,
        # whose bool result converts to bf16 ~8x slower than int16 does (unvectorised): with it a
        # small model's bf16 dropout took 2.44 against 1.80 ms, forward and backward (2026-11-26).
        keep = r.sub_(round(self.p * 32768)).bitwise_right_shift_(15).add_(1)
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def autocast_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                       dropout_p: float = 0.0) -> Tensor:
    """Equation 1 (3.2.1), softmax(Q K^T / sqrt(d_k)) V, for training under bf16 autocast on the
    CPU: Q K^T in fp32 (from q and k as they are, bf16 out of their projections: the scores the
    math kernel computes, up to the order of the sums), the scaling, mask and softmax in fp32, then
    the weights rounded to V's dtype for the second product, in bf16 like every other product under
    autocast. Same arguments and mask convention as `scaled_dot_product_attention` (bool, True =
    may attend); dropout on the weights as it applies it. In fp32 it is equation 1 in fp32.

    Why: PyTorch's flash kernel's backward in bf16 is several times slower than its math kernel
    on the CPU (`transduce.train.step.attention_kernel_for`), and the math kernel upcasts q, k and
    v and computes both products and their gradients in fp32; this keeps the fp32 scores and runs
    the second product in bf16. Training steps, Zen 4, 2 threads, bf16 (`benchmarks/bench.py`, this
    against the math kernel, alternating, medians of 3): small 3,986 against 3,858 target tokens/s,
    base 559 against 533 (docs/RESULTS.md)."""
    # fp32 copies laid out (B, h, T, d) contiguously: q and k come as views of (B, T, h, d), and a
    # copy that kept their strides would be copied again inside the batched product
    q32, k32 = (x.to(torch.float32, memory_format=torch.contiguous_format) for x in (q, k))
    with torch.autocast(q.device.type, enabled=False):
        scores = torch.matmul(q32, k32.transpose(-2, -1)).mul_(q.size(-1) ** -0.5)
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, float("-inf"))  # a fresh tensor: in place is safe
    weights = scores.softmax(dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return torch.matmul(weights.to(v.dtype), v)


def fast_attention(model: nn.Module) -> int:
    """Every `MultiHeadAttention` of `model` computes equation 1 outside decoding steps through
    `autocast_attention` (`MultiHeadAttention.sequence_attention`; decoding steps keep theirs). For
    bf16 training on the CPU (what the trainer and `benchmarks/bench.py` do); call it once, on the
    model that trains. Returns how many layers it set."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for m in layers:
        m.sequence_attention = autocast_attention
    return len(layers)


def keep_freed_memory() -> bool:
    """glibc: serve every allocation from the heap and keep what is freed there for reuse, instead
    of mapping each large block afresh (glibc maps every block over 32 MB, and many smaller ones)
    and unmapping it when freed. A training step allocates and frees the same large tensors every
    step (the logits and their gradient, the embedding matrix's gradient and its bf16 copy); mapped
    afresh, the first touch of each of their pages is a page fault: zeroing the base model's 37,000
    x 512 embedding gradient took 97 ms of a 5.7 s step. With this, base bf16 training on a Zen 4 ran
    495 and 522 against 464 and 462 target tokens/s (`benchmarks/bench.py`, alternating; docs/
    RESULTS.md). The process keeps its peak memory, which the next step needs again anyway. For the
    CPU trainer (`transduce.train.trainer`); returns whether it took (elsewhere nothing changes)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def fast_dropout(model: nn.Module) -> int:
    """Replace every `nn.Dropout` in `model` by a `BitDropout` of the same p (in place; dropout has
    no parameters, so `state_dict` is unchanged). Call it once, on the model that trains, before
    its first step. Returns how many were replaced."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, nn.Dropout)]
    for parent, name, child in swaps:
        setattr(parent, name, BitDropout(child.p).train(child.training))
    return len(swaps)
