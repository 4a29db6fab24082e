"""`transduce evaluate`: hypotheses read (or made by MODEL) and scored (`transduce.evaluate.score`, EVALB)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import evaluate
from ..data.corpora import DATASETS
from ..data.text import read_lines
from ..errors import DataError, UsageError
from .common import (
    check_decoding_args,
    decoding_options,
    fill_decoding_defaults,
    library_length_penalty,
    load_from_args,
    model_metadata,
    warner,
)
from .options import add_decoding_args, add_quiet, epilog

DESCRIPTION = """\
Score --hyp FILE, or MODEL's translations of --input: BLEU in every convention
(sacreBLEU, chrF, the paper's, Multi30k's), or parses with EVALB (Section 6.3).
details: transduce docs evaluation"""
EPILOG = epilog(
    "transduce evaluate --hyp hyp.de --dataset wmt14-en-de --src en --tgt de",
    "transduce evaluate runs/base -i test.en --ref test.de --tgt de -o hyp.de",
)
PROG = "transduce evaluate"
warn = warner(PROG)


def add_args(parser: argparse.ArgumentParser) -> None:
    """The options of `transduce evaluate`."""
    from sacrebleu.metrics import BLEU

    g = parser.add_argument_group("what to score")
    g.add_argument("model_path", type=Path, nargs="?", metavar="MODEL", help="translate --input with this model")
    g.add_argument("--hyp", type=Path, metavar="FILE", help="translations to score (instead of MODEL)")
    g.add_argument("--ref", type=Path, metavar="FILE", help="references (detokenized, cased)")
    g.add_argument("--input", "-i", type=Path, metavar="FILE", help="source sentences, for MODEL")
    g.add_argument("--tok-ref", type=Path, metavar="FILE", help="Multi30k's lowercased tokenized references")
    g.add_argument(
        "--dataset", choices=sorted(DATASETS), metavar="NAME", help="a registered test set instead of --ref, --input"
    )
    g.add_argument("--split", help="its split (default: its main test set)")
    g.add_argument(
        "--variant",
        default="raw",
        choices=["raw", "tok"],
        metavar="V",
        help="multi30k: raw (default) or tok (lowercased)",
    )
    g.add_argument("--src", metavar="LANG", help="source language (with --dataset)")
    g.add_argument("--tgt", metavar="LANG", help="target language (required for BLEU)")
    g.add_argument("--data-dir", metavar="DIR", help="datasets' mirror (default $TRANSDUCE_DATA_DIR)")
    g = parser.add_argument_group("scoring and output")
    g.add_argument(
        "--sacrebleu-tokenize",
        default="13a",
        choices=list(BLEU.TOKENIZERS),
        metavar="NAME",
        help="sacreBLEU's tokenizer (default 13a)",
    )
    g.add_argument("--json", metavar="FILE", help="the report as JSON into FILE (-: stdout, no table)")
    g.add_argument("--out", "-o", type=Path, metavar="FILE", help="write MODEL's translations")
    add_quiet(g)
    g.add_argument("--trees", action="store_true", help="--hyp and --ref are trees: EVALB (6.3)")
    g.add_argument("--evalb-params", type=Path, metavar="PRM", help="EVALB parameters (default COLLINS.prm)")
    g.add_argument("--constrained", action="store_true", help="MODEL's beam only makes trees (not the paper)")
    add_decoding_args(
        parser,
        beam=None,
        alpha=None,
        max_len_offset=None,
        batch_size=None,
        note="the task's",
        section="6.1; parsing 6.3",
    )


def is_parsing(args: argparse.Namespace) -> bool:
    """Trees to score: a treebank dataset, --trees, or a MODEL trained on a treebank."""
    from ..data.datasets import get_dataset
    from ..parsing.parse import is_parsing_model

    if args.trees or (args.dataset and get_dataset(args.dataset).kind == "treebank"):
        return True
    return args.model_path is not None and is_parsing_model(model_metadata(Path(args.model_path)))


def _read(path: str | Path) -> list[str]:
    return list(read_lines(Path(path)))


def check_direction(model_path: Path, src: str | None, tgt: str) -> None:
    """Refuse languages other than those the model's training data recorded (data.json in a run
    directory, or beside a model directory inside one; a lone model directory records none)."""
    for meta_path in (model_path / "data.json", model_path.parent / "data.json"):
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return
            trained = meta.get("src_lang"), meta.get("tgt_lang")
            if None in trained or meta.get("task") == "parsing":
                return
            if tgt != trained[1] or (src is not None and src != trained[0]):
                asked = f"{src}->{tgt}" if src else f"target {tgt}"
                raise UsageError(
                    f"{model_path} translates {trained[0]}->{trained[1]} ({meta_path}); --src/--tgt ask for {asked}"
                )
            return


def resolve_files(args: argparse.Namespace) -> tuple[dict, Path | None, Path, Path | None]:
    """The start of the report, and the source, reference and tokenized reference files: the
    flags' own, or those of --dataset (fetched)."""
    if not args.tgt:
        raise ValueError("give --tgt LANG (the target language: it chooses the Moses tokenizer's rules)")
    report: dict = {"tgt_lang": args.tgt, "src_lang": args.src}
    if args.model_path is not None:
        check_direction(Path(args.model_path), args.src, args.tgt)
    src_path, ref_path, tok_ref_path = args.input, args.ref, args.tok_ref
    if args.dataset:
        from ..data.datasets import fetch, get_dataset

        if args.ref or args.input:
            raise ValueError("give --dataset or --ref/--input, not both")
        info = get_dataset(args.dataset)
        split = args.split or info.tests[0]
        if args.variant not in info.variants:
            raise ValueError(f"{info.name} has no variant {args.variant!r} (choose from {', '.join(info.variants)})")
        if args.model_path is not None and not args.src:
            raise ValueError(f"give --src (the source language of {info.name}) to translate it")
        ref_path = fetch(info.name, split, args.tgt, data_dir=args.data_dir)
        if args.src:
            src_path = fetch(info.name, split, args.src, variant=args.variant, data_dir=args.data_dir)
        if "tok" in info.variants and tok_ref_path is None:
            tok_ref_path = fetch(info.name, split, args.tgt, variant="tok", data_dir=args.data_dir)
        report.update(dataset=info.name, split=split, variant=args.variant)
    elif args.variant != "raw":
        raise ValueError("--variant goes with --dataset")
    if ref_path is None:
        raise ValueError("give --ref FILE or --dataset NAME")
    if (args.hyp is None) == (args.model_path is None):
        raise ValueError("give either --hyp FILE or a MODEL to translate with")
    return report, src_path, ref_path, tok_ref_path


