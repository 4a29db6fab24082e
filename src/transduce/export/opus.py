"""OPUS-MT's MarianMT models (Helsinki-NLP's, as they publish them for Hugging Face) as transduce
model directories, exactly: the same function from source ids to logits, tokenized as
MarianTokenizer tokenizes.

What differs from the paper's model is carried by `ModelConfig` options (docs/paper_map.md):
swish in the FFN (`activation`), attention biases (`attention_bias`), the final logits bias
(`output_bias`), LayerNorm epsilon 1e-5 (`layer_norm_eps`); Marian's [sin | cos] sinusoids by
permuting the hidden dimension (`transduce.export.marian`). What differs in the vocabulary is
mapped once, here, as data: OPUS-MT numbers `</s>` 0, `<unk>` 1, the pieces, `<pad>` last, and
starts decoding with `<pad>`; transduce's ids are PAD 0, UNK 1, BOS 2, EOS 3. The rows of the
embedding (and of the logits bias) are renumbered (`data.vocab.marian_order`): BOS is Marian's
`<pad>` row (the start token Marian decodes from), UNK and EOS Marian's, then every other id in
Marian's order, and PAD a row of its own (zeros), which padding positions read and nothing
attends to, with a logits bias of `PAD_LOGIT` so that its probability is exactly 0 and every
other token's log-probability is Marian's. transduce's search bans PAD and BOS as Marian's
`bad_words_ids` bans `<pad>`. The vocabulary of each side (its sentencepiece model and vocab.json,
renumbered) is one file, `data.vocab.MarianVocab`, which `Vocab(path)` opens wherever transduce
loads a model's vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..checkpoint import atomic_dir, save_model
from ..config import Config
from ..data.vocab import BOS, EOS, PAD, UNK, Vocab, marian_order, write_marian_vocab
from ..errors import DataError
from ..model import Transformer
from .marian import INFO, _check_exportable, _config_from_marian, check_marian_dir, import_marian, load_hf_marian
from .marian import transduce_tensors

PAD_LOGIT = -1.0e4
"""The logits bias of the PAD row transduce adds: exp(PAD_LOGIT - max) is 0 in fp32, bf16 and fp16."""

VOCAB_FILES = {"src": "marian.src.json", "tgt": "marian.tgt.json"}
"""The imported model's vocabulary files (`data.vocab.write_marian_vocab`)."""


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"not JSON ({e})", path) from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise DataError("not MarianTokenizer's vocabulary (a JSON object of pieces to ids)", path)
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise DataError(f"its ids are not 0 .. {len(vocab) - 1}, each once", path)
    if "<unk>" not in vocab:
        raise DataError("no <unk> piece (MarianTokenizer needs one)", path)
    return vocab


def in_transduce_layout(path: Path) -> bool:
    """Whether a MarianMT directory numbers its vocabulary as transduce's sentencepiece models
    (what `transduce export marian` writes), which `marian.import_marian` reads as it is."""
    if (path / INFO).is_file():
        return True
    vocab = _read_vocab(path / "vocab.json")
    try:
        sv = Vocab(path / "source.spm")
    except DataError:  # special ids other than transduce's
        return False
    return len(vocab) == len(sv) and all(sv.sp.piece_to_id(p) == i for p, i in vocab.items()) \
        and [vocab.get(p) for p in ("<pad>", "<unk>", "<s>", "</s>")] == [PAD, UNK, BOS, EOS]


