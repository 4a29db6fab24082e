"""The library's defaults that the help pages show, each written once: the library's functions and
dataclasses take them from here, and so does every subcommand's parser.

Why a module of its own: `transduce SUBCOMMAND --help` answers without importing PyTorch, so the
values it shows must live where importing them costs nothing. This module imports nothing (not even
the standard library); the modules that import PyTorch read their defaults from it, so the help
and the library cannot disagree."""

# --- Translation's search (Section 6.1: "beam search with a beam size of 4 and length penalty
# alpha = 0.6"; "We set the maximum output length during inference to input length + 50")
BEAM = 4
ALPHA = 0.6
MAX_LEN_OFFSET = 50

# --- The parser's search (Section 6.3: "We used a beam size of 21 and alpha = 0.3"; "we increased
# the maximum output length to input length + 300")
PARSE_BEAM = 21
PARSE_ALPHA = 0.3
PARSE_MAX_LEN_OFFSET = 300
PARSE_BATCH_SIZE = 16  # Sentences per batch: the decoder works on 21 beams of each

# --- Lines through a search (not the paper's): the batches and chunks of `decoding.streaming`
BATCH_TOKENS = 4096  # Padded source tokens per batch (sentences x longest sentence, EOS included)
BATCH_SIZE = 128  # Sentences per batch at most
CHUNK_LINES = 2000  # Lines read, sorted and translated at a time
MAX_INPUT_TOKENS = 1024  # Longer source lines are cut to this many subword tokens, with a warning

# --- Fine-tuning (`train --init`; not in the paper): a trained model's schedule where the flags give none, chosen on the
# WMT14 sample's validation split (docs/training.md, "Fine-tuning")
FINETUNE_LR = 1e-3  # The peak rate, at step FINETUNE_WARMUP, where neither --lr nor --lr-scale is given
FINETUNE_WARMUP = 100  # Warmup steps where --warmup is not given

# --- A vocabulary shortlist (not in the paper; `transduce shortlist`): a batch's candidate target tokens
SHORTLIST_PER_SOURCE = 64  # Target tokens kept for each source token
SHORTLIST_FREQUENT = 256  # The most frequent target tokens, candidates of every batch

# --- Arithmetic (docs/precision.md): what --precision takes
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # Training's
DECODING_PRECISIONS = ("auto", "auto-int8", "fp32", "bf16", "int8")  # Decoding's; int8: on the CPU only

# --- prepare's vocabulary (not the paper's size: 5.1's is about 37000 tokens, for WMT14 En-De)
VOCAB_SIZE = 8000  # Right for small corpora such as Multi30k (29k pairs)
VOCAB_SAMPLE = 1_000_000  # Sentences sampled for training a vocabulary (all of them if the corpus is smaller)
CHARACTER_COVERAGE = 1.0
"""Every character seen in the sample gets a piece (sentencepiece's 0.9995 maps letters such as "Ä"
to UNK on a corpus the size of Multi30k); lower it for noisy web text full of rare scripts."""

# --- prepare's length filter: subword tokens without EOS, training pairs only (BLEU needs whole test sets)
MAX_LEN = 256  # Pairs with more subword tokens than this on either side are dropped from training
MAX_RATIO = 9.0  # Pairs whose longer side has more than this many times the tokens of the shorter
# side are dropped from training (the default of Moses' clean-corpus-n.perl, there counted in words)

# --- A treebank's (Section 6.3)
TREE_VOCAB_SIZE = 16000  # 6.3: "We used a vocabulary of 16K tokens for the WSJ only setting"
TREE_MAX_LEN = 512
"""Training pairs with more target symbols (or source pieces) than this are left out: tensor2tensor's
max_length of transformer_parsing_base. The longest tree of sections 02-21 has fewer."""

# --- attention's pages
ATTENTION_TYPES = ("encoder", "decoder_self", "decoder_cross")  # The three uses of attention (3.2.3)
ATTENTION_MAX_TOKENS = 64  # Subword tokens per side kept (the page says so): a page stays a few MB

# --- serve's limits on a request (beyond them it is refused), its batching and its shutdown
SERVE_MAX_BODY_BYTES = 1 << 20
SERVE_MAX_SENTENCES = 64  # Sentences per request (texts in q, and sentences in all after the split)
SERVE_MAX_CHARS = 2000  # Characters per sentence (LibreTranslate's API: per request, summed over q)
SERVE_MAX_TOKENS = 256  # Subword tokens per sentence (EOS not counted)
SERVE_MAX_QUEUE = 256  # Requests waiting to be decoded; more are answered 429
SERVE_MAX_BEAM = 16
SERVE_MAX_LEN_OFFSET = 256  # The largest max_len_offset a request may ask for
SERVE_MAX_WAIT = 0.01  # Seconds the first request of a batch waits for others
SERVE_GRACEFUL_TIMEOUT = 30.0  # Seconds a shutdown waits for the requests in flight (as Kubernetes)

# --- experiment's variants: Table 3's rows, top to bottom
TABLE3 = (
    "base",
    "A1",
    "A2",
    "A3",
    "A4",
    "B1",
    "B2",
    "C1",
    "C2",
    "C3",
    "C4",
    "C5",
    "C6",
    "C7",
    "D1",
    "D2",
    "D3",
    "D4",
    "E",
    "big",
)