def translate_source(
    args: argparse.Namespace, src_path: Path | None, ref_path: Path, n_refs: int, report: dict
) -> list[str]:
    """MODEL's translations of the source (saved to --out if given), noted in `report`."""
    from ..checkpoint.files import atomic_write_text
    from ..decoding.translate import translate_lines

    if src_path is None:
        raise ValueError("give --input FILE (or --dataset with --src) for MODEL to translate")
    check_decoding_args(args)
    penalty = library_length_penalty(args, "evaluate", ("gnmt", "hf", "none"))
    srcs = _read(src_path)
    if len(srcs) != n_refs:
        raise DataError(f"{len(srcs)} lines, but the reference {ref_path} has {n_refs}", src_path)
    loaded = load_model(args, f"translating {len(srcs):,} sentences", report)
    if loaded.precision.warning:
        warn(loaded.precision.warning)
    hyps = translate_lines(
        loaded.model,
        loaded.src_vocab,
        loaded.tgt_vocab,
        srcs,
        **decoding_options(args),
        warn=warn,
        progress=not args.quiet and sys.stderr.isatty(),
        source_name=str(src_path),
        length_penalty=penalty,
    )
    report["decoding"] = decoding_report(args, loaded, bf16=args.bf16)
    if args.out:
        atomic_write_text(args.out, "".join(h + "\n" for h in hyps))
    return hyps


