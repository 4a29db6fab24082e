"""transduce and CTranslate2 side by side on the Multi30k test set, in one run: BLEU and
sentences/s of each engine and precision, and how far CTranslate2's length penalty moves BLEU.
Measured, not asserted (docs/RESULTS.md, "Exactness of the exports and of reduced precision").

    python -m benchmarks.engines runs/m30k --threads 2
    python -m benchmarks.engines runs/m30k/avg_last5 --alpha 1.5

Method: docs/speed.md, "What the benchmarks measure".
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a run directory or model directory")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--max-len-offset", type=int, default=50)
    p.add_argument("--threads", type=int, default=2, help="CPU threads for every engine (default 2)")
    p.add_argument("--limit", type=int, help="only the first N sentences")
    p.add_argument("--greedy", action="store_true", help="also greedy rows")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from transduce import evaluate
    from transduce.data.datasets import fetch
    from transduce.data.text import read_lines
    from transduce.decoding.engines import load_ct2
    from transduce.export.ct2 import export_ct2, pieces
    from transduce.precision import choose_precision
    from transduce.decoding.ready import load_translation_model, make_ready
    from transduce.decoding.translate import translate_stream

    read = lambda path: list(read_lines(Path(path)))  # noqa: E731  (plain or gzip)
    src = read(fetch("multi30k", args.split, "en"))
    ref = read(fetch("multi30k", args.split, "de"))
    tok_ref = read(fetch("multi30k", args.split, "de", variant="tok"))
    if args.limit:
        src, ref, tok_ref = src[: args.limit], ref[: args.limit], tok_ref[: args.limit]
    loaded = load_translation_model(args.model, device="cpu")
    print(f"model: {loaded.description}; {len(src)} sentences of {args.split}", file=sys.stderr)
    auto = choose_precision("auto", torch.device("cpu"))
    print(auto.line(), file=sys.stderr)

    tmp = Path(tempfile.mkdtemp(prefix="transduce-engines-"))
    t0 = time.perf_counter()
    ct2_dirs = {
        q: export_ct2(loaded.model, loaded.config, loaded.src_vocab, loaded.tgt_vocab, tmp / q, quantization=q)
        for q in ("float32", "int8")
    }
    print(f"exported in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ct2 = {q: load_ct2(d, threads=args.threads) for q, d in ct2_dirs.items()}

    search = dict(beam=args.beam, alpha=args.alpha, max_len_offset=args.max_len_offset)
    runs = []  # (name, function that translates lines -> list of texts)
    fp32 = loaded.model
    bf16 = copy.deepcopy(fp32) if auto.precision == "bf16" else None
    make_ready(fp32)  # as `transduce translate --precision fp32` decodes

    def torch_run(model, bf16, greedy=False):
        return lambda lines: [
            c[0].text
            for c in translate_stream(
                model, loaded.src_vocab, loaded.tgt_vocab, lines, bf16=bf16, greedy=greedy, **search
            )
        ]

    runs.append(("transduce fp32", torch_run(fp32, False)))
    if bf16 is not None:
        make_ready(bf16, auto)
        runs.append(("transduce bf16 (auto)", torch_run(bf16, True)))
    for q, m in ct2.items():
        for lp in ("paper", "ct2"):
            label = "paper's ((5+|Y|)/6)^a" if lp == "paper" else "CT2's |Y|^a"
            runs.append(
                (
                    f"CTranslate2 {q} [{m.compute_type}], {label}",
                    (
                        lambda m, lp: (
                            lambda lines: [
                                c[0].text
                                for c in translate_stream(
                                    m, m.src_vocab, m.tgt_vocab, lines, length_penalty=lp, **search
                                )
                            ]
                        )
                    )(m, lp),
                )
            )
    if args.greedy:
        runs.append(("transduce fp32 greedy", torch_run(fp32, False, greedy=True)))
        m = ct2["float32"]
        runs.append(
            (
                "CTranslate2 float32 greedy",
                lambda lines: [
                    c[0].text
                    for c in translate_stream(
                        m, m.src_vocab, m.tgt_vocab, lines, greedy=True, max_len_offset=args.max_len_offset
                    )
                ],
            )
        )

    rows, base = [], {}
    for name, fn in runs:
        fn(src[:16])  # warm-up
        t0 = time.perf_counter()
        hyps = fn(src)
        dt = time.perf_counter() - t0
        scores = evaluate.score(hyps, ref, lang="de", tok_refs=tok_ref)
        first = base.setdefault("greedy" in name, hyps)  # beam rows against transduce's beam, greedy against its greedy
        same = sum(a == b for a, b in zip(hyps, first)) / len(hyps)
        length = statistics.mean(len(h.split()) for h in hyps)
        rows.append(
            (name, scores["sacrebleu"]["score"], scores["multi30k_lc_tok_bleu"]["score"], len(src) / dt, same, length)
        )
        print(f"{name}: sacreBLEU {rows[-1][1]:.2f}, {rows[-1][3]:.1f} sentences/s", file=sys.stderr, flush=True)

    # int8 against float32, token by token: log-probabilities of the references
    sp, tp = pieces(loaded.src_vocab), pieces(loaded.tgt_vocab)
    s_tok = [[sp[i] for i in loaded.src_vocab.encode(s)][:1000] for s in src]
    t_tok = [[tp[i] for i in loaded.tgt_vocab.encode(r)][:1000] for r in ref]
    lp32 = [r.log_probs for r in ct2["float32"].translator.score_batch(s_tok, t_tok, max_batch_size=64)]
    lp8 = [r.log_probs for r in ct2["int8"].translator.score_batch(s_tok, t_tok, max_batch_size=64)]
    diffs = [abs(a - b) for x, y in zip(lp32, lp8) for a, b in zip(x, y)]
    argmax_note = f"mean |log p int8 - log p float32| over {len(diffs):,} reference tokens {statistics.mean(diffs):.4f}, max {max(diffs):.3f}"

    print(
        f"\n{len(src)} sentences of Multi30k {args.split}, beam {args.beam}, alpha {args.alpha}, max length input + "
        f"{args.max_len_offset}, {args.threads} threads; model {loaded.description}\n"
    )
    print(
        "| engine | sacreBLEU | Multi30k lc tok BLEU | sentences/s | outputs identical to transduce fp32's (same search) | mean words |"
    )
    print("|---|---|---|---|---|---|")
    for name, bleu, tok_bleu, speed, same, length in rows:
        print(f"| {name} | {bleu:.2f} | {tok_bleu:.2f} | {speed:.1f} | {same:.1%} | {length:.2f} |")
    print(f"\nint8: {argmax_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
