"""Subword vocabularies: sentencepiece models, and an imported Marian model's vocabulary, each with
its special ids (`Vocab.ids`: `transduce.special_ids`).

Section 5.1: "Sentences were encoded using byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens" (En-De). The vocabularies transduce trains (`train_vocab`) have
the default layout, `special_ids.DEFAULT` (PAD, UNK, BOS, EOS, importable from here too); a
sentencepiece model of another layout is read with its own ids, and a Marian model's vocabulary
(`MarianVocab`: its vocab.json and sentencepiece model, as OPUS-MT publishes them) with Marian's.
`vocab_record` and `open_vocabs` write and read what data.json (and an export's transduce.json)
says of a model's two vocabularies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm
import torch

from ..defaults import CHARACTER_COVERAGE, VOCAB_SAMPLE, VOCAB_SIZE
from ..errors import DataError
from ..special_ids import BOS, DEFAULT, EOS, PAD, UNK, SpecialIds  # noqa: F401 - PAD .. EOS: DEFAULT's, re-exported

SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}


def train_vocab(
    model_prefix: str | Path,
    sentences: Iterable[str],
    vocab_size: int = VOCAB_SIZE,
    *,
    sample_size: int = VOCAB_SAMPLE,
    character_coverage: float = CHARACTER_COVERAGE,
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
    word = (
        {}
        if model_type == "bpe"
        else dict(
            normalization_rule_name="identity",
            split_by_unicode_script=False,
            split_by_number=False,
            split_digits=False,
            hard_vocab_limit=False,
            use_all_vocab=True,
            max_sentencepiece_length=64,
            max_sentence_length=1 << 16,
        )
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
            pad_id=DEFAULT.pad,
            unk_id=DEFAULT.unk,
            bos_id=DEFAULT.bos,
            eos_id=DEFAULT.eos,
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
            raise DataError(
                f"vocabulary size {vocab_size} is too small for the characters of this corpus ({least}"
                "the special pieces and one per character; or lower --character-coverage)"
            ) from None
        raise DataError(f"sentencepiece training failed: {message}") from None
    return model_prefix.with_name(model_prefix.name + ".model")


class Vocab:
    """A sentencepiece model: text <-> subword ids, with the special ids it defines (`ids`; those
    of the vocabularies `train_vocab` makes are `special_ids.DEFAULT`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError("no such vocabulary file", self.path)
        if _is_old_marian_vocab(self.path):
            raise DataError(
                "the vocabulary of a model imported by an earlier transduce: import the model again "
                "(`transduce import`), which keeps Marian's own files",
                self.path,
            )
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError):
            raise DataError("not a sentencepiece model", self.path) from None
        found = SpecialIds(self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        missing = [name for name, i in found.to_dict().items() if i < 0]
        if missing:
            raise DataError(
                f"no {', '.join(missing)} piece (special ids {found.to_dict()}): train the vocabulary with transduce",
                self.path,
            )
        self.ids = found
        self.files = [self.path]  # what the vocabulary is, on disk (copied by the exports and imports)

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

    @property
    def pad(self) -> int:
        return self.ids.pad

    @property
    def unk(self) -> int:
        return self.ids.unk

    @property
    def bos(self) -> int:
        return self.ids.bos

    @property
    def eos(self) -> int:
        return self.ids.eos

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, size={len(self)})"


def _is_old_marian_vocab(path: Path) -> bool:
    """Whether `path` is the one-file JSON vocabulary an earlier transduce wrote for an imported model."""
    with open(path, "rb") as f:
        return f.read(32).startswith(b'{"format": "transduce-marian-voc')


# -- A Marian model's vocabulary (OPUS-MT's), as it is ------------------------------------------

MARIAN_SPECIALS = ("</s>", "<unk>", "<pad>")
"""The pieces MarianTokenizer keeps whole wherever they occur in the text, and drops when decoding."""


