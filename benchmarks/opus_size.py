"""OPUS-MT's sizes, the models people serve, against CTranslate2 and Hugging Face: CTranslate2's
README table for the machine at hand (target tokens/s, the peak memory of the whole process
tree, and BLEU where a model is trained).

    python -m benchmarks.opus_size                                  # opus-mt-en-de's shape, 64 sentences
    python -m benchmarks.opus_size --shapes en-de,tc-big --sentences 512 --rounds 3 --out opus.json
    python -m benchmarks.opus_size --before ../old-tree             # transduce's rows with another tree too
    python -m benchmarks.opus_size --trained runs/multi30k-en-de    # and BLEU of a trained model

Each shape is a MarianMT directory made with transformers' own classes (random weights, seeded;
EOS banned through the final logits bias, so that every system decodes to its length limit),
imported with `transduce import` (or `transduce export from-marian`) and converted with
`ct2-transformers-converter`. Every row is a process of its own, run as a user runs it, its
process tree's resident memory sampled from /proc; the rows take turns, round after round.
Method: docs/speed.md, "opus_size.py".
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.serve_load import free_port, start_server, wait_healthy

REPO = Path(__file__).resolve().parents[1]
ALPHA = 0.6  # the paper's length penalty (6.1): with lengths all equal it ranks nothing, but it gives |Y| back
EOS_BAN = -1.0e4  # the final logits bias on EOS: no system ends a hypothesis before its length limit
SPM_SIZE = 8000  # the sentencepiece model's pieces (the rest of the vocabulary: pieces never in the input)


@dataclass(frozen=True)
class Shape:
    """A published MarianMT shape (its config.json's numbers); PAD is the last id and the decoder's start."""

    title: str
    d_model: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    eos: int
    activation: str
    positions: int

    def describe(self) -> str:
        return (
            f"d_model {self.d_model}, {self.layers}+{self.layers} layers, {self.heads} heads, FFN {self.ffn}, "
            f"{self.activation}, vocabulary {self.vocab:,}, EOS {self.eos}, PAD {self.vocab - 1} = decoder start"
        )


SHAPES = {
    "en-de": Shape("opus-mt-en-de's shape", 512, 6, 8, 2048, 58101, 0, "swish", 512),
    "tc-big": Shape(
        "opus-mt-tc-big's shape (opus-mt-tc-big-fr-en's config.json)", 1024, 6, 16, 4096, 53017, 43311, "relu", 1024
    ),
    "tiny": Shape("a tiny shape (the tests')", 32, 2, 4, 64, 500, 0, "swish", 512),
}
SYSTEMS = (
    "transduce-fp32",
    "transduce-int8",
    "transduce-bf16",
    "ct2-float32",
    "ct2-int8",
    "hf-fp32",
    "transduce-int8-shortlist",
)
"""transduce-int8-shortlist: `translate --shortlist` (not exact; in batches, this tree only), the shortlist made
by `transduce shortlist` of the WMT14 train sample (--shortlist-src/--shortlist-tgt)."""


# -- the peak memory of a process tree ---------------------------------------------------------------


def tree_pids(root: int) -> list[int]:
    """`root` and all its descendants: the children each of their threads started (/proc/PID/task/TID/children)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # it ended meanwhile
            pass
    return pids


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class TreeMemory:
    """The peak resident memory of a process and all its descendants, summed (pages that forked
    workers share count in each, as `ps` shows them): /proc read every `interval` s in a thread,
    the tree itself every `rescan` s."""

    def __init__(self, pid: int, interval: float = 0.005, rescan: float = 0.02):
        self.pid, self.interval, self.rescan = pid, interval, rescan
        self.peak, self.processes = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        pids, rescan_at = [], 0.0
        while True:
            if time.monotonic() >= rescan_at:
                pids, rescan_at = tree_pids(self.pid), time.monotonic() + self.rescan
                self.processes = max(self.processes, len(pids))
            self.peak = max(self.peak, sum(rss_bytes(p) for p in pids))
            if self._stop.wait(self.interval):
                return


def measured(cmd: list[str], env: dict, timeout: float) -> dict:
    """Run `cmd` to its end: its wall time, its process tree's peak memory, its stdout and stderr."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with TreeMemory(proc.pid) as mem:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RuntimeError(f"{' '.join(cmd[1:4])} ran past --timeout ({timeout:.0f} s)") from None
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{' '.join(cmd[1:4])} ... failed ({proc.returncode}): {last}")
    return {
        "wall_s": time.perf_counter() - t0,
        "peak_mb": mem.peak / 2**20,
        "processes": mem.processes,
        "stdout": out,
        "stderr": err,
    }


# -- the inputs: a vocabulary of the published size, sentences of a fixed number of pieces ---------------


def train_spm(lines: list[str], size: int) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        vocab_size=size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return buf.getvalue()


def opus_vocab(sp, shape: Shape) -> dict[str, int]:
    """vocab.json as OPUS-MT numbers it: `</s>` at the shape's EOS, `<unk>`, the sentencepiece
    model's pieces, pieces of no text up to the published size, `<pad>` last."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    slots: list[str | None] = [None] * shape.vocab
    slots[shape.eos], slots[-1] = "</s>", "<pad>"
    slots[next(i for i in (1, 2) if slots[i] is None)] = "<unk>"
    fill = iter(pieces + [f"\u2581unused{i}" for i in range(shape.vocab)])
    return {(p if p is not None else next(fill)): i for i, p in enumerate(slots)}


def pick_sentences(lines: list[str], sp, vocab: dict[str, int], n: int, pieces: int) -> list[tuple[str, list[str]]]:
    """The first `n` lines cut to `pieces` source pieces: (text, its pieces), the text encoding back
    to exactly those pieces (so that every system reads the same ids), each piece in `vocab`."""
    out = []
    for line in lines:
        cut = sp.encode(line.strip(), out_type=str)[:pieces]
        text = sp.decode_pieces(cut) if len(cut) == pieces else ""
        if (
            text
            and sp.encode(text, out_type=str) == cut
            and all(p in vocab for p in cut)
            and "<" not in text
            and not text.startswith(">>")
        ):  # MarianTokenizer keeps <unk>, </s>, >>xx<< whole
            out.append((text, cut))
            if len(out) == n:
                return out
    raise RuntimeError(
        f"only {len(out)} lines of the source have {pieces} pieces that encode back to themselves "
        f"(--sentences asks for {n})"
    )


def read_text(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


# -- the processes: a row is one of them ----------------------------------------------------------------


def env_for(src: Path) -> dict:
    """The environment of a child: the transduce of `src` first on the path, then this tree's benchmarks."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def child_cmd(kind: str, spec: dict, work: Path) -> list[str]:
    path = work / f"{kind}-{len(list(work.glob(f'{kind}-*.json')))}.json"
    path.write_text(json.dumps(spec))
    return [sys.executable, "-m", "benchmarks.opus_size", "--child", kind, str(path)]


def child_result(r: dict) -> dict:
    """The child's JSON (its last line of output), with the parent's measurements."""
    return {**json.loads(r["stdout"].strip().splitlines()[-1]), **{k: r[k] for k in ("wall_s", "peak_mb", "processes")}}


def ct2_converter() -> list[str]:
    exe = Path(sys.executable).with_name("ct2-transformers-converter")
    return (
        [str(exe)]
        if exe.is_file()
        else [sys.executable, "-c", "from ctranslate2.converters.transformers import main; main()"]
    )


def import_command(env: dict) -> list[str]:
    """`transduce import` where the tree has it, else its older spelling `transduce export from-marian`."""
    new = (
        subprocess.run(
            [sys.executable, "-m", "transduce", "import", "--help"], env=env, cwd=REPO, capture_output=True, check=False
        ).returncode
        == 0
    )
    return [sys.executable, "-m", "transduce", *(["import"] if new else ["export", "from-marian"])]


def penalty_flags(env: dict) -> list[str]:
    """The paper's length penalty as the tree's translate and serve spell it (`--length-penalty gnmt:A`,
    earlier `--alpha A`): given, so that every tree searches alike (an imported model's default is its own)."""
    out = subprocess.run(
        [sys.executable, "-m", "transduce", "translate", "--help"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return ["--length-penalty", f"gnmt:{ALPHA}"] if "gnmt:" in out else ["--alpha", str(ALPHA)]


def lengths_from_scores(tsv: str) -> list[int]:
    """|Y| of each best hypothesis of `translate --n-best 1`, from its score = log P / ((5 + |Y|) / 6)^alpha."""
    out = []
    for line in tsv.splitlines():
        _, _, score, logprob, _ = line.split("\t", 4)
        out.append(length_of(float(score), float(logprob)))
    return out


def length_of(score: float, logprob: float) -> int:
    if score >= 0 or logprob >= 0:
        raise RuntimeError(f"cannot read a length from score {score} and log-probability {logprob}")
    y = 6 * (logprob / score) ** (1 / ALPHA) - 5
    return round(y) if abs(y - round(y)) < 0.05 else -1


def check_lengths(what: str, lengths: list[int], n: int, steps: int) -> None:
    if len(lengths) != n or set(lengths) != {steps}:
        raise RuntimeError(f"{what}: {len(lengths)} outputs of lengths {sorted(set(lengths))}, expected {n} of {steps}")


@dataclass
class Row:
    """One system in one regime: a transduce precision (of a tree, with its workers) or a peer's."""

    system: str  # one of SYSTEMS
    tree: str = "this tree"  # transduce's rows: "this tree" or "before"
    workers: str = "auto"  # transduce translate's --workers

    @property
    def precision(self) -> str:
        return self.system.split("-")[1]

    @property
    def shortlist(self) -> bool:
        return self.system.endswith("-shortlist")

    def label(self, regime: str = "batch", workers: str | None = None) -> str:
        """The row's name in the table; `workers`: how many the default --workers gave."""
        kind = self.system.split("-")[0]
        name = {"transduce": "transduce", "ct2": "CTranslate2", "hf": "Hugging Face generate"}[
            kind
        ] + f" {self.precision}"
        name += " --shortlist" if self.shortlist else ""
        name += " [before]" if self.tree == "before" else ""
        if regime == "single":
            return name + (" (serve)" if kind == "transduce" else " (in process)")
        if kind == "transduce" and self.workers != "auto":
            return name + f" (--workers {self.workers})"
        return name + (f" (default workers: {workers})" if workers else "")


class Bench:
    """One shape's files and settings, and the rows run on them."""

    def __init__(self, args, shape: Shape, work: Path, trees: dict[str, Path]):
        self.args, self.shape, self.work, self.trees = args, shape, work, trees
        self.threads = args.threads
        self.steps = args.source_pieces + 1 + args.max_len_offset  # the source's pieces and EOS, + the offset
        self.single_steps = args.source_pieces + 1 + args.single_max_len_offset
        self.shortlist_text: tuple[Path, Path] | None = None  # parallel text for the shortlist rows

    def prepare(self, lines: list[str]) -> dict:
        """The MarianMT directory, its transduce imports and CTranslate2 conversions, and the inputs."""
        import sentencepiece as spm

        s, a = self.shape, self.args
        model = spm.SentencePieceProcessor(model_proto=train_spm(lines, min(SPM_SIZE, s.vocab - 3)))
        vocab = opus_vocab(model, s)
        picked = pick_sentences(lines, model, vocab, max(a.sentences, a.single_sentences), a.source_pieces)
        self.texts = [t for t, _ in picked]
        self.pieces = [p + ["</s>"] for _, p in picked]  # CTranslate2 takes pieces, EOS included (as MarianTokenizer's)
        self.ids = [[vocab[p] for p in ps] for ps in self.pieces]
        self.source = self.work / "source.txt"
        self.source.write_text("\n".join(self.texts[: a.sentences]) + "\n", encoding="utf-8")
        self.marian = self.work / "marian"
        env = env_for(self.trees["this tree"])
        built = child_result(
            measured(
                child_cmd("build", {"shape": asdict(s), "out": str(self.marian), "seed": a.seed}, self.work),
                env,
                a.timeout,
            )
        )
        for name in ("source.spm", "target.spm"):
            (self.marian / name).write_bytes(model.serialized_model_proto())
        (self.marian / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (self.marian / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
        self.bf16 = built["bf16"]
        setup = {"parameters": built["parameters"], "spm_pieces": model.get_piece_size()}
        self.models, self.penalty = {}, {}
        for tree, src in self.trees.items():
            cmd, self.penalty[tree] = import_command(env_for(src)), penalty_flags(env_for(src))
            self.models[tree] = self.work / f"transduce-{tree.replace(' ', '-')}"
            r = measured([*cmd, str(self.marian), "-o", str(self.models[tree])], env_for(src), a.timeout)
            what = f"{' '.join(['transduce', *cmd[3:]])} ({tree})"
            setup[what] = {"wall_s": r["wall_s"], "peak_mb": r["peak_mb"]}
            progress(f"{s.title}: {what} {r['wall_s']:.1f} s, {r['peak_mb']:,.0f} MB")
        if self.shortlist_text:
            model = self.models["this tree"]
            r = measured(
                [
                    sys.executable,
                    "-m",
                    "transduce",
                    "shortlist",
                    str(model),
                    "--train-src",
                    str(self.shortlist_text[0]),
                    "--train-tgt",
                    str(self.shortlist_text[1]),
                ],
                env,
                a.timeout,
            )
            setup["transduce shortlist (this tree)"] = {"wall_s": r["wall_s"], "peak_mb": r["peak_mb"]}
        for q in ("float32", "int8"):
            out = self.work / f"ct2-{q}"
            r = measured(
                [*ct2_converter(), "--model", str(self.marian), "--output_dir", str(out), "--quantization", q],
                env,
                a.timeout,
            )
            setup[f"ct2-transformers-converter {q}"] = {"wall_s": r["wall_s"], "peak_mb": r["peak_mb"]}
        return setup

    def batch(self, row: Row) -> dict:
        """Batches of --batch-size: `transduce translate` as a user runs it, or a peer's child."""
        a, n = self.args, self.args.sentences
        if row.system.startswith("transduce"):
            out = self.work / "out.tsv"
            cmd = [
                sys.executable,
                "-m",
                "transduce",
                "translate",
                str(self.models[row.tree]),
                "-i",
                str(self.source),
                "-o",
                str(out),
                "--beam",
                str(a.beam),
                "--max-len-offset",
                str(a.max_len_offset),
                "--precision",
                row.precision,
                "--batch-size",
                str(a.batch_size),
                "--threads",
                str(self.threads),
                "--n-best",
                "1",
                *self.penalty[row.tree],
            ]
            cmd += ["--workers", row.workers] if row.workers != "auto" else []
            cmd += ["--shortlist"] if row.shortlist else []
            r = measured(cmd, env_for(self.trees[row.tree]), a.timeout)
            check_lengths(row.label(), lengths_from_scores(out.read_text(encoding="utf-8")), n, self.steps)
            workers = re.search(r"workers: (\d+) x (\d+)", r["stderr"])
            r = {k: r[k] for k in ("wall_s", "peak_mb", "processes")}
            r["workers"] = f"{workers[1]} x {workers[2]} thread(s)" if workers else None
        else:
            r = self._peer(row, single=False)
        r["tokens_per_s"] = n * self.steps / r["wall_s"]
        return r

    def single(self, row: Row) -> dict:
        """One sentence at a time: `transduce serve` over HTTP (started, warmed, then the sentences
        one by one), CTranslate2 in its own process."""
        if not row.system.startswith("transduce"):
            r = self._peer(row, single=True)
        else:
            r = self._serve(row)
        r["latency_s"] = statistics.median(r["latencies"])
        r["tokens_per_s"] = self.single_steps / r["latency_s"]
        return r

    def _peer(self, row: Row, single: bool) -> dict:
        a = self.args
        n = a.single_sentences if single else a.sentences
        kind = row.system.split("-")[0]
        spec = {
            "model": str(self.work / f"ct2-{row.precision}") if kind == "ct2" else str(self.marian),
            "compute_type": row.precision,
            "threads": self.threads,
            "batch_size": a.batch_size,
            "beam": a.beam,
            "steps": self.single_steps if single else self.steps,
            "single": single,
            "tokens": self.pieces[:n] if kind == "ct2" else self.ids[:n],
        }
        r = child_result(measured(child_cmd(kind, spec, self.work), env_for(self.trees["this tree"]), a.timeout))
        check_lengths(row.label("single" if single else "batch"), r.pop("lengths"), n, spec["steps"])
        return r

    def _serve(self, row: Row) -> dict:
        import httpx

        a = self.args
        port, t0 = free_port(), time.perf_counter()
        proc = start_server(
            str(self.models[row.tree]),
            port,
            [
                "--precision",
                row.precision,
                "--beam",
                str(a.beam),
                "--max-len-offset",
                str(a.single_max_len_offset),
                *self.penalty[row.tree],
            ],
            self.threads,
            src=self.trees[row.tree],
        )
        url, latencies, lengths = f"http://127.0.0.1:{port}", [], []
        with TreeMemory(proc.pid) as mem:
            try:
                wait_healthy(httpx, url, proc, timeout=a.timeout)
                ready = time.perf_counter() - t0
                with httpx.Client(timeout=a.timeout) as client:
                    for i in range(-2, a.single_sentences):  # two requests warm the server up
                        t1 = time.perf_counter()
                        res = client.post(
                            url + "/translate", json={"sentences": [self.texts[max(i, 0)]], "scores": True}
                        )
                        if res.status_code != 200:
                            raise RuntimeError(f"transduce serve answered {res.status_code}: {res.text[:200]}")
                        if i >= 0:
                            latencies.append(time.perf_counter() - t1)
                            h = res.json()["translations"][0]
                            lengths.append(length_of(h["score"], h["logprob"]))
            finally:
                proc.terminate()
                proc.wait(60)
        check_lengths(row.label("single"), lengths, a.single_sentences, self.single_steps)
        return {"latencies": latencies, "ready_s": ready, "peak_mb": mem.peak / 2**20, "processes": mem.processes}


# -- the children: the build, CTranslate2 and Hugging Face, each in a process of its own -------------------


def child_build(spec: dict) -> dict:
    """A MarianMT directory of the shape, made with transformers' own classes (as OPUS-MT's config.json
    says: tied embeddings, final logits bias, scaled embeddings, static sinusoids), EOS banned; and
    whether `transduce.cpu` says bf16 is native here."""
    import torch
    from transformers import MarianConfig, MarianMTModel
    from transformers.utils import logging as hf_logging

    from transduce.cpu import cpu_flags

    hf_logging.set_verbosity_error()
    s = Shape(**spec["shape"])
    pad = s.vocab - 1
    config = MarianConfig(
        vocab_size=s.vocab,
        decoder_vocab_size=s.vocab,
        d_model=s.d_model,
        encoder_layers=s.layers,
        decoder_layers=s.layers,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=s.ffn,
        decoder_ffn_dim=s.ffn,
        activation_function=s.activation,
        scale_embedding=True,
        static_position_embeddings=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        normalize_before=False,
        normalize_embedding=False,
        add_bias_logits=False,
        max_position_embeddings=s.positions,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=pad,
        eos_token_id=s.eos,
        bos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=s.eos,
        architectures=["MarianMTModel"],
    )
    torch.manual_seed(spec["seed"])
    model = MarianMTModel(config).eval()
    for k, v in {
        "num_beams": 4,
        "max_length": 512,
        "bad_words_ids": [[pad]],
    }.items():  # as the hub's generation_config.json
        setattr(model.generation_config, k, v)
    with torch.no_grad():
        model.final_logits_bias[0, s.eos] = EOS_BAN
    model.save_pretrained(spec["out"])
    return {"parameters": model.num_parameters(), "bf16": bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})}


def child_ct2(spec: dict) -> dict:
    import ctranslate2

    t = ctranslate2.Translator(
        spec["model"], device="cpu", compute_type=spec["compute_type"], intra_threads=spec["threads"], inter_threads=1
    )
    options = {"beam_size": spec["beam"], "length_penalty": ALPHA, "max_decoding_length": spec["steps"]}
    if not spec["single"]:
        out = t.translate_batch(spec["tokens"], max_batch_size=spec["batch_size"], **options)
        return {"lengths": [len(r.hypotheses[0]) for r in out]}
    t.translate_batch(spec["tokens"][:1], **options)  # warm-up
    latencies, lengths = [], []
    for tokens in spec["tokens"]:
        t0 = time.perf_counter()
        [r] = t.translate_batch([tokens], **options)
        latencies.append(time.perf_counter() - t0)
        lengths.append(len(r.hypotheses[0]))
    return {"lengths": lengths, "latencies": latencies}


def child_hf(spec: dict) -> dict:
    import torch
    from transformers import MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(spec["threads"])
    model = MarianMTModel.from_pretrained(spec["model"]).eval()
    lengths, ids, bs = [], spec["tokens"], spec["batch_size"]
    with torch.inference_mode():
        for start in range(0, len(ids), bs):
            src = torch.tensor(ids[start : start + bs])  # (B, S): every source as long as the others
            out = model.generate(
                input_ids=src,
                attention_mask=torch.ones_like(src),
                num_beams=spec["beam"],
                max_new_tokens=spec["steps"],
                length_penalty=ALPHA,
                do_sample=False,
                early_stopping=False,
            )
            lengths += [out.size(1) - 1] * src.size(0)  # (B, 1 + steps): the start token, then each step's
    return {"lengths": lengths}


CHILDREN = {"build": child_build, "ct2": child_ct2, "hf": child_hf}


# -- trained: BLEU of each transduce precision and CTranslate2's -------------------------------------------


def trained_bleu(args, trees: dict[str, Path], precisions: list[str], work: Path) -> list[dict]:
    import sacrebleu

    from transduce.data.datasets import fetch

    src = Path(args.test_src) if args.test_src else fetch("multi30k", "test_2016_flickr", "en", data_dir=args.data_dir)
    ref = Path(args.test_ref) if args.test_ref else fetch("multi30k", "test_2016_flickr", "de", data_dir=args.data_dir)
    refs, rows = read_text(ref), []

    def translate(label: str, model: str, extra: list[str], src_tree: Path) -> None:
        out = work / "bleu.txt"
        cmd = [
            sys.executable,
            "-m",
            "transduce",
            "translate",
            model,
            "-i",
            str(src),
            "-o",
            str(out),
            "-q",
            "--threads",
            str(args.threads),
            *extra,
        ]
        r = measured(cmd, env_for(src_tree), args.timeout)
        bleu = sacrebleu.corpus_bleu(read_text(out), [refs]).score
        rows.append({"system": label, "bleu": bleu, "wall_s": r["wall_s"], "peak_mb": r["peak_mb"]})
        progress(f"trained: {label}: BLEU {bleu:.2f}")

    for tree, src_tree in trees.items():
        for p in precisions:
            translate(Row(f"transduce-{p}", tree).label(), args.trained, ["--precision", p], src_tree)
    ct2 = work / "trained-ct2"
    measured(
        [sys.executable, "-m", "transduce", "export", "ct2", args.trained, "-o", str(ct2)],
        env_for(trees["this tree"]),
        args.timeout,
    )
    for q in ("float32", "int8"):
        translate(
            f"CTranslate2 {q} (transduce export ct2)",
            str(ct2),
            ["--engine", "ct2", "--ct2-compute-type", q],
            trees["this tree"],
        )
    return rows


# -- the report ---------------------------------------------------------------------------------------


def progress(line: str) -> None:
    print(f"opus_size: {line}", file=sys.stderr, flush=True)


def summarize(rounds: list[dict], steps: int) -> dict:
    """The rounds of one row: the median wall time (batches) or the median latency of all its
    sentences (one at a time), the largest peak memory; the rounds themselves kept."""
    out = {
        "rounds": rounds,
        "peak_mb": max(r["peak_mb"] for r in rounds),
        "processes": max(r["processes"] for r in rounds),
        "workers": rounds[0].get("workers"),
    }
    if "latencies" in rounds[0]:
        out["latency_s"] = statistics.median(x for r in rounds for x in r["latencies"])
        out["tokens_per_s"] = steps / out["latency_s"]
    else:
        out["wall_s"] = statistics.median(r["wall_s"] for r in rounds)
        out["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in rounds)
    return out


def versus(rows: dict, label: str, key: str) -> str:
    """How many times CTranslate2 int8's speed a row has (its tokens/s over CTranslate2 int8's)."""
    base = next((r for name, r in rows.items() if name.startswith("CTranslate2 int8")), None)
    return f"{rows[label][key] / base[key]:.2f}x" if base else "-"


def markdown(result: dict) -> str:
    a, v = result["args"], result["versions"]
    lines = [
        "# OPUS-MT's sizes: transduce, CTranslate2 and Hugging Face",
        "",
        f"{result['date']}, commit {result['commit']}"
        + (f" (before: commit {result['before_commit']}, {a['before']})" if a["before"] else "")
        + f"; {a['threads']} threads; torch {v['torch']}, ctranslate2 {v['ctranslate2']}, transformers {v['transformers']}",
        "",
    ] + [f"    {m}" for m in result["machine"]]
    for s in result["shapes"].values():
        lines += [
            "",
            (
                f"## {s['title']}: {s['shape']}; {s['setup']['parameters'] / 1e6:.1f}M parameters, random weights, "
                "EOS banned"
            ),
            "",
            "; ".join(
                f"{k}: {v['wall_s']:.1f} s, {v['peak_mb']:,.0f} MB"
                for k, v in s["setup"].items()
                if isinstance(v, dict)
            ),
        ]
        if s["batch"]:
            lines += [
                "",
                (
                    f"Batches of {a['batch_size']}: {a['sentences']} sentences cut to {a['source_pieces']} source "
                    f"pieces, beam {a['beam']}, {s['steps']} decoder steps each ({a['sentences'] * s['steps']:,} target "
                    f"tokens); each row a process of its own, timed whole; the median of {a['rounds']} round(s)"
                ),
                "",
                "| system | target tokens/s | x CTranslate2 int8 | wall time | peak memory (process tree) |",
                "|---|---|---|---|---|",
            ]
            for label, r in s["batch"].items():
                n = r["processes"]
                lines.append(
                    f"| {label} | {r['tokens_per_s']:,.1f} | {versus(s['batch'], label, 'tokens_per_s')} | "
                    f"{r['wall_s']:.1f} s | {r['peak_mb']:,.0f} MB ({n} process{'es' if n > 1 else ''}) |"
                )
        if s["single"]:
            lines += [
                "",
                (
                    f"One sentence at a time: {a['single_sentences']} sentences, beam {a['beam']}, {s['single_steps']} "
                    "decoder steps each; transduce through `transduce serve` over HTTP (started, warmed up, then the "
                    "sentences one by one), CTranslate2 in its process; the median of the sentences and rounds"
                ),
                "",
                "| system | latency per sentence | x CTranslate2 int8 | target tokens/s | peak memory (process tree) |",
                "|---|---|---|---|---|",
            ]
            for label, r in s["single"].items():
                lines.append(
                    f"| {label} | {r['latency_s']:.3f} s | {versus(s['single'], label, 'tokens_per_s')} | "
                    f"{r['tokens_per_s']:,.1f} | {r['peak_mb']:,.0f} MB |"
                )
    if result.get("bleu"):
        lines += [
            "",
            f"## BLEU of the trained model {a['trained']} (sacreBLEU; beam 4, alpha 0.6)",
            "",
            "| system | BLEU | wall time | peak memory (process tree) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['system']} | {r['bleu']:.2f} | {r['wall_s']:.1f} s | {r['peak_mb']:,.0f} MB |"
            for r in result["bleu"]
        ]
    return "\n".join(lines) + "\n"


def machine(env: dict) -> tuple[list[str], dict]:
    """benchmarks/machine.py's lines (the CPU, its flags, the kernels each library runs) and the libraries' versions."""
    from importlib.metadata import PackageNotFoundError, version

    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.machine"], env=env, cwd=REPO, capture_output=True, text=True, check=False
    )
    versions = {}
    for name in ("torch", "ctranslate2", "transformers"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            raise RuntimeError(f"{name} is not installed: pip install -e '.[ct2,hf,serve]'") from None
    return r.stdout.strip().splitlines(), versions


def git_commit(path: Path) -> str:
    """The tree's commit, "-dirty" after it where files differ from it."""
    r = subprocess.run(
        ["git", "-C", str(path), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    )
    return r.stdout.strip() or "unknown"


def source_tree(path: str) -> Path:
    """A transduce source tree: a checkout (its src/) or a folder holding the transduce package."""
    p = Path(path).resolve()
    for src in (p / "src", p):
        if (src / "transduce" / "__init__.py").is_file():
            return src
    raise RuntimeError(f"{path}: no transduce package in it or in its src/")


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.opus_size", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shapes",
        default="en-de",
        metavar="S,...",
        help="comma-separated: en-de, tc-big (tiny: the tests'); default en-de",
    )
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        metavar="S,...",
        help="comma-separated, default all: " + ", ".join(SYSTEMS) + " (bf16 only where native)",
    )
    p.add_argument("--shortlist-src", metavar="FILE", help="transduce-int8-shortlist: parallel text's source side")
    p.add_argument("--shortlist-tgt", metavar="FILE", help="... and its target side (default: the WMT14 train sample)")
    p.add_argument(
        "--regimes", default="batch,single", metavar="R,...", help="comma-separated: batch, single (default both)"
    )
    p.add_argument("--sentences", type=int, default=64, metavar="N", help="sentences decoded in batches (default 64)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="sentences per batch (default 32)")
    p.add_argument(
        "--single-sentences", type=int, default=8, metavar="N", help="sentences decoded one at a time (default 8)"
    )
    p.add_argument(
        "--source-pieces", type=int, default=20, metavar="N", help="each source cut to this many pieces (default 20)"
    )
    p.add_argument("--beam", type=int, default=4, metavar="K", help="beam size (default 4)")
    p.add_argument(
        "--max-len-offset",
        type=int,
        default=10,
        metavar="N",
        help="batches: output length = source + EOS + this (default 10: 31 steps)",
    )
    p.add_argument(
        "--single-max-len-offset",
        type=int,
        default=50,
        metavar="N",
        help="one at a time: the same (default 50: 71 steps)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, metavar="N", help="rounds, the rows taking turns in each (default 2)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        metavar="N",
        help="CPU threads of every system (default: the usable cores)",
    )
    p.add_argument(
        "--transduce-workers",
        default="auto,1",
        metavar="W,...",
        help="comma-separated: transduce translate's --workers in batches (default auto,1)",
    )
    p.add_argument(
        "--before", metavar="SRC_TREE", help="also transduce's rows with this source tree (e.g. a git worktree)"
    )
    p.add_argument("--trained", metavar="RUN", help="also BLEU of this trained run or model directory")
    p.add_argument(
        "--test-src", metavar="FILE", help="--trained: source sentences (default Multi30k test_2016_flickr, English)"
    )
    p.add_argument(
        "--test-ref", metavar="FILE", help="--trained: references (default Multi30k test_2016_flickr, German)"
    )
    p.add_argument("--source", metavar="FILE", help="sentences to decode (default newstest2014's English side)")
    p.add_argument("--data-dir", metavar="DIR", help="dataset mirror (default: transduce's)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="the random weights' seed (default 0)")
    p.add_argument("--timeout", type=float, default=3600, metavar="S", help="seconds a process may take (default 3600)")
    p.add_argument("--workdir", metavar="DIR", help="where the models go (default a temporary directory, removed)")
    p.add_argument("--out", metavar="JSON", help="also write the results as JSON")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, values, allowed in (
        ("shape", args.shapes, SHAPES),
        ("system", args.systems, SYSTEMS),
        ("regime", args.regimes, ("batch", "single")),
    ):
        if bad := [v for v in values.split(",") if v not in allowed]:
            p.error(f"unknown {name} {bad[0]!r} (choose from {', '.join(allowed)})")
    if args.trained and bool(args.test_src) != bool(args.test_ref):
        p.error("--test-src and --test-ref go together")
    if min(args.sentences, args.single_sentences, args.batch_size, args.rounds, args.threads) < 1:
        p.error("--sentences, --single-sentences, --batch-size, --rounds and --threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](json.loads(Path(args.child[1]).read_text()))))
        return 0
    try:
        return run(args)
    except RuntimeError as e:
        print(f"opus_size: error: {e}", file=sys.stderr)
        return 1


def shortlist_text(args) -> tuple[Path, Path]:
    """The parallel text the shortlist rows' shortlist is made of: --shortlist-src/--shortlist-tgt, else the
    WMT14 En-De train sample (the mirror, or downloaded)."""
    from transduce.data.datasets import fetch

    if args.shortlist_src and args.shortlist_tgt:
        return Path(args.shortlist_src), Path(args.shortlist_tgt)
    return tuple(fetch("wmt14-en-de", "train-sample", lang, data_dir=args.data_dir) for lang in ("en", "de"))


def plan_rows(systems: list[str], trees: list[str], workers: list[str]) -> dict[str, list[Row]]:
    """The rows of each regime: transduce's for each tree (in batches, for each --workers), the peers' once
    (one sentence at a time: CTranslate2's alone)."""
    rows: dict[str, list[Row]] = {"batch": [], "single": []}
    for system in systems:
        for tree in trees:
            if system.endswith("-shortlist"):
                rows["batch"] += [Row(system, tree, w) for w in workers] if tree == "this tree" else []
            elif system.startswith("transduce"):
                rows["batch"] += [Row(system, tree, w) for w in workers]
                rows["single"].append(Row(system, tree))
            elif tree == "this tree":
                rows["batch"].append(Row(system))
                rows["single"] += [Row(system)] if system.startswith("ct2") else []
    return rows


def run(args) -> int:
    from transduce.data.datasets import fetch

    trees = {"this tree": REPO / "src"}
    if args.before:
        trees["before"] = source_tree(args.before)
    lines, versions = machine(env_for(trees["this tree"]))
    result = {
        "args": vars(args),
        "machine": lines,
        "versions": versions,
        "commit": git_commit(REPO),
        "before_commit": git_commit(trees["before"]) if args.before else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "shapes": {},
    }
    source = Path(args.source) if args.source else fetch("wmt14-en-de", "newstest2014", "en", data_dir=args.data_dir)
    text = [line for line in read_text(source) if line.strip()]
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opus-size-", dir=args.workdir) as tmp:
        for key in args.shapes.split(","):
            shape, work = SHAPES[key], Path(tmp) / key
            work.mkdir()
            bench = Bench(args, shape, work, trees)
            if "transduce-int8-shortlist" in args.systems.split(","):
                bench.shortlist_text = shortlist_text(args)
            s = result["shapes"][key] = {
                "title": shape.title,
                "shape": shape.describe(),
                "steps": bench.steps,
                "single_steps": bench.single_steps,
                "setup": bench.prepare(text),
                "batch": {},
                "single": {},
            }
            systems = [x for x in args.systems.split(",") if x != "transduce-bf16" or bench.bf16]
            if len(systems) < len(args.systems.split(",")):
                progress("no transduce bf16 rows: transduce.cpu finds no native bf16 here")
            rows = plan_rows(systems, list(trees), args.transduce_workers.split(","))
            for regime in args.regimes.split(","):
                measure, timing = (bench.batch, "wall_s") if regime == "batch" else (bench.single, "latency_s")
                done: dict[str, list] = {}
                for r in range(args.rounds):
                    for row in rows[regime]:
                        m = measure(row)
                        label = row.label(regime, m.get("workers"))
                        done.setdefault(label, []).append(m)
                        progress(
                            f"{key} {regime} round {r + 1}/{args.rounds}: {label}: {m[timing]:.3f} s, "
                            f"{m['tokens_per_s']:,.1f} tokens/s, {m['peak_mb']:,.0f} MB"
                        )
                steps = bench.steps if regime == "batch" else bench.single_steps
                s[regime] = {label: summarize(ms, steps) for label, ms in done.items()}
        if args.trained:
            precisions = [s.split("-")[1] for s in systems if s.startswith("transduce")]
            result["bleu"] = trained_bleu(args, trees, precisions, Path(tmp))
    table = markdown(result)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({**result, "table": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
