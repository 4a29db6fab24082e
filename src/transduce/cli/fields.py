"""Flags derived from dataclass fields, so that an option is declared once, on its field:
`--keep-last` for `keep_last`, of the field's type and default, the rest (help, metavar, choices)
from its metadata; a boolean on by default is turned off by `--no-NAME`. `from_args` builds the
dataclass back from the parsed flags."""

from __future__ import annotations

import argparse
import dataclasses
import typing


def flag(name: str) -> str:
    """The flag of a field: keep_last -> --keep-last."""
    return "--" + name.replace("_", "-")


def field_type(cls: type, name: str) -> type:
    """The type a flag's value is converted to: the field's annotation, without its None."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def add_field_flags(
    parser, cls: type, names: typing.Iterable[str] | None = None, flags: dict[str, tuple[str, ...]] | None = None
) -> None:
    """Flags for the fields `names` of dataclass `cls` (default: all of them), in that order;
    `flags` gives a field other option strings."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for name in by_name if names is None else names:
        f, kind = by_name[name], field_type(cls, name)
        kwargs = dict(f.metadata)
        if kind is bool:  # a switch: --NAME, or --no-NAME for a field on by default
            kwargs["action"] = "store_false" if f.default else "store_true"
        else:
            kwargs.update(type=kind, default=f.default)
        shown = ["--no-" + name.replace("_", "-")] if kind is bool and f.default else [flag(name)]
        parser.add_argument(*((flags or {}).get(name) or shown), dest=name, **kwargs)


def from_args(cls: type, args: argparse.Namespace):
    """The dataclass `cls` from parsed flags: every field from the attribute of its name."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
