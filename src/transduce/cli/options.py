"""The flags that several subcommands take, each group declared once, and the help's layout:
one name per concept (`VOCABULARY`, docs/cli.md), each option on one line at a fixed width
(`HelpFormatter`)."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..defaults import BATCH_TOKENS, CHUNK_LINES, DECODING_PRECISIONS, MAX_INPUT_TOKENS

WIDTH = 80
"""Columns of every help page (fixed: the line counts do not depend on the terminal)."""


@dataclass(frozen=True)
class Concept:
    """One concept's flag: its name, short form and destination."""

    what: str
    name: str
    short: str | None
    dest: str


VOCABULARY: tuple[Concept, ...] = (
    Concept("output file or directory", "--out", "-o", "out"),
    Concept("replace existing output", "--overwrite", None, "overwrite"),
    Concept("no progress bars", "--quiet", "-q", "quiet"),
    Concept("tokens per training or decoding batch", "--batch-tokens", None, "batch_tokens"),
    Concept("tokens per optimizer update (experiment)", "--update-tokens", None, "update_tokens"),
    Concept(
        "input lines cut to N subword tokens, with a warning (translate, evaluate, parse)",
        "--truncate-input",
        None,
        "truncate_input",
    ),
    Concept(
        "longest input sentence accepted, longer ones refused (serve)", "--max-input-tokens", None, "max_input_tokens"
    ),
    Concept("subword tokens kept per side (attention)", "--keep-tokens", None, "keep_tokens"),
    Concept("a sentence's target text (attention; --tgt is a language)", "--target-text", None, "target_text"),
    Concept("training length", "--max-steps", None, "max_steps"),
    Concept("checkpoints averaged: the last K", "--average", None, "average"),
    Concept("checkpoint interval in steps", "--save-every-steps", None, "save_every_steps"),
    Concept("source text file", "--input", "-i", "input"),
    Concept("the vocabulary of: a sentencepiece model file, or a model or run directory", "--vocab", None, "vocab"),
    Concept("search: beam size", "--beam", None, "beam"),
    Concept("search: the length penalty's formula and alpha", "--length-penalty", None, "length_penalty"),
    Concept("search: output length limit", "--max-len-offset", None, "max_len_offset"),
    Concept("search: greedy decoding", "--greedy", None, "greedy"),
    Concept("arithmetic precision", "--precision", None, "precision"),
    Concept("CPU threads", "--threads", None, "threads"),
    Concept("device", "--device", None, "device"),
)
"""The flag vocabulary (docs/cli.md). `dest` is what the flag sets; train's batch size is its
`TrainOptions.max_tokens` field and its --quiet turns `progress` off (`cli.train.RENAMED`); translate's
--truncate-input sets `max_input_tokens`."""

SHORT_FORMS = frozenset({"--bf16", "--int8"})
"""--precision bf16 and --precision int8 in one word: hidden, to keep --precision's help on one line."""

LENGTH_PENALTIES = {  # --length-penalty's formulas -> (what, the alpha a bare name takes; None: the command's)
    "gnmt": ("((5 + |Y|) / 6)^alpha, Wu et al.'s, the paper's (6.1)", None),
    "hf": ("|Y|^alpha with Hugging Face generate's beam search (--engine torch)", 1.0),
    "ct2": ("|Y|^alpha, CTranslate2's own (--engine ct2)", 1.0),
    "none": ("no penalty: hypotheses ranked by log-probability", 0.0),
}
"""The one length-penalty flag: `--length-penalty FORMULA[:ALPHA]`, e.g. gnmt:0.6 (the default),
hf:1.0, ct2:1.0, none. A bare formula takes the alpha its own home defaults to."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option on one line, "-o, --out FILE   help", short forms left out; a fixed width."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=WIDTH, max_help_position=30)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Prose wrapped to the width; indented lines (examples, lists) and the lines that start
        with "examples:", "details:" or "exit status:" kept as they are."""
        out: list[str] = []
        prose: list[str] = []
        for line in text.splitlines() + [""]:
            if line.strip() and not line.startswith((" ", "examples:", "details:", "exit status:")):
                prose.append(line.strip())
                continue
            if prose:
                out += textwrap.wrap(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent)
                prose = []
            out.append(indent + line)
        return "\n".join(out[:-1])

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = [s for s in action.option_strings if s not in SHORT_FORMS]
        names.sort(key=lambda s: (s.startswith("--"), s))  # -o before --out
        if action.nargs == 0:
            return ", ".join(names)
        return ", ".join(names) + " " + self._format_args(action, self._get_default_metavar_for_optional(action))


