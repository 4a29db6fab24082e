"""HTML, and the XHTML documents of an EPUB: each file is one segment, translated as HTML by
`transduce.text.markup` (a block at a time, a sentence at a time, the inline tags placed by the
model's alignment; everything that is not translated text written back as it was read)."""

from __future__ import annotations

import re
import zipfile
from io import BytesIO
from posixpath import dirname, join, normpath

from ..extras import require
from .base import Document, DocumentError

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
        raise DocumentError(
            f"not {encoding} text (byte {e.start}): give the file's character set in <meta charset>", name, line
        ) from None


class Html(Document):
    """An HTML file."""

    html = True

    def __init__(self, data: bytes, name: str):
        super().__init__()
        self.text, self.encoding = decode_html(data, name)

    @property
    def segments(self) -> list[str]:
        return [self.text]

    def fill(self, translations: list[str]) -> None:
        (self.text,) = translations

    def save(self) -> bytes:
        return self.text.encode(self.encoding, "xmlcharrefreplace")


_OPF = "urn:oasis:names:tc:opendocument:xmlns:container"


class Epub(Document):
    """An EPUB: the XHTML documents of its package (chapters and the table of contents), each
    translated as HTML; every other file of the archive copied as it is, in its order."""

    html = True

    def __init__(self, data: bytes, name: str):
        super().__init__()
        try:
            self.zip = zipfile.ZipFile(BytesIO(data))
            paths = _epub_documents(self.zip)
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            raise DocumentError(f"not a readable EPUB file ({e})", name) from None
        self.documents = {path: decode_html(self.zip.read(path), f"{name}:{path}") for path in paths}

    @property
    def segments(self) -> list[str]:
        return [text for text, _ in self.documents.values()]

    def fill(self, translations: list[str]) -> None:
        # XHTML is XML: no &nbsp; (an HTML entity) but its number
        self.documents = {
            path: (text.replace("&nbsp;", "&#160;"), encoding)
            for (path, (_, encoding)), text in zip(self.documents.items(), translations, strict=True)
        }

    def save(self) -> bytes:
        out = BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for info in self.zip.infolist():
                if info.filename in self.documents:
                    text, encoding = self.documents[info.filename]
                    z.writestr(info, text.encode(encoding, "xmlcharrefreplace"))
                else:
                    z.writestr(info, self.zip.read(info))
        return out.getvalue()


def _epub_documents(z: zipfile.ZipFile) -> list[str]:
    """The archive paths of the XHTML documents of an EPUB's package (META-INF/container.xml's
    first rootfile, its manifest's application/xhtml+xml items)."""
    etree = require("lxml.etree", "translating .epub files")
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    try:
        container = etree.fromstring(z.read("META-INF/container.xml"), parser)
    except etree.XMLSyntaxError as e:
        raise ValueError(f"META-INF/container.xml: {e}") from None
    rootfile = container.find(f".//{{{_OPF}}}rootfile")
    if rootfile is None or not rootfile.get("full-path"):
        raise ValueError("META-INF/container.xml names no package document")
    opf_path = rootfile.get("full-path")
    try:
        opf = etree.fromstring(z.read(opf_path), parser)
    except etree.XMLSyntaxError as e:
        raise ValueError(f"{opf_path}: {e}") from None
    names = set(z.namelist())
    found = []
    for item in opf.iter("{*}item"):
        if item.get("media-type") == "application/xhtml+xml" and item.get("href"):
            path = normpath(join(dirname(opf_path), item.get("href").split("#")[0]))
            if path in names:
                found.append(path)
    return found
