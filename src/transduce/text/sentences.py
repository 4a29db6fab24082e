"""Text as sentences and back: a model trained on sentences (Section 5.1's corpora are sentence
pairs) translates a paragraph a sentence at a time. `split` cuts a text into pieces, the sentences
to translate and what lies between them (spaces, line breaks) kept as it is; `rejoin` puts the
translations back in their places. The modes are DeepL's `split_sentences`: "on" (1: at sentence
ends and at line breaks), "nonewlines" (at sentence ends only: a line break inside a sentence is a
space to the model) and "off" (0: the whole text is one sentence). Which splitter finds the
sentence ends, and why: docs/text.md.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Iterator, Sequence

MODES = ("on", "off", "nonewlines")
"""DeepL's split_sentences 1, 0 and "nonewlines"."""

_LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")  # what str.splitlines splits at


@dataclass(frozen=True)
class Piece:
    """A stretch of a text: a sentence to translate (`translate` True) or what is kept as it is
    (whitespace, line breaks, a stretch with no letter or digit)."""

    text: str
    translate: bool

    @property
    def source(self) -> str:
        """What the model is given: the sentence with its inner whitespace (a line break kept in
        by "nonewlines" or "off") as single spaces."""
        return " ".join(self.text.split())


def words(text: str) -> bool:
    """Whether a text has anything to translate: a letter or a digit (punctuation, symbols,
    emoji and whitespace alone are kept as they are)."""
    return any(c.isalnum() for c in text)


def split(text: str, lang: str, mode: str = "on") -> list[Piece]:
    """`text` as pieces, ``"".join(p.text for p in pieces) == text`` always: the sentences of
    language `lang` (an ISO 639-1 code; "de-DE" is "de") to translate, and between them the
    whitespace and line breaks, kept. `mode`: "on", "nonewlines" or "off" (the module's docstring)."""
    if mode not in MODES:
        raise ValueError(f"the sentence-splitting mode must be one of {', '.join(MODES)}, not {mode!r}")
    pieces: list[Piece] = []
    if mode == "off":
        _sentences(text, [(0, len(text))] if text.strip() else [], pieces)
    elif mode == "nonewlines":  # line breaks as spaces (the same length): the splitter sees one line
        _sentences(text, _segment(_LINE_BREAK.sub(lambda m: " " * len(m.group()), text), lang), pieces)
    else:
        start = 0
        for m in [*_LINE_BREAK.finditer(text), None]:
            end = len(text) if m is None else m.start()
            line = text[start:end]
            _sentences(line, _segment(line, lang), pieces)
            if m is not None:
                pieces.append(Piece(m.group(), False))
                start = m.end()
    return _merged(pieces)


def rejoin(pieces: Sequence[Piece], outputs: Sequence[str]) -> str:
    """The text of `pieces` with each sentence (a piece with `translate`) replaced by its output,
    in order, and everything between kept as it was."""
    n = sum(p.translate for p in pieces)
    if len(outputs) != n:
        raise ValueError(f"{len(outputs)} outputs for {n} sentences: give one per sentence")
    it = iter(outputs)
    return "".join(next(it) if p.translate else p.text for p in pieces)


def split_all(texts: Sequence[str], lang: str, mode: str = "on") -> tuple[list[list[Piece]], list[str]]:
    """Each text's pieces, and the sentences of all of them in order (each as `Piece.source`):
    what one batch translates. `rejoin_all(layouts, outputs)` puts them back."""
    layouts = [split(t, lang, mode) for t in texts]
    return layouts, [p.source for pieces in layouts for p in pieces if p.translate]


def rejoin_all(layouts: Sequence[Sequence[Piece]], outputs: Sequence[str]) -> list[str]:
    """Each text of `split_all` with its sentences' outputs (the sentences of all texts, in order)."""
    counts = [sum(p.translate for p in pieces) for pieces in layouts]
    if len(outputs) != sum(counts):
        raise ValueError(f"{len(outputs)} outputs for {sum(counts)} sentences: give one per sentence")
    texts, k = [], 0
    for pieces, n in zip(layouts, counts):
        texts.append(rejoin(pieces, outputs[k : k + n]))
        k += n
    return texts


def translate_texts(
    translate_batch: Callable[[list[str]], list[str]], texts: Sequence[str], lang: str, mode: str = "on"
) -> list[str]:
    """Translate `texts` sentence by sentence: every sentence of every text in ONE call of
    `translate_batch` (a list of sentences in, their translations in the same order out), each
    text put back together with its own whitespace and line breaks."""
    layouts, sentences = split_all(texts, lang, mode)
    outputs = list(translate_batch(sentences)) if sentences else []
    if len(outputs) != len(sentences):
        raise ValueError(f"the translator gave {len(outputs)} translations for {len(sentences)} sentences")
    return rejoin_all(layouts, outputs)


def translate_text(translate_batch: Callable[[list[str]], list[str]], text: str, lang: str, mode: str = "on") -> str:
    """`translate_texts` of one text."""
    return translate_texts(translate_batch, [text], lang, mode)[0]


