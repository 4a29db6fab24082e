"""The Transformer of Section 3 of "Attention Is All You Need", in one file, read next to the paper:

* 3.1   `Encoder`, `Decoder`: stacks of N identical layers (`EncoderLayer`, `DecoderLayer`), each
        sub-layer wrapped as LayerNorm(x + Dropout(Sublayer(x))) (post-norm; pre-norm is an option,
        `ModelConfig.norm_first`, never the default).
* 3.2.1 equation 1, Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V: `transduce.attention`
        (`attention_reference` as the paper writes it, and its faster forms).
* 3.2.2 `MultiHeadAttention`: h heads, concatenated and projected by W^O; `StackedLinear` holds
        [W^Q; W^K; W^V]. 3.2.3: its three uses (encoder, masked decoder, encoder-decoder).
* 3.3   `PositionwiseFeedForward`: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2  (equation 2).
* 3.4   `Embeddings`, scaled by sqrt(d_model); one matrix shared by both embeddings and the
        pre-softmax projection. 3.5: `transduce.positions` (sinusoids; learned: Table 3 row E).
* 5.4   dropout (P_drop) on every sub-layer output before the residual add, and on the sums of
        the embeddings and the positional encodings.

Every mask is a boolean tensor, True = may attend, built in one place: `transduce.masks`.
Incremental decoding hands the decoder's layers a `transduce.cache.DecoderCache`; the searches step
the model through it with `encode`, `init_cache` and `decode_step`, which `Transformer` inherits
(`transduce.cache.IncrementalDecoding`). Options off by default, not in the paper: the parser's word
positions (`ModelConfig.word_positions`) and Section 4's restricted self-attention
(`ModelConfig.attention_window`). CPU speed-ups are applied from the outside by `transduce.fast`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import attention_reference, concat_heads, fold_beams, sequence_attention, step_attention
from .cache import DecoderCache, IncrementalDecoding, LayerCache
from .config import ModelConfig
from .masks import make_masks
from .positions import LearnedPositions, SinusoidalPositions
from .restricted import within_window
from .word_positions import WordPositions

# -- 3.2 Attention -----------------------------------------------------------------------------


class StackedLinear(nn.Linear):
    """A linear layer whose output rows are several projections stacked, [W^Q; W^K; W^V] of all
    heads (3.2.2): `forward(x)` applies all of them in one product, `forward(x, rows)` the block
    `rows` alone, x W[rows]^T + b[rows] (views of the parameters, no copy)."""

    def forward(self, x: Tensor, rows: slice | None = None) -> Tensor:
        if rows is None:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight[rows], None if self.bias is None else self.bias[rows])


class MultiHeadAttention(nn.Module):
    """Multi-head attention (3.2.2): Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    W^Q, W^K, W^V of all heads are stacked into one matrix `in_proj` (rows: h*d_k for Q, h*d_k for
    K, h*d_v for V): self-attention projects with one matmul, encoder-decoder attention uses the Q
    rows on the decoder states and the K, V rows on the encoder output. d_k and d_v are independent
    of d_model / h (Table 3 rows A and B). Equation 1's forms are in `transduce.attention`, which
    picks the one for a decoding step's queries (`step_attention`) and for all others
    (`sequence_attention`) from where and how they are computed."""

    def __init__(
        self, d_model: int, n_heads: int, d_k: int, d_v: int, attention_dropout: float = 0.0, bias: bool = False
    ):
        super().__init__()
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.attention_dropout = attention_dropout
        # The paper's projections are matrices alone; `bias` (ModelConfig.attention_bias) adds biases.
        self.in_proj = StackedLinear(d_model, n_heads * (2 * d_k + d_v), bias=bias)  # [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)  # W^O
        q, kv = n_heads * d_k, n_heads * (d_k + d_v)
        with torch.no_grad():
            for block in self.in_proj.weight.split([q, n_heads * d_k, n_heads * d_v]):
                nn.init.xavier_uniform_(block)
            nn.init.xavier_uniform_(self.out_proj.weight)
            for b in (self.in_proj.bias, self.out_proj.bias):
                if b is not None:
                    nn.init.zeros_(b)
        self.q_rows, self.kv_rows = slice(0, q), slice(q, q + kv)  # blocks of in_proj

    def _heads(self, x: Tensor, d: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, d).transpose(1, 2)  # (B, h, T, d)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: queries, keys and values from the same sequence, (B, h, T, d)."""
        qkv = self.in_proj(x)
        q, k, v = qkv.split([self.n_heads * self.d_k, self.n_heads * self.d_k, self.n_heads * self.d_v], -1)
        return self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)

    def project_q(self, x: Tensor) -> Tensor:
        """Encoder-decoder attention: queries from the decoder, (B, h, T, d_k)."""
        return self._heads(self.in_proj(x, self.q_rows), self.d_k)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder-decoder attention: keys and values from the encoder output, (B, h, S, d)."""
        k, v = self.in_proj(memory, self.kv_rows).split([self.n_heads * self.d_k, self.n_heads * self.d_v], -1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool = False,
        incremental: bool = False,
        keys_first: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Equation 1 on every head, then Concat and W^O: (B, Tq, d_model) and, if asked, the weights
        (B, h, Tq, Tk). `incremental`: q holds one decoding step's positions (`attention.step_attention`,
        with the cache's `keys_first`).
        Where k and v have fewer rows than q (a sentence's beams in encoder-decoder attention), each
        group of q's rows that shares one is folded into one row's queries (`attention.fold_beams`)."""
        group = q.size(0) // k.size(0)
        q = fold_beams(q, group)
        p = self.attention_dropout if self.training else 0.0
        if need_weights:
            out, weights = attention_reference(q, k, v, mask, p)
            if group > 1:  # the beams unfolded as `concat_heads` unfolds them: (R, h, n, Tk)
                weights = concat_heads(weights, group).unflatten(-1, (weights.size(1), -1)).transpose(1, 2).contiguous()
        elif incremental:
            out, weights = step_attention(q, k, v, mask, keys_first), None
        else:
            out, weights = sequence_attention(q, k, v, attn_mask=mask, dropout_p=p), None
        return self.out_proj(concat_heads(out, group)), weights  # Concat(head_1..h) W^O

    def forward(
        self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention over x, or encoder-decoder attention from x to `memory`."""
        if memory is None:
            q, k, v = self.project_qkv(x)
        else:
            q, (k, v) = self.project_q(x), self.project_kv(memory)
        return self.attend(q, k, v, mask, need_weights)


# -- 3.3 Position-wise feed-forward networks ---------------------------------------------------


ACTIVATIONS = {"relu": F.relu, "swish": F.silu}
"""The FFN's nonlinearity (`ModelConfig.activation`): the paper's max(0, x), or swish (OPUS-MT's)."""


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2  (equation 2), d_model -> d_ff -> d_model; with
    `activation` "swish" (not the paper), x * sigmoid(x) in place of max(0, x)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        self.activation = activation
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        for lin in (self.w_1, self.w_2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(ACTIVATIONS[self.activation](self.w_1(x)))


# -- 3.4 Embeddings (3.5 Positional encoding: transduce.positions) -----------------------------


class Embeddings(nn.Module):
    """Learned token embeddings, multiplied by sqrt(d_model) (3.4). Initialised normal with
    standard deviation d_model^-1/2: after the scale, unit variance like the sinusoids they are
    added to, and logits of unit scale as the pre-softmax projection (tensor2tensor's convention)."""

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight) * self.scale


# -- 3.1 Encoder and decoder stacks ------------------------------------------------------------


def _attention(c: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(c.d_model, c.n_heads, c.head_dim_k, c.head_dim_v, c.attention_dropout, c.attention_bias)


def _norm(c: ModelConfig) -> nn.LayerNorm:
    return nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)


class _Sublayers(nn.Module):
    """3.1's residual connection around each sub-layer: LayerNorm(x + Dropout(Sublayer(x)))
    (post-norm, the paper), or x + Dropout(Sublayer(LayerNorm(x))) (pre-norm, `norm_first`)."""

    def _input(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.norm_first else x

    def _output(self, x: Tensor, sublayer_out: Tensor, norm: nn.LayerNorm) -> Tensor:
        x = x + self.dropout(sublayer_out)
        return x if self.norm_first else norm(x)


class EncoderLayer(_Sublayers):
    """Multi-head self-attention, then the position-wise FFN (3.1), each in its residual connection."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = _attention(c)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation)
        self.norm1, self.norm2 = _norm(c), _norm(c)
        self.dropout = nn.Dropout(c.dropout)
        self.norm_first = c.norm_first

    def forward(self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        a, weights = self.self_attn(self._input(x, self.norm1), mask=src_mask, need_weights=need_weights)
        x = self._output(x, a, self.norm1)
        return self._output(x, self.feed_forward(self._input(x, self.norm2)), self.norm2), weights


class DecoderLayer(_Sublayers):
    """Masked multi-head self-attention, encoder-decoder attention, then the FFN (3.1), each in its
    residual connection. With a `LayerCache`, self-attention keys/values are appended to the cache
    and encoder-decoder keys/values are read from it."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn, self.cross_attn = _attention(c), _attention(c)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation)
        self.norm1, self.norm2, self.norm3 = _norm(c), _norm(c), _norm(c)
        self.dropout = nn.Dropout(c.dropout)
        self.norm_first = c.norm_first

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None,
        src_mask: Tensor | None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        # Masked self-attention (3.2.3): each position sees itself and earlier positions.
        q, k, v = self.self_attn.project_qkv(self._input(x, self.norm1))
        incremental = cache is not None
        keys_first = incremental and cache.keys_first
        if incremental:
            k, v = cache.append(k, v)
        a, self_weights = self.self_attn.attend(q, k, v, tgt_mask, need_weights, incremental, keys_first)
        x = self._output(x, a, self.norm1)
        # Encoder-decoder attention (3.2.3): queries from the decoder, keys/values from the encoder.
        q = self.cross_attn.project_q(self._input(x, self.norm2))
        k, v = (cache.cross_k, cache.cross_v) if incremental else self.cross_attn.project_kv(memory)
        a, cross_weights = self.cross_attn.attend(q, k, v, src_mask, need_weights, incremental, keys_first)
        x = self._output(x, a, self.norm2)
        x = self._output(x, self.feed_forward(self._input(x, self.norm3)), self.norm3)
        return x, self_weights, cross_weights


class _Stack(nn.Module):
    """Embeddings + positions (with dropout, 5.4), then N identical `Layer`s (3.1)."""

    Layer: type[nn.Module]

    def __init__(self, c: ModelConfig, embed: Embeddings, positions: nn.Module, words: WordPositions | None = None):
        super().__init__()
        self.embed, self.positions, self.words = embed, positions, words
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(self.Layer(c) for _ in range(c.n_layers))
        # Pre-norm leaves the last residual sum un-normalised; post-norm needs no final norm.
        self.final_norm = _norm(c) if c.norm_first else None
        self.window = c.attention_window  # Table 1's restricted self-attention; None: the paper


class Encoder(_Stack):
    """Embeddings + positions (with dropout, 5.4), then N encoder layers (3.1)."""

    Layer = EncoderLayer

    def forward(self, src: Tensor, src_mask: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        self_mask = within_window(src_mask, self.window, src.size(1), src.size(1), src.device)
        x = self.embed(src) + self.positions(src.size(1))  # (B, S, d_model)
        if self.words is not None:  # not in the paper: ModelConfig.word_positions
            x = x + self.words.source(src)
        x = self.dropout(x)
        all_weights = []
        for layer in self.layers:
            x, w = layer(x, self_mask, need_weights)
            all_weights.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights


class Decoder(_Stack):
    """Embeddings + positions (with dropout, 5.4), then N decoder layers (3.1)."""

    Layer = DecoderLayer

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask: Tensor,
        tgt_mask: Tensor | None,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        start = cache.length if cache is not None else 0
        # with a window, the cached keys too: the step at position t sees keys max(0, t - r) .. t
        tgt_mask = within_window(tgt_mask, self.window, tgt.size(1), start + tgt.size(1), tgt.device)
        x = self.embed(tgt) + self.positions(tgt.size(1), offset=start)  # (B, T, d_model)
        if self.words is not None:  # not in the paper: ModelConfig.word_positions
            x = x + self.words.decoder_input(tgt, cache)
        x = self.dropout(x)
        self_w, cross_w = [], []
        layer_caches = cache.begin_step() if cache is not None else [None] * len(self.layers)
        for layer, layer_cache in zip(self.layers, layer_caches):
            x, sw, cw = layer(x, memory, tgt_mask, src_mask, layer_cache, need_weights)
            self_w.append(sw)
            cross_w.append(cw)
        if cache is not None:
            cache.length += tgt.size(1)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, self_w, cross_w


class Transformer(IncrementalDecoding, nn.Module):
    """The encoder-decoder Transformer (Figure 1). `forward(src, tgt)` returns logits over the
    target vocabulary (the loss: `transduce.train.loss`). Token batches are (B, L) LongTensors
    right-padded with `config.pad_id`; `tgt` is the decoder input (`config.bos_id`, then the target shifted right)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        src_embed = Embeddings(c.src_vocab_size, c.d_model, c.scale_embeddings)
        # 3.4: "we share the same weight matrix between the two embedding layers and the
        # pre-softmax linear transformation".
        tgt_embed = src_embed if c.share_embeddings else Embeddings(c.target_vocab_size, c.d_model, c.scale_embeddings)
        if c.positional == "sinusoidal":
            src_pos = tgt_pos = SinusoidalPositions(c.d_model, c.max_positions)
        else:
            src_pos, tgt_pos = (
                LearnedPositions(c.d_model, c.max_positions),
                LearnedPositions(c.d_model, c.max_positions),
            )
        self.word_positions = WordPositions(c) if c.word_positions else None  # not in the paper
        self.encoder = Encoder(c, src_embed, src_pos, self.word_positions)
        self.decoder = Decoder(c, tgt_embed, tgt_pos, self.word_positions)
        if c.share_embeddings or c.tie_output:
            self.output_proj = None  # logits = x @ E^T with the target embedding matrix E
        else:
            self.output_proj = nn.Linear(c.d_model, c.target_vocab_size, bias=False)
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=c.d_model**-0.5)
        # Not in the paper (`ModelConfig.output_bias`): a bias on the logits, Marian's final_logits_bias
        self.output_bias = nn.Parameter(torch.zeros(c.target_vocab_size)) if c.output_bias else None

    def logits(self, x: Tensor) -> Tensor:
        """The pre-softmax linear transformation (3.4): (B, T, d_model) -> (B, T, V)."""
        if self.output_proj is None:
            logits = F.linear(x, self.decoder.embed.weight)  # the shared embedding matrix
        else:
            logits = self.output_proj(x)
        return logits if self.output_bias is None else logits + self.output_bias

    def forward(self, src: Tensor, tgt: Tensor, return_attention: bool = False):
        """Teacher-forced pass: logits (B, T, V) for every target position. With `return_attention`,
        (logits, attention), the weights (B, h, Tq, Tk) of every layer (by the slower reference path):
        {"encoder": [...], "decoder_self": [...], "decoder_cross": [...]}."""
        src_mask, tgt_mask = make_masks(src, tgt, self.config.pad_id)
        memory, enc_w = self.encoder(src, src_mask, return_attention)
        x, self_w, cross_w = self.decoder(tgt, memory, src_mask, tgt_mask, need_weights=return_attention)
        logits = self.logits(x)
        if return_attention:
            return logits, {"encoder": enc_w, "decoder_self": self_w, "decoder_cross": cross_w}
        return logits


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
