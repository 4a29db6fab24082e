"""F.linear against oneDNN with the weight pre-packed (what `transduce.kernels.pack_weights` uses), at
the shapes of one step of base-size beam search: M rows (32 sentences x beam 4 = 128) times the
decoder's weight matrices (W^Q W^K W^V together, W^O, FFN in and out) and the 37,000-way output
layer, in fp32 and bf16.

    python benchmarks/linear_packing.py [THREADS [M]]      # defaults: 2 threads, M = 128

Prints per shape the best of 3 timings of each path and the total for one decoding step (six
layers: self-attention QKV and W^O, encoder-decoder Q and W^O, FFN; plus the output layer).
"""
import argparse
import time

import torch

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("threads", nargs="?", type=int, default=2, help="PyTorch threads (default 2)")
parser.add_argument("rows", nargs="?", type=int, default=128, metavar="M",
                    help="rows of each product (default 128: 32 sentences x beam 4)")
args = parser.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
M = args.rows
shapes = [(512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 37000)]  # (in, out)


def timeit(f, n):
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n


with torch.inference_mode():
    for dtype in (torch.float32, torch.bfloat16):
        tot = {"F.linear": 0.0, "packed": 0.0}
        for K, N in shapes:
            x = torch.randn(M, K, dtype=dtype)
            w = (torch.randn(N, K) * 0.05).to(dtype)
            b = torch.randn(N, dtype=dtype) if N != 37000 else None
            wp = torch.ops.mkldnn._reorder_linear_weight(w, M)
            fa = lambda: torch.nn.functional.linear(x, w, b)  # noqa: E731
            fb = lambda: torch.ops.mkldnn._linear_pointwise(x, wp, b, "none", [], "")  # noqa: E731
            d = (fa().float() - fb().float()).abs().max().item()
            n = max(3, int(2e9 / (2 * M * K * N)))
            res = {}
            for rep in range(3):
                for name, f in (("F.linear", fa), ("packed", fb)):
                    res.setdefault(name, []).append(timeit(f, n))
            line = f"{str(dtype)[6:]:9s} {K:5d}x{N:<6d}"
            for name, ts in res.items():
                t = min(ts)
                # one step: 6 decoder layers (512x512 three times: self W^O, cross Q, cross W^O), 1 output layer
                tot[name] += t * (6 if N != 37000 else 1) * (3 if (K, N) == (512, 512) else 1)
                line += f"  {name} {t*1e3:7.3f} ms {2*M*K*N/t/1e9:6.0f} GF/s"
            print(line + f"  maxdiff {d:.2e}", flush=True)
        print(f"{dtype}: per decode step (6 layers + output) F.linear {tot['F.linear']*1e3:.1f} ms, "
              f"packed {tot['packed']*1e3:.1f} ms")