def import_opus(path: str | os.PathLike) -> tuple[Transformer, Config, dict[str, tuple[bytes, dict, list]]]:
    """An OPUS-MT MarianMT directory as a transduce model (see the module's doc), its config, and
    each side's vocabulary as (sentencepiece model, vocab.json, transduce order) for
    `data.vocab.write_marian_vocab`."""
    path = Path(path)
    check_marian_dir(path)
    hf = load_hf_marian(path)
    mc = hf.config
    separate = (path / "target_vocab.json").is_file()
    vocabs = {"src": _read_vocab(path / "vocab.json")}
    vocabs["tgt"] = _read_vocab(path / "target_vocab.json") if separate else vocabs["src"]
    start = mc.decoder_start_token_id if mc.decoder_start_token_id is not None else mc.pad_token_id
    orders = {side: marian_order(v, mc.pad_token_id, mc.eos_token_id, start) for side, v in vocabs.items()}
    extra = int(mc.pad_token_id == start)  # OPUS-MT: PAD gets a row of its own
    sizes = {"src": mc.vocab_size, "tgt": mc.decoder_vocab_size or mc.vocab_size}
    for side, v in vocabs.items():
        if len(v) != sizes[side]:
            raise DataError(f"{len(v)} pieces, but config.json says {sizes[side]}",
                            path / ("target_vocab.json" if side == "tgt" and separate else "vocab.json"))
    config = _config_from_marian(mc, output_bias=True, extra_rows=extra)
    c = config.model
    _check_exportable(c)
    tensors = transduce_tensors(hf, c, True, path)
    rows = {"encoder.embed.weight": "src", "decoder.embed.weight": "tgt", "output_proj.weight": "tgt", "output_bias": "tgt"}
    for name, side in rows.items():
        if name in tensors:
            tensors[name] = _renumber(tensors[name], orders[side], PAD_LOGIT if name == "output_bias" else 0.0)
    model = Transformer(c)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: the weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    spm = {"src": (path / "source.spm").read_bytes(), "tgt": (path / "target.spm").read_bytes()}
    return model.eval(), config, {side: (spm[side], vocabs[side], orders[side]) for side in ("src", "tgt")}


def _renumber(t: torch.Tensor, order: list[int | None], fill: float) -> torch.Tensor:
    """Rows of `t` (Marian's ids) in transduce's order; the added PAD row `fill`."""
    out = torch.full((len(order), *t.shape[1:]), fill, dtype=t.dtype)
    have = [i for i, m in enumerate(order) if m is not None]
    out[have] = t[[order[i] for i in have]]
    return out


def write_model_dir(marian_dir: str | os.PathLike, out: str | os.PathLike) -> str:
    """`transduce export from-marian`: a MarianMT directory as a transduce model directory at
    `out` (whole or not at all): one in transduce's layout as it is (`marian.import_marian`), an
    OPUS-MT one renumbered (`import_opus`). Returns what it was, for the user."""
    marian_dir = Path(marian_dir)
    check_marian_dir(marian_dir)
    if in_transduce_layout(marian_dir):
        model, config, sv, tv = import_marian(marian_dir)
        with atomic_dir(out) as tmp:
            save_model(model, config, tmp)
            if sv is tv:
                shutil.copy(sv.path, tmp / "spm.model")
            else:
                files = {"src": "spm.src.model", "tgt": "spm.tgt.model"}
                shutil.copy(sv.path, tmp / files["src"])
                shutil.copy(tv.path, tmp / files["tgt"])
                _write_metadata(tmp, files, False, len(sv), len(tv))
        return "MarianMT in transduce's layout"
    model, config, vocabs = import_opus(marian_dir)
    with atomic_dir(out) as tmp:
        save_model(model, config, tmp)
        for side, (spm, vocab, order) in vocabs.items():
            write_marian_vocab(tmp / VOCAB_FILES[side], spm, vocab, order)
        m = config.model
        _write_metadata(tmp, VOCAB_FILES, m.share_embeddings, m.src_vocab_size, m.target_vocab_size, _languages(marian_dir))
    return "OPUS-MT (MarianMT) model, its vocabulary renumbered"


def _languages(path: Path) -> dict:
    try:
        tok = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {f"{k}_lang": tok[f"{name}_lang"] for k, name in (("src", "source"), ("tgt", "target"))
            if isinstance(tok.get(f"{name}_lang"), str)}


def _write_metadata(d: Path, files: dict, shared: bool, src: int, tgt: int, extra: dict | None = None) -> None:
    """data.json beside the model: its vocabulary files, as `transduce translate` looks for them."""
    meta = {"format": 1, "special_ids": {"pad": PAD, "unk": UNK, "bos": BOS, "eos": EOS},
            "vocab": {"shared": shared, "files": dict(files), "size": {"src": src, "tgt": tgt}}, **(extra or {})}
    (d / "data.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
