"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as real software."""

from __future__ import annotations


def _version() -> str:
    """pyproject.toml's `version`: from the installed distribution, or in a source tree never
    installed from pyproject.toml itself; "0+unknown" where neither is found."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transduce")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        try:
            text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
        except OSError:
            return "0+unknown"
        project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)  # the table alone
        found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.MULTILINE)
        return found.group(1) if found else "0+unknown"


__version__ = _version()
__all__ = ["Config", "ModelConfig", "TrainConfig", "get_preset", "PRESETS", "Transformer", "__version__"]

_EXPORTS = {
    "Config": "config",
    "ModelConfig": "config",
    "TrainConfig": "config",
    "get_preset": "config",
    "PRESETS": "config",
    "Transformer": "model",
}


def __getattr__(name: str):
    """`transduce.Transformer` and the config names, imported when first asked for (PEP 562), so
    that `import transduce.cli` does not import torch."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
