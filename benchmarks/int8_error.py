"""How far reduced-precision decoding is from fp32, with less noise than BLEU: teacher-forced.

    python -m benchmarks.int8_error runs/m30k/avg_last5 --dataset multi30k --src en --tgt de --split val
    python -m benchmarks.int8_error MODEL ... --precisions bf16,int8

For every sentence pair of the split (a validation split: this is for choosing, not reporting), the
model reads the source and the reference target (teacher forcing) in fp32 and in each precision as
`transduce translate --precision P` prepares it (`transduce.decoding.ready.load_for_decoding`: cast or
quantized, and packed). Printed per precision:
the mean KL(fp32 || P) of the next-token distributions per target token, and how often the most
likely next token is the same as fp32's. BLEU over 1,000 sentences moves by ~0.3 when 10% of the
outputs change; this moves by little but the arithmetic.
"""

from __future__ import annotations

import argparse
import sys

import torch

from transduce.data.datasets import fetch
from transduce.data.text import read_lines
from transduce.data.vocab import BOS, EOS
from transduce.decoding.ready import load_for_decoding

PRECISIONS = ("bf16", "int8")


def batches(loaded, sources: list[str], targets: list[str], size: int):
    pad = loaded.model.config.pad_id
    for i in range(0, len(sources), size):
        s = [loaded.src_vocab.encode(x) + [EOS] for x in sources[i : i + size]]
        t = [[BOS] + loaded.tgt_vocab.encode(x) + [EOS] for x in targets[i : i + size]]
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

    loaded = load_for_decoding(args.model, precision="fp32")
    sources = list(read_lines(fetch(args.dataset, args.split, args.src, data_dir=args.data_dir)))
    targets = list(read_lines(fetch(args.dataset, args.split, args.tgt, data_dir=args.data_dir)))
    data = list(batches(loaded, sources, targets, args.batch_size))
    pad = loaded.model.config.pad_id
    reference = log_probs(loaded.model.eval(), data)
    print(
        f"{args.dataset} {args.split}: {len(sources):,} pairs; mean KL(fp32 || P) per target token, "
        f"and next-token argmax equal to fp32's"
    )
    for p in precisions:
        ready = load_for_decoding(args.model, precision=p)
        ready.model.eval()
        kl = agree = n = 0.0
        for (_, t), ref, lp in zip(data, reference, log_probs(ready.model, data)):
            mask = t[:, 1:] != pad
            kl += (ref.exp() * (ref - lp)).sum(-1)[mask].sum().item()
            agree += (ref.argmax(-1) == lp.argmax(-1))[mask].sum().item()
            n += mask.sum().item()
        print(
            f"{p:<5} KL {kl / n:.5f} nats/token   argmax equal {agree / n:.4f}   ({int(n):,} tokens; "
            f"{ready.precision.reason})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
