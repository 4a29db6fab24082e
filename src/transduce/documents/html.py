"""HTML (and the XHTML of an EPUB): each block (a paragraph, a heading, a list item, a table cell,
the title) is a segment, its inline elements (b, i, em, strong, a, span, sub, sup, ...) its tags;
a line break, an image, inline code and anything marked translate="no" are kept whole in their
place; script, style, pre and the like are left as they are. Everything that is not translated
text is written back byte for byte as it was read: the markup, attributes, entities and
comments of the file."""

from __future__ import annotations

import re
import zipfile
from html import escape
from html.parser import HTMLParser
from io import BytesIO
from posixpath import dirname, join, normpath

from ..extras import require
from .base import Document, DocumentError
from .inline import Paragraph, Piece

INLINE = frozenset("a abbr b bdi bdo big cite data del dfn em font i ins label mark nobr q s small span strike strong "
                   "sub sup time tt u".split())
"""Elements that format text inside a block: tags of the segment."""
VOID = frozenset("br img wbr input".split())
"""Elements with no content inside a block: kept whole in their place."""
KEEP_INLINE = frozenset("code kbd samp var svg math button select".split())
"""Elements inside a block whose content is not translated: kept whole, content and all."""
KEEP = frozenset("script style pre textarea template noscript".split())
"""Elements whose content is never translated, left as they are."""


