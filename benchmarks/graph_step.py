"""The decoding step as one CUDA graph: an experiment for the next GPU lease (`benchmarks/gpu.py`'s
`transduce-graph`), not part of transduce until a lease has measured it.

On an H200 beam search waits on the host: 2026-11-27's profile counted some 4,000 operator calls
a step for base (64 sentences x beam 4), the GPU busy 12% of the time (docs/RESULTS.md). A CUDA
graph replays a step's kernels with one launch. It needs fixed shapes and addresses, so
`GraphStep` keeps each layer's self-attention keys and values in buffers of a fixed capacity of
positions (two sets, A and B: a step gathers the rows of the surviving hypotheses from one set into
the other, writes the new position there and attends over it, and the next step goes the other
way), masks the positions not yet written, and takes the step's inputs (the new tokens, the
position, the parent rows) from tensors it owns. The first step (one row per sentence) runs the
model's own; from the second, `GraphStep` holds the cache's target side. It builds a new pair of
graphs when the rows change (a sentence finished), when the capacity is reached (twice as many
positions), or for a new search; everything else (training mode, autograd, autocast, several
positions, options outside the paper) goes to `Transformer.decode_step` after the keys and values
are handed back to the cache.

The same arithmetic as the model's step, except that self-attention runs over the capacity with
the unwritten positions masked (their weights exactly 0) and may pick another SDPA kernel: on the
GPU the logits agree to rounding, not bit for bit. On the CPU the step runs eagerly
(tests/test_gpu_bench.py compares it with the model's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.cache import DecoderCache
from transduce.fast_step import _linear
from transduce.model import Transformer


class _State:
    """The buffers and graphs of one search at one number of rows and one capacity."""

    def __init__(self, step: GraphStep, cache: DecoderCache, R: int, capacity: int):
        model, lead = step.model, cache.layers[0]
        p = next(model.parameters())
        self.cache, self.R, self.capacity = cache, R, capacity
        self.cross = [lc.cross_k for lc in cache.layers]  # a new object: the rows changed
        h, d = lead.cross_k.size(1), lead.cross_k.size(3)
        self.sets = [[(p.new_zeros(R, h, capacity, d), p.new_zeros(R, h, capacity, d)) for _ in cache.layers]
                     for _ in range(2)]
        n, rows = cache.length, cache.pending
        cache.pending = None
        for (K, V), lc in zip(self.sets[0], cache.layers):  # the cache's positions so far, reordered
            K[:, :, :n] = lc.self_k if rows is None else lc.self_k.index_select(0, rows)
            V[:, :, :n] = lc.self_v if rows is None else lc.self_v.index_select(0, rows)
        self.tok = torch.zeros(R, 1, dtype=torch.long, device=p.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=p.device)
        self.identity = torch.arange(R, device=p.device)
        self.parent = self.identity.clone()
        self.arange = torch.arange(capacity, device=p.device)
        self.pe = model.decoder.positions(capacity)  # (capacity, d_model)
        self.turn, self.out, self.graphs = 0, [None, None], None
        if p.device.type == "cuda":
            self.graphs = [self._capture(step, i) for i in (0, 1)]

    def _capture(self, step: GraphStep, i: int):
        self.pos.fill_(self.cache.length)  # warm-up writes land where the real step writes again
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step.body(self, self.sets[i], self.sets[1 - i])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out[i] = step.body(self, self.sets[i], self.sets[1 - i])
        return graph

    def give_back(self) -> None:
        """Hand the positions so far back to the cache (as views), for the model's own step."""
        n = self.cache.length
        for (K, V), lc in zip(self.sets[self.turn], self.cache.layers):
            lc.self_k, lc.self_v = K[:, :, :n], V[:, :, :n]
            lc._flat, lc._spare = [None, None], [None, None]