def translate_lines_split(
    translate_stream: Callable[[Iterable[str]], Iterable[str]],
    lines: Iterable[str],
    lang: str,
    mode: str = "on",
    advance: Callable[[int], None] | None = None,
) -> Iterator[str]:
    """Each of `lines` (any iterable, read as needed) translated sentence by sentence, in order:
    `translate_stream` is given the sentences of all lines as one stream and yields their
    translations in order (as `decoding.translate.translate_stream` does, batching as it reads);
    each line is put back together as it completes (`advance(1)` then). A line is never split at
    its end: as many lines out as in."""
    pending: deque[list[Piece]] = deque()

    def sentences() -> Iterator[str]:
        for line in lines:
            pieces = split(line, lang, mode)
            pending.append(pieces)
            yield from (p.source for p in pieces if p.translate)

    outputs: list[str] = []
    results = iter(translate_stream(sentences()))
    done = False
    while not done:
        try:
            outputs.append(next(results))
        except StopIteration:
            done = True
        while pending and len(outputs) >= (n := sum(p.translate for p in pending[0])):
            yield rejoin(pending.popleft(), outputs[:n])
            del outputs[:n]
            if advance is not None:
                advance(1)
    if pending or outputs:
        raise ValueError(f"the translator's stream ended with {len(pending)} lines untranslated")


# -- the splitter -----------------------------------------------------------------------------------


def _sentences(text: str, spans: list[tuple[int, int]], pieces: list[Piece]) -> None:
    """Append `text`'s pieces: each span (whitespace trimmed) a sentence if it has words, the rest kept."""
    at = 0
    for start, end in spans:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if start == end:
            continue
        if start > at:
            pieces.append(Piece(text[at:start], False))
        pieces.append(Piece(text[start:end], words(text[start:end])))
        at = end
    if at < len(text):
        pieces.append(Piece(text[at:], False))


def _merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent pieces kept as they are made one."""
    out: list[Piece] = []
    for p in pieces:
        if out and not p.translate and not out[-1].translate:
            out[-1] = Piece(out[-1].text + p.text, False)
        elif p.text:
            out.append(p)
    return out


def _segment(text: str, lang: str) -> list[tuple[int, int]]:
    """The sentences of one line of text as (start, end) offsets: where both splitters end a
    sentence (docs/text.md, "Which splitter": pysbd's rules and sentencex's agree), or, for a
    language pysbd has no rules for, where sentencex ends one."""
    if not words(text):
        return [(0, len(text))] if text.strip() else []
    splitters = _splitters(_language(lang))
    ends = set.intersection(*({end for _, end in _locate(text, split(text))} for split in splitters))
    spans, start = [], 0
    for end in sorted(ends | {len(text)}):
        if end > start:
            spans.append((start, end))
            start = end
    return spans


def _locate(text: str, sentences: list[str]) -> list[tuple[int, int]]:
    """The splitter's sentences as offsets into `text`, found by their characters other than
    whitespace (a splitter may change whitespace, none drops or adds another character); the
    whole text as one sentence if they do not match."""
    spans, at = [], 0
    for s in sentences:
        n = sum(not c.isspace() for c in s)
        if n == 0:
            continue
        while at < len(text) and text[at].isspace():
            at += 1
        start = at
        while n and at < len(text):
            n -= not text[at].isspace()
            at += 1
        if n:
            return [(0, len(text))]
        spans.append((start, at))
    if any(not c.isspace() for c in text[at:]):
        return [(0, len(text))]
    return spans


def _language(lang: str) -> str:
    """ "de-DE", "pt_BR", "EN" -> "de", "pt", "en"."""
    return re.split(r"[-_]", lang.strip().lower(), maxsplit=1)[0]


_NON_ASCII_SPACE = re.compile(r"[^\S\x00-\x7f]")


@lru_cache(maxsize=None)
def _splitters(lang: str) -> tuple[Callable[[str], list[str]], ...]:
    """pysbd's segmenter and sentencex's for `lang`, or sentencex's alone where pysbd has no rules
    for it; docs/text.md says why these."""
    from ..extras import require

    sentencex = require("sentencex", "sentence splitting")
    pysbd = require("pysbd", "sentence splitting")
    from pysbd.languages import LANGUAGE_CODES

    def by_sentencex(text: str) -> list[str]:
        # sentencex 1.0.32 slices a string by bytes where a capital and a period have a multi-byte space
        # between them ("Z\u00a0."), and panics: its spaces as ASCII ones (`_locate` maps back by the
        # other characters), and a panic of another text as no sentence end found by it
        try:
            return list(sentencex.segment(lang, _NON_ASCII_SPACE.sub(" ", text)))
        except BaseException as e:  # pyo3's PanicException derives from BaseException
            if type(e).__name__ != "PanicException":
                raise
            return [text]

    if lang not in LANGUAGE_CODES:
        return (by_sentencex,)
    return pysbd.Segmenter(language=lang, clean=False).segment, by_sentencex
