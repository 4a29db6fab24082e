"""HTML, and text with inline tags, translated a sentence at a time with its tags put back where
the model's own attention places them (as DeepL's tag handling does), not a text node at a time.

Each block of a document (the text of a p, li, td, h1..h6, div ...) becomes plain text, its inline
tags (b, i, a, span, br, ...) taken out and remembered as character spans of that text
(`blocks.parse`). The text is split into sentences (`sentences.split`), every sentence of the document translated in ONE
call of `translator.translate`, and each tag put around the output characters that the source
characters it covered are aligned with (`translator.align`: for each output token, the source token
it attends to most; `align.AttentionAligner` reads that from the model's encoder-decoder attention,
3.2.3). Markup outside the blocks, attributes, entities of untranslated text, comments, void tags
(br, img) and elements that are not text to translate (script, style, pre, textarea, and inline
code, kbd, samp, var or anything marked translate="no", each kept whole) stay as written.

A translator is any object with
    translate(sentences: list[str]) -> list[str]
    align(sources: list[str], outputs: list[str]) -> list[list[tuple[int, int, int, int]]]
where each link (t0, t1, s0, s1) says that the output characters [t0, t1) (one output token) are
aligned to the source characters [s0, s1) (one source token); a sentence given no links is aligned
in proportion (`proportional_links`: an engine without attention). docs/text.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import Protocol, Sequence

from .blocks import Block, parse
from .sentences import Piece, split, words

Link = tuple[int, int, int, int]  # output characters [t0, t1) aligned to source characters [s0, s1)
_WORD = re.compile(r"\w+|[^\w\s]")


class Translator(Protocol):
    def translate(self, sentences: list[str]) -> list[str]: ...

    def align(self, sources: list[str], outputs: list[str]) -> list[list[Link]]: ...


# -- translating: every sentence of every block in one call, then the tags placed -----------------


@dataclass
class Job:
    """Documents to translate in two steps, for a caller that batches on its own (a server):
    `sentences` go to the translator as one batch, `aligned` (indices into `sentences`) are those
    whose alignment the tags need; `render(outputs, links)` gives the documents back."""

    parts: list[list[str | Block]]
    layouts: dict[tuple[int, int], list[Piece]]
    sentences: list[str]
    aligned: list[int]
    html: bool

    def render(self, outputs: Sequence[str], links: Sequence[Sequence[Link]]) -> list[str]:
        """The documents with `outputs` (one per sentence) and `links` (one list per `aligned` sentence)."""
        if len(outputs) != len(self.sentences) or len(links) != len(self.aligned):
            raise ValueError(
                f"{len(outputs)} outputs and {len(links)} alignments for {len(self.sentences)} sentences, "
                f"{len(self.aligned)} of them aligned"
            )
        linked = dict(zip(self.aligned, links))
        docs, k = [], 0
        for d, parts in enumerate(self.parts):
            out = []
            for i, part in enumerate(parts):
                pieces = self.layouts.get((d, i))
                if pieces is None:
                    out.append(part if isinstance(part, str) else part.raw)
                    continue
                n = sum(p.translate for p in pieces)
                out.append(
                    _render_block(
                        part, pieces, outputs[k : k + n], [linked.get(j, []) for j in range(k, k + n)], self.html
                    )
                )
                k += n
            docs.append("".join(out))
        return docs


def plan(docs: Sequence[str], lang: str, mode: str = "on", html: bool = True) -> Job:
    """The `Job` of `docs` (HTML, or with `html` False text with inline tags), split into sentences
    of language `lang` by `mode` ("on", "nonewlines", "off": `sentences.split`)."""
    parts = [parse(doc, html) for doc in docs]
    layouts, sentences, aligned = {}, [], []
    for d, doc_parts in enumerate(parts):
        for i, part in enumerate(doc_parts):
            if isinstance(part, str) or not words(_outside_kept(part)):
                continue
            pieces = split(part.text, lang, mode)
            layouts[(d, i)] = pieces
            for p in pieces:
                if p.translate:
                    if part.tags:
                        aligned.append(len(sentences))
                    sentences.append(p.source)
    return Job(parts, layouts, sentences, aligned, html)


def run(job: Job, translator: Translator) -> list[str]:
    """`job` through `translator`: one `translate` call for all its sentences, one `align` call."""
    outputs = list(translator.translate(job.sentences)) if job.sentences else []
    if len(outputs) != len(job.sentences):
        raise ValueError(f"the translator gave {len(outputs)} translations for {len(job.sentences)} sentences")
    links = (
        translator.align([job.sentences[j] for j in job.aligned], [outputs[j] for j in job.aligned])
        if job.aligned
        else []
    )
    return job.render(outputs, list(links))


def translate_html(doc: str, lang: str, translator: Translator, mode: str = "on") -> str:
    """An HTML document (or fragment) translated a sentence at a time, its inline tags placed by
    the translator's alignment (the module's docstring); `lang` the source language."""
    return run(plan([doc], lang, mode, html=True), translator)[0]


def translate_tagged(texts: Sequence[str], lang: str, translator: Translator, mode: str = "on") -> list[str]:
    """Texts with inline tags (`<b>`, `<x1>`, `<br/>`, any name: each text is one block; text
    escaped as in HTML, &amp; &lt; &gt;; its own line breaks are line breaks), translated as
    `translate_html` translates a block: all sentences of all texts in one call."""
    return run(plan(texts, lang, mode, html=False), translator)


def proportional_links(source: str, output: str) -> list[Link]:
    """Links in proportion, for a translator that gives no alignment: the i-th of m output words
    with the source word as far into the source (words: runs of letters and digits, or a sign)."""
    src = [m.span() for m in _WORD.finditer(source)]
    out = [m.span() for m in _WORD.finditer(output)]
    if not src or not out:
        return []
    return [(t0, t1, *src[round(i * (len(src) - 1) / max(len(out) - 1, 1))]) for i, (t0, t1) in enumerate(out)]


def _outside_kept(block: Block) -> str:
    """The block's text less that of the elements kept whole."""
    text = block.text
    for t in sorted((t for t in block.tags if t.whole is not None), key=lambda t: -t.start):
        text = text[: t.start] + text[t.end :]
    return text