def read_marian_pieces(path: str | Path) -> dict[str, int]:
    """A Marian vocab.json (piece -> id, every id 0 .. V-1 once, an `<unk>`), or a one-line DataError."""
    path = Path(path)
    try:
        pieces = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"not JSON ({e})", path) from None
    if not isinstance(pieces, dict) or not all(isinstance(i, int) for i in pieces.values()):
        raise DataError("not MarianTokenizer's vocabulary (a JSON object of pieces to ids)", path)
    if sorted(pieces.values()) != list(range(len(pieces))):
        raise DataError(f"its ids are not 0 .. {len(pieces) - 1}, each once", path)
    missing = [p for p in MARIAN_SPECIALS if p not in pieces]
    if missing:
        raise DataError(f"no {' or '.join(missing)} piece (MarianTokenizer's special pieces)", path)
    return pieces


class MarianVocab(Vocab):
    """One side of a Marian model's vocabulary as OPUS-MT publishes it, read where it lies: its
    sentencepiece model (`spm_path`, source.spm or target.spm) and Marian's ids of the pieces
    (`pieces_path`, vocab.json, or target_vocab.json for a separate target vocabulary). Text is
    encoded as MarianTokenizer encodes it (`</s>`, `<unk>`, `<pad>` kept whole; a leading `>>xx<<`
    target-language token kept as one token; the rest through the sentencepiece model, its pieces
    looked up in vocab.json, unknown ones `<unk>`) and decoded as MarianTokenizer decodes with
    `skip_special_tokens=True` (the specials dropped). The special ids are Marian's: `</s>`, `<unk>`,
    `<pad>`, and the decoder's start `bos` (Marian's decoder_start_token_id; default `<s>` where
    the vocabulary has one, else `<pad>`, as OPUS-MT's models start). `sp` is the vocabulary
    itself, for the piece look-ups callers make on a sentencepiece processor."""

    def __init__(
        self, spm_path: str | Path, pieces_path: str | Path, bos: int | None = None, shares: "MarianVocab | None" = None
    ):
        self.path, self.pieces_path = Path(spm_path), Path(pieces_path)
        # the other side's look-up where it read the same vocab.json (12 MB of Python for 58k pieces)
        same = shares is not None and shares.pieces_path == self.pieces_path
        self.ids_of = shares.ids_of if same else read_marian_pieces(self.pieces_path)
        if not self.path.is_file():
            raise DataError("no such vocabulary file", self.path)
        try:
            self._spm = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError):
            raise DataError("not a sentencepiece model", self.path) from None
        self.pieces = sorted(self.ids_of, key=self.ids_of.__getitem__)
        get = self.ids_of.get
        self.ids = SpecialIds(
            pad=get("<pad>"), unk=get("<unk>"), bos=get("<s>", get("<pad>")) if bos is None else bos, eos=get("</s>")
        )
        if not 0 <= self.ids.bos < len(self.pieces):
            raise DataError(f"the decoder's start id {self.ids.bos} is not an id of this vocabulary", self.pieces_path)
        self.files = [self.path, self.pieces_path]
        self.sp = self
        self._specials = {p: self.ids_of[p] for p in MARIAN_SPECIALS}
        self._skip = set(self._specials.values())
        self._split = re.compile("(" + "|".join(map(re.escape, self._specials)) + ")")

    def _chunks(self, text: str) -> list[str]:
        """The text split around the special pieces (MarianTokenizer's added tokens), empty parts dropped."""
        return [c for c in self._split.split(text) if c]

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        chunks = [self._chunks(t) for t in texts]
        plain = [c for cs in chunks for c in cs if c not in self._specials]
        codes, rest = zip(*map(_language_code, plain)) if plain else ((), ())
        pieces = iter(self._spm.encode(list(rest), out_type=str, num_threads=num_threads or os.cpu_count() or 1))
        codes = iter(codes)
        unk, get = self.ids.unk, self.ids_of.get
        out = []
        for cs in chunks:
            ids: list[int] = []
            for c in cs:
                if c in self._specials:
                    ids.append(self._specials[c])
                else:
                    ids += [get(p, unk) for p in next(codes) + next(pieces)]
            out.append(ids)
        return out

    def encode(self, text: str) -> list[int]:
        """MarianTokenizer's ids of one sentence, without its EOS."""
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
        return self.ids_of.get(piece, self.ids.unk)

    def word_starts(self) -> torch.Tensor:
        return torch.tensor([p.startswith("\u2581") for p in self.pieces])


