"""Every command the documentation shows runs with today's flags.

Each `transduce ...` command in README.md and docs/*.md (in code blocks, and in inline code that
starts with `transduce `) is split as the shell would and checked against the CLI's own argparse
parsers, without running it: a known subcommand, every flag one that subcommand has (whole names:
abbreviations are off), and a value among the flag's choices where the doc gives a literal one. A
`python -m benchmarks.X` line is checked against the flags its script declares, and a `bash
scripts/X.sh` line against the script and the variables it reads. A failure names the file and line.

Placeholders are the docs' own convention and pass: upper-case words (`RUN`, `OUT`, `MODEL`),
`...`, alternatives written `a|b`, and `[optional]` parts."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from transduce.cli import SUBCOMMANDS, build_parser
from transduce.cli.options import LENGTH_PENALTIES

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)", re.M)
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1", "&>"}


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}: {self.text}"


SHELL = ("", "bash", "sh", "shell", "console")
"""Code blocks read as commands: untagged or shell (```text, ```python and the like are not)."""


def _blocks(text: str) -> tuple[list[tuple[int, str]], str]:
    """The shell code blocks' lines as (line number, text), and the text with every code block's
    lines blanked."""
    code, prose, inside, shell = [], [], False, False
    for i, line in enumerate(text.split("\n"), start=1):
        if FENCE.match(line.lstrip()):
            inside = not inside
            shell = inside and line.lstrip()[3:].strip().lower() in SHELL
            prose.append("")
        elif inside:
            if shell:
                code.append((i, line))
            prose.append("")
        else:
            prose.append(line)
    return code, "\n".join(prose)


def commands_in(doc: Path) -> list[Command]:
    """The shell commands of `doc`: a code block's lines (continuations joined, comments off),
    and inline code spans that start with `transduce ` or `python -m benchmarks.` or `bash scripts/`."""
    code, prose = _blocks(doc.read_text(encoding="utf-8"))
    found: list[Command] = []
    pending: list[str] = []
    start = 0
    for n, line in code:
        if not pending:
            start = n
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        found.append(Command(doc, start, " ".join([*pending, stripped]).strip()))
        pending = []
    for m in re.finditer(r"`([^`]+)`", prose):
        span = " ".join(m.group(1).split())
        if re.match(
            r"(\[[^]]*\] |\S+=\S+ )*(transduce [a-z]|python3? -m benchmarks\.|bash (scripts|benchmarks)/)", span
        ):
            found.append(Command(doc, prose.count("\n", 0, m.start()) + 1, span))
    return found


def _words(text: str) -> list[list[str]]:
    """The simple commands of a shell line: words, with separators, redirections and their targets
    left out."""
    text = re.sub(r"(?<=[^\s|])\|(?=[^\s|])", "¦", text)  # a|b without spaces: alternatives, not a pipe
    text = re.sub(r"\[(?![-A-Za-z_][A-Za-z0-9_]*=|-)[^]]*\]", "", text)  # [AVX2 env]: a placeholder for settings
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: prose, not a command
        return []
    out: list[list[str]] = [[]]
    skip = False
    for tok in tokens:
        if skip:
            skip = False
        elif tok in SEPARATORS:
            out.append([])
        elif tok in REDIRECTS or tok.endswith(">") or tok.endswith("<"):
            skip = True
        else:
            out[-1].append(tok)
    return [w for w in out if w]


def _placeholder(word: str) -> bool:
    return (
        word in ("...", "…")
        or "|" in word
        or "¦" in word
        or word.isupper()
        or word.startswith("$")
        or "$" in word
        or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*[/.].*|.*/[A-Z][A-Z0-9_]*", word))
    )


def _unbracket(words: list[str]) -> list[str]:
    """`[--profile]`, `[VAR=x]`: optional parts, checked as if given."""
    return [w.strip("[]") for w in words if w.strip("[]")]


PARSERS: dict[str, argparse.ArgumentParser] = next(
    a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
).choices


def check_transduce(words: list[str]) -> str | None:
    """What is wrong with `transduce WORDS...` (None: nothing)."""
    if not words:
        return "transduce without a subcommand"
    verb, rest = words[0], words[1:]
    if verb.endswith(":"):  # a line of output ("transduce serve: ..."), not a command
        return None
    if verb.startswith("-"):
        return None if verb in ("--help", "-h", "--version") else f"unknown option {verb}"
    if _placeholder(verb):
        return None
    if verb not in SUBCOMMANDS:
        return f"unknown subcommand {verb!r}"
    parser = PARSERS[verb]
    options = {s: a for a in parser._actions for s in a.option_strings}
    positionals = [a for a in parser._actions if not a.option_strings]
    i = 0
    seen_positional = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-\d.*", word):
            name, eq, value = word.partition("=")
            action = options.get(name)
            if action is None:
                return f"transduce {verb} has no flag {name}"
            if action.nargs == 0:
                i += 1
                continue
            if not eq:
                i += 1
                value = rest[i] if i < len(rest) else ""
            problem = _check_value(action, value)
            if problem:
                return f"transduce {verb} {name} {value}: {problem}"
        else:
            if seen_positional < len(positionals):
                action = positionals[seen_positional]
                if action.choices and not _placeholder(word) and word not in action.choices:
                    return f"transduce {verb}: {word!r} is not one of {', '.join(action.choices)}"
                if action.nargs not in ("*", "+", "?"):
                    seen_positional += 1
        i += 1
    return None


def _check_value(action: argparse.Action, value: str) -> str | None:
    if _placeholder(value) or not value:
        return None
    if action.choices is not None and value not in action.choices:
        return f"not one of {', '.join(map(str, action.choices))}"
    if "--length-penalty" in action.option_strings and value.partition(":")[0] not in LENGTH_PENALTIES:
        return f"the formula is one of {', '.join(LENGTH_PENALTIES)}"
    if action.type in (int, float):
        try:
            action.type(value)
        except ValueError:
            return f"not a number ({action.type.__name__})"
    return None


def declared_flags(script: Path) -> set[str]:
    """The option strings a script declares with add_argument (read, not imported)."""
    text = script.read_text(encoding="utf-8")
    return {
        s
        for call in re.findall(r"add_argument\(((?:\s*[\"']-[^\"']+[\"'],)+)", text)
        for s in re.findall(r"[\"'](-[^\"']+)[\"']", call)
    } | {"-h", "--help"}


def check_benchmark(module: str, rest: list[str]) -> str | None:
    script = REPO / "benchmarks" / f"{module}.py"
    if not script.is_file():
        return f"no benchmarks/{module}.py"
    flags = declared_flags(script)
    for word in rest:
        name = word.partition("=")[0]
        if name.startswith("--") and name not in flags:
            return f"benchmarks/{module}.py has no flag {name}"
    return None


def check_script(path: str, env: list[str]) -> str | None:
    script = REPO / path
    if not script.is_file():
        return f"no {path}"
    text = script.read_text(encoding="utf-8")
    for assignment in env:
        var = assignment.partition("=")[0]
        if not re.search(rf"\b{re.escape(var)}\b", text) and var not in ("OMP_NUM_THREADS", "PYTHONPATH"):
            return f"{path} does not read {var}"
    return None


def problem_of(command: Command) -> str | None:
    for words in _words(command.text):
        words = _unbracket(words)
        env = []
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            env.append(words.pop(0))
        if not words:
            continue
        head = words[0]
        if head == "transduce":
            problem = check_transduce(words[1:])
        elif head == "torchrun" and "transduce" in words and words[words.index("transduce") - 1] == "-m":
            problem = check_transduce(words[words.index("transduce") + 1 :])
        elif head in ("python", "python3") and words[1:2] == ["-m"] and len(words) > 2:
            target = words[2]
            if target == "transduce":
                problem = check_transduce(words[3:])
            elif target.startswith("benchmarks."):
                problem = check_benchmark(target.split(".", 1)[1], words[3:])
            else:
                problem = None
        elif head == "bash" and len(words) > 1 and words[1].startswith(("scripts/", "benchmarks/")):
            problem = check_script(words[1], env)
        else:
            problem = None
        if problem:
            return problem
    return None


ALL = [c for doc in DOCS for c in commands_in(doc)]


def test_the_docs_show_commands():
    transduce = [c for c in ALL if "transduce " in c.text]
    assert len(transduce) > 100, len(transduce)
    assert {c.doc.name for c in transduce} >= {"README.md", "RESULTS.md", "training.md", "decoding.md", "serve.md"}


def test_every_command_in_the_docs_parses_with_todays_flags():
    problems = [f"{c.where()}\n    -> {p}" for c in ALL if (p := problem_of(c))]
    assert not problems, "commands in the docs that today's CLI refuses:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("transduce translate runs/multi30k-en-de --alpha 1.2", "transduce translate has no flag --alpha"),
        ("transduce trian --data d", "unknown subcommand 'trian'"),
        ("transduce translate RUN --length-penalty paper", "the formula is one of"),
        ("transduce translate RUN --precision fp64", "not one of"),
        ("echo a | transduce translate RUN --alph 1 > out.txt", "no flag --alph"),
        ("torchrun --nproc_per_node 8 -m transduce train --run-dir r --resume", "no flag --resume"),
        ("python -m benchmarks.decode_speed --no-such-flag 1", "no flag --no-such-flag"),
        ("STEPS=10 bash scripts/multi30k.sh", None),
        ("NO_SUCH_VARIABLE=1 bash scripts/multi30k.sh", "does not read NO_SUCH_VARIABLE"),
        ("transduce translate RUN/avg_last5 -i test.en -o OUT --length-penalty gnmt:1.2 --precision fp32|int8", None),
        ("transduce export ct2 RUN -o OUT --quantization int8", None),
    ],
)
def test_the_checker_refuses_what_the_cli_refuses(text, problem):
    got = problem_of(Command(REPO / "README.md", 1, text))
    assert (got is None) if problem is None else (got is not None and problem in got), got


def test_commands_are_found_where_the_docs_write_them(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `transduce average RUN --last 3` here.\n\n```bash\ntransduce translate m \\\n"
        "    --alpha 1   # a comment --nope\n```\n",
        encoding="utf-8",
    )
    found = commands_in(doc)
    assert [(c.line, c.text) for c in found] == [
        (4, "transduce translate m      --alpha 1   # a comment --nope"),
        (1, "transduce average RUN --last 3"),
    ]
    assert "no flag --alpha" in problem_of(found[0]) and "no flag --last" in problem_of(found[1])