def _normal_positions(text: str) -> list[int]:
    """For `Piece.source` of `text` (whitespace runs as one space, the ends trimmed): the offset in
    `text` of each of its characters, and len(text) after the last."""
    positions, at, space = [], 0, False
    for i, c in enumerate(text):
        if c.isspace():
            space = bool(positions)
            continue
        if space:
            positions.append(i - 1)
            space = False
        positions.append(i)
        at = i
    return positions + [len(text) if not positions else at + 1]


@dataclass
class _Placed:
    """A block's translation: its output text and, per piece, where it was and where it is."""

    text: str
    spans: list[tuple[int, int, int, int, int | None]]  # (source start, end, output start, end, sentence or None)
    positions: list[list[int]]  # per sentence, `_normal_positions` of it, offset in the block
    links: list[Sequence[Link]]

    def point(self, p: int) -> int:
        """The output offset where a point at source offset `p` goes."""
        for ps, pe, os_, oe, k in self.spans:
            if ps <= p < pe:
                if k is None:
                    return os_ + p - ps
                if p == ps:
                    return os_
                norm = next((j for j, q in enumerate(self.positions[k]) if q >= p), len(self.positions[k]) - 1)
                after = [(s0, t0) for t0, _, s0, _ in self.links[k] if s0 >= norm]
                if not after:
                    return oe
                first = min(s0 for s0, _ in after)
                return os_ + _word_start(self.text[os_:oe], min(t0 for s0, t0 in after if s0 == first))
        return len(self.text)

    def span(self, a: int, b: int) -> tuple[int, int] | None:
        """The output span of source [a, b), or None where nothing of it is aligned."""
        found = []
        for ps, pe, os_, oe, k in self.spans:
            if pe <= a or ps >= b:
                continue
            if k is None:
                found.append((os_ + max(a, ps) - ps, os_ + min(b, pe) - ps))
            elif a <= ps and b >= pe:
                found.append((os_, oe))
            else:
                pos = self.positions[k]
                na = next(j for j, q in enumerate(pos) if q >= a)
                nb = next((j for j, q in enumerate(pos) if q >= b), len(pos) - 1)
                hit = [(t0, t1) for t0, t1, s0, s1 in self.links[k] if s0 < nb and s1 > na]
                if hit:
                    out = self.text[os_:oe]
                    found.append(
                        (os_ + _word_start(out, min(h[0] for h in hit)), os_ + _word_end(out, max(h[1] for h in hit)))
                    )
        return (min(f[0] for f in found), max(f[1] for f in found)) if found else None


