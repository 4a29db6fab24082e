"""Documents in, documents out: txt, html, docx, pptx, odt, odp, srt and epub read with their own
libraries, each paragraph a segment whose inline formatting (bold, italic, a link, a style) is
inline tags (`inline`), all segments of a document translated as one batch, and the file written
back with the formatting, tables, headers and footers, notes and timings where they were.
`transduce translate MODEL --file IN` and the server's /translate_file; docs/serve.md, "Documents"."""

from .base import Document, DocumentError
from .files import (FORMATS, Translate, format_of, installed_formats, join_segments, output_name, read, split_segments,
                    tagged_translator, translate_document)

__all__ = ["FORMATS", "Document", "DocumentError", "Translate", "format_of", "installed_formats", "join_segments",
           "output_name", "read", "split_segments", "tagged_translator", "translate_document"]
