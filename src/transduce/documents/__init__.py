"""Documents in, documents out: txt, html, docx, pptx, odt, odp, srt and epub read with their own
libraries, each paragraph a segment whose inline formatting (bold, italic, a link, a style) is
inline tags (`inline`); all segments of a document translated as one batch, a sentence at a time,
the tags placed by the model's alignment (`transduce.text.markup`); the file written back with its
formatting, tables, headers and footers, notes and timings where they were. `transduce translate
MODEL --file IN` and the server's /translate_file; docs/serve.md, "Documents"."""

from .base import Document, DocumentError
from .files import FORMATS, Translator, format_of, installed_formats, output_name, read, translate_document

__all__ = [
    "FORMATS",
    "Document",
    "DocumentError",
    "Translator",
    "format_of",
    "installed_formats",
    "output_name",
    "read",
    "translate_document",
]
