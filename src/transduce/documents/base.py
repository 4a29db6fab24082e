"""What every format shares: a document read as paragraphs (`inline.Paragraph`), each a segment
with inline tags for the translator, and written back from the translations; the one error a
file that cannot be read raises."""

from __future__ import annotations

from typing import Callable

from ..errors import DataError
from .inline import Paragraph, Piece, strip_space, tagged, untagged, with_space, words


class DocumentError(DataError):
    """A file that cannot be read (or written) as its format: one line, naming the file."""


Apply = Callable[[Paragraph, list[Piece]], None]
"""Puts a paragraph's translation (its pieces, the tags' payloads) back into the document."""


class Document:
    """A document of some format: `segments` (the paragraphs with words, as texts with inline
    tags, in document order; with `html`, whole HTML documents), `fill(translations)` (one per
    segment) and `save()` (the bytes of the translated file). A format's reader calls `add` for
    each paragraph it finds."""

    html = False

    def __init__(self) -> None:
        self._items: list[tuple[Paragraph, str, list[Piece], str, Apply]] = []

    def add(self, paragraph: Paragraph, apply: Apply) -> None:
        """A paragraph to translate; one without a letter or a digit is left as it is."""
        lead, core, trail = strip_space(paragraph.pieces)
        if words("".join(p.text for p in core)):
            self._items.append((paragraph, lead, core, trail, apply))

    @property
    def segments(self) -> list[str]:
        return [tagged(core) for _, _, core, _, _ in self._items]

    def fill(self, translations: list[str]) -> None:
        if len(translations) != len(self._items):
            raise ValueError(f"{len(translations)} translations for {len(self._items)} segments")
        for (paragraph, lead, _, trail, apply), text in zip(self._items, translations):
            apply(paragraph, with_space(lead, untagged(text, paragraph.pairs, paragraph.atoms), trail))

    def save(self) -> bytes:
        raise NotImplementedError


def opened(load, data: bytes, name: str, what: str):
    """`load(a file object of data)`, a format library's reader; whatever it finds wrong with the
    file a DocumentError: "NAME: not a readable WHAT file (the library's complaint)"."""
    from io import BytesIO

    try:
        return load(BytesIO(data))
    except Exception as e:  # noqa: BLE001 - the library's own exception, whatever it is
        raise DocumentError(f"not a readable {what} file ({type(e).__name__}: {e})", name) from None


def decode_text(data: bytes, name: str, what: str) -> tuple[str, bool]:
    """(the text of UTF-8 `data`, whether it began with a byte-order mark), or a DocumentError."""
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8-sig"), bom
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DocumentError(f"not UTF-8 text: a {what} file must be UTF-8 (byte {e.start})", name, line) from None
