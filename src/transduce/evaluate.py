"""`transduce evaluate`'s scores: BLEU as the paper computed it, and as it should be reported today
(docs/evaluation.md). Each convention, step by step:

``sacrebleu``, ``chrf``  `sacrebleu.metrics.BLEU` (13a, cased) and `CHRF` with their defaults,
    on the detokenized output against the untouched reference, with their signatures.
``paper_bleu``  the paper's convention. Table 2's 27.3 / 28.4 (En-De) were computed by
    tensor2tensor's ``get_ende_bleu.sh``, which runs, on the hypotheses and on the reference:

    1. Moses ``tokenizer.perl -l de`` (default options: no aggressive hyphen splitting, special
       characters escaped to &amp; &quot; &apos; &lt; &gt; &#91; &#93; &#124;), here
       `sacremoses.MosesTokenizer(lang).tokenize(escape=True)`;
    2. ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``: "compound splitting" (GNMT, ConvS2S
       and Stanford's NMT did the same "for historical reasons"): a hyphen between two
       non-space characters becomes its own token; `compound_split` does it byte for byte, as
       Perl does (checked against perl in the tests);
    3. ``multi-bleu.perl``: corpus BLEU on whitespace tokens, case-sensitive, 4-grams, no
       smoothing (a zero n-gram precision gives 0), brevity penalty exp(1 - r/c) with r the
       sum of the closest reference lengths. `multi_bleu` implements it (and equals
       `sacrebleu.corpus_bleu(..., tokenize="none", smooth_method="none", force=True)`).

    Escaping does not change the score (it maps whole tokens one to one), so it is kept as
    tokenizer.perl's default. Other pairs: ``-l`` the target language (the paper does not say
    how its En-Fr scores were tokenized).
``multi30k_lc_tok_bleu``  Multi30k's convention in the literature: lowercased tokenized BLEU
    against the official `tok` references (``data/task1/tok/*.lc.norm.tok.*``, made with
    ``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L``). The
    hypotheses go through the same three steps (`str.lower`, `sacremoses.MosesPunctNormalizer`,
    `sacremoses.MosesTokenizer` with escaping), then `multi_bleu`. (Checked: sacremoses 0.2
    reproduces the official tok files of val and test, en, de and fr, 10,425 lines, but for 3
    where Multi30k's older Moses normalizer differs.)
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF

from .errors import DataError

CONVENTIONS = {
    "sacrebleu": "sacreBLEU on detokenized, cased text (Post, 2018)",
    "chrf": "chrF on detokenized, cased text (sacreBLEU)",
    "paper_bleu": "tokenized BLEU with compound splitting, as tensor2tensor's get_ende_bleu.sh computed the paper's "
    "Table 2: Moses tokenizer.perl -l LANG on hypotheses and reference, "
    "s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g, multi-bleu.perl",
    "multi30k_lc_tok_bleu": "Multi30k: lowercased BLEU on tokens against the official tok references "
    "(lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG, "
    "applied to the hypotheses too), multi-bleu.perl",
}

# Perl without -C matches bytes: \S is any byte but ASCII whitespace (a no-break space, bytes
# C2 A0, is \S), and one byte, not one character, is consumed on each side of the hyphen.
_ATAT = re.compile(rb"([^ \t\n\r\f\v])-([^ \t\n\r\f\v])")


def compound_split(line: str) -> str:
    """get_ende_bleu.sh's ``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``, byte for
    byte: "Auto-Fahrer" -> "Auto ##AT##-##AT## Fahrer"; hyphens at either end of a token, or
    between spaces, stay as they are; "a-b-c" -> "a ##AT##-##AT## b-c" (/g matches do not
    overlap; but "ß-Ü-ß" is split twice, since Perl consumed only the first byte of "Ü")."""
    return _ATAT.sub(rb"\1 ##AT##-##AT## \2", line.encode("utf-8")).decode("utf-8")


def _sacremoses():
    try:
        import sacremoses
    except ImportError:
        raise DataError("the tokenized BLEU conventions need sacremoses (pip install sacremoses)") from None
    return sacremoses


@functools.lru_cache(maxsize=None)
def _moses(kind: str, lang: str):
    """One sacremoses `kind` (MosesTokenizer, MosesPunctNormalizer) per language, made once."""
    return getattr(_sacremoses(), kind)(lang=lang)


def moses_tokenize(line: str, lang: str) -> str:
    """Moses ``tokenizer.perl -l LANG`` with its defaults (escaping on, no -a)."""
    return _moses("MosesTokenizer", lang).tokenize(line, aggressive_dash_splits=False, return_str=True, escape=True)


def paper_tokenize(line: str, lang: str) -> str:
    """tokenizer.perl -l LANG, then the ##AT## compound split (get_ende_bleu.sh)."""
    return compound_split(moses_tokenize(line, lang))


