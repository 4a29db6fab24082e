"""Table 1 of "Attention Is All You Need" (Section 4, "Why Self-Attention"), measured on this CPU:
per layer type, counted FLOPs, time, peak memory and their exponents of n, sequential operations
and the maximum path length (how each is measured: docs/table1.md).

    python -m benchmarks.table1 --out DIR                 # d = 512, n = 16 ... 4096 (a few minutes)
    python -m benchmarks.table1 --out DIR --max-n 1024    # a shorter range
    python -m benchmarks.table1 --out DIR --quick         # n = 64 ... 1024, one repeat: seconds

Layer types, each mapping n vectors of width d to n (batch 1, fp32, --threads threads): self-attention
(transduce's MultiHeadAttention, h = 8, SDPA), restricted self-attention as the model masks it
(|i - j| <= r, n x n scores) and banded (`banded_attention`: O(r n d)), recurrent (nn.LSTM(d, d),
oneDNN's kernel), convolution (nn.Conv1d, k = 3) and separable (depthwise k, then pointwise). A
layer type stops at the first n whose forward + backward takes more than --time-limit seconds or
--memory-limit GiB (or is predicted to). Writes DIR/table1.json (every point), DIR/table1.md (the
tables) and DIR/table1.png (log-log time and FLOPs against n).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from benchmarks.table1_report import figure, machine, markdown, summarize
from transduce.memory import glibc, release_free_memory as trim
from transduce.model import MultiHeadAttention
from transduce.restricted import window_mask

KINDS = ["self-attention", "restricted (masked)", "restricted (banded)", "recurrent", "convolution", "separable"]


def banded_attention(q: Tensor, k: Tensor, v: Tensor, r: int) -> Tensor:
    """Equation 1 with each query i attending the keys j with |i - j| <= r only, in O(r n d): the
    queries in blocks of r, each block against the 3r keys around it (the block before, its own,
    the one after; those outside the window masked). q, k, v (B, h, n, d) -> (B, h, n, d_v)."""
    B, h, n, d = q.shape
    nb = -(-n // r)  # blocks of r queries
    pad = nb * r - n
    qb = F.pad(q, (0, 0, 0, pad)).view(B, h, nb, r, d)
    kw = F.pad(k, (0, 0, r, r + pad)).unfold(2, 3 * r, r)  # (B, h, nb, d, 3r): keys (b-1)r .. (b+2)r-1
    vw = F.pad(v, (0, 0, r, r + pad)).unfold(2, 3 * r, r)
    scores = qb @ kw / math.sqrt(d)  # (B, h, nb, r, 3r)
    qi = torch.arange(nb * r, device=q.device).view(nb, r, 1)  # query position
    kj = (torch.arange(nb, device=q.device) * r - r).view(nb, 1, 1) + torch.arange(
        3 * r, device=q.device
    )  # key position
    allowed = ((qi - kj).abs() <= r) & (kj >= 0) & (kj < n)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return (weights @ vw.transpose(-1, -2)).view(B, h, nb * r, -1)[:, :, :n]


class SelfAttention(nn.Module):
    """transduce's MultiHeadAttention as a self-attention layer: full (window None), restricted by
    the model's mask (`window_mask`), or restricted by `banded_attention` (banded=True)."""

    def __init__(self, d: int, heads: int, window: int | None = None, banded: bool = False):
        super().__init__()
        self.attn = MultiHeadAttention(d, heads, d // heads, d // heads)
        self.window, self.banded = window, banded

    def forward(self, x: Tensor) -> Tensor:
        if self.banded:
            q, k, v = self.attn.project_qkv(x)
            out = banded_attention(q, k, v, self.window)
            return self.attn.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        mask = None if self.window is None else window_mask(x.size(1), window=self.window, device=x.device)
        return self.attn(x, mask=mask)[0]


class Recurrent(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lstm = nn.LSTM(d, d, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.lstm(x)[0]


class Convolution(nn.Module):
    """Conv1d over the positions ('same' padding); separable: depthwise k then pointwise 1x1;
    dilated: causal (position i reads i, i - dilation, ..., i - (k-1) dilation: ByteNet's and
    WaveNet's dilated convolutions, whose receptive field grows as k^L with dilation k^l)."""

    def __init__(self, d: int, k: int = 3, separable: bool = False, dilation: int = 1, causal: bool = False):
        super().__init__()
        self.left = dilation * (k - 1) if causal else 0  # causal: all the padding on the left
        pad = 0 if causal else k // 2
        if separable:
            self.conv = nn.Sequential(nn.Conv1d(d, d, k, padding=pad, groups=d), nn.Conv1d(d, d, 1))
        else:
            self.conv = nn.Conv1d(d, d, k, padding=pad, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        x = x.transpose(1, 2)
        return self.conv(F.pad(x, (self.left, 0)) if self.left else x).transpose(1, 2)


def make_layer(kind: str, d: int, heads: int = 8, r: int = 64, k: int = 3, dilation: int = 1) -> nn.Module:
    if kind == "self-attention":
        return SelfAttention(d, heads)
    if kind == "restricted (masked)":
        return SelfAttention(d, heads, window=r)
    if kind == "restricted (banded)":
        return SelfAttention(d, heads, window=r, banded=True)
    if kind == "recurrent":
        return Recurrent(d)
    if kind in ("convolution", "separable", "dilated convolution"):
        return Convolution(d, k, separable=kind == "separable", dilation=dilation, causal=kind == "dilated convolution")
    raise ValueError(f"unknown layer type {kind!r}")


def _flash_cpu(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _flash_cpu_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _lstm_layer(input, weight0, weight1, *args, out_shape=None, **kwargs) -> int:
    four_h, d_in = weight0
    h = weight1[1]
    tokens = math.prod(input) // input[-1]
    return 2 * tokens * four_h * (d_in + h)


def _lstm_layer_backward(input, weight1, weight2, *args, out_shape=None, **kwargs) -> int:
    return 2 * _lstm_layer(input, weight1, weight2)


FLOP_FORMULAS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _flash_cpu_backward,
    torch.ops.aten.mkldnn_rnn_layer: _lstm_layer,
    torch.ops.aten.mkldnn_rnn_layer_backward: _lstm_layer_backward,
}


def count_flops(layer: nn.Module, x: Tensor) -> tuple[int, int]:
    """(forward, backward) FLOPs of one pass, FlopCounterMode with FLOP_FORMULAS."""
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as fwd:
        y = layer(x)
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as bwd:
        y.backward(torch.randn_like(y))
    return fwd.get_total_flops(), bwd.get_total_flops()


def time_point(layer: nn.Module, x: Tensor, budget_s: float, max_repeats: int) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of each repeat, after one warm-up; repeats until `budget_s`
    is spent (at least 2, at most max_repeats)."""
    g = torch.randn_like(layer(x).detach())
    layer(x).backward(g)  # warm-up
    fwd, bwd, started = [], [], time.perf_counter()
    while len(fwd) < max_repeats and (len(fwd) < 2 or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        y = layer(x)
        t1 = time.perf_counter()
        y.backward(g)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        x.grad = None
    return fwd, bwd


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def fix_mmap_threshold(nbytes: int = 64 * 1024) -> bool:
    """glibc: allocations of nbytes or more mapped afresh and unmapped when freed (mallopt)."""
    libc = glibc()
    return bool(libc and libc.mallopt(-3, nbytes))  # M_MMAP_THRESHOLD


def release_free_memory() -> None:
    """glibc keeps freed heap memory resident and serves later allocations from it before it maps
    any: give it back (malloc_trim), so that what a point allocates shows in the resident set."""
    gc.collect()
    trim()


def peak_memory(layer: nn.Module, x: Tensor) -> int:
    """Bytes of resident memory one forward + backward adds at its peak (see the module docstring)."""
    g = torch.randn_like(layer(x).detach())
    x.grad = None
    for p in layer.parameters():
        p.grad = None
    release_free_memory()
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    layer(x).backward(g)
    return max(0, _status_kib("VmHWM") - base) * 1024


PRODUCTS = ("mm", "bmm", "addmm", "baddbmm", "convolution", "_scaled_dot_product", "mkldnn_rnn", "linear", "matmul")


class ProductDepth(TorchDispatchMode):
    """Tracks, for every tensor an op makes, the longest chain of matrix products that led to it
    (each needing the result of the one before): an op's outputs get 1 + the deepest input if the
    op is a product, the deepest input otherwise. Inputs start at 0."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = [a for a in (*args, *kwargs.values()) for a in (a if isinstance(a, (list, tuple)) else [a])]
        depth = max((getattr(a, "_depth", 0) for a in flat if isinstance(a, Tensor)), default=0)
        name = func.__name__.split(".")[0]
        depth += any(name.startswith(p) for p in PRODUCTS)
        for o in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(o, Tensor):
                o._depth = max(depth, getattr(o, "_depth", 0))  # in place: the deeper of the two
        return out


def product_depth(module: nn.Module, x: Tensor) -> int:
    """The longest chain of dependent products from x to module(x), traced (LSTM: torch's
    step-by-step kernel, oneDNN's off, so that every step is an op)."""
    with warnings.catch_warnings():  # (the flags' setter warns about Intel GPUs' TF32)
        warnings.simplefilter("ignore")
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), ProductDepth():
            y = module(x)
    return getattr(y, "_depth", 0)


def path_layers(kind: str, n: int, d: int, r: int, k: int, max_layers: int, backwards: bool = False) -> dict:
    """Fewest stacked layers for output position n to depend on input position 1 (or 1 on n, with
    `backwards`), by the gradient; with the traced chain of dependent products of that stack."""
    torch.manual_seed(0)
    x = torch.randn(1, n, d, dtype=torch.float64, requires_grad=True)
    layers = [
        make_layer(kind, d, heads=2, r=r, k=k, dilation=k**i if kind == "dilated convolution" else 1).double()
        for i in range(max_layers)
    ]

    def reaches(depth: int) -> bool:
        h = x
        for layer in layers[:depth]:
            h = layer(h)
        (grad,) = torch.autograd.grad(h[0, 0 if backwards else n - 1].sum(), x)
        return bool(grad[0, n - 1 if backwards else 0].abs().max() > 0)

    lo, hi = 0, 1  # reaching is monotone in the depth: double, then bisect
    while not reaches(hi):
        if hi == max_layers:
            return {"layers": None, "products_on_path": None}  # not reached (causal, or beyond max_layers)
        lo, hi = hi, min(2 * hi, max_layers)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return {"layers": hi, "products_on_path": product_depth(nn.Sequential(*layers[:hi]), x.detach())}


def run(args) -> dict:
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    ns = (
        [n for n in (64, 128, 256, 512, 1024) if n <= args.max_n]
        if args.quick
        else [2**i for i in range(4, 20) if 2**i <= args.max_n]
    )
    kinds = args.kinds or KINDS
    result = {"d": args.d, "r": args.r, "k": args.k, "ns": ns, "points": {}, "stopped": {}, "machine": machine()}
    m = result["machine"]
    print(
        f"CPU: {m['cpu']} | ISA: {', '.join(m['isa'])} (torch: {m['torch_capability']}) | torch {m['torch']} | "
        f"threads {m['threads']}",
        flush=True,
    )
    bar = tqdm(total=len(kinds) * len(ns), desc="Table 1", unit="point", file=sys.stderr)
    for kind in kinds:
        torch.manual_seed(0)
        layer = make_layer(kind, args.d, r=args.r, k=args.k)
        pts, predicted = [], 0.0
        for n in ns:
            if predicted > args.time_limit:
                result["stopped"][kind] = {
                    "n": pts[-1]["n"],
                    "why": f"n = {n} predicted {predicted:.0f} s > {args.time_limit} s",
                }
                bar.update(len(ns) - ns.index(n))
                break
            bar.set_postfix_str(f"{kind}, n = {n}")
            x = torch.randn(1, n, args.d, requires_grad=True)
            flops_fwd, flops_bwd = count_flops(layer, x)
            q, k, v = (t.detach() for t in layer.attn.project_qkv(x)) if hasattr(layer, "attn") else (None,) * 3
            with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as att:  # equation 1 alone
                if kind.startswith("self") or kind.startswith("restricted"):
                    with torch.no_grad():
                        banded_attention(q, k, v, args.r) if layer.banded else F.scaled_dot_product_attention(
                            q, k, v, attn_mask=None if layer.window is None else window_mask(n, window=layer.window)
                        )
            x.grad = None
            fwd, bwd = time_point(layer, x, args.budget, args.repeats)
            t_fwd, t_bwd = min(fwd), min(bwd)  # the fastest repeat: the usual defence against interference
            pts.append(
                {
                    "n": n,
                    "flops_fwd": flops_fwd,
                    "flops_bwd": flops_bwd,
                    "flops_attention_fwd": att.get_total_flops(),
                    "time_fwd": t_fwd,
                    "time_bwd": t_bwd,
                    "median_fwd": statistics.median(fwd),
                    "median_bwd": statistics.median(bwd),
                    "repeats": len(fwd),
                }
            )
            bar.update()
            total = t_fwd + t_bwd
            predicted = total * 4.0  # the next n is twice this one: at most quadratic
            if total > args.time_limit:
                result["stopped"][kind] = {"n": n, "why": f"{total:.1f} s > {args.time_limit} s"}
                bar.update(len(ns) - ns.index(n) - 1)
                break
        result["points"][kind] = pts
    bar.close()

    if not args.no_memory:  # a pass of its own: mapping every allocation afresh slows the timings
        fixed = fix_mmap_threshold()
        result["memory_method"] = "peak RSS (VmHWM after /proc/self/clear_refs) above the RSS before the pass, " + (
            "glibc mmap threshold fixed at 64 KiB" if fixed else "glibc's default allocator"
        )
        for kind in tqdm(list(result["points"]), desc="memory", unit="type", file=sys.stderr):
            torch.manual_seed(0)
            layer = make_layer(kind, args.d, r=args.r, k=args.k)
            for p in result["points"][kind]:
                p["memory"] = peak_memory(layer, torch.randn(1, p["n"], args.d, requires_grad=True))
                if p["memory"] > args.memory_limit * 2**30:
                    result["stopped"][kind] = {
                        "n": p["n"],
                        "why": f"{p['memory'] / 2**30:.1f} GiB > {args.memory_limit} GiB",
                    }
                    result["points"][kind] = [q for q in result["points"][kind] if q["n"] <= p["n"]]
                    break

    result["seq_n"] = (16, 32)
    result["sequential"] = {
        kind: [
            product_depth(make_layer(kind, 16, heads=2, r=4, k=args.k), torch.randn(1, n, 16)) for n in result["seq_n"]
        ]
        for kind in KINDS
    }
    result["path_n"], result["path_r"] = args.path_n, args.path_r
    result["path"] = {}
    dilated_max = math.ceil(math.log(args.path_n, args.k)) + 2 if args.k > 1 else 1  # dilations grow as k^l
    for kind in tqdm(
        ["self-attention", "restricted (masked)", "recurrent", "convolution", "separable", "dilated convolution"],
        desc="path length",
        unit="type",
        file=sys.stderr,
    ):
        causal = kind in ("recurrent", "dilated convolution")
        most = dilated_max if kind == "dilated convolution" else args.path_n
        result["path"][kind] = {
            "forward": path_layers(kind, args.path_n, 16, args.path_r, args.k, most),
            "backward": path_layers(kind, args.path_n, 16, args.path_r, args.k, 1 if causal else most, backwards=True),
        }
    result["summary"] = summarize(result)
    result["largest"] = max(p["n"] for pts in result["points"].values() for p in pts)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for table1.json, table1.md, table1.png")
    p.add_argument("--max-n", type=int, default=4096, help="largest sequence length (default 4096; n = 16, 32, ...)")
    p.add_argument("--quick", action="store_true", help="n = 64 ... 1024 at most, one timed repeat: seconds")
    p.add_argument("--d", type=int, default=512, help="width d (default 512)")
    p.add_argument("--r", type=int, default=64, help="window of restricted self-attention (default 64)")
    p.add_argument("--k", type=int, default=3, help="convolution kernel width (default 3)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per point at most (default 7)")
    p.add_argument("--budget", type=float, default=1.5, help="seconds of timed repeats per point (at least 2 repeats)")
    p.add_argument("--time-limit", type=float, default=20.0, help="stop a layer type past this forward+backward s")
    p.add_argument("--memory-limit", type=float, default=8.0, help="stop a layer type past this peak GiB")
    p.add_argument("--path-n", type=int, default=128, help="length for the path-length stacks (default 128)")
    p.add_argument("--path-r", type=int, default=8, help="window of the restricted stacks (default 8: n/r layers)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, help="only these layer types")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.budget = min(args.repeats, 2), 0.0
        args.max_n = min(args.max_n, 1024)
    if args.max_n < 16 or args.d % 8 or min(args.r, args.k, args.threads, args.path_n, args.path_r) < 1:
        p.error("need --max-n >= 16, --d a multiple of 8 (h = 8), and positive --r, --k, --threads, --path-n, --path-r")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (out / "table1.json").write_text(json.dumps(result, indent=1))
    (out / "table1.md").write_text(markdown(result))
    figure(result, out / "table1.png")
    print(markdown(result))
    print(f"wrote {out / 'table1.json'}, {out / 'table1.md'}, {out / 'table1.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
