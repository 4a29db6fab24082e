"""The formats by file extension, and a document translated: read, its segments' sentences sent to
the translator as one batch, the tags placed, written back."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from .base import Document, DocumentError

FORMATS = {
    ".txt": ("plain", "Text"),
    ".srt": ("plain", "Subtitles"),
    ".html": ("html", "Html"),
    ".htm": ("html", "Html"),
    ".xhtml": ("html", "Html"),
    ".docx": ("office", "Docx"),
    ".pptx": ("office", "Pptx"),
    ".odt": ("odf", "Odf"),
    ".odp": ("odf", "Odf"),
    ".epub": ("html", "Epub"),
}
"""Extension -> (the module of this package, the Document class) that reads and writes it."""

NEEDS = {".docx": "docx", ".pptx": "pptx", ".odt": "odf", ".odp": "odf", ".srt": "srt", ".epub": "lxml"}
"""The module a format needs beyond the standard library (the documents extra installs it)."""


def format_of(name: str | Path) -> str:
    """The format of a file, by its extension (".docx"), or a DocumentError naming the file."""
    ext = Path(name).suffix.lower()
    if ext not in FORMATS:
        what = f"{ext} files are" if ext else "a file without an extension is"
        raise DocumentError(f"{what} not translated: give one of {', '.join(FORMATS)}", name)
    return ext


def installed_formats(upload: bool = False) -> list[str]:
    """The extensions whose library is installed; with `upload` (a server's), none unless
    python-multipart is too, which reads an upload."""
    from importlib.util import find_spec

    if upload and find_spec("python_multipart") is None:
        return []
    return [ext for ext in FORMATS if ext not in NEEDS or find_spec(NEEDS[ext]) is not None]


def read(data: bytes, fmt: str, name: str = "document") -> Document:
    """The document of `data`, a file of format `fmt` (an extension of FORMATS)."""
    module, cls = FORMATS[fmt]
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(data, name)


def translate_document(doc: Document, translator, lang: str, mode: str = "on") -> bytes:
    """The file of `doc` (`read`) translated: its segments' sentences (of language `lang`, split
    by `mode`: `transduce.text.sentences`) in ONE call of `translator.translate`, the inline tags
    placed by `translator.align` (`transduce.text.markup`)."""
    from ..text.markup import plan, run

    segments = doc.segments
    doc.fill(run(plan(segments, lang, mode, html=doc.html), translator) if segments else [])
    return doc.save()


def output_name(path: str | Path, target: str | None) -> Path:
    """Where a translated file goes by default: report.docx -> report.de.docx (report.translated.docx
    where the target language is not known)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{target or 'translated'}{path.suffix}")


class Translator:
    """A `text.markup.Translator`: `translate_batch` (sentences in, their translations out, in
    one call) and `align` (a model's attention: `text.align.AttentionAligner.align`; None, for an
    engine that gives no attention: no links, and `text.markup` places the tags in proportion)."""

    def __init__(self, translate_batch: Callable[[list[str]], list[str]], align=None):
        self.translate = translate_batch
        self.align = align or (lambda sources, outputs: [[] for _ in sources])