def multi30k_tokenize(line: str, lang: str) -> str:
    """lowercase.perl | normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG: how the
    Multi30k `tok` files were made (multi30k/dataset scripts/task1-tokenize.sh)."""
    return moses_tokenize(_moses("MosesPunctNormalizer", lang).normalize(line.lower()), lang)


_ASCII_SPACE = re.compile(r"[ \t\n\r\f\v]+")


def _words(line: str) -> list[str]:
    """Perl's ``split`` on a byte string: ASCII whitespace separates, leading/trailing ignored."""
    return [w for w in _ASCII_SPACE.split(line) if w]


@dataclass
class BleuResult:
    """multi-bleu.perl's numbers: `str()` prints its line."""

    score: float  # BLEU x 100
    precisions: list[float]  # Modified n-gram precisions x 100, n = 1..4
    bp: float
    ratio: float
    hyp_len: int
    ref_len: int
    correct: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        p = self.precisions
        return (
            f"BLEU = {self.score:.2f}, {p[0]:.1f}/{p[1]:.1f}/{p[2]:.1f}/{p[3]:.1f} "
            f"(BP={self.bp:.3f}, ratio={self.ratio:.3f}, hyp_len={self.hyp_len}, ref_len={self.ref_len})"
        )


def _ngrams(words: list[str]) -> Counter:
    """The 1- to 4-grams of `words`, counted."""
    return Counter(tuple(words[i : i + n]) for n in range(1, 5) for i in range(len(words) - n + 1))


def multi_bleu(
    hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], lowercase: bool = False
) -> BleuResult:
    """Corpus BLEU exactly as Moses' multi-bleu.perl computes it on pre-tokenized text.

    `refs` is one reference stream (a list of lines) or several (a list of such lists, like
    sacrebleu). Per sentence: n-gram counts clipped by the largest count in any reference;
    reference length = the closest reference length (the shorter on a tie). Corpus: precision
    p_n = sum of clipped matches / sum of hypothesis n-grams, BLEU = BP * exp(mean log p_n)
    with log 0 taken as -9999999999 (so a zero precision gives 0: no smoothing), BP =
    exp(1 - ref_len / hyp_len) if hyp_len < ref_len, else 1. `lowercase` is its -lc flag.
    """
    streams: list[Sequence[str]] = [refs] if refs and isinstance(refs[0], str) else list(refs)  # type: ignore[list-item]
    for s in streams:
        if len(s) != len(hyps):
            raise ValueError(f"{len(hyps)} hypotheses but a reference stream of {len(s)} lines")
    correct, total = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for i, hyp in enumerate(hyps):
        words = _words(hyp.lower() if lowercase else hyp)
        refs_words = [_words(stream[i].lower() if lowercase else stream[i]) for stream in streams]
        ref_max: Counter = Counter()  # each n-gram's largest count in any reference
        for ref_words in refs_words:
            ref_max |= _ngrams(ref_words)
        hyp_len += len(words)
        ref_len += min((len(r) for r in refs_words), key=lambda n: (abs(len(words) - n), n), default=0)  # closest
        for g, c in _ngrams(words).items():
            total[len(g) - 1] += c
            correct[len(g) - 1] += min(c, ref_max.get(g, 0))
    prec = [c / t if t else 0.0 for c, t in zip(correct, total)]
    if ref_len == 0 or hyp_len == 0:
        return BleuResult(
            0.0,
            [100 * p for p in prec],
            0.0,
            0.0 if ref_len == 0 else hyp_len / ref_len,
            hyp_len,
            ref_len,
            correct,
            total,
        )
    bp = math.exp(1 - ref_len / hyp_len) if hyp_len < ref_len else 1.0
    log_mean = sum(math.log(p) if p > 0 else -9999999999 for p in prec) / 4
    return BleuResult(
        100 * bp * math.exp(log_mean), [100 * p for p in prec], bp, hyp_len / ref_len, hyp_len, ref_len, correct, total
    )


def sacrebleu_scores(hyps: Sequence[str], refs: Sequence[str], tokenize: str = "13a") -> dict:
    """sacreBLEU BLEU and chrF on detokenized text, with their signatures."""
    bleu = BLEU(tokenize=tokenize)
    b = bleu.corpus_score(list(hyps), [list(refs)])
    chrf = CHRF()
    c = chrf.corpus_score(list(hyps), [list(refs)])
    return {
        "sacrebleu": {
            "score": b.score,
            "signature": str(bleu.get_signature()),
            "precisions": list(b.precisions),
            "bp": b.bp,
            "ratio": b.sys_len / b.ref_len if b.ref_len else 0.0,
            "hyp_len": b.sys_len,
            "ref_len": b.ref_len,
            "text": str(b),
            "convention": CONVENTIONS["sacrebleu"],
        },
        "chrf": {
            "score": c.score,
            "signature": str(chrf.get_signature()),
            "text": str(c),
            "convention": CONVENTIONS["chrf"],
        },
    }


