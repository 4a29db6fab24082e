"""Does a trained model read its source? A diagnostic for encoder collapse (docs/parsing.md: why the
post-norm parser failed).

    python scripts/source_use.py DATA_DIR MODEL_OR_CHECKPOINT_DIR... [--pairs 128]

For the first N validation pairs of a prepared dataset, prints the teacher-forced perplexity per
target token with the right source and with every source moved to the next pair's target
(`shuffled`), their ratio (1.0: the source is ignored, the model is a language model of its
targets), and the encoder output's spread: the standard deviation across the real positions of a
sentence, averaged over dimensions and sentences (near 0: the encoder writes the same vector at
every position).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from transduce.checkpoint import load_config, model_from_tensors
from transduce.data.indexed import IndexedDataset
from transduce.data.vocab import BOS, EOS, PAD


def padded(seqs) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a directory written by `transduce prepare` (valid.src/.tgt)")
    ap.add_argument("models", nargs="+", help="model or checkpoint directories (model.safetensors)")
    ap.add_argument("--pairs", type=int, default=128)
    args = ap.parse_args()
    src_ds, tgt_ds = IndexedDataset(f"{args.data}/valid.src"), IndexedDataset(f"{args.data}/valid.tgt")
    n = min(args.pairs, len(src_ds))
    srcs = [src_ds[i] for i in range(n)]
    tgts = [tgt_ds[i] for i in range(n)]
    tgt_in = padded([np.concatenate([[BOS], t]) for t in tgts])
    tgt_out = padded([np.concatenate([t, [EOS]]) for t in tgts])
    for directory in args.models:
        model = model_from_tensors(
            load_file(f"{directory}/model.safetensors"), load_config(directory), directory
        ).eval()
        ppl = []
        with torch.no_grad():
            for s in (srcs, srcs[1:] + srcs[:1]):
                logits = model(padded(s), tgt_in)
                nll = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
                ppl.append(nll.exp().item())
            memory = model.encode(padded(srcs))
            spread = np.mean([memory[i, : len(s)].std(0).mean().item() for i, s in enumerate(srcs)])
        print(
            f"{directory}: perplexity right source {ppl[0]:.3f}, shuffled {ppl[1]:.3f}, ratio {ppl[1] / ppl[0]:.3f}; "
            f"encoder spread across positions {spread:.3f}"
        )


if __name__ == "__main__":
    main()
