"""Fixtures shared by several test files (helpers that are plain functions live in modules such
as train_data.py), and the one rule for tests that read a real corpus.

A test that reads a corpus from the data mirror is marked `@pytest.mark.corpus("ptb-wsj")` (any
number of names) and takes the `mirror` fixture, the mirror's root. Where the mirror lacks one of
its corpora (a clone with no `shared/data` beside it, or `TRANSDUCE_NO_SHARED_DATA=1`), the test
is skipped, saying which corpus and how to get it: the suite passes on any machine, and
`pytest -m corpus` selects exactly the tests that a mirror adds.
"""

from pathlib import Path

import pytest
import torch

from transduce.data import datasets

MIRROR = datasets.mirror_dir()
"""The mirror as the data layer finds it ($TRANSDUCE_DATA_DIR, else `shared/data` beside the
repository), resolved once, before any test replaces the data layer's lookup."""

FREE = "downloadable: transduce/data/corpora.py names each file's URL"
CORPORA = {  # name -> what the tests read of it, and how to get it
    "multi30k": f"Multi30k Task 1, raw/ and tok/ ({FREE})",
    "wmt14-en-de": f"WMT14 En-De newstest2012-2014 and the 10k-pair train sample ({FREE})",
    "wmt14-en-fr": f"WMT14 En-Fr newstest2012-2014 ({FREE})",
    "ptb-wsj": "the Penn Treebank's WSJ trees, one per line (licensed by the LDC: docs/parsing.md), and EVALB's COLLINS.prm",
}


def missing_corpus(name: str) -> str | None:
    """Why a test needing corpus `name` cannot run here, or None when the mirror has it."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r} in a corpus mark (known: {', '.join(CORPORA)})")
    if MIRROR is not None and (MIRROR / name).is_dir():
        return None
    where = "no data mirror" if MIRROR is None else f"no {name}/ in the data mirror {MIRROR}"
    return (
        f"needs the {name} corpus ({where}): {CORPORA[name]}, in DIR/{name}/ with TRANSDUCE_DATA_DIR=DIR "
        "(or shared/data beside the repository)"
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "corpus(*names): reads these corpora from the data mirror; skipped, "
        "saying how to get them, where the mirror lacks one (tests/conftest.py)",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        for mark in item.iter_markers("corpus"):
            reasons = [r for r in map(missing_corpus, mark.args) if r]
            if reasons:
                item.add_marker(pytest.mark.skip(reason=reasons[0]))


@pytest.fixture
def mirror(request) -> Path:
    """The data mirror's root, for a test marked with the corpora it reads (so that it skips where
    they are missing, rather than failing)."""
    if request.node.get_closest_marker("corpus") is None:
        pytest.fail("a test that reads the data mirror is marked @pytest.mark.corpus(NAME, ...)")
    return MIRROR


@pytest.fixture
def one_thread():
    """Tiny models: thousands of tiny ops, which two threads on a busy machine only slow down.
    A test file uses it for all its tests with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