def _language_code(text: str) -> tuple[list[str], str]:
    """MarianTokenizer's `remove_language_code`: ([">>xx<<"], the rest) where the text starts with one."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2 :]
    return [], text


# -- What data.json says of a model's two vocabularies ------------------------------------------


def shares_ids(src: Vocab, tgt: Vocab) -> bool:
    """Whether the two sides number their pieces alike: one vocabulary (3.4's shared embeddings
    possible); for Marian's, one vocab.json (its two sentencepiece models may differ)."""
    if isinstance(src, MarianVocab) or isinstance(tgt, MarianVocab):
        return isinstance(src, MarianVocab) and isinstance(tgt, MarianVocab) and src.pieces_path == tgt.pieces_path
    return src is tgt or src.path == tgt.path


def vocab_record(src: Vocab, tgt: Vocab, names: dict[str, str] | None = None) -> tuple[dict, dict[Path, str]]:
    """(data.json's "vocab" record, {file: the name it is copied under}) of a model's two
    vocabularies: sentencepiece models under `names` ({"src": ..., "tgt": ...}; default spm.model,
    or spm.src.model and spm.tgt.model); a Marian vocabulary's files under their own names."""
    shared = shares_ids(src, tgt)
    record: dict = {"shared": shared, "size": {"src": len(src), "tgt": len(tgt)}}
    if isinstance(src, MarianVocab) and isinstance(tgt, MarianVocab):
        record.update(
            type="marian",
            files={"src": src.path.name, "tgt": tgt.path.name},
            pieces={"src": src.pieces_path.name, "tgt": tgt.pieces_path.name},
        )
        copies = {f: f.name for f in src.files + tgt.files}
        if len(set(copies.values())) != len(copies):
            raise ValueError(f"two of the vocabulary files have one name: {', '.join(map(str, copies))}")
        return record, copies
    if isinstance(src, MarianVocab) or isinstance(tgt, MarianVocab):
        raise ValueError("a Marian vocabulary on one side only")
    if names is None:
        names = {"src": "spm.model", "tgt": "spm.model"} if shared else {"src": "spm.src.model", "tgt": "spm.tgt.model"}
    record["files"] = dict(names)
    return record, {src.path: names["src"], tgt.path: names["tgt"]}


def copy_vocabs(src: Vocab, tgt: Vocab, directory: str | Path, names: dict[str, str] | None = None) -> dict:
    """Copy the files of a model's two vocabularies, as they are, into `directory`; return the record
    (`vocab_record`) that `open_vocabs` reads them back with."""
    record, copies = vocab_record(src, tgt, names)
    for f, name in copies.items():
        shutil.copy(f, Path(directory) / name)
    return record


def open_vocabs(record: dict, home: str | Path, special_ids: dict | None = None) -> tuple[Vocab, Vocab]:
    """(source, target) vocabulary that a data.json "vocab" `record` names in `home` (the same object
    where shared); `special_ids`: data.json's record of them (for a Marian vocabulary, the decoder's start)."""
    home, files = Path(home), record["files"]
    if record.get("type") == "marian":
        bos = (special_ids or {}).get("bos")
        pieces = record["pieces"]
        src = MarianVocab(home / files["src"], home / pieces["src"], bos)
        same = (files["tgt"], pieces["tgt"]) == (files["src"], pieces["src"])
        return src, src if same else MarianVocab(home / files["tgt"], home / pieces["tgt"], bos, shares=src)
    src = Vocab(home / files["src"])
    return src, src if files["tgt"] == files["src"] else Vocab(home / files["tgt"])
