"""Plain text and subtitles. A .txt file: each line a segment, its line ending, the blank lines
and the byte-order mark kept. An .srt file (the `srt` library): each cue a segment, its lines
joined, its inline markup (<i>, <b>, <u>, <font ...>, {\\an8}) as tags; written back with the
cue's number and timings as they were, the translation broken into as many lines as the cue had."""

from __future__ import annotations

import re

from ..extras import require
from .base import Document, DocumentError, decode_text
from .inline import Paragraph, Piece

_LINE_END = re.compile(r"(\r\n|\n|\r)")


class Text(Document):
    """A UTF-8 text file."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        text, self.bom = decode_text(data, name, ".txt")
        self.parts = _LINE_END.split(text)  # line, ending, line, ending, ..., line
        for i in range(0, len(self.parts), 2):
            paragraph = Paragraph()
            paragraph.text(self.parts[i])
            self.add(paragraph, lambda _, pieces, i=i: self.parts.__setitem__(i, _plain(pieces)))

    def save(self) -> bytes:
        return ("\ufeff" * self.bom + "".join(self.parts)).encode("utf-8")


def _plain(pieces: list[Piece]) -> str:
    return " ".join("".join(p.text for p in pieces if p.atom is None).splitlines())


_MARKUP = re.compile(r"<(/?)([A-Za-z]+)[^>]*>|\{\\[^}]*\}")


class Subtitles(Document):
    """A SubRip (.srt) file."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        self.srt = require("srt", "translating .srt files")
        text, self.bom = decode_text(data, name, ".srt")
        self.eol = "\r\n" if "\r\n" in text else "\n"
        try:
            self.cues = list(self.srt.parse(text))
        except self.srt.SRTParseError as e:
            line = text[: e.actual_start].count("\n") + 1
            raise DocumentError(f"not a readable SubRip file: {str(e).splitlines()[0]}", name, line) from None
        for k, cue in enumerate(self.cues):
            lines = cue.content.splitlines() or [""]
            self.add(
                _markup(" ".join(line.strip() for line in lines)),
                lambda paragraph, pieces, k=k, n=len(lines): self._put(k, n, paragraph, pieces),
            )

    def _put(self, k: int, n: int, paragraph: Paragraph, pieces: list[Piece]) -> None:
        self.cues[k].content = "\n".join(balanced(_render(pieces, paragraph.payloads), n))

    def save(self) -> bytes:
        text = self.srt.compose(self.cues, reindex=False, strict=True, eol=self.eol)
        return ("\ufeff" * self.bom + text).encode("utf-8")


def _markup(content: str) -> Paragraph:
    """A cue's text as a paragraph: an HTML-like tag of SubRip's a tag, {\\...} kept whole."""
    paragraph = Paragraph()
    open_: list[tuple[str, int]] = []
    at = 0
    for m in _MARKUP.finditer(content):
        stack = tuple(k for _, k in open_)
        paragraph.text(content[at : m.start()], stack)
        at = m.end()
        name = (m.group(2) or "").lower()
        if m.group(2) is None:
            paragraph.atom(m.group(), stack)
        elif m.group(1) and any(t == name for t, _ in open_):
            while open_.pop()[0] != name:
                pass
        elif m.group(1) or m.group().endswith("/>"):
            paragraph.atom(m.group(), stack)
        else:
            open_.append((name, paragraph.tag((name, m.group()))))
    paragraph.text(content[at:], tuple(k for _, k in open_))
    return paragraph


def _render(pieces: list[Piece], payloads: list) -> str:
    """A cue's pieces as SubRip text: each tag as it was written and its end tag around its
    pieces, each kept thing as it was; the text's line breaks as spaces (the cue's own lines are
    made again by `balanced`)."""
    out: list[str] = []
    stack: tuple[int, ...] = ()

    def move(want: tuple[int, ...]) -> None:
        nonlocal stack
        common = 0
        while common < min(len(stack), len(want)) and stack[common] == want[common]:
            common += 1
        out.extend(f"</{payloads[k - 1][0]}>" for k in reversed(stack[common:]))
        out.extend(payloads[k - 1][1] for k in want[common:])
        stack = want

    for p in pieces:
        if p.atom is not None:
            out.append(payloads[p.atom - 1])
        else:
            move(p.stack)
            out.append(" ".join(p.text.splitlines()))
    move(())
    return "".join(out)


def balanced(text: str, n: int) -> list[str]:
    """`text` broken at spaces into at most `n` lines of about equal visible length (markup not
    counted): a subtitle's translation laid out as many lines as the cue's original."""
    words = text.split(" ")
    if n <= 1 or len(words) <= 1:
        return [text]
    visible = [len(_MARKUP.sub("", w)) for w in words]
    total = sum(visible) + len(words) - 1
    lines, line, length = [], [], 0
    for w, size in zip(words, visible):
        if line and len(lines) < n - 1 and length + size / 2 > total * (len(lines) + 1) / n:
            lines.append(" ".join(line))
            line = []
        line.append(w)
        length += size + 1
    return lines + [" ".join(line)]
