"""Which layers int8 should take on this CPU: the float type against int8 with every layer of the
decoding step (`TRANSDUCE_INT8_LAYERS=decoder`) and with the pre-softmax projection alone
(`=output`), in one process, rounds interleaved (order reversed every other round), so that the
machine's drift touches all three alike.

    OMP_NUM_THREADS=1 python benchmarks/int8_layers.py --preset small --threads 1 --rounds 10
    OMP_NUM_THREADS=2 python benchmarks/int8_layers.py --preset base --threads 2 --rounds 4
    [AVX2 env] OMP_NUM_THREADS=1 python benchmarks/int8_layers.py ...   # the float type is then fp32

The work is `decode_speed.py`'s: random weights of the preset, a batch of 32 random source
sentences of 20 tokens, beam 4 forced to 30 steps; each variant built as `translate` builds it
(`int8.quantize_int8` over bf16 weights where the CPU computes bf16 natively, the float layers
left packed). Prints milliseconds per beam step for every round and the median. The default of
`--precision int8` follows from such runs: with AMX the projection alone (docs/speed.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_speed as ds  # noqa: E402
import machine  # noqa: E402

from transduce import int8, kernels  # noqa: E402
from transduce.precision import read_capability  # noqa: E402


def build(preset: str, variant: str, base: str) -> ds.ForcedLength:
    model = ds.build_transduce(0, preset).eval()
    if variant == base:
        ds.prepare_transduce(model, base)
    else:
        if base == "bf16":
            model.to(torch.bfloat16)
        int8.quantize_int8(model, decoder=variant == "int8-decoder")
        kernels.apply(model, pack=False)
        kernels.pack_weights(model)
    return ds.ForcedLength(model)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("small", "base"), default="small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("\n".join(machine.describe()), flush=True)
    base = "bf16" if read_capability("cpu").native_bf16 else "fp32"
    variants = [base, "int8-decoder", "int8-output"]
    src = torch.randint(4, ds.SIZES[args.preset], (32, 20), generator=torch.Generator().manual_seed(0))
    models = {v: build(args.preset, v, base) for v in variants}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            times[v].append(ds.run_transduce(models[v], src, 30, base if v == base else "int8") / 30 * 1e3)
    for v, t in times.items():
        print(f"{args.preset} {args.threads} thread(s) {v:13s} ms per step: {' '.join(f'{x:.2f}' for x in t)}; "
              f"median {statistics.median(t):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
