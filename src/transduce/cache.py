"""The decoding cache: an explicit object passed to the decoder, never state hidden on modules.

Incremental decoding (Section 3.1: the decoder is auto-regressive) needs, in each decoder layer,
the self-attention keys/values of the positions so far, which grow by one position a step into
one contiguous buffer (a strided view would be copied inside the batched product every step),
and the encoder-decoder keys/values, projected once per source (`Transformer.init_cache`).
Beam search keeps the cache in step with its hypotheses through `reorder` (applied lazily, by
the next step's append: one copy of each position a step) and `repeat_rows`; the source side
keeps one row per source, never copied per beam. The model's layers consume it, the searches
(`transduce.decoding`) drive it: it stands beside the model, below both. The model's side of it,
which `model.Transformer` inherits, is `IncrementalDecoding`: the sources encoded once (`encode`),
the cache made (`init_cache`), the decoder stepped through it (`decode_step`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import cpu
from .masks import causal_mask, padding_mask


@dataclass
class LayerCache:
    """Keys and values of one decoder layer."""

    cross_k: Tensor  # Encoder-decoder attention keys, (B, h, S, d_k), projected once from the encoder output
    cross_v: Tensor  # Encoder-decoder attention values, (B, h, S, d_v)
    self_k: Tensor | None = None  # self-attention keys so far, (B', h, length, d_k); B': rows before pending
    self_v: Tensor | None = None  # Self-attention values, (B', h, length, d_v)
    # The flat buffers `self_k` and `self_v` are views of (inference mode sets no `Tensor._base`)
    _flat: list = field(default_factory=lambda: [None, None])
    # Free buffers for the next append's keys and values, shared by the layers of one `DecoderCache`:
    # a layer's buffers of the step before become the next layer's (fresh megabytes cost page
    # faults), so a cache holds one spare pair, not one per layer
    _spare: list = field(default_factory=lambda: [None, None])
    pending: Tensor | None = None  # the reorder this layer's next `append` applies (`begin_step`)
    # a step's attention scores as K q^T (`attention.decode_attention`): where oneDNN runs AMX (`cpu_keys_first`)
    keys_first: bool = False

    def append(self, k: Tensor, v: Tensor, positions: int | None = None) -> tuple[Tensor, Tensor]:
        """Add the new positions' keys/values (B, h, n, d); return all positions so far,
        (B, h, length + n, d), contiguous. The pending reorder (which old row each row
        continues) is applied in the same copy. `positions` (at least length + n): the tensors
        returned hold that many, the ones past length + n zero (a step's products then have one
        shape for several steps: `fast.step`), for the caller to mask."""
        rows, self.pending = self.pending, None
        spare, n = self._spare, k.size(2) + (0 if self.self_k is None else self.self_k.size(2))
        k, flat_k = _extend(self.self_k, k, rows, spare[0], positions)
        v, flat_v = _extend(self.self_v, v, rows, spare[1], positions)
        spare[:], self._flat = self._flat, [flat_k, flat_v]  # the old buffers are free now: the next layer's
        self.self_k, self.self_v = (k, v) if k.size(2) == n else (k[:, :, :n], v[:, :, :n])
        return k, v


@functools.cache
def cpu_keys_first() -> bool:
    """Whether a CPU decoding step computes its scores as K q^T: where oneDNN runs AMX (`transduce.cpu`,
    read once), whose layout that is (docs/speed.md)."""
    return cpu.amx_products()


@dataclass
class DecoderCache:
    """Everything the decoder needs to take one more step."""

    layers: list[LayerCache]
    src_mask: Tensor  # (B, 1, 1, S) source padding mask, True = may attend
    length: int = 0  # Target positions decoded so far (the next position's index)
    # Consecutive rows that read the same source (the beam size): the source side (cross keys/values,
    # `src_mask`) has one row per source, the self-attention keys/values one per row
    rows_per_source: int = 1
    word_count: Tensor | None = None  # (B,) words emitted so far by each row (`ModelConfig.word_positions`)
    pending: Tensor | None = None  # a reorder not yet applied to self_k/self_v: row i continues `pending[i]`

    def __post_init__(self) -> None:
        spare = [None, None]  # one spare pair for all the layers (`LayerCache._spare`)
        for layer in self.layers:
            layer._spare = spare

    @property
    def batch_size(self) -> int:
        """Rows (hypotheses) being decoded."""
        return self.src_mask.size(0) * self.rows_per_source

    def repeat_rows(self, k: int) -> None:
        """Each row becomes k consecutive rows reading the same source (B -> B * k), not copied."""
        self._select_rows(torch.arange(self.batch_size, device=self.src_mask.device).repeat_interleave(k))
        self.rows_per_source *= k

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep the batch rows `index` (row numbers; may repeat rows); the next step's append gathers
        the self-attention keys/values (`pending`). `same_sources=True`: the caller promises every new
        row reads the same source as the row it replaces (beams of one sentence), so the source side
        stays as it is. Otherwise, with `rows_per_source` g > 1, the new rows must come in groups of g
        that each read one source."""
        if not same_sources:
            g = self.rows_per_source
            sources = index if g == 1 else _group_sources(index, g)
            self.src_mask = self.src_mask.index_select(0, sources)
            for layer in self.layers:
                layer.cross_k = layer.cross_k.index_select(0, sources)
                layer.cross_v = layer.cross_v.index_select(0, sources)
        self._select_rows(index)

    def _select_rows(self, index: Tensor) -> None:
        if self.word_count is not None:
            self.word_count = self.word_count.index_select(0, index)
        if self.length == 0:  # nothing cached on the target side yet
            return
        self.pending = index if self.pending is None else self.pending.index_select(0, index)

    def begin_step(self) -> list[LayerCache]:
        """The layers' caches for the next decoding step, each handed the pending reorder."""
        rows, self.pending = self.pending, None
        for layer in self.layers:
            layer.pending = rows
        return self.layers


