"""Beam-search translation speed: transduce vs Hugging Face `MarianMTModel`, same model, same work.

    python benchmarks/decode_speed.py --n-sentences 300            # a stable subset (minutes on 2 cores)
    python benchmarks/decode_speed.py                              # all 3003 sentences of newstest2014
    python benchmarks/decode_speed.py --precisions fp32 --batch-size 16 --threads 2 --json out.json

What is measured
----------------
Beam-4 search (Section 6.1) over the English side of newstest2014 En->De
(`fetch("wmt14-en-de", "newstest2014", "en")`, 3003 sentences; `--n-sentences` takes the first
N) with a base-size Transformer (preset `base`: N=6, d_model 512, d_ff 2048, h=8, post-norm,
sinusoidal positions, shared/tied 37000-token embeddings scaled by sqrt(d_model)), random
weights, in three precisions, the same for both systems:

* fp32;
* bf16: the weights cast to bf16 (`model.to(torch.bfloat16)`, Hugging Face's usual
  `torch_dtype=torch.bfloat16`; transduce's `translate --bf16`); transduce keeps the search's
  log-probabilities and scores in fp32;
* bf16-autocast: fp32 weights, the forward passes under `torch.autocast("cpu", torch.bfloat16)`.

* transduce: `transduce.decode.beam_search` on `transduce.model.Transformer` (what
  `transduce translate` runs per batch), timed from source ids to finished hypotheses
  (encoder included), with the speed-ups of `transduce.kernels` applied as `translate` does
  (`kernels.apply`, done once per precision, untimed like the casts).
  `--systems transduce-nopack,...` adds the same model through plain `F.linear` (its decoding
  steps' attention still `kernels.decode_attention`).
* Hugging Face: `MarianMTModel` built from a `MarianConfig` with the same dimensions (6+6
  layers, 8 heads, FFN 2048, ReLU, post-norm, static sinusoidal positions, scale_embedding,
  shared and tied embeddings, vocabulary 37000), random init, `generate(num_beams=4, ...)`,
  timed the same way.

Equal work. The weights are random, so the outputs would be of arbitrary length; every
hypothesis is therefore forced to the same length L, per batch: EOS is forbidden before L
and the only choice at L. transduce: a wrapper model whose `decode_step` edits the logits
(`ForcedLength`, here; decode.py is untouched). Hugging Face: `min_new_tokens=L-1,
max_new_tokens=L, forced_eos_token_id=EOS`. Both run exactly L decoder steps on batch x 4
rows, and the benchmark checks that every output has length L. L = the longest source in the
batch (tokens, EOS included) + 10, at most the shortest + 50 (transduce's maximum output
length). Sentences are sorted by source length and cut into batches of --batch-size
sentences; both systems get the same batches. The two systems alternate batch by batch, so
that a machine shared with other jobs slows both alike; with --repeats R each batch runs R
times per system and the fastest run counts (the usual defence against interference).

Source ids: the weights are random, so ids only need realistic lengths: each sentence is split
into words and punctuation (regex \\w+|[^\\w\\s], about what Moses gives) and each piece is mapped
to 4 + crc32(piece) mod 36996 (0-3 are PAD, UNK, BOS, EOS), plus EOS. A 37000-piece BPE would
give roughly 10-20% more tokens per sentence.

Output: a table of system, precision, sentences/s, target tokens/s (sum of L over sentences,
EOS included) and the speedup of transduce over Hugging Face in the same precision. The
target (issue): >= 2x Hugging Face's sentences/s in the same precision.
`--workers W` runs W batches at a time, each in its own Python thread with threads / W torch
threads (what Marian and CTranslate2 call CPU workers or inter-op threads), for both systems
alike: each system takes the same group of W batches in turn, and the group's wall time counts.

`--profile` runs torch.profiler over one batch (the middle one; `--profile-batches 5,25,45`
picks others, summed) of each system and prints where the time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from transduce import kernels  # noqa: E402
from transduce.config import get_preset  # noqa: E402
from transduce.data.datasets import fetch  # noqa: E402
from transduce.data.text import read_lines  # noqa: E402
from transduce.decode import beam_search  # noqa: E402
from transduce.model import Transformer, count_parameters  # noqa: E402

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB = 37000
BEAM = 4
ALPHA = 0.6
MAX_LEN_OFFSET = 50
EXTRA = 10
_PIECES = re.compile(r"\w+|[^\w\s]")


def encode(line: str, vocab_size: int = VOCAB) -> list[int]:
    """Word/punctuation pieces hashed to ids in [4, vocab_size), then EOS."""
    return [4 + zlib.crc32(p.encode("utf-8")) % (vocab_size - 4) for p in _PIECES.findall(line)] + [EOS]


def make_batches(srcs: list[list[int]], batch_size: int) -> list[tuple[list[int], int]]:
    """(sentence indices, forced output length L) per batch, sentences sorted by length."""
    order = sorted(range(len(srcs)), key=lambda i: (len(srcs[i]), i))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        lens = [len(srcs[i]) for i in idx]
        L = min(max(lens) + EXTRA, min(lens) + MAX_LEN_OFFSET)
        batches.append((idx, L))
    return batches


def pad_batch(srcs: list[list[int]], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(srcs[i]) for i in idx)
    ids = torch.full((len(idx), S), PAD, dtype=torch.long)
    for row, i in enumerate(idx):
        ids[row, : len(srcs[i])] = torch.tensor(srcs[i])
    return ids, ids != PAD


class ForcedLength:
    """A transduce model whose every hypothesis has exactly `length` tokens (EOS included):
    `decode_step` forbids EOS before that length and allows only EOS at it. Everything else is
    the model's own; the cache is its DecoderCache (whose `length` is the step count)."""

    def __init__(self, model: Transformer):
        self.model, self.config, self.length = model, model.config, 0

    def encode(self, src, src_mask):
        return self.model.encode(src, src_mask)

    def init_cache(self, memory, src_mask):
        return self.model.init_cache(memory, src_mask)

    def decode_step(self, tokens, cache):
        logits = self.model.decode_step(tokens, cache)  # advances cache.length to this step's count
        if cache.length < self.length:
            logits[..., EOS] = float("-inf")
        else:
            eos = logits[..., EOS].clone()
            logits.fill_(float("-inf"))
            logits[..., EOS] = eos
        return logits


