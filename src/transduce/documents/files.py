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

Translate = Callable[[list[str]], list[str]]
"""Segments (texts with inline tags, `inline.tagged`) in, their translations (with the tags) out."""


def format_of(name: str | Path) -> str:
    """The format of a file, by its extension (".docx"), or a DocumentError naming the file."""
    ext = Path(name).suffix.lower()
    if ext not in FORMATS:
        what = f"{ext} files are" if ext else "a file without an extension is"
        raise DocumentError(f"{what} not translated: give one of {', '.join(FORMATS)}", name)
    return ext


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


def tagged_translator(translate_batch: Callable[[list[str]], list[str]], lang: str, mode: str = "on") -> Translate:
    """A `Translate` from a translator of sentences (a list of sentences in, their translations
    out): every stretch of text between tags split into sentences (`transduce.text.sentences`),
    all of them translated as one batch, the tags kept where they were."""
    from html import escape, unescape

    from ..text.sentences import translate_texts

    def translate(segments: list[str]) -> list[str]:
        parts = [_TAG.split(s) for s in segments]
        texts = [unescape(p) for ps in parts for p in ps[0::2]]
        out = iter(translate_texts(translate_batch, texts, lang, mode))
        return ["".join(escape(next(out), quote=False) if i % 2 == 0 else p for i, p in enumerate(ps)) for ps in parts]

    return translate
