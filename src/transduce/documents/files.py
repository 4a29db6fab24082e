"""The formats by file extension, and a document translated: read, its segments sent to the
translator as one batch, written back."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Callable

from .base import Document, DocumentError

FORMATS = {
    ".txt": ("plain", "Text"), ".srt": ("plain", "Subtitles"), ".html": ("html", "Html"), ".htm": ("html", "Html"),
    ".xhtml": ("html", "Html"), ".docx": ("office", "Docx"), ".pptx": ("office", "Pptx"), ".odt": ("odf", "Odf"),
    ".odp": ("odf", "Odf"), ".epub": ("html", "Epub"),
}
"""Extension -> (the module of this package, the Document class) that reads and writes it."""

NEEDS = {".docx": "docx", ".pptx": "pptx", ".odt": "odf", ".odp": "odf", ".srt": "srt", ".epub": "lxml"}
"""The module a format needs beyond the standard library (the documents extra installs it)."""

Translate = Callable[[list[str]], list[str]]
"""Segments (texts with inline tags, `inline.tagged`) in, their translations (with the tags) out."""


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


def translate_document(doc: Document, translate: Translate) -> bytes:
    """The file of `doc` (`read`) with every segment translated by ONE call of `translate`."""
    segments = doc.segments
    translations = list(translate(segments)) if segments else []
    if len(translations) != len(segments):
        raise ValueError(f"the translator gave {len(translations)} translations for {len(segments)} segments")
    doc.fill(translations)
    return doc.save()


def output_name(path: str | Path, target: str | None) -> Path:
    """Where a translated file goes by default: report.docx -> report.de.docx (report.translated.docx
    where the target language is not known)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{target or 'translated'}{path.suffix}")


_TAG = re.compile(r"(<[^<>]*>)")


def split_segments(segments: list[str], lang: str, mode: str = "on") -> tuple[list, list[str]]:
    """(a layout for `join_segments`, the sentences to translate): every stretch of text between
    the segments' tags split into sentences of language `lang` (`transduce.text.sentences`, its
    `mode`), the sentences of all segments in one list, for one batch."""
    from html import unescape

    from ..text.sentences import split_all

    parts = [_TAG.split(s) for s in segments]
    layouts, sentences = split_all([unescape(p) for ps in parts for p in ps[0::2]], lang, mode)
    return (parts, layouts), sentences


def join_segments(layout: tuple, outputs: list[str]) -> list[str]:
    """The segments of `split_segments` with their sentences' translations, the tags where they were."""
    from html import escape

    from ..text.sentences import rejoin_all

    parts, layouts = layout
    texts = iter(rejoin_all(layouts, outputs))
    return ["".join(escape(next(texts), quote=False) if i % 2 == 0 else p for i, p in enumerate(ps)) for ps in parts]


def tagged_translator(translate_batch: Callable[[list[str]], list[str]], lang: str, mode: str = "on") -> Translate:
    """A `Translate` from a translator of sentences (a list of sentences in, their translations
    out, in one call): `split_segments`, the batch, `join_segments`."""

    def translate(segments: list[str]) -> list[str]:
        layout, sentences = split_segments(segments, lang, mode)
        outputs = list(translate_batch(sentences)) if sentences else []
        if len(outputs) != len(sentences):
            raise ValueError(f"the translator gave {len(outputs)} translations for {len(sentences)} sentences")
        return join_segments(layout, outputs)

    return translate