def usage(parser: argparse.ArgumentParser) -> str:
    """A one-line usage: ``PROG [options] POSITIONAL ...``."""
    formatter = parser._get_formatter()
    positionals = [formatter._format_args(a, a.dest.upper()) for a in parser._actions if not a.option_strings]
    return " ".join(["%(prog)s", "[options]", *positionals])


def epilog(*examples: str) -> str:
    """The end of a help page: examples (where the details are is the description's last line)."""
    return "examples:\n" + "".join(f"  {e}\n" for e in examples).rstrip("\n")


# --- the shared groups ---------------------------------------------------------------------------


def add_model_args(g) -> None:
    """Which model: one checkpoint, or an average; its vocabulary."""
    g.add_argument("--checkpoint", metavar="NAME", help="one checkpoint: step_N, N, latest, model, or a dir")
    g.add_argument("--average", type=int, metavar="K", help="average the last K checkpoints (default: the run's)")
    g.add_argument("--vocab", type=Path, metavar="PATH", help="PATH's vocabulary: an SPM file or a model dir")
    g.add_argument("--src-vocab", type=Path, metavar="SPM", help="separate vocabularies: with --tgt-vocab SPM")
    g.add_argument("--tgt-vocab", type=Path, metavar="SPM", help=argparse.SUPPRESS)  # said on --src-vocab's line


