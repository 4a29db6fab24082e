"""What justifies a row of `transduce.precision.CPU_TABLE` on this CPU: the products of a decoding
step, and of a training step's FFN, timed in each precision at a preset's sizes.

    python -m benchmarks.precision_table                        # small and base, the threads PyTorch has
    OMP_NUM_THREADS=1 python -m benchmarks.precision_table --threads 1
    [AVX2 env] python -m benchmarks.precision_table             # a CPU without bf16, imitated

Decoding: one decoder layer's products ([W^Q; W^K; W^V], W^O, cross-attention's query and output,
the FFN with its ReLU) and the pre-softmax projection over the whole vocabulary, for 128
hypotheses (32 sentences x beam 4), as `translate` runs them: packed fp32, packed bf16, and int8
(`transduce.fast.int8.Int8Weight`, over bf16 where the CPU has it natively, else fp32) with every
layer in int8 ("int8") or the projection alone ("int8-out"). Training: the FFN's two products at
2048 rows, fp32 against bf16 autocast. The fastest of --rounds alternating rounds. Prints the
CPU's flags, the row the table takes, and each precision's speed as a multiple of fp32's: a row
is right where the precision it names is the fastest measured here by a clear margin.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from transduce.config import get_preset
from transduce.fast.decode import PackedWeight, can_pack
from transduce.fast.int8 import Int8Weight, can_int8
from transduce.precision import cpu_row, read_capability

VOCAB = {"small": 8000, "base": 37000}


def fastest(calls: dict, rounds: int) -> dict[str, float]:
    """The fastest of `rounds` alternating timings of each call, after one warm-up each."""
    times = {name: [] for name in calls}
    with torch.inference_mode():
        for call in calls.values():
            call()
        for _ in range(rounds):
            for name, call in calls.items():
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
    return {name: min(t) for name, t in times.items()}


def product(w: torch.Tensor, kind: str):
    """A product with `w` as `translate` runs it: "packed" (oneDNN, else F.linear) or "int8"."""
    if kind == "int8":
        return Int8Weight(w)
    if can_pack(w.dtype, "cpu"):
        return PackedWeight(w)
    return lambda x, b, act="none": F.linear(x, w) if act == "none" else F.linear(x, w).relu()


def decoding_step(d: int, f: int, vocab: int, dtype: torch.dtype, int8: str | None, rows: int = 128):
    """One decoder layer's products and the projection, as a function of no arguments."""
    g = torch.Generator().manual_seed(0)
    shapes = [(3 * d, d), (d, d), (d, d), (d, d), (f, d), (d, f), (vocab, d)]
    ws = [torch.rand(s, generator=g).sub_(0.5).mul_(s[1] ** -0.5).to(dtype) for s in shapes]
    ps = [product(w, "int8" if int8 == "all" or (int8 == "output" and i == 6) else "packed") for i, w in enumerate(ws)]
    x = torch.randn(rows, d, generator=g).to(dtype)

    def step() -> None:
        for p in ps[:4]:
            p(x, None)
        ps[5](ps[4](x, None, "relu"), None)
        ps[6](x, None)

    return step


def training_ffn(d: int, f: int, bf16: bool, rows: int = 2048):
    x, w1, w2 = torch.full((rows, d), 0.5), torch.full((f, d), 0.01), torch.full((d, f), 0.01)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            F.linear(F.linear(x, w1).relu_(), w2)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,base")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cap = read_capability("cpu")
    row = cpu_row(cap)
    print(f"{cap.name}: {cap.detail}; {torch.get_num_threads()} thread(s), torch {torch.__version__}")
    print(f"the table: auto {row.auto}, auto-int8 {row.auto_int8} ({row.why})")
    base = torch.bfloat16 if cap.native_bf16 else torch.float32
    for preset in args.presets.split(","):
        m = get_preset(preset).model
        d, f, v = m.d_model, m.d_ff, VOCAB.get(preset, m.target_vocab_size)
        calls = {
            "fp32": decoding_step(d, f, v, torch.float32, None),
            "bf16": decoding_step(d, f, v, torch.bfloat16, None),
        }
        if can_int8():
            calls["int8"] = decoding_step(d, f, v, base, "all")
            calls["int8-out"] = decoding_step(d, f, v, base, "output")
        t = fastest(calls, args.rounds)
        decode = ", ".join(f"{p} {t['fp32'] / t[p]:.2f}x" for p in calls)
        t = fastest({"fp32": training_ffn(d, f, False), "bf16": training_ffn(d, f, True)}, max(3, args.rounds // 3))
        print(
            f"{preset} (d_model {d}, d_ff {f}, vocab {v:,}): decoding step's products {decode}; "
            f"training FFN bf16 {t['fp32'] / t['bf16']:.2f}x (speed over fp32's)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
