"""`transduce prepare` for a treebank (Section 6.3): each cleaned tree becomes a pair, its words
and its linearization, prepared like any parallel text with a BPE source vocabulary and a closed
word-level target vocabulary (about 60 symbols with XX, 100 with tags). data.json records
``"task": "parsing"``, the linearization and each split's tree file, which `evaluate` scores against.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from ..data.datasets import fetch, get_dataset
from ..data.prepare import Split, check_output_dir, prepare
from ..defaults import TREE_MAX_LEN, TREE_VOCAB_SIZE
from ..errors import DataError
from .trees import clean, linearize, read_trees

MAX_RATIO = 1e9
"""No length-ratio filter: a tree's sequence is always longer than its words (about 3x)."""


def dataset_tree_splits(name: str, data_dir: str | None = None) -> list[tuple[str, Path, str]]:
    """(split name, tree file, origin) of a registered treebank: train, valid, test, other tests."""
    info = get_dataset(name)
    if info.kind != "treebank":
        raise DataError(f"{name} is not a treebank")
    wanted = [("train", info.train), ("valid", info.valid), ("test", info.tests[0])]
    wanted += [(t, t) for t in info.tests[1:]]
    return [(split, fetch(name, origin, "trees", data_dir=data_dir), f"{name}:{origin}") for split, origin in wanted]


def prepare_treebank(
    splits: list[tuple[str, Path, str]],
    out: str | Path,
    *,
    tags: bool = False,
    vocab_size: int = TREE_VOCAB_SIZE,
    max_len: int = TREE_MAX_LEN,
    overwrite: bool = False,
    progress: bool = True,
    extra: dict | None = None,
    **prepare_options,
) -> dict:
    """Prepare `splits` ((name, tree file, origin), train first) into `out`; return data.json's
    content. Other options are `transduce.data.prepare.prepare`'s."""
    out = Path(out).absolute()
    check_output_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    text_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.text-", dir=out.parent))
    try:
        pairs = []
        for name, path, origin in splits:
            src, tgt = text_dir / f"{name}.words", text_dir / f"{name}.lin"
            n = 0
            with open(src, "w", encoding="utf-8") as fs, open(tgt, "w", encoding="utf-8") as ft:
                for tree in tqdm(
                    read_trees(path), desc=f"linearize {name}", unit=" trees", disable=not progress, mininterval=1
                ):
                    n += 1
                    t = clean(tree)
                    if t is None:
                        raise DataError(f"tree {n} has no word left once empty elements are removed", path)
                    fs.write(" ".join(t.leaves()) + "\n")
                    ft.write(" ".join(linearize(t, tags=tags)) + "\n")
            if n == 0:
                raise DataError("no trees", path)
            pairs.append(Split(name, src, tgt, origin, files={"trees_file": str(Path(path).absolute()), "trees": n}))
        meta = prepare(
            pairs,
            out,
            src_lang="words",
            tgt_lang="trees",
            vocab_size=vocab_size,
            separate_vocab=True,
            max_len=max_len,
            max_ratio=MAX_RATIO,
            overwrite=overwrite,
            progress=progress,
            tgt_vocab_type="word",
            extra={**(extra or {}), "task": "parsing", "linearization": {"tags": tags, "scheme": "vinyals2015"}},
            **prepare_options,
        )
    finally:
        shutil.rmtree(text_dir, ignore_errors=True)
    return meta
