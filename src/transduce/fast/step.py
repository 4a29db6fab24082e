"""One decoding step without the module layers around it: `Transformer.decode_step` for one new
position per row (3.1's auto-regressive decoder, then 3.4's pre-softmax projection), as one flat
function, the same operations in the same order on the same weights (its logits bit for bit the
model's), with the checks made once per step, not per product: the Python around a step's few
hundred small operations costs a good part of a small model's step (docs/speed.md). Not in the
paper, and not a different computation; what it covers: `HANDLED`, `FALLBACK`, `FastStep.usable`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import concat_heads, fold_beams
from ..decoding.cache import DecoderCache
from ..config import ModelConfig
from ..model import Transformer

HANDLED = {
    "src_vocab_size": "the source side: the encoder's, in the cache",
    "tgt_vocab_size": "the embedding and projection matrices' shapes",
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
    "share_embeddings": "the decoder's embedding matrix, shared or not",
    "tie_output": "the tied matrix or the projection layer",
    "scale_embeddings": "the embedding's own scale",
    "norm_first": "post-norm or pre-norm residuals, and the final LayerNorm",
    "layer_norm_eps": "each LayerNorm's own eps",
    "pad_id": "the source mask in the cache",
    "activation": "ReLU inside W_1's packed product (else after it), swish after W_1, as the model's FFN",
    "output_bias": "the model's logits bias, added after the projection, None or not",
}
    "unk_id": "not read by a step",
    "bos_id": "the search's first input, a token as any other to the step",
    "eos_id": "read by the search, not by a step",
"""The `ModelConfig` fields the step computes as the model does, and how."""

FALLBACK = {"word_positions": False, "attention_window": None}
"""The options that change the step and that it does not run: it covers a model only with these
values (the paper's); any other goes to the model's own step."""


def covers(config: ModelConfig) -> bool:
    """Whether the step computes what the model's own does for models of `config`: every field
    in `HANDLED`, or in `FALLBACK` at its covered value."""
    return all(getattr(config, f.name) == FALLBACK[f.name] if f.name in FALLBACK else f.name in HANDLED
               for f in dataclasses.fields(config))


class FastStep:
    """`model.decode_step` as one function, set on the instance by `install` (`ready.make_ready`),
    after the weights are packed or quantized; where it is not `usable`, the model's own step runs."""

    def __init__(self, model: Transformer):
        self.model = model
        dec = model.decoder
        self.embed, self.scale, self.positions = dec.embed.weight, dec.embed.scale, dec.positions
        self.norm_first, self.final_norm = model.config.norm_first, dec.final_norm
        self.checks: list = []  # the packed copies relied on: usable only while unchanged
        self.layers = []
        sdpa = F.scaled_dot_product_attention  # where a layer sets no `step_attention`: the model's own
        for layer in dec.layers:
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
            norms = tuple((n.normalized_shape, n.weight, n.bias, n.eps, True) for n in (layer.norm1, layer.norm2, layer.norm3))
            self.layers.append((
                self._linear(sa.in_proj), self._linear(sa.out_proj), self._linear(ca.in_proj, ca.q_rows),
                self._linear(ca.out_proj), self._linear(ffn.w_1), self._linear(ffn.w_2), norms,
                sa.step_attention or sdpa, ca.step_attention or sdpa, sa.n_heads, sa.d_k, sa.d_v,
            ))
        if model.output_proj is None:  # tied to the embedding matrix, unpacked (`Transformer.logits`)
            weight = dec.embed.weight
            project = lambda x: F.linear(x, weight)  # noqa: E731
        else:
            project = self._linear(model.output_proj)
        bias = model.output_bias  # ModelConfig.output_bias (not in the paper)
        self.logits = project if bias is None else (lambda x: project(x) + bias)
        self.swish = model.config.activation == "swish"  # ModelConfig.activation (not in the paper)
        dtypes = {c.dtype for c in self.checks}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else (None if not dtypes else "mixed")
        self._versions = [(c.source, c.version, c.ptr, getattr(c, "bias", None), getattr(c, "bias_version", None))
                          for c in self.checks]

    def _linear(self, layer, rows: slice | None = None):
        """fn(x, activation) = x W[rows]^T + b[rows], as `layer` runs it (`decode.PackedLinear.forward`);
        the packed copy it relies on (none for a plain `nn.Linear`) joins `checks`."""
        w, b = layer.weight, layer.bias
        if rows is not None:
            w, b = w[rows], None if b is None else b[rows]
        packed = layer.packed_for(rows) if hasattr(layer, "packed_for") else None  # a `decode.PackedLinear`
        if packed is None:
            def plain(x: Tensor, activation: str = "none") -> Tensor:
                y = F.linear(x, w, b)
                return F.relu(y) if activation == "relu" else y
            return plain
        self.checks.append(packed)
        return lambda x, activation="none": packed(x, b, activation)

    def usable(self, tgt: Tensor) -> bool:
        """Whether this step computes what the model's would: one position, eval mode, no autograd
        or autocast, activations in the packed weights' dtype, every packed copy current."""
        if (tgt.size(1) != 1 or tgt.numel() == 0 or self.model.training or torch.is_grad_enabled()
                or torch.is_autocast_enabled(tgt.device.type) or self.dtype not in (None, self.embed.dtype)):
            return False
        return all(source._version == version and source.data_ptr() == ptr
                   and (bias is None or bias._version == bias_version)
                   for source, version, ptr, bias, bias_version in self._versions)

    def __call__(self, tgt: Tensor, cache: DecoderCache) -> Tensor:
        if not self.usable(tgt):
            return Transformer.decode_step(self.model, tgt, cache)
        pre = self.norm_first
        norm = torch.layer_norm  # F.layer_norm's own call, without its Python wrapper
        x = torch.embedding(self.embed, tgt) * self.scale + self.positions(1, offset=cache.length)  # (R, 1, d_model)
        R = x.size(0)
        for (qkv, w_o, q_c, w_oc, w_1, w_2, (n1, n2, n3), self_att, cross_att, h, d_k, d_v), lc in zip(
                self.layers, cache.begin_step()):
            # masked self-attention over the cache (3.2.3)
            q, k, v = qkv(norm(x, *n1) if pre else x).split([h * d_k, h * d_k, h * d_v], -1)
            k, v = lc.append(k.view(R, 1, h, d_k).transpose(1, 2), v.view(R, 1, h, d_v).transpose(1, 2))
            a = self_att(q.view(R, 1, h, d_k).transpose(1, 2), k, v, None).transpose(1, 2).reshape(R, 1, h * d_v)
            x = x + w_o(a) if pre else norm(x + w_o(a), *n1)
            # encoder-decoder attention: the g beams of a source folded into one row's queries,
            # and unfolded as the heads are concatenated (the model's own `fold_beams`, `concat_heads`)
            g = R // lc.cross_k.size(0)
            q = fold_beams(q_c(norm(x, *n2) if pre else x).view(R, 1, h, d_k).transpose(1, 2), g)
            a = w_oc(concat_heads(cross_att(q, lc.cross_k, lc.cross_v, cache.src_mask), g))
            x = x + a if pre else norm(x + a, *n2)
            # the position-wise FFN (equation 2)
            f = norm(x, *n3) if pre else x
            f = w_2(F.silu(w_1(f)) if self.swish else w_1(f, "relu"))  # W_1's ReLU inside a packed product, else after it
            x = x + f if pre else norm(x + f, *n3)
        cache.length += 1
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.logits(x)


def install(model: Transformer) -> bool:
    """Set a `FastStep` as `model.decode_step` where it covers the model (returns whether it did);
    `uninstall` takes it away."""
    if not covers(model.config) or model.word_positions is not None or model.decoder.words is not None:
        return False
    model.decode_step = FastStep(model)
    return True


def uninstall(model: Transformer) -> None:
    """Take away the `FastStep` that `install` set."""
    if isinstance(model.__dict__.get("decode_step"), FastStep):
        del model.__dict__["decode_step"]


def refresh(model) -> None:
    """Rebuild the `FastStep` of every model inside `model` that has one, after its layers were
    packed, unpacked, quantized or put back: it never runs on layers the model no longer has."""
    for m in model.modules():
        if isinstance(m, Transformer) and isinstance(m.__dict__.get("decode_step"), FastStep):
            uninstall(m)
            install(m)
