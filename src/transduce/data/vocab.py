"""Subword vocabularies: sentencepiece BPE models with fixed special ids.

Section 5.1: "Sentences were encoded using byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens" (En-De). The special ids are the same in every vocabulary
(`transduce.special_ids`: PAD, UNK, BOS, EOS, importable from here too).
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm
import torch

from ..errors import DataError
from ..special_ids import BOS, EOS, PAD, UNK

SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}

DEFAULT_VOCAB_SIZE = 8000  # Right for small corpora such as Multi30k (29k pairs); the paper: ~37000 (WMT14 En-De)

DEFAULT_SAMPLE_SIZE = 1_000_000  # Sentences sampled for training a vocabulary (all of them if the corpus is smaller)

DEFAULT_CHARACTER_COVERAGE = 1.0
"""Every character seen in the sample gets a piece (sentencepiece's 0.9995 maps letters such as "Ä"
to UNK on a corpus the size of Multi30k); lower it for noisy web text full of rare scripts."""


def train_vocab(
    model_prefix: str | Path,
    sentences: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    *,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    character_coverage: float = DEFAULT_CHARACTER_COVERAGE,
    seed: int = 0,
    num_threads: int | None = None,
    model_type: str = "bpe",
) -> Path:
    """Train a sentencepiece BPE model on a random sample of `sample_size` of `sentences` (a
    stream, read once in bounded memory); return `{model_prefix}.model`. `model_type="word"`: a
    closed word-level vocabulary instead, one piece per distinct symbol taken as it is, for
    targets such as linearized trees (Section 6.3; `vocab_size` is then an upper bound).
    Raises DataError if `vocab_size` does not fit the corpus."""
    model_prefix = Path(model_prefix)
    read_error: list[DataError] = []

    def stream():
        try:
            yield from sentences
        except DataError as e:  # sentencepiece would turn it into a RuntimeError with a traceback
            read_error.append(e)
            raise

    if model_type not in ("bpe", "word"):
        raise ValueError(f"model_type must be 'bpe' or 'word', not {model_type!r}")
    word = {} if model_type == "bpe" else dict(
        normalization_rule_name="identity", split_by_unicode_script=False, split_by_number=False,
        split_digits=False, hard_vocab_limit=False, use_all_vocab=True, max_sentencepiece_length=64,
        max_sentence_length=1 << 16,
    )
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=stream(),
            model_prefix=str(model_prefix),
            model_type=model_type,
            **word,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            input_sentence_size=sample_size,
            shuffle_input_sentence=True,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            **{f"{name}_piece": piece for name, piece in SPECIAL_PIECES.items()},
            num_threads=num_threads or os.cpu_count() or 1,
            minloglevel=2,  # sentencepiece logs every step at INFO; errors still raise
        )
    except RuntimeError as e:
        if read_error:
            raise read_error[0] from None
        message = str(e).strip().splitlines()[0]
        if "Vocabulary size too high" in message:
            limit = message.split("<=")[-1].strip(" .")
            raise DataError(f"vocabulary size {vocab_size} is too large for this corpus (at most {limit})") from None
        if "smaller than required_chars" in message:  # "... required_chars. 10 vs 83. Increase ..."
            need = re.search(r"(\d+) vs (\d+)", message)
            least = f"at least {need.group(2)}, " if need else ""
            raise DataError(f"vocabulary size {vocab_size} is too small for the characters of this corpus ({least}"
                            "the special pieces and one per character; or lower --character-coverage)") from None
        raise DataError(f"sentencepiece training failed: {message}") from None
    return model_prefix.with_name(model_prefix.name + ".model")


class Vocab:
    """A trained sentencepiece model: text <-> subword ids, with the fixed special ids. `Vocab(path)`
    of a file `write_marian_vocab` wrote opens a `MarianVocab` (an imported OPUS-MT model's)."""

    def __new__(cls, path: str | Path | None = None):  # None: unpickling
        if cls is Vocab and path is not None and is_marian_vocab(path):
            return super().__new__(MarianVocab)
        return super().__new__(cls)

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError("no such vocabulary file", self.path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError):
            raise DataError("not a sentencepiece model", self.path) from None
        found = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if found != (PAD, UNK, BOS, EOS):
            raise DataError(
                f"special ids (pad, unk, bos, eos) are {found}, expected {(PAD, UNK, BOS, EOS)}: "
                "train it with transduce", self.path
            )

    def encode(self, text: str) -> list[int]:
        """Subword ids of one sentence, without BOS or EOS."""
        return self.sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """`encode` over many sentences at once (multi-threaded inside sentencepiece)."""
        return self.sp.encode(list(texts), num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of ids; PAD, BOS and EOS are dropped (UNK prints as ' ⁇ ')."""
        return self.sp.decode([int(i) for i in ids])

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def word_starts(self) -> torch.Tensor:
        """(V,) bool: which pieces begin a word (sentencepiece marks them with "▁")."""
        return torch.tensor([self.sp.id_to_piece(i).startswith("▁") for i in range(len(self))])

    pad, unk, bos, eos = PAD, UNK, BOS, EOS

    def __repr__(self) -> str:
        return f"Vocab({str(self.path)!r}, size={len(self)})"


# -- Imported MarianMT (OPUS-MT) vocabularies -------------------------------------------------

MARIAN_VOCAB_FORMAT = "transduce-marian-vocab"
MARIAN_SPECIALS = ("</s>", "<unk>", "<pad>")
"""The pieces MarianTokenizer keeps whole wherever they occur in the text, and drops when decoding."""


def marian_order(vocab: dict[str, int], pad_id: int, eos_id: int, start_id: int) -> list[int | None]:
    """The Marian id of each transduce id: PAD a row of its own (None) where Marian pads with its
    decoder's start token (OPUS-MT's PAD), else Marian's PAD; UNK Marian's `<unk>`; BOS Marian's
    start token; EOS Marian's; then every other id in Marian's order."""
    specials = [None if pad_id == start_id else pad_id, vocab["<unk>"], start_id, eos_id]
    return specials + sorted(set(vocab.values()) - set(specials))


def write_marian_vocab(path: str | Path, spm_model: bytes, vocab: dict[str, int], order: list[int | None]) -> Path:
    """One self-contained file: the sentencepiece model of one side, and MarianTokenizer's
    vocab.json renumbered by `order` (`marian_order`). `Vocab(path)` opens it as a `MarianVocab`."""
    index = {m: t for t, m in enumerate(order) if m is not None}
    by_id = {i: p for p, i in vocab.items()}
    names = list(SPECIAL_PIECES.values()) + [by_id[m] for m in order[len(SPECIAL_PIECES):]]
    data = {"format": MARIAN_VOCAB_FORMAT, "version": 1, "pieces": names, "ids": {p: index[i] for p, i in vocab.items()},
            "spm": base64.b64encode(spm_model).decode("ascii")}
    Path(path).write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return Path(path)


def is_marian_vocab(path: str | Path) -> bool:
    """Whether `path` is a file `write_marian_vocab` wrote (a JSON object; sentencepiece models are protobuf)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MARIAN_VOCAB_FORMAT) + 16).startswith(b'{"format": "' + MARIAN_VOCAB_FORMAT.encode())
    except OSError:
        return False


