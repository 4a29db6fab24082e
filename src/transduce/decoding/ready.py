"""Loading a model to decode (`load_translation_model`), and making it ready (`make_ready`), or both
(`load_for_decoding`): the one way `translate`, `evaluate`, `parse`, `serve`, `attention`,
`experiment`, `synthetic` and the benchmarks get a model to decode with."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from ..data.batching import METADATA, load_vocabs
from ..data.vocab import Vocab
from ..device import resolve_device
from ..errors import DataError
from ..fast import step
from ..fast.decode import pack_weights, unpack_weights
from ..fast.train import keep_freed_memory
from ..memory import bound_kernel_caches, map_large_blocks, release_free_memory
from ..model import Transformer
from ..precision import Choice, choose_decoding_precision
from ..checkpoint.generation import Generation, find_generation
from .streaming import choose_workers, one_process_reason, thread_workers


def make_ready(
    model: nn.Module, choice: Choice | None = None, *, pack: bool = True, keep: bool = True
) -> Callable[[], None]:
    """Make `model` ready to decode: cast to bf16 (faster than autocast) or quantized to int8 as
    `choice` says (None: as it is); on the CPU, with `pack`, the weights packed; everywhere the
    decoder's steps as one flat loop (`fast.step.FastDecoder`, set as `model.decoder`). Layers
    stand in for layers, as modules: nothing is set on an instance, and nothing needs refreshing
    after. What is set already is kept. `keep=False`: the float weights each packed or quantized
    layer replaces are dropped (a model for decoding only, held once: `load_for_decoding`).
    Returns what undoes the speed-ups (not the cast or quantization; nothing where `keep` is False)."""
    int8 = choice is not None and choice.precision == "int8"
    # a model for decoding only, every linear layer in int8: quantized from its weights as they are, the rest cast after
    after = torch.bfloat16 if int8 and choice.base == "bf16" and choice.int8_decoder and not keep else None
    if choice is not None and (choice.precision == "bf16" or (int8 and choice.base == "bf16")) and after is None:
        model.to(torch.bfloat16)
    if int8:
        from ..fast.int8 import quantize_int8

        quantize_int8(model, decoder=choice.int8_decoder, keep=keep, embeddings=not keep, dtype=after)
    packed_here = pack and pack_weights(model, keep=keep)
    stepped = isinstance(model, Transformer) and step.install(model)

    def undo() -> None:
        if stepped:
            step.uninstall(model)
        if packed_here and keep:
            unpack_weights(model)

    return undo


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: object
    src_vocab: Vocab
    tgt_vocab: Vocab
    description: str  # What was loaded, for the user (a checkpoint, or the average of the last ones)
    precision: object = None  # its `transduce.precision.Choice`; it and the workers set by `load_for_decoding`
    metadata: dict | None = None  # The data.json found beside the model (e.g. "task": "parsing"), if any
    workers: int = 1
    workers_line: str = ""  # How many CPU workers decode, and why
    generation: Generation | None = None  # An imported model's own settings, its languages (generation.json)


def load_for_decoding(
    path: str | os.PathLike,
    *,
    precision: str = "auto",
    device: str | torch.device = "cpu",
    threads: int | None = None,
    workers: int | str | None = None,
    checkpoint: str | None = None,
    average: int | None = None,
    vocab: str | os.PathLike | None = None,
    src_vocab: str | os.PathLike | None = None,
    tgt_vocab: str | os.PathLike | None = None,
    keep: bool = False,
    keep_freed: bool = True,
) -> LoadedModel:
    """`load_translation_model` on `device` (`threads` CPU threads where given), `make_ready` in
    `precision`, the CPU decoding processes chosen from `workers` (a number or "auto"); oneDNN's
    kernel caches bounded first, before the first product; large blocks mapped on their own while
    loading (`memory.map_large_blocks`: its peak), then freed memory kept for the steps' reuse
    (`fast.train.keep_freed_memory`: no page faults a step; docs/speed.md, "Memory at OPUS-MT's size"),
    unless `keep_freed` is False (a server of several models, whose unloaded models' memory goes back). The model is held once: its tensors
    are read and cast one at a time, and (unless `keep`) the float weights of the layers packed
    or quantized are dropped, so it decodes only (inference mode, no autocast); in int8, each part
    is quantized as it is read (`fast.int8.quantize_part`), never all of it in float at once. Raises
    FileNotFoundError, ValueError or DataError."""
    bound_kernel_caches()
    map_large_blocks()  # large blocks given back when freed: the loading's peak, and a server's rounds
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(device) if isinstance(device, str) else device
    choice = choose_decoding_precision(precision, device)
    bf16 = choice.precision == "bf16" or (choice.precision == "int8" and choice.base == "bf16")
    as_filled, packing, dtype = None, contextlib.nullcontext(), torch.bfloat16 if bf16 else None
    if choice.precision == "int8" and not keep:  # quantized a part at a time as read: never all of it in float
        from ..fast.int8 import packing_behind, quantize_part

        # every linear layer quantized as read: from the weights as stored, each part cast to bf16 after
        to = dtype if choice.int8_decoder else None
        as_filled = functools.partial(quantize_part, decoder=choice.int8_decoder, dtype=to)
        dtype = None if to is not None else dtype
        packing = packing_behind()  # each part packed while the next is read
    with packing:
        loaded = load_translation_model(
            path,
            checkpoint=checkpoint,
            average=average,
            vocab=vocab,
            src_vocab=src_vocab,
            tgt_vocab=tgt_vocab,
            device=device,
            dtype=dtype,
            as_filled=as_filled,
        )
    if workers is not None:
        n = torch.get_num_threads()
        kernel = None
        if choice.precision == "int8":
            from ..fast.int8 import int8_kernel

            kernel = int8_kernel(torch.bfloat16 if bf16 else torch.float32)
        one = one_process_reason(loaded.config.model, choice.precision, kernel) if device.type == "cpu" else ""
        loaded.workers, why = choose_workers(workers, device, n, loaded.config.model.d_model, one)
        if loaded.workers > 1 and thread_workers(loaded.config.model):
            why += "; threads of one process, each batch shared among them"
        loaded.workers_line = f"workers: {loaded.workers} x {max(1, n // loaded.workers)} thread(s) ({why})"
    loaded.precision = choice
    make_ready(loaded.model, loaded.precision, keep=keep)
    release_free_memory()  # what reading, casting and quantizing freed goes back to the system now
    if keep_freed:  # from here, a step's large tensors reuse the last step's memory (no page faults)
        keep_freed_memory()
    return loaded


def find_metadata(dirs: Sequence[Path]) -> dict | None:
    """The data.json of the first of `dirs` that has one (a model's directory, its run's), or None."""
    for d in dirs:
        if (d / METADATA).is_file():
            return json.loads((d / METADATA).read_text(encoding="utf-8"))
    return None


def find_vocabs(dirs: Sequence[Path]) -> tuple[Vocab, Vocab] | None:
    """The vocabularies beside the first of `dirs` that has a data.json (or its recorded data
    directory's) or an spm.model (shared), or None."""
    for d in dirs:
        if (d / METADATA).is_file():
            try:
                return load_vocabs(d)
            except DataError:  # vocabulary files not copied beside it: try the recorded data dir
                data_dir = find_metadata([d]).get("data_dir")
                if data_dir and Path(data_dir).is_dir():
                    return load_vocabs(data_dir)
                raise
        if (d / "spm.model").is_file():
            v = Vocab(d / "spm.model")
            return v, v
    return None


def vocabulary_of(path: str | os.PathLike) -> tuple[Vocab, Vocab]:
    """`--vocab PATH`'s one meaning in every command: PATH's vocabulary. A sentencepiece model file
    is itself, shared by both sides; a model or run directory gives the (source, target) pair it was
    trained with, found as beside a model (`find_vocabs`: the directory, then the two above it)."""
    path = Path(path)
    if not path.is_dir():
        v = Vocab(path)
        return v, v
    found = find_vocabs(list(dict.fromkeys([path, path.parent, path.parent.parent])))
    if found is None:
        raise FileNotFoundError(f"{path}: no vocabulary found in it (no data.json or spm.model)")
    return found


def load_translation_model(
    path: str | os.PathLike,
    *,
    checkpoint: str | None = None,
    average: int | None = None,
    vocab: str | os.PathLike | None = None,
    src_vocab: str | os.PathLike | None = None,
    tgt_vocab: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    as_filled=None,
) -> LoadedModel:
    """The model and vocabularies `transduce translate MODEL` uses, on `device` (a name for
    `resolve_device` or a torch.device), as stored (or in `dtype`; not made ready; `as_filled`
    called on each part read: `checkpoint.model_dir.build_model`). Raises FileNotFoundError,
    ValueError or DataError."""
    from ..checkpoint import load_for_inference

    if isinstance(device, str):
        device = resolve_device(device)
    resolved = load_for_inference(
        path, checkpoint=checkpoint, average=average, device=device, dtype=dtype, as_filled=as_filled
    )
    model, config, what = resolved.model, resolved.config, resolved.description
    if vocab is not None and (src_vocab is not None or tgt_vocab is not None):
        raise ValueError("give --vocab (shared) or --src-vocab/--tgt-vocab, not both")
    if vocab is not None:
        sv, tv = vocabulary_of(vocab)
    elif src_vocab is not None or tgt_vocab is not None:
        if src_vocab is None or tgt_vocab is None:
            raise ValueError("give both --src-vocab and --tgt-vocab")
        sv, tv = Vocab(src_vocab), Vocab(tgt_vocab)
    else:
        found = find_vocabs(resolved.search_dirs)
        if found is None:
            raise FileNotFoundError(
                f"no vocabulary found beside {what} (no data.json or spm.model): "
                "pass --vocab PATH (a sentencepiece model or a model directory)"
            )
        sv, tv = found
    mc = config.model
    if len(sv) != mc.src_vocab_size or len(tv) != mc.target_vocab_size:
        raise ValueError(
            f"vocabulary sizes ({len(sv)} source, {len(tv)} target) do not match the model's "
            f"({mc.src_vocab_size}, {mc.target_vocab_size}): wrong --vocab?"
        )
    ids = mc.special_ids
    if (tv.pad, tv.eos) != (ids.pad, ids.eos):
        raise ValueError(
            f"the target vocabulary's PAD and EOS are ids {tv.pad} and {tv.eos}, the model's {ids.pad} and "
            f"{ids.eos}: wrong --vocab?"
        )
    return LoadedModel(
        model,
        config,
        sv,
        tv,
        what,
        metadata=find_metadata(resolved.search_dirs),
        generation=find_generation(resolved.search_dirs),
    )
