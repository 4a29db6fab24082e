"""Milliseconds per beam-search step, one system at a time: what bounds decoding per core.

    OMP_NUM_THREADS=1 python benchmarks/step_time.py --system ct2
    OMP_NUM_THREADS=1 python benchmarks/step_time.py --system transduce --profile

A batch of 32 random source sentences of 20 tokens, beam 4 forced to 30 steps (the setting of
`decode_speed.py`: random weights of the `small` or `base` preset, the same functions
`run_transduce` / `run_ct2`), run `--passes` times after two warm-up passes on one thread; prints
the time per step. `--profile` (transduce) adds torch.profiler's heaviest operators per step and
how many operator calls a step makes. Run it under the AVX2 environment of docs/speed.md to
imitate an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_speed as ds  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=("transduce", "ct2"), default="transduce")
    p.add_argument("--precision", default="int8", help="transduce: fp32, bf16 or int8; ct2: its compute type "
                   "(int8 or float32; default int8)")
    p.add_argument("--preset", choices=("small", "base"), default="small")
    p.add_argument("--passes", type=int, default=20, help="timed passes over the batch (default 20)")
    p.add_argument("--profile", action="store_true", help="transduce: the heaviest operators per step")
    args = p.parse_args()
    torch.set_num_threads(1)
    vocab, steps = ds.SIZES[args.preset], 30
    src = torch.randint(4, vocab, (32, 20), generator=torch.Generator().manual_seed(0))
    model = ds.build_transduce(0, args.preset)
    if args.system == "ct2":
        tmp = tempfile.TemporaryDirectory()
        translator = ds.build_ct2(model, Path(tmp.name) / "m", 1, 1)["int8" if args.precision == "int8" else "fp32"]
        pieces = ds.ct2_pieces(vocab)
        tokens = [[pieces[i] for i in row.tolist()] for row in src]
        run = lambda: ds.run_ct2(translator, tokens, steps)  # noqa: E731
    else:
        model = model.eval()
        ds.prepare_transduce(model, args.precision)
        forced = ds.ForcedLength(model)
        run = lambda: ds.run_transduce(forced, src, steps, args.precision)  # noqa: E731
    for _ in range(2):
        run()
    t0 = time.perf_counter()
    for _ in range(args.passes):
        run()
    per_step = (time.perf_counter() - t0) / args.passes / steps * 1e3
    print(f"{args.system} {args.preset} {args.precision}: {per_step:.2f} ms per step (one thread)")
    if args.profile and args.system == "transduce":
        from torch.profiler import ProfilerActivity, profile

        n = max(1, args.passes // 2)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                run()
        events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        calls = sum(e.count for e in events) / n / steps
        print(f"{calls:.0f} operator calls a step; heaviest (self time per step):")
        for e in events[:8]:
            print(f"  {e.key:45s} {e.self_cpu_time_total / n / steps / 1e3:6.2f} ms  ({e.count / n / steps:.1f} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