def _bleu_entry(r: BleuResult, convention: str) -> dict:
    return {**asdict(r), "text": str(r), "convention": convention}


def score(
    hyps: Sequence[str],
    refs: Sequence[str],
    *,
    lang: str,
    tok_refs: Sequence[str] | None = None,
    sacrebleu_tokenize: str = "13a",
    tokenized: bool = False,
) -> dict:
    """Every score of the module docstring: {"sacrebleu", "chrf", "paper_bleu"} and, with the
    lowercased tokenized references `tok_refs`, "multi30k_lc_tok_bleu"; `lang`: the target's.

    `tokenized`: the hypotheses are lowercased and Moses-tokenized (Multi30k's `tok` variant):
    scored against `tok_refs` as they are, and detokenized for the other scores, computed
    lowercased ("sacrebleu_lc", "chrf_lc"): cased, they would only measure the missing capitals."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if tok_refs is not None and len(tok_refs) != len(hyps):
        raise ValueError(f"{len(hyps)} hypotheses but {len(tok_refs)} tokenized references")
    if tokenized:
        return _tokenized_scores(hyps, refs, lang=lang, tok_refs=tok_refs, sacrebleu_tokenize=sacrebleu_tokenize)
    scores = sacrebleu_scores(hyps, refs, sacrebleu_tokenize)
    scores["paper_bleu"] = _bleu_entry(
        multi_bleu([paper_tokenize(h, lang) for h in hyps], [paper_tokenize(r, lang) for r in refs]),
        CONVENTIONS["paper_bleu"].replace("LANG", lang),
    )
    if tok_refs is not None:
        scores["multi30k_lc_tok_bleu"] = _bleu_entry(
            multi_bleu([multi30k_tokenize(h, lang) for h in hyps], list(tok_refs)),
            CONVENTIONS["multi30k_lc_tok_bleu"].replace("LANG", lang),
        )
    return scores


def _tokenized_scores(hyps, refs, *, lang, tok_refs, sacrebleu_tokenize) -> dict:
    scores: dict = {}
    if tok_refs is not None:
        scores["multi30k_lc_tok_bleu"] = _bleu_entry(
            multi_bleu(list(hyps), list(tok_refs), lowercase=True),
            "Multi30k: multi-bleu.perl -lc on the lowercased tokenized output against the official tok references",
        )
    detok = _sacremoses().MosesDetokenizer(lang=lang)
    plain = [detok.detokenize(h.split()) for h in hyps]
    bleu = BLEU(tokenize=sacrebleu_tokenize, lowercase=True)
    result = bleu.corpus_score(plain, [list(refs)])
    scores["sacrebleu_lc"] = {
        "score": result.score,
        "text": str(result),
        "signature": str(bleu.get_signature()),
        "convention": "sacreBLEU, lowercased, on the Moses-detokenized output against the raw reference",
    }
    chrf = CHRF(lowercase=True)
    result = chrf.corpus_score(plain, [list(refs)])
    scores["chrf_lc"] = {
        "score": result.score,
        "text": str(result),
        "signature": str(chrf.get_signature()),
        "convention": "chrF, lowercased, on the Moses-detokenized output against the raw reference",
    }
    return scores


LABELS = {
    "sacrebleu_lc": "sacreBLEU, lowercased (detokenized output)",
    "chrf_lc": "chrF, lowercased (detokenized output)",
    "sacrebleu": "sacreBLEU (detokenized, cased)",
    "chrf": "chrF",
    "paper_bleu": "paper: tokenized BLEU, compound split",
    "multi30k_lc_tok_bleu": "Multi30k: lowercased tokenized BLEU",
}


def format_table(report: dict) -> str:
    """The report as a table for people."""
    head = f"{report['n_sentences']:,} sentences"
    if report.get("src_lang") and report.get("tgt_lang"):
        head += f", {report['src_lang']}->{report['tgt_lang']}"
    elif report.get("tgt_lang"):
        head += f", target {report['tgt_lang']}"
    if report.get("dataset"):
        head += f", {report['dataset']} {report['split']}"
    lines = [head]
    if report.get("model"):
        lines.append(f"model: {report['model']}")
    width = max(len(v) for v in LABELS.values())
    lines.append(f"{'metric':<{width}}  {'score':>6}  details")
    for key, s in report["scores"].items():
        detail = s.get("signature") or s.get("text", "")  # multi-bleu's entries: its line
        lines.append(f"{LABELS.get(key, key):<{width}}  {s['score']:>6.2f}  {detail}")
        if key == "sacrebleu":
            lines.append(f"{'':<{width}}  {'':>6}  {s['text']}")
    return "\n".join(lines)
