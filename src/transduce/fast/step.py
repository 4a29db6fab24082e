"""One decoding step without the module layers around it: the decoder (3.1's auto-regressive
stack) for one new position per row as one flat loop, the same operations in the same order on the
same weights (its output, and so the logits, bit for bit the model's), with the checks made once
per step, not per product: the Python around a step's few hundred small operations costs a good
part of a small model's step (docs/speed.md). `FastDecoder` stands in for a model's `Decoder`
(`ready.make_ready` sets it as `model.decoder`, as the packed layers stand in for linear ones);
it reads the layers it runs when they change (`decode.swaps`), so nothing needs refreshing. Not
in the paper, and not a different computation; what it covers: `HANDLED`, `FALLBACK`,
`FastDecoder.usable`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import concat_heads, fold_beams, fused_step, step_attention
from ..config import ModelConfig
from ..model import Decoder, Transformer

HANDLED = {
    "src_vocab_size": "the source side: the encoder's, in the cache",
    "tgt_vocab_size": "the embedding matrix's shape",
    "n_layers": "one pass per decoder layer",
    "d_model": "the weights' shapes",
    "d_ff": "the weights' shapes",
    "n_heads": "h of each attention layer",
    "d_k": "d_k of each attention layer",
    "d_v": "d_v of each attention layer",
    "dropout": "eval mode only: no dropout",
    "attention_dropout": "eval mode only: no dropout",
    "attention_bias": "the layers' biases, None or not",
    "positional": "the decoder's own `positions` module",
    "max_positions": "the decoder's own `positions` module",
    "share_embeddings": "the decoder's own embedding module, shared or not",
    "tie_output": "the logits: `Transformer.logits` after the step",
    "scale_embeddings": "the embedding's own scale",
    "norm_first": "post-norm or pre-norm residuals, and the final LayerNorm",
    "layer_norm_eps": "each LayerNorm's own eps",
    "pad_id": "the source mask in the cache",
    "unk_id": "not read by a step",
    "bos_id": "the search's first input, a token as any other to the step",
    "eos_id": "read by the search, not by a step",
    "activation": "ReLU inside W_1's packed product (else after it), swish after W_1, as the model's FFN",
    "output_bias": "the logits: `Transformer.logits` after the step, as for the model's own",
}
"""The `ModelConfig` fields the step computes as the model does, and how."""

FALLBACK = {"word_positions": False, "attention_window": None}
"""The options that change the step and that it does not run: it covers a model only with these
values (the paper's); any other decodes through the model's own `Decoder`."""


def covers(config: ModelConfig) -> bool:
    """Whether the step computes what the model's own does for models of `config`: every field
    in `HANDLED`, or in `FALLBACK` at its covered value."""
    return all(
        getattr(config, f.name) == FALLBACK[f.name] if f.name in FALLBACK else f.name in HANDLED
        for f in dataclasses.fields(config)
    )


class FastDecoder(Decoder):
    """A model's `Decoder`, the same modules under the same names (`state_dict` unchanged), whose
    steps of one position run as one flat loop (`step`) where `usable`, and otherwise as the
    `Decoder` does. Made by `wrap`, after the weights are packed or quantized."""

    @classmethod
    def wrap(cls, decoder: Decoder, config: ModelConfig) -> "FastDecoder":
        """A `FastDecoder` holding `decoder`'s modules (itself kept as `original`)."""
        fast = cls.__new__(cls)
        fast.__dict__.update(decoder.__dict__)
        fast._modules, fast._parameters, fast._buffers = (
            dict(decoder._modules),
            dict(decoder._parameters),
            dict(decoder._buffers),
        )
        fast.__dict__["original"] = decoder  # not a submodule
        fast.__dict__["norm_first"], fast.__dict__["swish"] = config.norm_first, config.activation == "swish"
        fast.__dict__["_plan"], fast.__dict__["_built"] = None, -1
        return fast

    def _build(self) -> None:
        """The flat loop's products, read from the layers the decoder has now."""
        from .decode import swaps

        self.checks: list = []  # the packed copies relied on: usable only while unchanged
        layers = []
        for layer in self.layers:
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
            norms = tuple(
                (n.normalized_shape, n.weight, n.bias, n.eps, True) for n in (layer.norm1, layer.norm2, layer.norm3)
            )
            layers.append(
                (
                    self._linear(sa.in_proj),
                    self._linear(sa.out_proj),
                    self._linear(ca.in_proj, ca.q_rows),
                    self._linear(ca.out_proj),
                    self._linear(ffn.w_1),
                    self._linear(ffn.w_2),
                    norms,
                    sa.n_heads,
                    sa.d_k,
                    sa.d_v,
                )
            )
        embed = self.embed  # a `model.Embeddings`, or an `int8.Int8Embeddings` (its `dtype`)
        self.activations = embed.weight.dtype if hasattr(embed, "weight") else embed.dtype
        dtypes = {c.dtype for c in self.checks}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else (None if not dtypes else "mixed")
        self._versions = [
            (c.source, c.version, c.ptr, getattr(c, "bias", None), getattr(c, "bias_version", None))
            for c in self.checks
            if c.source is not None
        ]  # None: a copy for decoding only (no original)
        self._plan, self._built = layers, swaps()

    def _linear(self, layer, rows: slice | None = None):
        """fn(x, activation) = x W[rows]^T + b[rows], as `layer` runs it (`decode.PackedLinear.forward`);
        the packed copy it relies on (none for a plain `nn.Linear`) joins `checks`."""
        packed = layer.packed_for(rows) if hasattr(layer, "packed_for") else None  # a `decode.PackedLinear`
        b = layer.bias if rows is None or layer.bias is None else layer.bias[rows]
        if packed is None:
            w = layer.weight if rows is None else layer.weight[rows]

            def plain(x: Tensor, activation: str = "none") -> Tensor:
                y = F.linear(x, w, b)
                return F.relu(y) if activation == "relu" else y

            return plain
        self.checks.append(packed)
        return lambda x, activation="none": packed(x, b, activation)

    def usable(self, tgt: Tensor, cache, need_weights: bool) -> bool:
        """Whether the flat loop computes what the `Decoder` would: one position with a cache, eval
        mode, no weights asked for, no autograd or autocast, activations in the packed weights'
        dtype, every packed copy current."""
        if (
            cache is None
            or need_weights
            or tgt.size(1) != 1
            or tgt.numel() == 0
            or self.training
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled(tgt.device.type)
        ):
            return False
        from .decode import swaps

        if self._built != swaps():
            self._build()
        if self.dtype not in (None, self.activations):
            return False
        return all(
            source._version == version and source.data_ptr() == ptr and (bias is None or bias._version == bias_version)
            for source, version, ptr, bias, bias_version in self._versions
        )

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_mask: Tensor,
        tgt_mask: Tensor | None,
        cache=None,
        need_weights: bool = False,
    ):
        if not self.usable(tgt, cache, need_weights):
            return Decoder.forward(self, tgt, memory, src_mask, tgt_mask, cache, need_weights)
        return self.step(tgt, cache), [], []

    def step(self, tgt: Tensor, cache) -> Tensor:
        """The decoder's output (R, 1, d_model) for one new position per row; advances the cache (a
        `cache.DecoderCache`)."""
        pre = self.norm_first
        norm = torch.layer_norm  # F.layer_norm's own call, without its Python wrapper
        x = self.embed(tgt) + self.positions(1, offset=cache.length)  # (R, 1, d_model)
        R = x.size(0)
        plan, layers = self._plan, cache.begin_step()
        # the same shape for several steps (bf16's products on the CPU; not where the fused kernel takes them)
        positions, mask = _padded(
            cache.length + 1, x, fused_step(R, plan[0][7], layers[0].keys_first) if plan else True
        )
        for (qkv, w_o, q_c, w_oc, w_1, w_2, (n1, n2, n3), h, d_k, d_v), lc in zip(plan, layers):
            # masked self-attention over the cache (3.2.3)
            q, k, v = qkv(norm(x, *n1) if pre else x).split([h * d_k, h * d_k, h * d_v], -1)
            k, v = lc.append(k.view(R, 1, h, d_k).transpose(1, 2), v.view(R, 1, h, d_v).transpose(1, 2), positions)
            a = step_attention(q.view(R, 1, h, d_k).transpose(1, 2), k, v, mask, lc.keys_first)
            a = a.transpose(1, 2).reshape(R, 1, h * d_v)
            x = x + w_o(a) if pre else norm(x + w_o(a), *n1)
            # encoder-decoder attention: the g beams of a source folded into one row's queries,
            # and unfolded as the heads are concatenated (the model's own `fold_beams`, `concat_heads`)
            g = R // lc.cross_k.size(0)
            q = fold_beams(q_c(norm(x, *n2) if pre else x).view(R, 1, h, d_k).transpose(1, 2), g)
            a = w_oc(concat_heads(step_attention(q, lc.cross_k, lc.cross_v, cache.src_mask, lc.keys_first), g))
            x = x + a if pre else norm(x + a, *n2)
            # the position-wise FFN (equation 2)
            f = norm(x, *n3) if pre else x
            f = w_2(
                F.silu(w_1(f)) if self.swish else w_1(f, "relu")
            )  # W_1's ReLU inside a packed product, else after it
            x = x + f if pre else norm(x + f, *n3)
        cache.length += 1
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x