def build_transduce(seed: int) -> Transformer:
    config = get_preset("base")
    config.model.src_vocab_size = VOCAB
    torch.manual_seed(seed)
    return Transformer(config.model).eval()


def build_marian(seed: int, d_model: int = 512, layers: int = 6, heads: int = 8, ffn: int = 2048, vocab: int = VOCAB):
    """Hugging Face's MarianMTModel with transduce's architecture (defaults: the base preset)."""
    from transformers import MarianConfig, MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    config = MarianConfig(
        vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, activation_function="relu",
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=1024,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS, forced_eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    return model


PRECISIONS = ("fp32", "bf16", "bf16-autocast")
SYSTEMS = ("transduce", "transduce-nopack", "hf")


def autocast(precision: str):
    if precision == "bf16-autocast":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cast(model, precision: str):
    """The model's weights in the precision's dtype (bf16 for "bf16", fp32 otherwise)."""
    return model.to(torch.bfloat16 if precision == "bf16" else torch.float32)


def run_transduce(forced: ForcedLength, src: torch.Tensor, L: int, precision: str) -> float:
    forced.length = L
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(precision):
        hyps = beam_search(forced, src, beam_size=BEAM, alpha=ALPHA, max_len_offset=MAX_LEN_OFFSET, bos_id=BOS, eos_id=EOS)
    dt = time.perf_counter() - t0
    lengths = {len(h[0].tokens) + 1 for h in hyps}  # + EOS
    assert lengths == {L}, f"transduce produced lengths {lengths}, expected {L}"
    return dt


def run_hf(marian, src: torch.Tensor, mask: torch.Tensor, L: int, precision: str) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(precision):
        out = marian.generate(
            input_ids=src, attention_mask=mask.long(), num_beams=BEAM, num_return_sequences=1,
            length_penalty=ALPHA, min_new_tokens=L - 1, max_new_tokens=L, do_sample=False, early_stopping=False,
        )
    dt = time.perf_counter() - t0
    assert out.shape[1] == L + 1, f"Hugging Face produced {out.shape[1] - 1} tokens, expected {L}"
    assert bool((out[:, -1] == EOS).all()), "Hugging Face outputs do not end in EOS"
    return dt


def profile_transduce(forced: ForcedLength, work: list, precision: str, rows: int = 25) -> str:
    """torch.profiler's top ops over the batches `work` ((src, mask, L) each), summed."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for src, _, L in work:
            run_transduce(forced, src, L, precision)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def profile_hf(marian, work: list, precision: str, rows: int = 25) -> str:
    """The same for Hugging Face."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for src, mask, L in work:
            run_hf(marian, src, mask, L, precision)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-sentences", type=int, default=3003, help="the first N sentences of newstest2014 (default all 3003)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the cores available)")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (bf16 weights), bf16-autocast (default fp32,bf16)")
    parser.add_argument("--systems", default="transduce,hf",
                        help="comma-separated: transduce, transduce-nopack (weights not pre-packed), hf (default transduce,hf)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every batch R times per system (alternating) and keep the fastest: "
                             "steadier on a shared machine (default 1)")
    parser.add_argument("--workers", type=int, default=1,
                        help="batches decoded at once, each in its own thread with threads/workers torch threads, "
                             "for both systems alike (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", help="dataset mirror (default: transduce's)")
    parser.add_argument("--profile", action="store_true", help="profile one batch of each system and precision, print the top ops")
    parser.add_argument("--profile-batches", metavar="I,J,...",
                        help="with --profile: the batches to profile (0-based, sorted by length; default the middle one)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)

    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    if not 1 <= args.workers <= threads:
        parser.error(f"--workers must be between 1 and the threads ({threads}), not {args.workers}")
    if args.workers > 1 and (args.profile or args.repeats > 1):
        parser.error("--workers > 1 does not combine with --profile or --repeats")
    torch.set_num_threads(threads // args.workers)
    precisions = [p for p in args.precisions.split(",") if p]
    if bad := [p for p in precisions if p not in PRECISIONS]:
        parser.error(f"unknown precision {bad[0]!r} (choose from {', '.join(PRECISIONS)})")
    systems = [s for s in args.systems.split(",") if s]

    path = fetch("wmt14-en-de", "newstest2014", "en", data_dir=args.data_dir)
    lines = list(read_lines(path))[: args.n_sentences]
    srcs = [encode(line) for line in lines]
    batches = make_batches(srcs, args.batch_size)
    n = len(srcs)
    try:
        profile_batches = [int(i) for i in args.profile_batches.split(",")] if args.profile_batches else [len(batches) // 2]
    except ValueError:
        parser.error(f"--profile-batches: expected comma-separated batch numbers, got {args.profile_batches!r}")
    if bad := [i for i in profile_batches if not 0 <= i < len(batches)]:
        parser.error(f"--profile-batches: batch {bad[0]} does not exist (0..{len(batches) - 1})")
    tgt_tokens = sum(L * len(idx) for idx, L in batches)
    print(f"{n} sentences of {path.name}: {sum(map(len, srcs)):,} source tokens (EOS included), "
          f"{tgt_tokens:,} forced target tokens; {len(batches)} batches of <= {args.batch_size}; "
          f"beam {BEAM}; {threads} threads, {args.workers} worker(s); best of {args.repeats} per batch; torch {torch.__version__}; "
          f"{platform.processor() or platform.machine()}",
          flush=True)

    if bad := [s for s in systems if s not in SYSTEMS]:
        parser.error(f"unknown system {bad[0]!r} (choose from {', '.join(SYSTEMS)})")
    models, spares = {}, {}
    for system in ("transduce", "transduce-nopack"):
        if system in systems:
            t = build_transduce(args.seed)
            models[system] = ForcedLength(t)
            spares[system] = [ForcedLength(t) for _ in range(args.workers - 1)]  # one per extra worker
            print(f"{system}: {count_parameters(t):,} parameters", flush=True)
    if "hf" in systems:
        import transformers

        m = build_marian(args.seed)
        models["hf"] = m
        n_params = sum(p.numel() for p in m.parameters() if p.requires_grad)
        print(f"Hugging Face transformers {transformers.__version__} MarianMTModel: {n_params:,} trainable parameters, "
              f"attention: {m.config._attn_implementation}", flush=True)

    def call(system: str, idx: list[int], L: int, precision: str, worker: int = 0) -> float:
        src, mask = pad_batch(srcs, idx)
        if system.startswith("transduce"):
            return run_transduce(models[system] if worker == 0 else spares[system][worker - 1], src, L, precision)
        return run_hf(models[system], src, mask, L, precision)

    def call_group(system: str, group: list[tuple[list[int], int]], precision: str) -> float:
        """Wall time of decoding `group`'s batches at once, one thread each (--workers)."""
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(group)) as pool:
            list(pool.map(lambda wb: call(system, *wb[1], precision, worker=wb[0]), enumerate(group)))
        return time.perf_counter() - t0

    results = []
    for precision in precisions:
        for system, m in models.items():
            cast(m.model if system.startswith("transduce") else m, precision)
            if system.startswith("transduce"):
                kernels.unpack_weights(m.model)
                kernels.apply(m.model, pack=False)  # decoding steps' attention, as translate runs them
                if system == "transduce" and not kernels.pack_weights(m.model):
                    print("transduce: weights not packed (no oneDNN for this dtype)", flush=True)
        # Warm-up: one short batch per system (allocator, oneDNN kernels, lazy initialisation).
        for system in models:
            call(system, batches[0][0][:4], batches[0][1], precision)
        if args.profile:
            chosen = [batches[i] for i in profile_batches]
            work = [(*pad_batch(srcs, idx), L) for idx, L in chosen]
            what = ", ".join(f"{len(idx)} sentences with L={L}" for idx, L in chosen)
            for system in models:
                print(f"\n--- profile: {system} {precision}, batches {profile_batches}: {what} ---")
                if system.startswith("transduce"):
                    print(profile_transduce(models[system], work, precision))
                else:
                    print(profile_hf(models[system], work, precision))
        times = {s: 0.0 for s in models}
        if args.workers > 1:
            groups = [batches[i : i + args.workers] for i in range(0, len(batches), args.workers)]
            for g, group in enumerate(groups):
                for system in list(models) if g % 2 == 0 else list(models)[::-1]:  # alternate who goes first
                    times[system] += call_group(system, group, precision)
                done = sum(len(i) for grp in groups[: g + 1] for i, _ in grp)
                print(f"\r{precision}: {done}/{n} sentences " + " ".join(f"{s} {t:.1f}s" for s, t in times.items()),
                      end="", file=sys.stderr, flush=True)
            batches_left = []
        else:
            batches_left = batches
        for b, (idx, L) in enumerate(batches_left):
            best = {s: float("inf") for s in models}
            for r in range(args.repeats):
                order = list(models) if (b + r) % 2 == 0 else list(models)[::-1]  # alternate who goes first
                for system in order:
                    best[system] = min(best[system], call(system, idx, L, precision))
            for system in models:
                times[system] += best[system]
            done = sum(len(i) for i, _ in batches[: b + 1])
            print(f"\r{precision}: {done}/{n} sentences " + " ".join(f"{s} {t:.1f}s" for s, t in times.items()),
                  end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        for system, t in times.items():
            results.append({"system": system, "precision": precision, "seconds": t, "sentences": n,
                            "sentences_per_s": n / t, "target_tokens_per_s": tgt_tokens / t})

    name = {"transduce": "transduce", "transduce-nopack": "transduce nopack", "hf": "HF MarianMTModel"}
    print(f"\n{'system':<18} {'precision':<13} {'time s':>8} {'sent/s':>8} {'tok/s':>9} {'vs HF':>7}")
    for r in results:
        hf = next((x for x in results if x["system"] == "hf" and x["precision"] == r["precision"]), None)
        speedup = f"{r['sentences_per_s'] / hf['sentences_per_s']:.2f}x" if hf else "-"
        r["speedup_vs_hf"] = r["sentences_per_s"] / hf["sentences_per_s"] if hf else None
        print(f"{name[r['system']]:<18} {r['precision']:<13} {r['seconds']:>8.1f} {r['sentences_per_s']:>8.2f} "
              f"{r['target_tokens_per_s']:>9.1f} {speedup:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "threads": threads, "workers": args.workers, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
