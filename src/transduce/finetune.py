"""Fine-tuning (not in the paper; docs/training.md, "Fine-tuning"): new training that starts from
an existing model. `transduce prepare --vocab MODEL` encodes the text with MODEL's vocabulary
(`model_vocabulary`: no vocabulary is learned, data.json records whose it is); `transduce train
--init MODEL` starts from MODEL's architecture (`init_config`) and weights (`load_init_weights`)
with a fresh optimizer and schedule, on data of MODEL's vocabulary only (`check_data_vocabulary`).

MODEL is what it is everywhere else: a model directory, a run directory (the model `translate`
loads from it: by default the average of its last checkpoints), a checkpoint, or an imported model
(`transduce import`, OPUS-MT: its vocabulary files and special ids as they are, which the data
prepared with it records); its vocabulary is found by the one lookup that
`transduce translate` uses.
"""

from __future__ import annotations

import json
from pathlib import Path

from .checkpoint.files import file_digest
from .config import Config, apply_overrides
from .data.batching import METADATA
from .errors import UsageError

TUNABLE = ("dropout", "attention_dropout")
"""Model fields a fine-tuning run may set otherwise than MODEL: regularization, not architecture."""

SPM = "spm.model"  # a model directory's shared vocabulary, when it has no data.json


def _search_dirs(model: Path) -> list[Path]:
    """Where a MODEL's vocabulary is looked for: beside it, then its run directory (a run's model/
    or checkpoints/step_N), as `transduce translate` does."""
    return list(dict.fromkeys([model, model.parent, model.parent.parent]))


def _vocab_home(model: Path) -> tuple[Path, dict]:
    """The directory that holds MODEL's vocabulary files and what its data.json says of them (in
    the order translate's lookup takes: a data.json, else an spm.model)."""
    for d in _search_dirs(model):
        if (d / METADATA).is_file():
            meta = json.loads((d / METADATA).read_text(encoding="utf-8"))
            record = dict(meta["vocab"])
            names = set(record["files"].values())
            if not all((d / n).is_file() for n in names) and meta.get("data_dir"):  # not copied beside it
                d = Path(meta["data_dir"])
            return d, record
        if (d / SPM).is_file():
            return d, {"type": "sentencepiece-bpe", "shared": True, "files": {"src": SPM, "tgt": SPM}}
    raise FileNotFoundError(f"{model}: no vocabulary found beside it (no data.json or {SPM})")


def _named_files(record: dict, home: Path) -> list[Path]:
    """The files a vocabulary record names (its "files", and any other name of a file in `home`,
    e.g. a vocab.json), with the .vocab listing beside each sentencepiece model."""
    names: list[str] = []

    def walk(value) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, str) and "/" not in value and (home / value).is_file():
            names.append(value)

    walk(record)
    files = [home / n for n in dict.fromkeys(names)]
    return files + [
        f.with_suffix(".vocab") for f in files if f.with_suffix(".vocab").is_file() and f.suffix == ".model"
    ]


def checksums(home: Path, record: dict) -> dict[str, str]:
    """SHA-256 of the source and target vocabulary files a record names (in `home`)."""
    return {role: file_digest(home / record["files"][role])["sha256"] for role in ("src", "tgt")}


def model_vocabulary(model: str | Path):
    """MODEL's vocabulary as `transduce.data.prepare.GivenVocabulary`: loaded by the lookup that
    `transduce translate` uses (`transduce.decoding.ready.find_vocabs`), so every kind of model
    directory it reads works; its files, to copy beside the token arrays; and data.json's record
    (+ "from_model", the SHA-256 of each side). A sentencepiece model file is taken as a shared
    vocabulary."""
    from .checkpoint import check_model_path
    from .data.prepare import GivenVocabulary
    from .data.vocab import Vocab
    from .decoding.ready import find_vocabs

    model = Path(model)
    if model.is_file():  # a sentencepiece model itself
        src = tgt = Vocab(model)
        home, record = (
            model.parent,
            {"type": "sentencepiece-bpe", "shared": True, "files": {"src": model.name, "tgt": model.name}},
        )
    else:
        check_model_path(model)
        home, record = _vocab_home(model)
        src, tgt = find_vocabs(_search_dirs(model))
    shared = record.get("shared", record["files"]["src"] == record["files"]["tgt"])
    record = {
        **record,
        "shared": shared,
        "size": {"src": len(src), "tgt": len(tgt)},
        "from_model": str(model.absolute()),
        "sha256": checksums(home, record),
    }
    return GivenVocabulary(record=record, files=_named_files(record, home), src=src, tgt=tgt)


def check_data_vocabulary(model: Path, data_dir: Path, meta: dict) -> None:
    """Refuse, in one line, prepared data whose vocabulary is not MODEL's (sizes or checksums)."""
    from .checkpoint import load_config

    given = model_vocabulary(model)
    ours = meta["vocab"]
    sizes = {role: int(ours["size"][role]) for role in ("src", "tgt")}
    mc = load_config(model).model
    differences = [
        f"{side} size {sizes[role]} (the model's {n})"
        for role, side, n in (("src", "source", mc.src_vocab_size), ("tgt", "target", mc.target_vocab_size))
        if sizes[role] != n
    ]
    if not differences:
        data_sums = checksums(data_dir, ours)
        differences = [
            f"{data_dir / ours['files'][role]} is not the model's {given.record['files'][role]} (SHA-256)"
            for role in ("src", "tgt")
            if data_sums[role] != given.record["sha256"][role]
        ]
    if differences:
        raise UsageError(
            f"{data_dir} is not tokenized with the vocabulary of --init {model}: "
            f"{'; '.join(dict.fromkeys(differences))}; prepare it with `transduce prepare ... --vocab {model}`"
        )


def init_config(
    model: str | Path, preset_config: Config | None, overrides: list[str], data_dir: Path, meta: dict
) -> Config:
    """The config of a run that starts from MODEL: MODEL's architecture; the regime of the preset
    (`preset_config`, when --preset is given) or else MODEL's own; --set applied. Refused in one
    line: data of another vocabulary, a preset or --set that changes the architecture."""
    from .checkpoint import load_config

    model = Path(model)
    check_data_vocabulary(model, data_dir, meta)
    base = load_config(model)
    config = Config(model=base.model, train=(preset_config or base).train)
    if preset_config is not None:
        config.model = preset_config.model  # checked against MODEL's below
    try:
        config = apply_overrides(config, overrides)
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --set ({e}) in: {' '.join(overrides)}") from None
    ours, theirs = config.model.__dict__, base.model.__dict__
    changed = [
        f"model.{name} {ours[name]!r} (the model's {theirs[name]!r})"
        for name in theirs
        if name not in TUNABLE and ours[name] != theirs[name]
    ]
    if changed:
        raise UsageError(
            f"--init {model} fixes the architecture, and --preset/--set change it: {'; '.join(changed)}; "
            "drop them (--set model.dropout=... and train.* may change)"
        )
    return config


def load_init_weights(model: str | Path, device) -> tuple[dict, str]:
    """MODEL's weights, as `transduce translate` loads them, and what they are (for one line)."""
    from .checkpoint import load_for_inference

    resolved = load_for_inference(model, device=device)
    return resolved.model.state_dict(), resolved.description
