"""OpenDocument text and presentations (.odt, .odp; odfpy): every paragraph and heading (text:p,
text:h) of the body, its tables, frames and notes, and of the page styles' headers and footers;
a presentation's slides and speaker notes alike. A span's or a link's element is a tag, nested as
in the file; a note, a frame, a field or a bookmark is kept whole in its place; the spaces element
(text:s) is a space, a line break and a tab their characters."""

from __future__ import annotations

import re
from io import BytesIO

from ..extras import require
from .base import Document, opened
from .inline import Paragraph, Piece

TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
PARAGRAPHS = {(TEXT, "p"), (TEXT, "h")}
TAGS = {(TEXT, "span"), (TEXT, "a")}
SPACES = (TEXT, "s")
CHARS = {(TEXT, "line-break"): "\n", (TEXT, "tab"): "\t"}
"""Elements that stand for a character: text to the translator, elements again in the file."""


class Odf(Document):
    """An OpenDocument text (.odt) or presentation (.odp)."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        require("odf", "translating OpenDocument files")
        from odf.opendocument import load

        self.doc = opened(load, data, name, "OpenDocument")
        for p in _paragraphs(self.doc.topnode):
            paragraph = Paragraph()
            _read(p, paragraph, ())
            self.add(paragraph, lambda paragraph, pieces, p=p: _write(p, paragraph, pieces))

    def save(self) -> bytes:
        out = BytesIO()
        self.doc.write(out)
        return out.getvalue()


def _paragraphs(node) -> list:
    """The paragraphs and headings under `node`, in document order (those inside a note or a
    frame of another paragraph included)."""
    found, todo = [], [node]
    while todo:
        n = todo.pop()
        if n.nodeType == n.ELEMENT_NODE:
            if n.qname in PARAGRAPHS:
                found.append(n)
            todo.extend(reversed(n.childNodes))
    return found


def _read(node, paragraph: Paragraph, stack: tuple[int, ...]) -> None:
    for child in node.childNodes:
        if child.nodeType == child.TEXT_NODE:
            paragraph.text(child.data, stack)
        elif child.nodeType != child.ELEMENT_NODE:
            continue
        elif child.qname in TAGS:
            _read(child, paragraph, stack + (paragraph.tag(child),))
        elif child.qname == SPACES:
            paragraph.text(" ", stack)
        elif child.qname in CHARS:
            paragraph.text(CHARS[child.qname], stack)
        else:
            paragraph.atom(child, stack)


def _write(p, paragraph: Paragraph, pieces: list[Piece]) -> None:
    """The paragraph's content replaced by the translation: a copy of a tag's element (its style,
    its link) around its pieces, each kept thing moved to its new place."""
    from odf.element import Element

    old = list(p.childNodes)
    del p.childNodes[:]  # not removeChild, which refuses text nodes (odfpy 1.4)
    for child in old:
        child.parentNode = child.previousSibling = child.nextSibling = None
    open_: list[tuple[int, object]] = []
    for piece in pieces:
        want = piece.stack
        common = 0
        while common < min(len(open_), len(want)) and open_[common][0] == want[common]:
            common += 1
        del open_[common:]
        for k in want[common:]:
            tag = paragraph.payloads[k - 1]
            copy = Element(qname=tag.qname, qattributes=dict(tag.attributes), check_grammar=False)
            (open_[-1][1] if open_ else p).appendChild(copy)
            open_.append((k, copy))
        parent = open_[-1][1] if open_ else p
        if piece.atom is not None:
            parent.appendChild(paragraph.payloads[piece.atom - 1])
        else:
            for part in re.split(r"([\n\t])", piece.text):
                if part in ("\n", "\t"):
                    char = next(q for q, c in CHARS.items() if c == part)
                    parent.appendChild(Element(qname=char, check_grammar=False))
                elif part:
                    parent.addText(part, check_grammar=False)