def load_model(args: argparse.Namespace, doing: str, report: dict, parsing_model: bool = False):
    """MODEL (`load_from_args`; with `parsing_model`, refused unless trained on a treebank), said on
    stderr with what it is `doing`, and named in `report`."""
    from ..parsing.parse import is_parsing_model

    loaded = load_from_args(args)
    if parsing_model and not is_parsing_model(loaded.metadata):
        raise DataError("not a parsing model (its data.json does not say task: parsing)", args.model_path)
    print(
        f"{PROG}: {doing} with {loaded.description}; {loaded.precision.line()}; {loaded.workers_line}", file=sys.stderr
    )
    report["model"] = loaded.description
    return loaded


def decoding_report(args: argparse.Namespace, loaded, **task) -> dict:
    """How MODEL decoded, for the report (`task`: what only the task has)."""
    return {
        "greedy": args.greedy,
        "beam": 1 if args.greedy else args.beam,
        "alpha": args.alpha,
        "length_penalty": args.length_penalty,
        "max_len_offset": args.max_len_offset,
        **task,
        "precision": loaded.precision.precision,
        "workers": args.workers,
    }


def print_report(args: argparse.Namespace, report: dict, table: str, ensure_ascii: bool = True) -> int:
    """The report as JSON on stdout (--json -), else `table`, then the JSON into --json FILE
    (after the table: a file that fails to be written loses nothing shown)."""
    from ..checkpoint.files import atomic_write_text

    text = json.dumps(report, indent=2, ensure_ascii=ensure_ascii)
    if args.json == "-":
        print(text)
        return 0
    print(table, flush=True)
    if args.json:
        atomic_write_text(args.json, text + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    """Score --hyp (or MODEL's translations) against the reference; print the table, or JSON."""
    from ..checkpoint.files import check_output

    for path in (args.out, args.json):  # before any work: one line naming an output that cannot be written
        check_output(path)
    if is_parsing(args):
        return run_parsing(args)
    fill_decoding_defaults(args)
    report, src_path, ref_path, tok_ref_path = resolve_files(args)
    refs = _read(ref_path)
    tok_refs = _read(tok_ref_path) if tok_ref_path is not None else None
    if args.hyp is not None:
        hyps = _read(args.hyp)
        report["hyp"] = str(args.hyp)
        if len(hyps) != len(refs):
            raise DataError(f"{len(hyps)} lines, but the reference {ref_path} has {len(refs)}", args.hyp)
    else:
        hyps = translate_source(args, src_path, ref_path, len(refs), report)
    files = {"ref": ref_path, "src": src_path, "tok_ref": tok_ref_path}
    report.update({name: str(path) for name, path in files.items() if path is not None}, n_sentences=len(hyps))
    report["scores"] = evaluate.score(
        hyps,
        refs,
        lang=args.tgt,
        tok_refs=tok_refs,
        sacrebleu_tokenize=args.sacrebleu_tokenize,
        tokenized=args.variant == "tok",
    )
    report["conventions"] = {k: v["convention"] for k, v in report["scores"].items()}
    return print_report(args, report, evaluate.format_table(report), ensure_ascii=False)


# --- parsing ---------------------------------------------------------------------------------------

TREEBANK_SPLIT_ALIASES = {"dev": "22", "valid": "22", "test": "23", "train": "02-21"}


def warn_other_words(hyp_path: Path, gold: list, parsed: list, shown: int = 10) -> None:
    """Name the --hyp lines whose tree holds other words than the gold tree's: EVALB makes each an
    error sentence, left out of the scores (unless only punctuation differs)."""
    other = [
        (n, g.leaves(), p.leaves())
        for n, (g, p) in enumerate(zip(gold, parsed), start=1)
        if p is not None and p.leaves() != g.leaves()
    ]
    for n, gw, pw in other[:shown]:
        k = next((i for i, (a, b) in enumerate(zip(gw, pw)) if a != b), min(len(gw), len(pw)))
        what = (
            f"{len(pw)} words, the gold tree {len(gw)}"
            if len(gw) != len(pw)
            else f"word {k + 1} is {pw[k]!r}, the gold tree's {gw[k]!r}"
        )
        print(f"{PROG}: warning: {hyp_path}:{n}: other words than the gold tree's ({what})", file=sys.stderr)
    if other:
        more = f" ({len(other) - shown} more not shown)" if len(other) > shown else ""
        print(
            f"{PROG}: warning: {len(other)} of {len(parsed)} trees in {hyp_path} have other words than the gold "
            f"trees{more}: EVALB makes them error sentences, left out of the scores (unless only punctuation differs)",
            file=sys.stderr,
        )


def run_parsing(args: argparse.Namespace) -> int:
    """EVALB of MODEL's parses (or of --hyp trees) against a treebank split (or --ref trees)."""
    from ..checkpoint.files import atomic_write_text
    from ..data.datasets import fetch, get_dataset
    from ..parsing import parse as parsing
    from ..parsing.evalb import COLLINS, EvalbParams
    from ..parsing.trees import clean, read_tree_lines, read_trees, tree_lines

    report: dict = {"task": "parsing"}
    if args.dataset:
        if args.ref:
            raise ValueError("give --dataset or --ref, not both")
        info = get_dataset(args.dataset)
        split = TREEBANK_SPLIT_ALIASES.get(args.split, args.split) if args.split else info.tests[0]
        ref_path = fetch(info.name, split, "trees", data_dir=args.data_dir)
        report.update(dataset=info.name, split=split)
    elif args.ref:
        ref_path = args.ref
    else:
        raise ValueError("give the gold trees: --dataset ptb-wsj --split 22|23, or --ref FILE")
    if (args.hyp is None) == (args.model_path is None):
        raise ValueError("give either --hyp FILE (trees) or a MODEL to parse with")
    params = EvalbParams.from_file(args.evalb_params) if args.evalb_params else COLLINS
    gold = []
    for t in read_trees(ref_path):  # .mrg trees too: cleaned as for training (a no-op on the mirror's)
        c = clean(t)
        if c is None:
            raise DataError("a gold tree has no word left once empty elements are removed", ref_path)
        gold.append(c)
    report["ref"] = str(ref_path)
    if args.hyp is not None:
        parsed = read_tree_lines(args.hyp)
        if len(parsed) != len(gold):
            raise DataError(f"{len(parsed)} lines, but the gold file {ref_path} has {len(gold)} trees", args.hyp)
        warn_other_words(args.hyp, gold, parsed)
        own = any(tag != "XX" for p in parsed if p is not None for tag in p.tags())
        scores = parsing.score_parses(gold, parsed, own_tags=own, params=params)
        report["hyp"] = str(args.hyp)
    else:
        fill_decoding_defaults(args, parsing=True)
        check_decoding_args(args)
        library_length_penalty(args, "parsing")
        loaded = load_model(args, f"parsing {len(gold):,} sentences", report, parsing_model=True)
        scores, parses = parsing.evaluate_parser(
            loaded,
            gold,
            progress=not args.quiet and sys.stderr.isatty(),
            source_name=str(ref_path),
            warn=warn,
            constrained=args.constrained,
            **decoding_options(args),
        )
        report["decoding"] = decoding_report(args, loaded, constrained=args.constrained)
        if args.out:
            atomic_write_text(args.out, "".join(line + "\n" for line in tree_lines(p.tree for p in parses)))
    report["n_sentences"] = len(gold)
    report["scores"] = scores.as_dict()
    return print_report(args, report, parsing.format_scores(scores, params.cutoff_len))