class _Events(HTMLParser):
    """The events of an HTML text: (kind, tag, attributes, offset where it starts, decoded text)."""

    def __init__(self, doc: str):
        super().__init__(convert_charrefs=True)
        self.starts = [0] + [i + 1 for i, c in enumerate(doc) if c == "\n"]  # HTMLParser counts lines by \n
        self.events: list[tuple[str, str, dict, int, str]] = []
        self.feed(doc)
        self.close()

    def _add(self, kind: str, tag: str = "", attrs=(), text: str = "") -> None:
        line, column = self.getpos()
        self.events.append((kind, tag, dict(attrs), self.starts[line - 1] + column, text))

    def handle_starttag(self, tag, attrs):
        self._add("start", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("void", tag, attrs)

    def handle_endtag(self, tag):
        self._add("end", tag)

    def handle_data(self, data):
        if self.events and self.events[-1][0] == "text":  # "a < b" comes in pieces
            kind, tag, attrs, start, text = self.events.pop()
            self.events.append((kind, tag, attrs, start, text + data))
        else:
            self._add("text", text=data)

    def handle_comment(self, data):
        self._add("other")

    handle_decl = handle_pi = unknown_decl = handle_comment


class _Reader:
    """An HTML text as parts (`parts`: str, each written back as it is), its blocks with words
    added to `doc` as paragraphs whose translation replaces their part."""

    def __init__(self, doc: Document, text: str):
        self.doc, self.text = doc, text
        self.events = _Events(text).events
        self.ends = [e[3] for e in self.events[1:]] + [len(text)]
        self.parts: list[str] = []
        self._new()
        i = 0
        while i < len(self.events):
            i = self._step(i)
        self._flush()

    def _new(self) -> None:
        self.paragraph, self.open, self.start = Paragraph(), [], None

    def raw(self, i: int, j: int | None = None) -> str:
        return self.text[self.events[i][3]:self.ends[i if j is None else j]]

    def _element_end(self, i: int) -> int:
        """The index of the event that ends the element started at `i` (its end tag, or `i`)."""
        tag, depth = self.events[i][1], 0
        for j in range(i, len(self.events)):
            kind, t = self.events[j][0], self.events[j][1]
            if t == tag and kind in ("start", "end"):
                depth += 1 if kind == "start" else -1
                if depth == 0:
                    return j
        return i if tag in VOID else len(self.events) - 1

    def _step(self, i: int) -> int:
        kind, tag, attrs, _, text = self.events[i]
        kept = attrs.get("translate") == "no"
        if self.start is None:
            self.start = i
        stack = tuple(k for _, k in self.open)
        if kind == "text":
            self.paragraph.text(text, stack)
        elif kind in ("start", "void") and tag in VOID:
            self.paragraph.atom(self.raw(i), stack)
        elif kind == "start" and (tag in KEEP_INLINE or (kept and tag in INLINE)):
            j = self._element_end(i)
            self.paragraph.atom(self.raw(i, j), stack)
            return j + 1
        elif kind == "start" and tag in INLINE:
            self.open.append((tag, self.paragraph.tag((tag, self.raw(i)))))
        elif kind == "end" and tag in INLINE and any(t == tag for t, _ in self.open):
            while self.open.pop()[0] != tag:
                pass
        elif kind in ("end", "void", "other") and (tag in INLINE or kind == "other") and self.paragraph.pieces:
            self.paragraph.atom(self.raw(i), stack)  # a stray end tag, a comment: where it was
        else:  # a block's boundary
            self.start = None if self.start == i else self.start
            self._flush(i)
            if kind == "start" and (tag in KEEP or kept):
                j = self._element_end(i)
                self.parts.append(self.raw(i, j))
                return j + 1
            self.parts.append(self.raw(i))
        return i + 1

    def _flush(self, end: int | None = None) -> None:
        """The block read so far: a paragraph (its part replaced by its translation), or kept."""
        if self.start is not None:
            end = len(self.events) if end is None else end
            raw = self.text[self.events[self.start][3]:self.ends[end - 1]] if end > self.start else ""
            self.parts.append(raw)
            self.paragraph.pieces = _collapsed(self.paragraph.pieces)
            unclosed = {k for _, k in self.open}
            self.doc.add(self.paragraph, lambda paragraph, pieces, at=len(self.parts) - 1, unclosed=unclosed:
                         self.parts.__setitem__(at, render(pieces, paragraph.payloads, unclosed)))
        self._new()


def _collapsed(pieces: list[Piece]) -> list[Piece]:
    """Whitespace inside the text as single spaces (as a browser shows it), that before the first
    text and after the last kept as it is (it is the file's layout)."""
    out = []
    texts = [i for i, p in enumerate(pieces) if p.atom is None]
    for i, p in enumerate(pieces):
        if p.atom is not None:
            out.append(p)
            continue
        core = p.text
        lead = core[: len(core) - len(core.lstrip())] if i == texts[0] else ""
        trail = core[len(core.rstrip()):] if i == texts[-1] and core.strip() else ""
        core = re.sub(r"\s+", " ", core[len(lead): len(core) - len(trail)])
        out.append(Piece(lead + core + trail, p.stack))
    return out


def render(pieces: list[Piece], payloads: list, unclosed: set[int] = frozenset(), escaped=True) -> str:
    """The pieces as markup: each tag's own start tag (as it was written) and an end tag of its
    name around its pieces, each kept thing as it was, the text escaped (`escaped`). A tag that
    was not closed inside the block is not closed at its end either."""
    out: list[str] = []
    stack: tuple[int, ...] = ()

    def move(want: tuple[int, ...], end: bool = False) -> None:
        nonlocal stack
        common = 0
        while common < min(len(stack), len(want)) and stack[common] == want[common]:
            common += 1
        out.extend(f"</{payloads[k - 1][0]}>" for k in reversed(stack[common:]) if not (end and k in unclosed))
        out.extend(payloads[k - 1][1] for k in want[common:])
        stack = want

    for p in pieces:
        if p.atom is not None:
            out.append(payloads[p.atom - 1])
        else:
            move(p.stack)
            out.append(escape(p.text, quote=False) if escaped else p.text)
    move((), end=True)
    return "".join(out)


_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def decode_html(data: bytes, name: str) -> tuple[str, str]:
    """(the text, its encoding): a byte-order mark's, else a <meta charset>'s, else UTF-8."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", "replace"), "utf-8-sig"
    m = _CHARSET.search(data[:4096])
    encoding = m.group(1).decode("ascii").lower() if m else "utf-8"
    try:
        return data.decode(encoding), encoding
    except LookupError:
        raise DocumentError(f"unknown character set {encoding!r} in its <meta charset>", name) from None
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DocumentError(f"not {encoding} text (byte {e.start}): give the file's character set in <meta charset>",
                            name, line) from None


class Html(Document):
    """An HTML file."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        text, self.encoding = decode_html(data, name)
        self.parts = _Reader(self, text).parts

    def save(self) -> bytes:
        return "".join(self.parts).encode(self.encoding, "xmlcharrefreplace")


_OPF = "urn:oasis:names:tc:opendocument:xmlns:container"


class Epub(Document):
    """An EPUB: the XHTML documents of its package (chapters and the table of contents), each
    translated as HTML; every other file of the archive copied as it is, in its order."""

    def __init__(self, data: bytes, name: str):
        super().__init__()
        try:
            self.zip = zipfile.ZipFile(BytesIO(data))
            documents = _epub_documents(self.zip)
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            raise DocumentError(f"not a readable EPUB file ({e})", name) from None
        self.readers = {}
        for path in documents:
            text, encoding = decode_html(self.zip.read(path), f"{name}:{path}")
            self.readers[path] = (_Reader(self, text), encoding)

    def save(self) -> bytes:
        out = BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for info in self.zip.infolist():
                if info.filename in self.readers:
                    reader, encoding = self.readers[info.filename]
                    z.writestr(info, "".join(reader.parts).encode(encoding, "xmlcharrefreplace"))
                else:
                    z.writestr(info, self.zip.read(info))
        return out.getvalue()


def _epub_documents(z: zipfile.ZipFile) -> list[str]:
    """The archive paths of the XHTML documents of an EPUB's package (META-INF/container.xml's
    first rootfile, its manifest's application/xhtml+xml items)."""
    etree = require("lxml.etree", "translating .epub files")
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    container = etree.fromstring(z.read("META-INF/container.xml"), parser)
    rootfile = container.find(f".//{{{_OPF}}}rootfile")
    if rootfile is None or not rootfile.get("full-path"):
        raise ValueError("META-INF/container.xml names no package document")
    opf_path = rootfile.get("full-path")
    opf = etree.fromstring(z.read(opf_path), parser)
    names = set(z.namelist())
    found = []
    for item in opf.iter("{*}item"):
        if item.get("media-type") == "application/xhtml+xml" and item.get("href"):
            path = normpath(join(dirname(opf_path), item.get("href").split("#")[0]))
            if path in names:
                found.append(path)
    return found
