"""The library's values that the help pages show, mirrored here so that building a subcommand's
parser imports no module that imports PyTorch: `transduce SUBCOMMAND --help` answers at once (the
run functions import the library). Each value is declared with the library name it mirrors
(`MIRRORS`); tests/test_flags.py holds every one equal to it."""

from __future__ import annotations

MIRRORS: dict[str, object] = {}
"""The library's name ("module:NAME", or "module:Class.field" for a dataclass default) -> its value here."""


def mirror(value, source: str):
    """`value`, recorded as the value of the library's `source` (checked by tests/test_flags.py)."""
    MIRRORS[source] = value
    return value


# Search (6.1) and streams of decoding
BEAM = mirror(4, "transduce.decoding.search:DEFAULT_BEAM")
ALPHA = mirror(0.6, "transduce.decoding.search:DEFAULT_ALPHA")
MAX_LEN_OFFSET = mirror(50, "transduce.decoding.search:DEFAULT_MAX_LEN_OFFSET")
BATCH_SIZE = mirror(128, "transduce.decoding.streaming:DEFAULT_BATCH_SIZE")
BATCH_TOKENS = mirror(4096, "transduce.decoding.streaming:DEFAULT_BATCH_TOKENS")
CHUNK_LINES = mirror(2000, "transduce.decoding.streaming:DEFAULT_CHUNK_LINES")
MAX_INPUT_TOKENS = mirror(1024, "transduce.decoding.streaming:DEFAULT_MAX_INPUT_TOKENS")

# Arithmetic
PRECISIONS = mirror(("auto", "fp32", "bf16", "fp16"), "transduce.precision:PRECISIONS")
DECODING_PRECISIONS = mirror(("auto", "auto-int8", "fp32", "bf16", "int8"), "transduce.precision:DECODING_PRECISIONS")

# prepare's vocabulary, and a treebank's
VOCAB_SIZE = mirror(8000, "transduce.data.vocab:DEFAULT_VOCAB_SIZE")
VOCAB_SAMPLE = mirror(1_000_000, "transduce.data.vocab:DEFAULT_SAMPLE_SIZE")
CHARACTER_COVERAGE = mirror(1.0, "transduce.data.vocab:DEFAULT_CHARACTER_COVERAGE")
TREE_MAX_LEN = mirror(512, "transduce.parsing.data:MAX_LEN")
TREE_VOCAB_SIZE = mirror(16000, "transduce.parsing.data:PAPER_VOCAB_SIZE")

# attention's pages, serve's limits, experiment's variants
ATTENTION_TYPES = mirror(("encoder", "decoder_self", "decoder_cross"), "transduce.views.weights:TYPES")
ATTENTION_MAX_TOKENS = mirror(64, "transduce.views.weights:MAX_TOKENS")
SERVE_MAX_BODY_BYTES = mirror(1 << 20, "transduce.serve.common:Limits.max_body_bytes")
SERVE_MAX_SENTENCES = mirror(64, "transduce.serve.common:Limits.max_sentences")
SERVE_MAX_CHARS = mirror(2000, "transduce.serve.common:Limits.max_chars")
SERVE_MAX_TOKENS = mirror(256, "transduce.serve.common:Limits.max_tokens")
SERVE_MAX_QUEUE = mirror(256, "transduce.serve.common:Limits.max_queue")
SERVE_MAX_BEAM = mirror(16, "transduce.serve.common:Limits.max_beam")
SERVE_MAX_LEN_OFFSET = mirror(256, "transduce.serve.common:Limits.max_len_offset")
TABLE3 = mirror(("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7",
                 "D1", "D2", "D3", "D4", "E", "big"), "transduce.experiments.plan:TABLE3")
