"""Real text in, real text out: a paragraph translated a sentence at a time (`sentences`: split,
translate as one batch, put back with its own whitespace and line breaks), and HTML or text with
inline tags translated a sentence at a time, each tag put back around the words the model's
attention aligns with it (`markup`, the document read as `blocks`). docs/text.md."""

from .sentences import MODES, Piece, rejoin, split, translate_text, translate_texts

__all__ = ["MODES", "Piece", "rejoin", "split", "translate_text", "translate_texts"]
