"""How far reduced-precision decoding is from fp32, with less noise than BLEU: teacher-forced.

    python benchmarks/int8_error.py runs/m30k/avg_last5 --dataset multi30k --src en --tgt de --split val
    python benchmarks/int8_error.py MODEL ... --precisions bf16,int8,int8-per-row

For every sentence pair of the split (a validation split: this is for choosing, not reporting), the
model reads the source and the reference target (teacher forcing) in fp32 and in each precision as
`transduce translate --precision P` prepares it (bf16: weights in bf16, packed; int8:
`int8.quantize_int8` over the float type the CPU computes natively). Printed per precision:
the mean KL(fp32 || P) of the next-token distributions per target token, and how often the most
likely next token is the same as fp32's. BLEU over 1,000 sentences moves by ~0.3 when 10% of the
outputs change; this moves by little but the arithmetic.

`int8-per-row` is an experiment, not a `translate` option: int8 with one activation scale per row
(per hypothesis) instead of one per tensor, symmetric around zero (zero point 128; for inputs
known to be >= 0, the FFN's second product, zero point 0 and all 8 bits), the rows rescaled after
oneDNN's product (its int8 linear takes a single activation scale). Docs/RESULTS.md ("int8
quality") has what it gains and what its rescaling costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from transduce import int8, kernels  # noqa: E402
from transduce.data.datasets import fetch  # noqa: E402
from transduce.data.text import read_lines  # noqa: E402
from transduce.data.vocab import BOS, EOS  # noqa: E402
from transduce.precision import int8_choice  # noqa: E402
from transduce.translate import load_translation_model  # noqa: E402

PRECISIONS = ("bf16", "int8", "int8-per-row")


def per_row_call(self, x, bias, activation="none"):
    """`int8.Int8Weight.__call__` with one activation scale per row (the experiment above)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    nonneg = bool(torch.aminmax(x2)[0].item() >= 0)
    zp, top = (0, float(self.levels)) if nonneg else ((self.levels + 2) // 2, self.levels / 2)
    m = x2.amax(-1, keepdim=True) if nonneg else x2.abs().amax(-1, keepdim=True)
    s = m.float().clamp_min_(1e-30).mul_(1.0 / top)  # (rows, 1)
    q = torch.mul(x2, s.reciprocal()).add_(zp + 0.5).to(torch.int16).to(torch.uint8)
    z = torch.ops.onednn.qlinear_pointwise(q, 1.0, zp, self.weight, self.scales, self.zeros, None, 1.0, 0,
                                           torch.float32, "none", [], "")
    y = torch.addcmul(bias, z, s) if bias is not None else z.mul_(s)
    if activation == "relu":
        y.relu_()
    return y.to(self.out_dtype or x.dtype).view(*shape[:-1], -1)


def batches(loaded, sources: list[str], targets: list[str], size: int):
    pad = loaded.model.config.pad_id
    for i in range(0, len(sources), size):
        s = [loaded.src_vocab.encode(x) + [EOS] for x in sources[i:i + size]]
        t = [[BOS] + loaded.tgt_vocab.encode(x) + [EOS] for x in targets[i:i + size]]
        S, T = max(map(len, s)), max(map(len, t))
        yield torch.tensor([x + [pad] * (S - len(x)) for x in s]), torch.tensor([x + [pad] * (T - len(x)) for x in t])


def log_probs(model, data) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(s, t[:, :-1]).float().log_softmax(-1) for s, t in data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a run directory, checkpoint or averaged model (as `transduce translate`)")
    parser.add_argument("--dataset", required=True, help="e.g. multi30k")
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--split", default="val", help="a validation split (default val)")
    parser.add_argument("--data-dir", help="dataset mirror (default: transduce's)")
    parser.add_argument("--precisions", default="bf16,int8", help=f"comma-separated, of {', '.join(PRECISIONS)}")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    precisions = [p for p in args.precisions.split(",") if p]
    if bad := [p for p in precisions if p not in PRECISIONS]:
        parser.error(f"unknown precision {bad[0]!r} (choose from {', '.join(PRECISIONS)})")
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_translation_model(args.model)
    sources = list(read_lines(fetch(args.dataset, args.split, args.src, data_dir=args.data_dir)))
    targets = list(read_lines(fetch(args.dataset, args.split, args.tgt, data_dir=args.data_dir)))
    data = list(batches(loaded, sources, targets, args.batch_size))
    model, pad = loaded.model.eval().float(), loaded.model.config.pad_id
    reference = log_probs(model, data)
    print(f"{args.dataset} {args.split}: {len(sources):,} pairs; mean KL(fp32 || P) per target token, "
          f"and next-token argmax equal to fp32's")
    original_call = int8.Int8Weight.__call__
    for p in precisions:
        int8.dequantize_int8(model)
        kernels.unpack_weights(model)
        model.float()
        if p == "bf16":
            model.to(torch.bfloat16)
            kernels.pack_weights(model)
            what = "bf16 weights, packed"
        else:
            choice = int8_choice()
            if choice.base == "bf16":
                model.to(torch.bfloat16)
            int8.quantize_int8(model, **choice.int8_options())
            kernels.pack_weights(model)  # the layers left in the float type, as `translate` packs them
            what = choice.reason
        int8.Int8Weight.__call__ = per_row_call if p == "int8-per-row" else original_call
        try:
            kl = agree = n = 0.0
            for (_, t), ref, lp in zip(data, reference, log_probs(model, data)):
                mask = t[:, 1:] != pad
                kl += (ref.exp() * (ref - lp)).sum(-1)[mask].sum().item()
                agree += (ref.argmax(-1) == lp.argmax(-1))[mask].sum().item()
                n += mask.sum().item()
        finally:
            int8.Int8Weight.__call__ = original_call
        print(f"{p:<13} KL {kl / n:.5f} nats/token   argmax equal {agree / n:.4f}   ({int(n):,} tokens; {what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
