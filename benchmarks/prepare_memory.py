"""Peak memory and wall time of `transduce prepare` on a large synthetic corpus.

    python -m benchmarks.prepare_memory                      # 5M pairs, vocab 37000 (the paper's size)
    python -m benchmarks.prepare_memory --pairs 1000000 --gzip

Writes a random-word parallel corpus (Zipf-distributed words, WMT-like sentence lengths) into a
temporary directory, runs `python -m transduce prepare` on it in a child process (the
vocabulary is trained on a sample of --vocab-sample sentences) and reports the child's peak
resident memory (getrusage RUSAGE_CHILDREN ru_maxrss) and wall time. Target: peak < 2 GiB,
whatever the corpus size, since text is streamed and tokens go straight to disk.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_lexicon(n_words: int, rng: np.random.Generator) -> list[str]:
    """Pronounceable random words of 1-4 syllables."""
    onsets = "b c d f g h k l m n p r s t v w z br tr st sch pl kr".split()
    vowels = "a e i o u ei au ie ä ö ü".split()
    codas = ["", "", "n", "r", "s", "t", "ng", "ch"]
    words = set()
    while len(words) < n_words:
        k = rng.integers(1, 5)
        words.add("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(k)))
    return sorted(words)


def write_side(path: Path, lengths: np.ndarray, lexicon: list[str], rng: np.random.Generator, use_gzip: bool) -> None:
    """One sentence per line with the given word counts, Zipf-distributed word choice."""
    ranks = np.arange(1, len(lexicon) + 1)
    p = 1.0 / ranks
    p /= p.sum()
    opener = (
        (lambda f: gzip.open(f, "wt", encoding="utf-8", compresslevel=1))
        if use_gzip
        else (lambda f: open(f, "w", encoding="utf-8"))
    )
    with opener(path) as out:
        for start in range(0, len(lengths), 100_000):
            chunk = lengths[start : start + 100_000]
            ids = rng.choice(len(lexicon), size=int(chunk.sum()), p=p).tolist()
            lines, pos = [], 0
            for n in chunk.tolist():
                lines.append(" ".join([lexicon[i] for i in ids[pos : pos + n]]))
                pos += n
            out.write("\n".join(lines) + "\n")


def make_corpus(directory: Path, pairs: int, use_gzip: bool, seed: int = 0) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    src_lex, tgt_lex = make_lexicon(40_000, rng), make_lexicon(60_000, rng)
    suffix = ".gz" if use_gzip else ""
    files = {}
    for split, n in (("train", pairs), ("valid", 3000)):
        src_len = np.clip(rng.lognormal(3.0, 0.55, n).astype(int), 1, 150)  # median 20 words, like news text
        tgt_len = np.clip((src_len * rng.uniform(0.8, 1.25, n)).astype(int), 1, 150)
        files[f"{split}-src"] = directory / f"{split}.en{suffix}"
        files[f"{split}-tgt"] = directory / f"{split}.de{suffix}"
        write_side(files[f"{split}-src"], src_len, src_lex, rng, use_gzip)
        write_side(files[f"{split}-tgt"], tgt_len, tgt_lex, rng, use_gzip)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5_000_000)
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--vocab-sample", type=int, default=1_000_000)
    parser.add_argument("--gzip", action="store_true", help="write the corpus gzip-compressed")
    parser.add_argument("--workdir", type=Path, help="where to put the corpus (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the corpus and the output")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="transduce-bench-", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        files = make_corpus(work, args.pairs, args.gzip)
        generate_s = time.perf_counter() - t0
        corpus_bytes = sum(p.stat().st_size for p in files.values())
        print(
            f"corpus: {args.pairs:,} pairs, {corpus_bytes / 2**20:,.0f} MiB on disk, generated in {generate_s:.0f} s",
            flush=True,
        )

        command = [
            sys.executable,
            "-m",
            "transduce",
            "prepare",
            "--src",
            "en",
            "--tgt",
            "de",
            "--vocab-size",
            str(args.vocab_size),
            "--vocab-sample",
            str(args.vocab_sample),
            "--out",
            str(work / "prepared"),
        ]
        for name, path in files.items():
            command += [f"--{name}", str(path)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
        print("running:", " ".join(command), flush=True)
        t0 = time.perf_counter()
        returncode = subprocess.run(command, env=env).returncode
        prepare_s = time.perf_counter() - t0
        peak_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if returncode != 0:
            print(f"prepare failed with status {returncode}")
            return returncode

        meta = json.loads((work / "prepared" / "data.json").read_text())
        output_bytes = sum(p.stat().st_size for p in (work / "prepared").iterdir())
        result = {
            "pairs": args.pairs,
            "vocab_size": args.vocab_size,
            "vocab_sample": args.vocab_sample,
            "gzip": args.gzip,
            "corpus_MiB": round(corpus_bytes / 2**20),
            "output_MiB": round(output_bytes / 2**20),
            "train_tokens": meta["splits"]["train"]["src_tokens"] + meta["splits"]["train"]["tgt_tokens"],
            "prepare_seconds": round(prepare_s, 1),
            "prepare_peak_rss_MiB": round(peak_child / 2**20),
            "generator_peak_rss_MiB": round(peak_self / 2**20),
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        verdict = "OK" if peak_child < 2 * 2**30 else "OVER"
        print(
            f"peak RSS of prepare: {peak_child / 2**30:.2f} GiB ({verdict}: target < 2 GiB); "
            f"wall time {prepare_s / 60:.1f} min"
        )
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
