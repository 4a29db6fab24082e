"""Flags derived from dataclass fields, so that an option is declared once, on its field:
`--keep-last` for `keep_last`, of the field's type and default, the rest (help, metavar, choices)
from its metadata; a boolean on by default is turned off by `--no-NAME`. `from_args` builds the
dataclass back from the parsed flags."""

from __future__ import annotations

import argparse
import dataclasses
import typing


def flag(name: str) -> str:
    """The flag of a field: max_tokens -> --max-tokens."""
    return "--" + name.replace("_", "-")


def field_type(cls: type, name: str) -> type:
    """The type a flag's value is converted to: the field's annotation, without its None."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def add_field_flag(parser, cls: type, f: dataclasses.Field, names: tuple[str, ...] = (), help: str | None = None) -> None:
    """The flag of one field of dataclass `cls`; `names` and `help`, if given, replace the field's."""
    kwargs = dict(f.metadata)
    if help is not None:
        kwargs["help"] = help
    if field_type(cls, f.name) is bool:
        if f.default:
            parser.add_argument(*(names or ["--no-" + f.name.replace("_", "-")]), dest=f.name, action="store_false",
                                **kwargs)
        else:
            parser.add_argument(*(names or [flag(f.name)]), dest=f.name, action="store_true", **kwargs)
        return
    parser.add_argument(*(names or [flag(f.name)]), dest=f.name, type=field_type(cls, f.name), default=f.default,
                        **kwargs)


def add_field_flags(parser, cls: type, names: typing.Iterable[str] | None = None,
                    flags: dict[str, tuple[str, ...]] | None = None, helps: dict[str, str] | None = None) -> None:
    """Flags for the fields `names` of dataclass `cls` (default: all of them), in that order;
    `flags` and `helps` give a field other option strings or another help (`add_field_flag`)."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for name in by_name if names is None else names:
        add_field_flag(parser, cls, by_name[name], (flags or {}).get(name, ()), (helps or {}).get(name))


def from_args(cls: type, args: argparse.Namespace):
    """The dataclass `cls` from parsed flags: every field from the attribute of its name."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
