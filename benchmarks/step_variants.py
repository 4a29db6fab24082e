"""The decoding step with and without `transduce.fast_step.FastStep` and the one-thread fused
attention, interleaved in one process: milliseconds per beam step.

    OMP_NUM_THREADS=1 python benchmarks/step_variants.py --preset small --precision int8 --threads 1 --passes 20

The forced beam search of `step_time.py` (32 random sentences of 20 tokens, beam 4 forced to 30
steps, the random weights of the `small` or `base` preset prepared as `translate --precision P`
prepares them), run in three variants, one pass each in turn, `--passes` times after a warm-up
pass, so that a host whose speed drifts slows all alike; prints each variant's median:

* `model`: `Transformer.decode_step` (the module layers), every step's attention through
  `kernels.product_attention`'s batched products (what `translate` ran before FastStep);
* `fast, products`: `FastStep`, the same attention;
* `fast`: `FastStep` with `kernels.decode_attention` as `translate` now runs it (on one thread,
  self-attention's single query through PyTorch's fused kernel).

It first checks that `model` and `fast, products` give the same hypotheses and scores (FastStep is
bit for bit the model's step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_speed as ds  # noqa: E402

from transduce import kernels  # noqa: E402
from transduce.decode import beam_search  # noqa: E402
from transduce.fast_step import FastStep  # noqa: E402
from transduce.model import Transformer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=("small", "base"), default="small")
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--passes", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = ds.build_transduce(0, args.preset)
    ds.prepare_transduce(model, args.precision)
    forced = ds.ForcedLength(model)
    src = torch.randint(4, ds.SIZES[args.preset], (32, 20), generator=torch.Generator().manual_seed(0))
    attns = [m for layer in model.decoder.layers for m in (layer.self_attn, layer.cross_attn)]

    def model_step(tokens, cache):
        return Transformer.decode_step(model, tokens, cache)

    def use(variant: str) -> None:
        for m in attns:
            m.step_attention = kernels.decode_attention if variant == "fast" else kernels.product_attention
        model.decode_step = model_step if variant == "model" else FastStep(model)

    variants = ("model", "fast, products", "fast")
    outputs = {}
    with torch.inference_mode():
        for v in variants[:2]:
            use(v)
            forced.length = 30
            outputs[v] = [(h[0].tokens, h[0].score) for h in beam_search(forced, src, beam_size=ds.BEAM, alpha=ds.ALPHA,
                                                                          max_len_offset=ds.MAX_LEN_OFFSET,
                                                                          bos_id=ds.BOS, eos_id=ds.EOS)]
    print(f"FastStep gives the model's hypotheses and scores: {outputs['model'] == outputs['fast, products']}")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(args.passes + 1):
        for v in variants:
            use(v)
            dt = ds.run_transduce(forced, src, 30, args.precision)
            if i:
                times[v].append(dt / 30 * 1e3)
    base = statistics.median(times["model"])
    for v in variants:
        m = statistics.median(times[v])
        print(f"{args.preset} {args.precision}, {args.threads} thread(s), {v:15s}: {m:6.2f} ms a step (median of "
              f"{args.passes}), {base / m:.3f}x the model's step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
