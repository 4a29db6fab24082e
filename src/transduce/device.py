"""The one rule for a `--device` name, shared by training and inference."""

from __future__ import annotations

import torch

from .errors import UsageError

DEVICES = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The device `name` means for the process of local rank `local_rank`: "auto" (CUDA if available,
    else the CPU), "cpu", "cuda" (the local rank's GPU) or "cuda:N"; a CUDA device set up by
    `setup_cuda`. A one-line `UsageError` if CUDA is asked for but absent, or the name is none of these."""
    key = str(name).strip().lower()
    if key == "auto":
        key = "cuda" if torch.cuda.is_available() else "cpu"
    if key == "cpu":
        return torch.device("cpu")
    kind, colon, index = key.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise UsageError(f"unknown device {name!r} ({DEVICES})")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {name}, but CUDA is not available")
    device = torch.device("cuda", int(index) if colon else local_rank)
    if device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: there is no {device} ({torch.cuda.device_count()} GPUs visible)")
    setup_cuda()
    return device


def setup_cuda() -> None:
    """The process-wide CUDA settings of every command (speed only): cuDNN's attention left out of
    `scaled_dot_product_attention`'s choices, since it builds a graph for every new shape, hundreds
    of milliseconds each, and decoding meets a new one every step (docs/speed.md, "On a GPU")."""
    torch.backends.cuda.enable_cudnn_sdp(False)