class GraphStep:
    """`model.decode_step` through CUDA graphs (see the module's doc)."""

    def __init__(self, model: Transformer, capacity: int = 64):
        c = model.config
        if c.attention_window is not None or model.word_positions is not None or model.decoder.words is not None:
            raise ValueError("GraphStep covers the paper's decoder only (no attention_window, no word_positions)")
        self.model, self.min_capacity, self.state = model, capacity, None
        dec = model.decoder
        self.embed, self.scale, self.norm_first, self.final_norm = dec.embed.weight, dec.embed.scale, model.config.norm_first, dec.final_norm
        self.layers = []
        for layer in dec.layers:
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
            norms = tuple((n.normalized_shape, n.weight, n.bias, n.eps, True) for n in (layer.norm1, layer.norm2, layer.norm3))
            self.layers.append((_linear(sa.in_proj)[0], _linear(sa.out_proj)[0], _linear(ca.in_proj, ca.q_rows)[0],
                                _linear(ca.out_proj)[0], _linear(ffn.w_1)[0], _linear(ffn.w_2)[0], norms,
                                sa.n_heads, sa.d_k, sa.d_v))
        weight = dec.embed.weight if model.output_proj is None else None
        self.logits = (lambda x: F.linear(x, weight)) if weight is not None else _linear(model.output_proj)[0]

    def __call__(self, tgt: Tensor, cache: DecoderCache) -> Tensor:
        st = self.state if self.state is not None and self.state.cache is cache else None
        usable = (tgt.size(1) == 1 and cache.length > 0 and not self.model.training and not torch.is_grad_enabled()
                  and not torch.is_autocast_enabled(tgt.device.type))
        if not usable:
            if st is not None:
                st.give_back()
                self.state = None
            return Transformer.decode_step(self.model, tgt, cache)
        R = tgt.size(0)
        if st is not None and (st.R != R or cache.length >= st.capacity
                               or any(a is not lc.cross_k for a, lc in zip(st.cross, cache.layers))):
            st.give_back()  # the rows changed or the buffers are full: build again from the cache
            st = None
        if st is None:
            capacity = self.min_capacity
            while capacity <= cache.length:
                capacity *= 2
            self.state = st = _State(self, cache, R, capacity)
        rows, cache.pending = cache.pending, None
        st.parent.copy_(st.identity if rows is None else rows)
        st.tok.copy_(tgt)
        st.pos.fill_(cache.length)
        i = st.turn
        if st.graphs is not None:
            st.graphs[i].replay()
            out = st.out[i]
        else:
            out = self.body(st, st.sets[i], st.sets[1 - i])
        st.turn = 1 - i
        cache.length += 1
        return out

    def body(self, st: _State, src: list, dst: list) -> Tensor:
        """One step on fixed buffers: gather the parents' keys/values from `src` into `dst`, add the
        new position, attend (3.2.3: positions after it masked), encoder-decoder attention, FFN."""
        pre, norm, R = self.norm_first, torch.layer_norm, st.R
        x = torch.embedding(self.embed, st.tok) * self.scale + st.pe.index_select(0, st.pos)  # (R, 1, d_model)
        seen = (st.arange <= st.pos).view(1, 1, 1, -1)
        for (qkv, w_o, q_c, w_oc, w_1, w_2, (n1, n2, n3), h, d_k, d_v), (Ks, Vs), (Kd, Vd), lc in zip(
                self.layers, src, dst, st.cache.layers):
            torch.index_select(Ks, 0, st.parent, out=Kd)
            torch.index_select(Vs, 0, st.parent, out=Vd)
            q, k, v = qkv(norm(x, *n1) if pre else x).split([h * d_k, h * d_k, h * d_v], -1)
            Kd.index_copy_(2, st.pos, k.view(R, 1, h, d_k).transpose(1, 2))
            Vd.index_copy_(2, st.pos, v.view(R, 1, h, d_v).transpose(1, 2))
            a = F.scaled_dot_product_attention(q.view(R, 1, h, d_k).transpose(1, 2), Kd, Vd, attn_mask=seen)
            a = w_o(a.transpose(1, 2).reshape(R, 1, h * d_v))
            x = x + a if pre else norm(x + a, *n1)
            g = R // lc.cross_k.size(0)
            q = q_c(norm(x, *n2) if pre else x).view(R // g, g, h, d_k).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, lc.cross_k, lc.cross_v, attn_mask=st.cache.src_mask)
            a = w_oc(a.transpose(1, 2).reshape(R, 1, h * d_v))
            x = x + a if pre else norm(x + a, *n2)
            f = w_2(w_1(norm(x, *n3) if pre else x, "relu"))
            x = x + f if pre else norm(x + f, *n3)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.logits(x)


def install(model: Transformer, capacity: int = 64) -> None:
    model.decode_step = GraphStep(model, capacity)


def uninstall(model: Transformer) -> None:
    if isinstance(model.__dict__.get("decode_step"), GraphStep):
        del model.__dict__["decode_step"]