class MarianVocab(Vocab):
    """An imported MarianMT model's vocabulary for one side, in transduce's id layout: text is
    encoded as MarianTokenizer encodes it (`</s>`, `<unk>`, `<pad>` kept whole; a leading `>>xx<<`
    target-language token kept as one token; the rest through this side's sentencepiece model,
    its pieces looked up in vocab.json, unknown ones UNK) and decoded as MarianTokenizer decodes
    with `skip_special_tokens=True` (the specials and UNK dropped). `sp` is the vocabulary
    itself, for the piece look-ups callers make on a sentencepiece processor."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._spm = spm.SentencePieceProcessor(model_proto=base64.b64decode(data["spm"]))
            self.pieces, self.ids = list(data["pieces"]), dict(data["ids"])
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise DataError(f"not a MarianMT vocabulary written by transduce ({type(e).__name__})", self.path) from None
        self.sp = self
        self._specials = {p: self.ids[p] for p in MARIAN_SPECIALS if p in self.ids}
        self._skip = {PAD, BOS, EOS, UNK} | set(self._specials.values())
        self._split = re.compile("(" + "|".join(map(re.escape, self._specials)) + ")" if self._specials else "(?!)")

    def _chunks(self, text: str) -> list[str]:
        """The text split around the special pieces (MarianTokenizer's added tokens), empty parts dropped."""
        return [c for c in self._split.split(text) if c]

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        chunks = [self._chunks(t) for t in texts]
        plain = [c for cs in chunks for c in cs if c not in self._specials]
        codes, rest = zip(*map(_language_code, plain)) if plain else ((), ())
        pieces = iter(self._spm.encode(list(rest), out_type=str, num_threads=num_threads or os.cpu_count() or 1))
        codes = iter(codes)
        out = []
        for cs in chunks:
            ids: list[int] = []
            for c in cs:
                if c in self._specials:
                    ids.append(self._specials[c])
                else:
                    ids += [self.ids.get(p, UNK) for p in next(codes) + next(pieces)]
            out.append(ids)
        return out

    def encode(self, text: str) -> list[int]:
        """Subword ids of one sentence, without EOS (MarianTokenizer's ids, renumbered)."""
        return self.encode_batch([text], 1)[0]

    def decode(self, ids: Iterable[int]) -> str:
        """MarianTokenizer's `decode(ids, skip_special_tokens=True)`."""
        pieces = [self.pieces[int(i)] for i in ids if int(i) not in self._skip]
        return self._spm.decode_pieces(pieces).replace("\u2581", " ").strip()

    def __len__(self) -> int:
        return len(self.pieces)

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[int(i)]

    def piece_to_id(self, piece: str) -> int:
        return self.ids.get(piece, UNK)

    def word_starts(self) -> torch.Tensor:
        return torch.tensor([p.startswith("\u2581") for p in self.pieces])

    def __repr__(self) -> str:
        return f"MarianVocab({str(self.path)!r}, size={len(self)})"


def _language_code(text: str) -> tuple[list[str], str]:
    """MarianTokenizer's `remove_language_code`: ([">>xx<<"], the rest) where the text starts with one."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2:]
    return [], text
