"""A paragraph with inline formatting as one text for the translator, and back.

A paragraph of a document is text in runs (bold, italic, a link, a style) with things between
them that are kept whole (an image, a line break, a field). The translator sees the paragraph as
one text with inline tags: a run of formatting as ``<r1>bold</r1>``, a thing kept whole as
``<r2/>``, the text's ``&``, ``<`` and ``>`` as entities. What comes back is read as pieces,
each with the tags it is inside; a format puts each piece back in a run of the formatting its
innermost tag names. A translator that drops a tag loses its formatting, never its text; one that
drops a kept thing gets it back at the end of the paragraph, so no image is ever lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape, unescape

_TAG = re.compile(r"<(/?)r(\d+)\s*(/?)>")


@dataclass(frozen=True)
class Piece:
    """Text under a stack of tags (outermost first), or (`atom`) a thing kept whole in its place."""

    text: str = ""
    stack: tuple[int, ...] = ()
    atom: int | None = None


def words(text: str) -> bool:
    """Whether a text has anything to translate: a letter or a digit."""
    return any(c.isalnum() for c in text)


def tagged(pieces: list[Piece]) -> str:
    """The pieces as one text with inline tags (``<rK>...</rK>``, ``<rK/>``)."""
    out: list[str] = []
    stack: tuple[int, ...] = ()
    for p in pieces:
        want = p.stack
        common = 0
        while common < min(len(stack), len(want)) and stack[common] == want[common]:
            common += 1
        out += [f"</r{k}>" for k in reversed(stack[common:])] + [f"<r{k}>" for k in want[common:]]
        stack = want
        out.append(f"<r{p.atom}/>" if p.atom is not None else escape(p.text, quote=False))
    out += [f"</r{k}>" for k in reversed(stack)]
    return "".join(out)


def untagged(text: str, pairs: set[int], atoms: set[int]) -> list[Piece]:
    """A translation with inline tags as pieces. Tags of `pairs` open and close formatting (one
    left open closes at the end, a closing one never opened is dropped), those of `atoms` stand
    for their thing (each once; any the translation left out are appended at the end), any other
    tag is dropped."""
    pieces: list[Piece] = []
    stack: list[int] = []
    placed: set[int] = set()

    def add(s: str) -> None:
        if not s:
            return
        s = unescape(s)
        if pieces and pieces[-1].atom is None and pieces[-1].stack == tuple(stack):
            pieces[-1] = Piece(pieces[-1].text + s, tuple(stack))
        else:
            pieces.append(Piece(s, tuple(stack)))

    at = 0
    for m in _TAG.finditer(text):
        add(text[at : m.start()])
        at = m.end()
        closing, k, empty = m.group(1) == "/", int(m.group(2)), m.group(3) == "/"
        if k in atoms:
            if k not in placed and not closing:
                placed.add(k)
                pieces.append(Piece(stack=tuple(stack), atom=k))
        elif k in pairs and not empty:
            if not closing:
                stack.append(k)
            elif k in stack:
                del stack[stack.index(k) :]
    add(text[at:])
    pieces += [Piece(atom=k) for k in sorted(atoms - placed)]
    return pieces


def strip_space(pieces: list[Piece]) -> tuple[str, list[Piece], str]:
    """(the whitespace before the first text, the pieces without it and without the whitespace
    after the last, that whitespace): what a paragraph keeps as it was around its translation."""
    pieces = list(pieces)
    lead = trail = ""
    texts = [i for i, p in enumerate(pieces) if p.atom is None]
    if texts:
        first, last = pieces[texts[0]], pieces[texts[-1]]
        lead = first.text[: len(first.text) - len(first.text.lstrip())]
        pieces[texts[0]] = first = Piece(first.text[len(lead) :], first.stack)
        if texts[-1] == texts[0]:
            last = first
        trail = last.text[len(last.text.rstrip()) :]
        pieces[texts[-1]] = Piece(last.text[: len(last.text) - len(trail)], last.stack)
    return lead, [p for p in pieces if p.atom is not None or p.text], trail


def with_space(lead: str, pieces: list[Piece], trail: str) -> list[Piece]:
    """`pieces` (a translation's) with the paragraph's own whitespace around its first and last text."""
    pieces = list(pieces)
    texts = [i for i, p in enumerate(pieces) if p.atom is None]
    if texts:
        first = pieces[texts[0]]
        pieces[texts[0]] = Piece(first.text.lstrip(), first.stack)
        last = pieces[texts[-1]]
        pieces[texts[-1]] = Piece(last.text.rstrip(), last.stack)
    pieces = [p for p in pieces if p.atom is not None or p.text]
    if lead:
        first = pieces[0] if pieces and pieces[0].atom is None else None
        pieces = [Piece(lead + first.text, first.stack)] + pieces[1:] if first else [Piece(lead)] + pieces
    if trail:
        last = pieces[-1] if pieces and pieces[-1].atom is None else None
        pieces = pieces[:-1] + [Piece(last.text + trail, last.stack)] if last else pieces + [Piece(trail)]
    return pieces


@dataclass
class Paragraph:
    """A paragraph being taken apart: its pieces, and per tag what it stands for in the format
    (`payloads[k - 1]`: the formatting of a pair tag, the thing of an atom)."""

    pieces: list[Piece]
    payloads: list
    atoms: set[int]

    def __init__(self) -> None:
        self.pieces, self.payloads, self.atoms = [], [], set()

    def tag(self, payload, atom: bool = False) -> int:
        """A new tag for `payload`: its number."""
        self.payloads.append(payload)
        if atom:
            self.atoms.add(len(self.payloads))
        return len(self.payloads)

    def text(self, text: str, stack: tuple[int, ...] = ()) -> None:
        if not text:
            return
        if self.pieces and self.pieces[-1].atom is None and self.pieces[-1].stack == stack:
            self.pieces[-1] = Piece(self.pieces[-1].text + text, stack)
        else:
            self.pieces.append(Piece(text, stack))

    def atom(self, payload, stack: tuple[int, ...] = ()) -> None:
        self.pieces.append(Piece(stack=stack, atom=self.tag(payload, atom=True)))

    @property
    def pairs(self) -> set[int]:
        return set(range(1, len(self.payloads) + 1)) - self.atoms
