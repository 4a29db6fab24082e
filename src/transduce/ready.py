"""Making a model ready to decode: load it, choose its precision, cast or quantize it. The one way
`translate`, `evaluate`, `parse`, `serve` and the benchmarks get a model to decode with."""

from __future__ import annotations

import os

import torch
from torch import nn

from .device import resolve_device
from .memory import bound_kernel_caches
from .precision import Choice, choose_decoding_precision
from .translate import LoadedModel, choose_workers, load_translation_model


def make_ready(model: nn.Module, choice: Choice) -> None:
    """Put `model` (fp32) in the precision `choice` says: bf16 weights (faster than autocast), or
    int8 products over weights in `choice.base`."""
    if choice.precision == "bf16" or (choice.precision == "int8" and choice.base == "bf16"):
        model.to(torch.bfloat16)
    if choice.precision == "int8":
        from .fast.int8 import quantize_int8

        quantize_int8(model, decoder=choice.int8_decoder)


def load_for_decoding(path: str | os.PathLike, *, precision: str = "auto", device: str | torch.device = "cpu",
                      threads: int | None = None, workers: int | str | None = None, checkpoint: str | None = None,
                      average: int | None = None, vocab: str | os.PathLike | None = None,
                      src_vocab: str | os.PathLike | None = None, tgt_vocab: str | os.PathLike | None = None,
                      ) -> LoadedModel:
    """The model a MODEL argument names (`load_translation_model`) on `device`, with `threads` CPU
    threads where given, in `precision` (the choice in `.precision`), and with `workers` (a number
    or "auto") the CPU decoding processes (`.workers`, why in `.workers_line`). Raises
    FileNotFoundError, ValueError or DataError. oneDNN's kernel caches are bounded first
    (`bound_kernel_caches`), before the process's first product."""
    bound_kernel_caches()
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(device) if isinstance(device, str) else device
    loaded = load_translation_model(path, checkpoint=checkpoint, average=average, vocab=vocab, src_vocab=src_vocab,
                                    tgt_vocab=tgt_vocab, device=device)
    if workers is not None:
        n = torch.get_num_threads()
        loaded.workers, why = choose_workers(workers, device, n, loaded.config.model.d_model)
        loaded.workers_line = f"workers: {loaded.workers} x {max(1, n // loaded.workers)} thread(s) ({why})"
    loaded.precision = choose_decoding_precision(precision, device)
    make_ready(loaded.model, loaded.precision)
    return loaded