def _word_start(text: str, i: int) -> int:
    while 0 < i < len(text) and text[i - 1].isalnum() and text[i].isalnum():
        i -= 1
    return i


def _word_end(text: str, i: int) -> int:
    while 0 < i < len(text) and text[i - 1].isalnum() and text[i].isalnum():
        i += 1
    return i


def _render_block(
    block: Block, pieces: list[Piece], outputs: Sequence[str], links: list[Sequence[Link]], html: bool
) -> str:
    """The block's translation with its tags in place (nested as they were, each within its parent,
    siblings in the order the translation puts them, none overlapping)."""
    text, spans, positions, at, k = "", [], [], 0, 0
    for p in pieces:
        end = at + len(p.text)
        if p.translate:
            positions.append([at + q for q in _normal_positions(p.text)])
            spans.append((at, end, len(text), len(text) + len(outputs[k]), k))
            text += outputs[k]
            k += 1
        else:
            spans.append((at, end, len(text), len(text) + len(p.text), None))
            text += block.shown[at:end]
        at = end
    links = [
        found or proportional_links(pieces_source, out)
        for found, pieces_source, out in zip(links, [p.source for p in pieces if p.translate], outputs)
    ]
    placed = _Placed(text, spans, positions, links)
    where: list[tuple[int, int]] = []
    for t in block.tags:
        if t.start == t.end or t.char:
            s = placed.point(t.start)
            verbatim = (
                t.char
                and s < len(text)
                and text[s] == "\n"
                and any(k is None and ps <= t.start < pe for ps, pe, _, _, k in spans)
            )
            where.append((s, s + 1 if verbatim else s))
        else:
            where.append(placed.span(t.start, t.end) or (placed.point(t.start),) * 2)
    children: dict[int | None, list[int]] = {}
    for i, t in enumerate(block.tags):
        children.setdefault(t.parent, []).append(i)
    _nest(children, where, None, 0, len(text))
    esc = (lambda s: escape(s, quote=False).replace("\xa0", "&nbsp;")) if html else (lambda s: escape(s, quote=False))

    def render(lo: int, hi: int, parent: int | None) -> str:
        out, cursor = [], lo
        for i in children.get(parent, []):
            s, e = where[i]
            t = block.tags[i]
            out.append(esc(text[cursor:s]))
            if t.whole is not None:
                out.append(t.whole)
            elif t.char or t.start == t.end and t.close is None:
                out.append(t.open or "")
            else:
                out.append((t.open or "") + render(s, e, i) + (t.close or ""))
            cursor = e
        out.append(esc(text[cursor:hi]))
        return "".join(out)

    return render(0, len(text), None)


def _nest(children: dict, where: list[tuple[int, int]], parent: int | None, lo: int, hi: int) -> None:
    """Each tag's output span within its parent's [lo, hi), siblings in output order, not overlapping."""
    kids = children.get(parent, [])
    for i in kids:
        s, e = where[i]
        s = min(max(s, lo), hi)
        where[i] = (s, min(max(e, s), hi))
    kids.sort(key=lambda i: where[i])
    cursor = lo
    for i in kids:
        s, e = where[i]
        s = max(s, cursor)
        where[i] = (s, max(e, s))
        cursor = where[i][1]
        _nest(children, where, i, *where[i])