def add_hardware_args(g, *, precisions: tuple[str, ...] | None = None, training: bool = False) -> None:
    """--precision (of `precisions`, default decoding's; () for none), --device, --threads;
    decoding's --bf16 and --int8 (`SHORT_FORMS`) hidden."""
    if precisions is None:
        precisions = DECODING_PRECISIONS
    if precisions:
        g.add_argument(
            "--precision",
            choices=precisions,
            default="auto",
            metavar="P",
            help=f"{'|'.join(precisions)} (default auto)",
        )
    if "int8" in precisions:
        g.add_argument("--bf16", action="store_const", const="bf16", dest="precision", help=argparse.SUPPRESS)
        g.add_argument("--int8", action="store_const", const="int8", dest="precision", help=argparse.SUPPRESS)
    g.add_argument("--device", default="auto", metavar="NAME", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads" + (" per process (default: cores / processes)" if training else " (default: PyTorch's)"),
    )


def add_search_args(
    g,
    *,
    beam: int | None,
    alpha: float | None,
    max_len_offset: int | None,
    note: str | tuple[str, str, str] = "",
    greedy: bool = True,
) -> None:
    """The search of Section 6.1 (6.3 for parsing): defaults as given, or None: the task's, as
    `note` says (one text for the three, or one each). --length-penalty sets `length_penalty` (the
    formula) and `alpha` (`LengthPenalty`)."""
    notes = note if isinstance(note, tuple) else (note,) * 3
    said = [f"default {n if v is None else v}" for v, n in zip((beam, alpha, max_len_offset), notes)]
    g.add_argument("--beam", type=int, default=beam, metavar="K", help=f"beam size ({said[0]})")
    g.add_argument(
        "--length-penalty",
        action=LengthPenalty,
        default="gnmt",
        default_alpha=alpha,
        metavar="F:A",
        help="gnmt:A (6.1), hf:A, ct2:A, none (default: " + (f"gnmt:{alpha})" if alpha is not None else "task's)"),
    )
    g.set_defaults(alpha=alpha)
    g.add_argument(
        "--max-len-offset",
        type=int,
        default=max_len_offset,
        metavar="N",
        help=f"output length <= input + N ({said[2]})",
    )
    if greedy:
        g.add_argument("--greedy", action="store_true", help="greedy decoding (ignores --beam, --length-penalty)")


class LengthPenalty(argparse.Action):
    """--length-penalty FORMULA[:ALPHA] (`LENGTH_PENALTIES`): sets `length_penalty` to the formula
    and `alpha` to ALPHA as given (a bare formula: its own default; gnmt's: the command's). Checked
    with the other search flags (`transduce.cli.common.check_search_args`), in one line."""

    def __init__(self, option_strings, dest, default_alpha: float | None = None, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.default_alpha = default_alpha

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        formula, colon, alpha = value.partition(":")
        namespace.length_penalty = formula
        bare = LENGTH_PENALTIES.get(formula, (None, None))[1]
        namespace.alpha = alpha if colon else (self.default_alpha if bare is None else bare)


def add_batch_args(g, *, batch_size: int | None, note: str = "") -> None:
    """--batch-tokens and --batch-size of decoding."""
    g.add_argument(
        "--batch-tokens",
        type=int,
        default=BATCH_TOKENS,
        metavar="N",
        help=f"padded source tokens per batch (default {BATCH_TOKENS})",
    )
    g.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        metavar="N",
        help=f"sentences per batch (default {batch_size if batch_size is not None else note})",
    )


def add_stream_args(g) -> None:
    """How a file is read and decoded: lines cut to a length, chunks, worker processes."""
    g.add_argument(
        "--truncate-input",
        type=int,
        default=MAX_INPUT_TOKENS,
        metavar="N",
        dest="max_input_tokens",
        help=f"cut longer lines to N tokens, warn (default {MAX_INPUT_TOKENS})",
    )
    g.add_argument(
        "--chunk-lines",
        type=int,
        default=CHUNK_LINES,
        metavar="N",
        help=f"lines read and sorted at a time (default {CHUNK_LINES})",
    )
    g.add_argument(
        "--workers", type=_workers, default="auto", metavar="W", help="CPU decoding processes (default auto)"
    )


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected auto or a positive number, not {value!r}")
    return n


def add_line_args(parser: argparse.ArgumentParser, model: str, out: str):
    """MODEL, --input and --out of a command that writes a line per input line; returns their group."""
    g = parser.add_argument_group("input and output")
    g.add_argument("model_path", type=Path, metavar="MODEL", help=model)
    g.add_argument("--input", "-i", type=Path, metavar="FILE", help="sentences, plain or .gz (default: stdin)")
    g.add_argument("--out", "-o", type=Path, metavar="FILE", help=f"{out} (default: stdout; .gz: gzip)")
    return g


def add_decoding_args(
    parser: argparse.ArgumentParser,
    *,
    beam: int | None,
    alpha: float | None,
    max_len_offset: int | None,
    batch_size: int | None,
    section: str = "6.1",
    note: str = "",
):
    """The group of the commands that decode a file (translate, evaluate, parse): the model, the
    search, the hardware, the batching. Returns it, for a command's own decoding flags."""
    g = parser.add_argument_group(f"model and decoding (Section {section})")
    add_model_args(g)
    add_search_args(g, beam=beam, alpha=alpha, max_len_offset=max_len_offset, note=note)
    add_hardware_args(g)
    add_batch_args(g, batch_size=batch_size, note=note)
    add_stream_args(g)
    return g


def add_schedule_args(g, default: tuple[str, str] = ("the preset's", "the preset's, 1.0")) -> None:
    """Equation 3's warmup and factor (unset: `default`, the words their help gives), the cooldown
    and the seed: the flags of `train` and `experiment` alike, with TrainOptions' defaults."""
    from ..train.options import TrainOptions

    d = TrainOptions()
    g.add_argument("--warmup", type=int, metavar="N", help=f"warmup_steps of equation 3 (default: {default[0]})")
    g.add_argument("--lr-scale", type=float, metavar="X", help=f"factor on equation 3 (default: {default[1]})")
    g.add_argument(
        "--cooldown",
        type=float,
        default=d.cooldown,
        metavar="F",
        help=f"not the paper: decay to 0 over the last F (default {d.cooldown:g})",
    )
    g.add_argument("--seed", type=int, default=d.seed, help=f"training seed (default {d.seed})")


def add_quiet(g, what: str = "no progress bar") -> None:
    g.add_argument("--quiet", "-q", action="store_true", help=what)
