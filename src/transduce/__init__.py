from __future__ import annotations
"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as real software."""

from .config import Config, ModelConfig, TrainConfig, get_preset, PRESETS
from .model import Transformer

__version__ = "0.1.0"
__all__ = ["Config", "ModelConfig", "TrainConfig", "get_preset", "PRESETS", "Transformer", "__version__"]