ROOM = 32
"""The positions a self-attention buffer holds are a multiple of this: a decode grows it once every
`ROOM` positions, and holds at most `ROOM` - 1 positions it has not reached."""


def _extend(
    cached: Tensor | None, new: Tensor, rows: Tensor | None, spare: Tensor | None, positions: int | None = None
) -> tuple[Tensor, Tensor | None]:
    """cached[rows] (all of it if rows is None) followed by `new` along the position axis (2), in
    one contiguous tensor, a view of `spare` (flat) when it is large enough: one copy of the cache
    per step; with `positions`, that many positions, zeros after the last. Returns the tensor and
    the flat buffer it is a view of (None where autograd may still need the memory)."""
    tracked = torch.is_grad_enabled() and (new.requires_grad or (cached is not None and cached.requires_grad))
    n = 0 if cached is None else cached.size(2)
    total = n + new.size(2)
    P = max(total, positions or 0)
    if cached is None and P == total:  # a copy (never a view of `new`: its memory becomes a spare later)
        out = new.clone(memory_format=torch.contiguous_format)
        return out, None if tracked else out.view(-1)
    h, d = new.size(1), new.size(3)
    shape = (new.size(0), h, P, d)
    size = shape[0] * h * P * d
    if tracked:  # autograd keeps the old tensors for backward: never reuse their memory
        out, spare = new.new_empty(shape), None
    else:
        if spare is None or spare.numel() < size or spare.dtype != new.dtype:
            spare = new.new_empty(shape[0] * h * -(-P // ROOM) * ROOM * d)  # room up to a multiple of ROOM positions
        out = spare[:size].view(shape)
    if cached is not None and rows is None:
        out[:, :, :n] = cached
    elif cached is not None and tracked:  # out= does not record gradients
        out[:, :, :n] = cached.index_select(0, rows)
    elif cached is not None:
        torch.index_select(cached, 0, rows, out=out[:, :, :n])
    out[:, :, n:total] = new
    if P > total:
        out[:, :, total:] = 0
    return out, spare


def _group_sources(index: Tensor, g: int) -> Tensor:
    """The source of each group of g new rows (old row // g), checking that a group reads one."""
    if index.numel() % g:
        raise ValueError(f"reorder: {index.numel()} rows do not form groups of {g} (rows_per_source)")
    sources = index.view(-1, g) // g
    if not bool((sources == sources[:, :1]).all()):
        raise ValueError("reorder: a group of rows_per_source rows must read a single source")
    return sources[:, 0]


class IncrementalDecoding:
    """Incremental decoding (3.1's auto-regressive decoder) as the searches drive it, the methods that
    `model.Transformer` inherits: they read its `config`, `encoder`, `decoder` and `logits`."""

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Encoder output ("memory"), (B, S, d_model)."""
        if src_mask is None:
            src_mask = padding_mask(src, self.config.pad_id)
        return self.encoder(src, src_mask)[0]

    def init_cache(self, memory: Tensor, src_mask: Tensor) -> DecoderCache:
        """A decoding cache for these sources: the encoder-decoder keys/values of every layer are
        projected here, once."""
        # contiguous: every step multiplies by them (a strided view would be copied each time)
        keys_first = memory.device.type == "cpu" and cpu_keys_first()
        layers = [
            LayerCache(*(x.contiguous() for x in layer.cross_attn.project_kv(memory)), keys_first=keys_first)
            for layer in self.decoder.layers
        ]
        return DecoderCache(layers=layers, src_mask=src_mask)

    def decode_step(self, tgt: Tensor, cache: DecoderCache) -> Tensor:
        """Feed the next target tokens (B, n) (usually n = 1) at positions [cache.length,
        cache.length + n); returns their logits (B, n, V) and advances the cache."""
        return self.logits(self.decode_hidden(tgt, cache))

    def decode_hidden(self, tgt: Tensor, cache: DecoderCache) -> Tensor:
        """`decode_step` before the pre-softmax projection: the decoder's output (B, n, d_model)."""
        n = tgt.size(1)
        # One new position attends to every cached one: no mask. Several: causal with offset.
        # (The decoder restricts either to ModelConfig.attention_window where one is set.)
        tgt_mask = None if n == 1 else causal_mask(n, cache.length + n, device=tgt.device)
        return self.decoder(tgt, None, cache.src_mask, tgt_mask, cache=cache)[0]
