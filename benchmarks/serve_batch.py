"""A q list of N strings in one LibreTranslate request against the same N strings sent as N
requests, through a live `transduce serve` (docs/serve.md, "Sentences"): wall time, the decoding
rounds the server ran (/metrics), and the sentence splitter's share of the request's time.

    python -m benchmarks.serve_batch                       # a tiny model trained here (about 20 s)
    python -m benchmarks.serve_batch --model RUN --lang en # a model of yours, its source's strings

Without --model, a model is trained on the spot to reverse its input (`transduce.synthetic`: 2
layers, d_model 64, 10 words, one token each) and saved as a model directory; the strings are 1
to 6 of its words. With --model, the strings are newstest2014's first lines in --lang, cut to 1
to 12 words (what a localisation tool sends: short strings). Three ways, in turn over --rounds
rounds (the median reported): the list in one request (one job: one decoding round); the N
strings one request after the other from one client; the N strings from --clients clients at
once (dynamic batching gathers them). Every way's translations must be the same. The splitter's
share: `text.sentences.split_all` over the same strings in this process (one thread), against the
list request's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORDS = "ant bee cat dog elk fox gnu hen ibis jay".split()


def reverse_model(root: Path) -> Path:
    """A model directory (ROOT/reverse) of a model trained to reverse its input (as tests/test_text_align.py
    trains it); it names no languages, so the server takes any codes."""
    import torch

    from transduce.checkpoint import save_model
    from transduce.config import Config, ModelConfig
    from transduce.data.vocab import Vocab, train_vocab
    from transduce.synthetic import N_SPECIAL, train_synthetic

    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    vocab = Vocab(
        train_vocab(root / "words", lines, vocab_size=N_SPECIAL + len(WORDS), model_type="word", num_threads=1)
    )
    config = ModelConfig(src_vocab_size=len(vocab), n_layers=2, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    model, result = train_synthetic(
        "reverse",
        n_symbols=len(WORDS),
        max_len=6,
        batch_size=64,
        eval_every=50,
        n_dev=200,
        n_eval=200,
        lr_scale=0.5,
        model_config=config,
    )
    out = root / "reverse"
    save_model(model, Config(model=config), out)
    shutil.copy(vocab.path, out / "spm.model")
    print(f"trained the reverse model: held-out exact match {result.exact_match:.1%}", file=sys.stderr)
    return out


def strings(n: int, model: bool, lang: str) -> list[str]:
    rng = random.Random(1)
    if not model:
        return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]
    import gzip

    from transduce.data.datasets import fetch

    with gzip.open(fetch("wmt14-en-de", "newstest2014", lang), "rt", encoding="utf-8") as f:
        lines = [line.split() for line, _ in zip(f, range(n))]
    return [" ".join(words[: rng.randint(1, 12)]) for words in lines]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(url: str, name: str) -> float:
    import httpx

    return float(re.search(rf"^{name} (\S+)$", httpx.get(url + "/metrics").text, re.M).group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a run or model directory (default: a reverse model trained here)")
    parser.add_argument("--lang", default="en", help="the model's source language (with --model)")
    parser.add_argument("--strings", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="the server's threads")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="keep the trained model in DIR/reverse (reused if there)"
    )
    args = parser.parse_args(argv)
    import httpx

    from transduce.text.sentences import split_all

    tmp = Path(tempfile.mkdtemp(prefix="serve-batch-"))
    try:
        trained = (args.keep or tmp) / "reverse"
        model = args.model or (trained if trained.is_dir() else reverse_model(args.keep or tmp))
        q = strings(args.strings, args.model is not None, args.lang)
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "transduce",
            "serve",
            str(model),
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--precision",
            args.precision,
            "--max-sentences",
            str(max(64, args.strings)),
            "--log-level",
            "warning",
        ]
        server = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(
                    f"transduce serve did not start: {server.stderr.read() if server.poll() is not None else ''}"
                )
            time.sleep(0.1)
        pair = httpx.get(url + "/info").json().get("languages") or {}  # a model that names none takes any codes
        body = {"source": pair.get("src") or args.lang, "target": pair.get("tgt") or "de"}
        client = httpx.Client(timeout=120)

        def one(text: str) -> str:
            r = client.post(url + "/translate", json={"q": text, **body})
            r.raise_for_status()
            return r.json()["translatedText"]

        def as_list() -> list[str]:
            r = client.post(url + "/translate", json={"q": q, **body})
            r.raise_for_status()
            return r.json()["translatedText"]

        def sequential() -> list[str]:
            return [one(t) for t in q]

        def concurrent() -> list[str]:
            with ThreadPoolExecutor(args.clients) as pool:
                return list(pool.map(one, q))

        ways = {
            "one request, a q list": as_list,
            "N requests, one client": sequential,
            f"N requests, {args.clients} clients": concurrent,
        }
        expected = as_list()  # also the first pass: the kernels made for the shapes, untimed
        sequential()
        times: dict[str, list[float]] = {w: [] for w in ways}
        rounds: dict[str, list[float]] = {w: [] for w in ways}
        for r in range(args.rounds):
            order = list(ways)[r % len(ways) :] + list(ways)[: r % len(ways)]
            for way in order:
                before = metric(url, "transduce_batch_sentences_count")
                start = time.perf_counter()
                got = ways[way]()
                times[way].append(time.perf_counter() - start)
                rounds[way].append(metric(url, "transduce_batch_sentences_count") - before)
                if got != expected:
                    raise SystemExit(f"{way}: other translations than the q list's")
        split = []
        for _ in range(max(5, args.rounds)):
            start = time.perf_counter()
            split_all(q, body["source"], "on")
            split.append(time.perf_counter() - start)
        server.terminate()
        server.wait(30)
        rows = {
            w: {"seconds": round(statistics.median(t), 3), "decoding_rounds": statistics.median(rounds[w])}
            for w, t in times.items()
        }
        list_s = rows["one request, a q list"]["seconds"]
        report = {
            "model": "a reverse model trained here (2 layers, d_model 64)" if args.model is None else str(args.model),
            "strings": len(q),
            "chars": sum(map(len, q)),
            "server_threads": args.threads,
            "precision": args.precision,
            "rounds": args.rounds,
            "ways": rows,
            "speedup_over_one_client": round(rows["N requests, one client"]["seconds"] / list_s, 1),
            "split_ms": round(statistics.median(split) * 1000, 2),
            "split_share_of_the_list_request": f"{statistics.median(split) / list_s:.1%}",
            "load": os.getloadavg()[0],
        }
        print(json.dumps(report, indent=1))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