POSITIONS_MULTIPLE = 8
"""The positions a bf16 step's self-attention runs over on the CPU, rounded up to a multiple of this:
oneDNN builds and keeps a kernel for every shape of product (`transduce.memory`), and a step whose
shape is its length would need a new one at every step (docs/speed.md, "Memory at OPUS-MT's size")."""


def _padded(length: int, x: Tensor, fused: bool) -> tuple[int | None, Tensor | None]:
    """(the positions a step attends over, the mask of those past `length`), or (None, None) where
    the step attends over `length` exactly: fp32 (exact, and no oneDNN kernels to keep), off the
    CPU, and where PyTorch's fused kernel takes the step (`attention.fused_step`: no oneDNN kernels)."""
    if fused or x.dtype != torch.bfloat16 or x.device.type != "cpu" or length % POSITIONS_MULTIPLE == 0:
        return None, None
    positions = -(-length // POSITIONS_MULTIPLE) * POSITIONS_MULTIPLE
    return positions, (torch.arange(positions) < length).view(1, 1, 1, positions)


def install(model: Transformer) -> bool:
    """Set a `FastDecoder` as `model.decoder` where it covers the model (returns whether it did);
    `uninstall` puts the `Decoder` back."""
    if (
        isinstance(model.decoder, FastDecoder)
        or not covers(model.config)
        or model.word_positions is not None
        or model.decoder.words is not None
    ):
        return False
    model.decoder = FastDecoder.wrap(model.decoder, model.config)
    return True


def uninstall(model: Transformer) -> None:
    """Put back the `Decoder` that `install` wrapped."""
    if isinstance(model.decoder, FastDecoder):
        model.decoder = model.decoder.original
