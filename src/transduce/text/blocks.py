"""A document read for translation a sentence at a time: markup kept as written (str) and blocks
of running text (`Block`: the text of a p, li, td, h1..h6, div ...), each block's inline tags
(b, i, a, span, br, ...) taken out and remembered as character spans of its text (`Tag`), nested
as they were. Which elements are which: `INLINE` (inside a sentence), `OPAQUE` and anything
marked translate="no" (inside a sentence, kept whole), `KEEP` (never translated: a block
boundary, kept as written), `VOID`. What `transduce.text.markup` translates and puts back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

INLINE = frozenset(
    "a abbr b bdi bdo big br cite code data del dfn em font i img ins kbd label mark q s samp small span "
    "strike strong sub sup time tt u var wbr".split()
)
"""Elements inside a sentence: their tags are carried over to the translation."""
OPAQUE = frozenset("code kbd samp var".split())
"""Inline elements whose text is not translated: kept whole, put where the model places their text."""
KEEP = frozenset("script style pre textarea template".split())
"""Elements whose content is never translated (a block boundary, kept as written)."""
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


@dataclass
class Tag:
    """An inline tag of a block: its text is `Block.text[start:end]` (start == end: a point, as a
    void tag); `open`/`close` its markup as written (None: opened before or closed after the
    block); `whole`: an element kept whole (opaque), its markup replacing its text; `char`: a br
    that stands in the text as one line break."""

    start: int
    end: int
    open: str | None
    close: str | None = None
    parent: int | None = None
    whole: str | None = None
    char: bool = False


@dataclass
class Block:
    """A stretch of running text: `text` to split (HTML's own line breaks as spaces, a br as \\n),
    `shown` the same length with the characters kept where kept (a line break as written), its
    inline `tags`, and `raw` the markup it came from (given back if there is nothing to translate)."""

    text: str = ""
    shown: str = ""
    tags: list[Tag] = field(default_factory=list)
    raw: str = ""


class _Events(HTMLParser):
    """A document's parts in order: (kind, tag, attrs, raw markup, decoded text)."""

    def __init__(self, doc: str):
        super().__init__(convert_charrefs=True)
        self.doc = doc
        self.starts = [0] + [i + 1 for i, c in enumerate(doc) if c == "\n"]  # HTMLParser counts lines by \n
        self.marks: list[tuple[int, str, str, dict, str]] = []

    def _at(self, kind: str, tag: str = "", attrs=(), data: str = "") -> None:
        line, column = self.getpos()
        self.marks.append((self.starts[line - 1] + column, kind, tag, dict(attrs), data))

    def handle_starttag(self, tag, attrs):
        self._at("start", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._at("void", tag, attrs)

    def handle_endtag(self, tag):
        self._at("end", tag)

    def handle_data(self, data):
        self._at("data", data=data)

    def handle_comment(self, data):
        self._at("other")

    handle_decl = handle_pi = unknown_decl = handle_comment

    def events(self) -> list[tuple[str, str, dict, str, str]]:
        self.feed(self.doc)
        self.close()
        ends = [m[0] for m in self.marks[1:]] + [len(self.doc)]
        out = []
        for (start, kind, tag, attrs, data), end in zip(self.marks, ends):
            if kind == "data" and out and out[-1][0] == "data":  # "a < b" comes in parts: one node
                out[-1] = ("data", "", {}, out[-1][3] + self.doc[start:end], out[-1][4] + data)
            else:
                out.append((kind, tag, attrs, self.doc[start:end], data))
        return out


def parse(doc: str, html: bool = True) -> list[str | Block]:
    """`doc` as markup kept as written (str) and blocks of running text. `html`: HTML's elements
    and whitespace (a line break in the text is a space; a br breaks the line); else every tag is
    inline, the whole text one block, and its own line breaks are line breaks (text with inline
    tags, as documents' runs)."""
    parts: list[str | Block] = []
    block, stack = Block(), []  # stack: open inline tags of the block (indices into block.tags)
    events = _Events(doc).events()
    k = 0
    while k < len(events):
        kind, tag, attrs, raw, data = events[k]
        kept = tag in KEEP or attrs.get("translate") == "no"
        inline = tag in INLINE or not html and kind != "other"
        if kind == "data":
            block.raw += raw
            block.text += " ".join(data.split("\n")) if html else data
            block.shown += data
        elif kind == "other" or inline and (kind == "void" or tag in VOID):
            char = tag == "br" and kind != "other"
            block.raw += raw
            block.tags.append(
                Tag(len(block.text), len(block.text) + char, raw, None, stack[-1] if stack else None, char=char)
            )
            block.text += "\n" * char
            block.shown += "\n" * char
        elif kind == "start" and inline and (tag in OPAQUE or kept):
            k, whole = _element(events, k)
            text = "".join(e[4] for e in events[k - len(whole) + 1 : k + 1] if e[0] == "data")
            block.raw += "".join(whole)
            block.tags.append(
                Tag(
                    len(block.text),
                    len(block.text) + len(text),
                    None,
                    parent=stack[-1] if stack else None,
                    whole="".join(whole),
                )
            )
            block.text += " ".join(text.split("\n")) if html else text
            block.shown += text
        elif kind == "start" and inline:
            block.raw += raw
            block.tags.append(Tag(len(block.text), -1, raw, parent=stack[-1] if stack else None))
            stack.append(len(block.tags) - 1)
        elif kind == "end" and inline:
            block.raw += raw
            opened = next((i for i in reversed(stack) if _name(block.tags[i].open) == tag), None)
            if opened is None:  # closes what opened before the block: around the block's text so far
                inside = [i for i, t in enumerate(block.tags) if t.parent is None and i not in stack]
                block.tags.append(Tag(0, len(block.text), None, raw, stack[-1] if stack else None))
                for i in inside:
                    block.tags[i].parent = len(block.tags) - 1
            else:
                while stack and stack[-1] != opened:  # inner tags left open end here too
                    block.tags[stack.pop()].end = len(block.text)
                stack.pop()
                block.tags[opened].end, block.tags[opened].close = len(block.text), raw
        else:  # a block boundary, or an element kept as written
            _flush(parts, block, stack)
            block, stack = Block(), []
            if kind == "start" and kept and tag not in VOID:
                k, whole = _element(events, k)
                raw = "".join(whole)
            parts.append(raw)
        k += 1
    _flush(parts, block, stack)
    return parts


def _name(open_tag: str | None) -> str:
    return "" if not open_tag else open_tag[1:].split(None, 1)[0].rstrip(">/").lower()


def _element(events: list, k: int) -> tuple[int, list[str]]:
    """(the index of the end tag of the element that starts at events[k], the raw parts of the
    whole element): nested elements of the same name counted."""
    tag, depth, raws = events[k][1], 0, []
    for j in range(k, len(events)):
        kind, name, _, raw, _ = events[j]
        raws.append(raw)
        if name == tag and kind == "start":
            depth += 1
        elif name == tag and kind == "end":
            depth -= 1
            if depth == 0:
                return j, raws
    return len(events) - 1, raws


def _flush(parts: list, block: Block, stack: list[int]) -> None:
    """End a block: its tags still open end with it (closed after it, as written)."""
    for i in stack:
        block.tags[i].end = len(block.text)
    if block.raw:
        parts.append(block)
