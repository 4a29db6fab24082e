"""What compiling a whole decoding step buys on the CPU: transduce's eager `decode_step` against the
same step written as one function and compiled by Inductor (a measurement, not a product path).

    OMP_NUM_THREADS=1 python benchmarks/compiled_step.py --dtype bf16
    OMP_NUM_THREADS=1 [AVX2 env] python benchmarks/compiled_step.py --dtype fp32
    OMP_NUM_THREADS=1 python benchmarks/compiled_step.py --dtype int8     # needs torchao
    OMP_NUM_THREADS=1 python benchmarks/compiled_step.py --whole-step     # int8, the search included

The setting of `decode_speed.py` / `step_time.py`: random weights of a preset, 32 sources of 20
tokens, beam 4 (128 hypotheses), one thread. "eager" is `Transformer.decode_step` as `translate`
runs it (`--precision` fp32, bf16 or int8: the same preparation as `decode_speed.py`), timed inside
a beam search forced to 30 steps, per cached length. "compiled" is the decoder's step (embedding,
N post-norm layers: self-attention over the cache with the beam reorder gathered, encoder-decoder
attention with the beams folded into the queries, the FFN; then the logits), a pure function of
the cache tensors, `torch.compile(dynamic=True)` with Inductor's freezing and (by default) its C++
wrapper; for int8 the same function quantized by PyTorch's own x86 flow first (torchao's PT2E
`X86InductorQuantizer`, dynamic activations, on the linear layers only, as `--precision int8`;
`torch.export` with the cached length dynamic; the script checks that every linear layer was
quantized). Both exclude the search (log-softmax, ranking). Prints ms per step at three cached
lengths and the compile time. `--whole-step`: the whole beam step, search included, of eager int8,
of the same search with the compiled int8 step, and of CTranslate2 int8, interleaved in one process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_speed as ds  # noqa: E402

SOURCES, BEAM, SRC_LEN, STEPS = 32, 4, 20, 30
LENGTHS = (6, 16, 30)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Linear:
    """An `nn.Linear` holding `weight` (and `bias`) themselves, not copies: PyTorch's int8 flow
    quantizes `nn.Linear` modules, not `F.linear` calls."""
    layer = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None)
    layer.weight = nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach(), requires_grad=False)
    return layer


class Step(nn.Module):
    """One decoding step of `model`'s decoder as a pure function of the cache tensors (post-norm,
    no attention bias), every product an `nn.Linear` over `model`'s own weights."""

    def __init__(self, model):
        super().__init__()
        self.m, c = model, model.config
        self.qkv, self.self_out, self.cross_q, self.cross_out, self.ff1, self.ff2 = (nn.ModuleList() for _ in range(6))
        for layer in model.decoder.layers:
            sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.feed_forward
            self.qkv.append(_linear(sa.in_proj.weight))
            self.self_out.append(_linear(sa.out_proj.weight))
            self.cross_q.append(_linear(ca.in_proj.weight[: c.d_model]))
            self.cross_out.append(_linear(ca.out_proj.weight))
            self.ff1.append(_linear(ffn.w_1.weight, ffn.w_1.bias))
            self.ff2.append(_linear(ffn.w_2.weight, ffn.w_2.bias))
        self.logits = _linear(model.decoder.embed.weight)  # the tied pre-softmax projection (3.4)

    def forward(self, tok, pe, rows, self_k, self_v, cross_k, cross_v, src_bias):
        m, c = self.m, self.m.config
        R, h = tok.size(0), c.n_heads
        dk = c.d_model // h
        x = F.embedding(tok, m.decoder.embed.weight) * m.decoder.embed.scale + pe
        new_k, new_v = [], []
        for i, layer in enumerate(m.decoder.layers):
            q, k, v = self.qkv[i](x).view(R, 3, h, dk).unbind(1)
            K = torch.cat([self_k[i].index_select(0, rows), k[:, :, None]], 2)  # (R, h, T + 1, dk)
            V = torch.cat([self_v[i].index_select(0, rows), v[:, :, None]], 2)
            new_k.append(K)
            new_v.append(V)
            s = torch.matmul(q[:, :, None], K.transpose(2, 3)).float() * dk**-0.5
            a = torch.matmul(s.softmax(-1).to(x.dtype), V).reshape(R, -1)
            x = F.layer_norm(x + self.self_out[i](a), (c.d_model,), layer.norm1.weight, layer.norm1.bias,
                             c.layer_norm_eps)
            B = cross_k[i].size(0)
            qc = self.cross_q[i](x).view(B, R // B, h, dk).transpose(1, 2)
            s = torch.matmul(qc, cross_k[i].transpose(2, 3)).float() * dk**-0.5 + src_bias
            a = torch.matmul(s.softmax(-1).to(x.dtype), cross_v[i]).transpose(1, 2).reshape(R, -1)
            x = F.layer_norm(x + self.cross_out[i](a), (c.d_model,), layer.norm2.weight, layer.norm2.bias,
                             c.layer_norm_eps)
            x = F.layer_norm(x + self.ff2[i](F.relu(self.ff1[i](x))), (c.d_model,), layer.norm3.weight,
                             layer.norm3.bias, c.layer_norm_eps)
        return self.logits(x).float(), new_k, new_v


def step_inputs(model, dtype: torch.dtype, T: int, vocab: int):
    c = model.config
    g = torch.Generator().manual_seed(T)
    R, h, dk, n = SOURCES * BEAM, c.n_heads, c.d_model // c.n_heads, c.n_layers

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    return (torch.randint(4, vocab, (R,), generator=g), rand(c.d_model), torch.randperm(R, generator=g),
            [rand(R, h, T, dk) for _ in range(n)], [rand(R, h, T, dk) for _ in range(n)],
            [rand(SOURCES, h, SRC_LEN, dk) for _ in range(n)], [rand(SOURCES, h, SRC_LEN, dk) for _ in range(n)],
            torch.zeros(SOURCES, 1, 1, SRC_LEN))


def eager_times(preset: str, precision: str) -> dict[int, float]:
    """ms of `decode_step` per cached length, inside a forced beam search, as `translate` runs it."""
    vocab = ds.SIZES[preset]
    src = torch.randint(4, vocab, (SOURCES, SRC_LEN), generator=torch.Generator().manual_seed(0))
    model = ds.build_transduce(0, preset).eval()
    ds.prepare_transduce(model, precision)
    forced, inner, times = ds.ForcedLength(model), model.decode_step, {}

    def timed(tgt, cache):
        t0 = time.perf_counter()
        out = inner(tgt, cache)
        if tgt.size(0) == SOURCES * BEAM:
            times.setdefault(cache.length, []).append(time.perf_counter() - t0)
        return out

    model.decode_step = timed
    for i in range(10):
        if i == 2:
            times.clear()  # two warm-up passes
        ds.run_transduce(forced, src, STEPS, precision)
    return {T: 1e3 * statistics.median(times[T]) for T in LENGTHS}


def _linears_only_quantizer():
    """PyTorch's x86 int8 recipe (torchao's PT2E `X86InductorQuantizer`, dynamic activations) on the
    linear layers only, as `int8.quantize_int8`: its global recipe also quantizes attention's
    products and products by tensors."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    class Quantizer(X86InductorQuantizer):
        def _annotate_matmul(self, *args, **kwargs):
            pass

        def _annotate_mul_tensor(self, *args, **kwargs):
            pass

    return Quantizer().set_global(get_default_x86_inductor_quantization_config(is_dynamic=True))


def compile_step(model, precision: str, cpp_wrapper: bool = True, freezing: bool = True):
    """`Step(model)` compiled by Inductor with the cached length dynamic; for int8 quantized first by
    PyTorch's own flow (`torch.export`, PT2E, the linear layers), the rest in fp32. `model` in the
    step's dtype (fp32 for int8)."""
    import torch._inductor.config as inductor

    inductor.cpp_wrapper, inductor.freezing = cpp_wrapper, freezing
    dtype = next(model.parameters()).dtype
    vocab, n = model.config.src_vocab_size, model.config.n_layers
    step = Step(model).eval()
    if precision == "int8":
        from torch.export import Dim
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        T = Dim("T", min=1, max=1024)
        shapes = (None, None, None, [{2: T}] * n, [{2: T}] * n, [None] * n, [None] * n, None)
        with torch.no_grad():
            graph = torch.export.export(step, step_inputs(model, dtype, 7, vocab), dynamic_shapes=shapes).module()
            graph = prepare_pt2e(graph, _linears_only_quantizer())
            for t in (3, 9, 20):  # calibration (dynamic activations: only the weights' ranges matter)
                graph(*step_inputs(model, dtype, t, vocab))
            step = convert_pt2e(graph)
        quantized = sum(node.target == torch.ops.quantized_decomposed.dequantize_per_channel.default
                        for node in step.graph.nodes)
        print(f"PT2E: {quantized} of {6 * n + 1} linear layers' weights quantized")
    return torch.compile(step, dynamic=True)


def compiled_times(preset: str, precision: str, cpp_wrapper: bool, freezing: bool) -> tuple[dict[int, float], float]:
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = ds.build_transduce(0, preset).eval().to(dtype)
    vocab = ds.SIZES[preset]
    fn = compile_step(model, precision, cpp_wrapper, freezing)
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(*step_inputs(model, dtype, 7, vocab))
        compile_s = time.perf_counter() - t0
        out = {}
        for T in LENGTHS:
            args = step_inputs(model, dtype, T - 1, vocab)  # T - 1 cached + this step's = T, as eager counts
            for _ in range(3):
                fn(*args)
            runs = []
            for _ in range(30):
                t0 = time.perf_counter()
                fn(*args)
                runs.append(time.perf_counter() - t0)
            out[T] = 1e3 * statistics.median(runs)
    return out, compile_s


def whole_step(preset: str, passes: int = 10) -> None:
    """ms per beam step of the forced search (`step_time.py`'s setting): eager int8 as `translate`
    runs it, the same search with the compiled int8 step (PT2E, fp32 around; the encoder and the
    first two steps, whose self-attention cache has fewer rows than hypotheses, eager fp32, packed),
    and CTranslate2 int8, interleaved."""
    import tempfile

    vocab = ds.SIZES[preset]
    src = torch.randint(4, vocab, (SOURCES, SRC_LEN), generator=torch.Generator().manual_seed(0))
    eager_model = ds.build_transduce(0, preset).eval()
    tmp = tempfile.TemporaryDirectory()
    ct2 = ds.build_ct2(eager_model, Path(tmp.name) / "m", 1, 1)["int8"]
    pieces = ds.ct2_pieces(vocab)
    tokens = [[pieces[i] for i in row.tolist()] for row in src]
    ds.prepare_transduce(eager_model, "int8")
    model = ds.build_transduce(0, preset).eval()
    fn = compile_step(model, "int8")
    ds.prepare_transduce(model, "fp32")
    eager_step, R = model.decode_step, SOURCES * BEAM

    def compiled_decode_step(tgt, cache):
        if cache.length == 0 or tgt.size(0) != R or cache.layers[0].self_k.size(0) != R:
            return eager_step(tgt, cache)
        layers = cache.layers
        rows = cache.pending if cache.pending is not None else torch.arange(R)
        bias = torch.zeros(cache.src_mask.shape).masked_fill_(~cache.src_mask, float("-inf"))
        pe = model.decoder.positions(1, offset=cache.length)[0]
        logits, K, V = fn(tgt[:, 0], pe, rows, [x.self_k for x in layers], [x.self_v for x in layers],
                          [x.cross_k for x in layers], [x.cross_v for x in layers], bias)
        for layer, k, v in zip(layers, K, V):
            layer.self_k, layer.self_v, layer.pending = k, v, None
        cache.pending, cache.length = None, cache.length + 1
        return logits[:, None]

    model.decode_step = compiled_decode_step
    runs = {"transduce int8, eager": lambda: ds.run_transduce(ds.ForcedLength(eager_model), src, STEPS, "int8"),
            "transduce int8, step compiled": lambda: ds.run_transduce(ds.ForcedLength(model), src, STEPS, "fp32"),
            "CTranslate2 int8": lambda: ds.run_ct2(ct2, tokens, STEPS)}
    times = {name: [] for name in runs}
    for i in range(passes + 2):
        for name, run in runs.items():
            t = run()
            if i >= 2:  # two warm-up passes (the first compiles)
                times[name].append(t / STEPS * 1e3)
    print(f"{preset}, one thread, {SOURCES} x beam {BEAM} forced to {STEPS} steps, {passes} passes interleaved; "
          "ms per beam step (median):")
    for name, t in times.items():
        print(f"  {name:30s} {statistics.median(t):6.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("small", "base"), default="small")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="bf16",
                   help="eager: translate's --precision; compiled: the step in this type (int8: PT2E, fp32 around)")
    p.add_argument("--python-wrapper", action="store_true", help="Inductor's Python wrapper instead of its C++ one")
    p.add_argument("--no-freezing", action="store_true", help="weights as inputs, not constants")
    p.add_argument("--whole-step", action="store_true", help="int8: the whole beam step (search included) with the "
                   "compiled decoder step, against eager int8 and CTranslate2 int8")
    args = p.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe  # noqa: E402

    print("\n".join(describe()))
    if args.whole_step:
        whole_step(args.preset)
        return 0
    eager = eager_times(args.preset, args.dtype)
    compiled, compile_s = compiled_times(args.preset, args.dtype, not args.python_wrapper, not args.no_freezing)
    print(f"{args.preset} {args.dtype}, one thread, {SOURCES} x beam {BEAM}; compile {compile_s:.1f} s "
          f"(cpp_wrapper={not args.python_wrapper}, freezing={not args.no_freezing})")
    for T in LENGTHS:
        print(f"  cached length {T:2d}: eager decode_step {eager[T]:6.2f} ms   compiled {compiled[T]:6.2f} ms   "
              f"eager / compiled {eager[T] / compiled[T]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
