"""The dataset registry (data/corpora.py) and its files fetched (data/datasets.py): the local mirror,
checksums, downloads (from file:// URLs), SGML extraction."""

import dataclasses
import gzip
import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path

import pytest

from transduce.data import corpora, datasets
from transduce.data.corpora import DATASETS, Source
from transduce.data.datasets import fetch, sgml_to_lines, sha256_text
from transduce.data.text import DataError, read_lines

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_mirror(monkeypatch):
    """No mirror at all: fetch must use the cache or download."""
    monkeypatch.delenv(datasets.ENV_DATA_DIR, raising=False)
    monkeypatch.setenv(datasets.ENV_NO_SHARED_DATA, "1")


def line_count(path):
    return sum(1 for _ in read_lines(path))


@pytest.mark.parametrize("switch", ["", "0", "1"])
def test_default_mirror_is_shared_data_beside_the_repository(monkeypatch, switch):
    """Found where it exists, unless TRANSDUCE_NO_SHARED_DATA is set (not "" or "0"); the variable
    and an explicit directory come first."""
    monkeypatch.delenv(datasets.ENV_DATA_DIR, raising=False)
    monkeypatch.setenv(datasets.ENV_NO_SHARED_DATA, switch)
    beside = REPO.parent / "shared" / "data"
    found = beside if beside.is_dir() and switch != "1" else None
    assert datasets.default_data_dir() == found and datasets.mirror_dir() == found
    monkeypatch.setenv(datasets.ENV_DATA_DIR, "elsewhere")
    assert datasets.mirror_dir() == Path("elsewhere") and datasets.mirror_dir("given") == Path("given")


@pytest.mark.corpus("multi30k")
@pytest.mark.parametrize("variant", ["raw", "tok"])
@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_multi30k_from_mirror(monkeypatch, tmp_path, mirror, variant, lang):
    monkeypatch.setenv(datasets.ENV_DATA_DIR, str(mirror))
    for split, n in [("train", 29000), ("val", 1014), ("test_2016_flickr", 1000), ("test_2017_mscoco", 461)]:
        path = fetch("multi30k", split, lang, variant=variant, cache_dir=tmp_path)
        assert path.is_relative_to(mirror) and line_count(path) == n
    assert list(tmp_path.iterdir()) == []  # nothing downloaded or copied


@pytest.mark.corpus("multi30k")
def test_multi30k_variants_differ(mirror):
    raw = next(read_lines(fetch("multi30k", "train", "en", data_dir=mirror)))
    tok = next(read_lines(fetch("multi30k", "train", "en", variant="tok", data_dir=mirror)))
    assert raw == "Two young, White males are outside near many bushes."
    assert tok == raw.lower().replace(",", " ,").replace(".", " .")


@pytest.mark.parametrize(
    "name, lang",
    [
        pytest.param(name, lang, marks=pytest.mark.corpus(name))
        for name, lang in [("wmt14-en-de", "en"), ("wmt14-en-de", "de"), ("wmt14-en-fr", "fr")]
    ],
)
def test_wmt14_test_sets_from_mirror(tmp_path, mirror, name, lang):
    for split, n in [("newstest2012", 3003), ("newstest2013", 3000), ("newstest2014", 3003)]:
        assert line_count(fetch(name, split, lang, data_dir=mirror, cache_dir=tmp_path)) == n
    if name == "wmt14-en-de":
        assert line_count(fetch(name, "newstest2014-filtered", lang, data_dir=mirror)) == 2737
        assert line_count(fetch(name, "train-sample", lang, data_dir=mirror)) == 10000


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.corpus(name)) for name in DATASETS])
def test_registry_checksums_match_provenance(mirror, name):
    # every sha256 in the registry appears in the mirror's PROVENANCE.md of that dataset
    provenance = (mirror / name / "PROVENANCE.md").read_text()
    for key, source in DATASETS[name].files.items():
        if source.sha256:
            assert source.sha256 in provenance, key


def test_env_var_points_at_a_mirror(monkeypatch, tmp_path):
    source = DATASETS["multi30k"].source("val", "en")
    text = b"a line\n"
    mirror_file = tmp_path / "mirror" / "multi30k" / source.mirror
    mirror_file.parent.mkdir(parents=True)
    mirror_file.write_bytes(gzip.compress(text))
    monkeypatch.setitem(
        DATASETS["multi30k"].files,
        ("raw", "val", "en"),
        dataclasses.replace(source, sha256=hashlib.sha256(text).hexdigest()),
    )
    monkeypatch.setenv(datasets.ENV_DATA_DIR, str(tmp_path / "mirror"))
    assert fetch("multi30k", "val", "en", cache_dir=tmp_path / "cache") == mirror_file


@pytest.mark.corpus("multi30k")
def test_plain_file_may_stand_in_for_gz_in_a_mirror(tmp_path, mirror):
    source = DATASETS["multi30k"].source("val", "de")
    plain = tmp_path / "multi30k" / source.mirror[: -len(".gz")]
    plain.parent.mkdir(parents=True)
    plain.write_bytes(gzip.open(mirror / "multi30k" / source.mirror).read())
    assert fetch("multi30k", "val", "de", data_dir=tmp_path) == plain


def test_explicit_mirror_without_the_file_is_an_error(tmp_path):
    with pytest.raises(DataError) as e:
        fetch("multi30k", "train", "en", data_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert str(e.value).startswith(
        f"{tmp_path / 'multi30k' / 'raw' / 'train.en.gz'}: no such file in the data directory"
    )
    assert not (tmp_path / "cache").exists()


def test_checksum_mismatch_in_mirror(tmp_path):
    bad = tmp_path / "multi30k" / "raw" / "val.en.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(gzip.compress(b"not the real text\n"))
    with pytest.raises(DataError, match=r"val\.en\.gz: checksum mismatch"):
        fetch("multi30k", "val", "en", data_dir=tmp_path)


def test_unknown_names():
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        fetch("nope", "train", "en")
    with pytest.raises(DataError, match="has no split 'dev'"):
        fetch("multi30k", "dev", "en")
    with pytest.raises(DataError, match="has no language 'cs'"):
        fetch("multi30k", "train", "cs")
    with pytest.raises(DataError, match="has no variant 'bpe'"):
        fetch("multi30k", "train", "en", variant="bpe")


# --- downloads, with file:// URLs standing in for the network ----------------------------------------


def register(monkeypatch, url, sha256, member=None, mirror="x/file.en.gz"):
    """A one-file dataset "toy" whose only file comes from `url`."""
    info = corpora.DatasetInfo(
        "toy",
        "test",
        ("en",),
        "train",
        "train",
        ("train",),
        {("raw", "train", "en"): Source(mirror, url, sha256, member)},
    )
    monkeypatch.setitem(DATASETS, "toy", info)


@pytest.mark.parametrize("gz", [True, False])
def test_download_verify_and_cache(monkeypatch, tmp_path, no_mirror, gz):
    text = "Zwei Männer.\nEin Hund.\n".encode()
    remote = tmp_path / "remote" / ("train.en.gz" if gz else "train.en")
    remote.parent.mkdir()
    remote.write_bytes(gzip.compress(text) if gz else text)
    register(monkeypatch, remote.as_uri(), hashlib.sha256(text).hexdigest())
    cache = tmp_path / "cache"

    path = fetch("toy", "train", "en", cache_dir=cache)
    assert path == cache / "toy" / ("x/file.en.gz" if gz else "x/file.en")
    assert list(read_lines(path)) == ["Zwei Männer.", "Ein Hund."]
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left

    remote.unlink()  # the second fetch is served from the cache
    assert fetch("toy", "train", "en", cache_dir=cache) == path


def test_download_with_wrong_checksum_leaves_nothing(monkeypatch, tmp_path, no_mirror):
    remote = tmp_path / "train.en"
    remote.write_bytes(b"tampered\n")
    register(monkeypatch, remote.as_uri(), "0" * 64)
    with pytest.raises(DataError) as e:
        fetch("toy", "train", "en", cache_dir=tmp_path / "cache")
    assert str(e.value).startswith(f"{remote.as_uri()}: downloaded file is corrupt: checksum mismatch")
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_download_failure(monkeypatch, tmp_path, no_mirror):
    register(monkeypatch, (tmp_path / "missing.gz").as_uri(), None)
    with pytest.raises(DataError, match="download failed"):
        fetch("toy", "train", "en", cache_dir=tmp_path / "cache")
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_interrupted_download_leaves_nothing(monkeypatch, tmp_path, no_mirror):
    """Ctrl-C in the middle of a download: the partial temporary file is removed too."""

    class Interrupted(io.BytesIO):
        def read(self, *args):
            if self.tell():
                raise KeyboardInterrupt
            return super().read(*args)

        def __enter__(self):
            return self

    register(monkeypatch, "https://example.invalid/train.en", None)
    monkeypatch.setattr(datasets.urllib.request, "urlopen", lambda url, timeout: Interrupted(b"partial\n"))
    with pytest.raises(KeyboardInterrupt):
        fetch("toy", "train", "en", cache_dir=tmp_path / "cache")
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


@pytest.mark.corpus("multi30k")
def test_download_of_the_real_multi30k_url_is_attempted(monkeypatch, tmp_path, mirror, no_mirror):
    """The registry's own URL is used; urlopen is replaced by a local file's content."""
    source = DATASETS["multi30k"].source("val", "fr")
    assert source.url == (
        f"https://raw.githubusercontent.com/multi30k/dataset/{corpora.MULTI30K_COMMIT}/data/task1/raw/val.fr.gz"
    )
    opened = []

    def fake_urlopen(url, timeout):
        opened.append(url)
        return io.BytesIO((mirror / "multi30k" / "raw" / "val.fr.gz").read_bytes())

    monkeypatch.setattr(datasets.urllib.request, "urlopen", fake_urlopen)
    path = fetch("multi30k", "val", "fr", cache_dir=tmp_path)
    assert opened == [source.url] and line_count(path) == 1014


def make_sgml(lines, doc="test"):
    segs = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, 1))
    return (
        f'<srcset setid="{doc}" srclang="any">\n<doc docid="d1" genre="news" origlang="en">\n{segs}</doc>\n</srcset>\n'
    )


def test_sgml_to_lines():
    sgml = make_sgml(["Hello  \tworld ", "A &amp; B", "Tel\xa0Aviv", "x"]) + '<seg id="9"> tail </seg> junk\n'
    assert sgml_to_lines(sgml) == ["Hello world", "A &amp; B", "Tel\xa0Aviv", "x", "tail"]


SGML_FILES = [
    (name, split, lang)
    for name in ("wmt14-en-de", "wmt14-en-fr")
    for (_, split, lang), source in DATASETS[name].files.items()
    if source.member
]


@pytest.mark.parametrize("name, split, lang", [pytest.param(*f, marks=pytest.mark.corpus(f[0])) for f in SGML_FILES])
def test_wmt14_sgml_archive_extraction(monkeypatch, tmp_path, mirror, no_mirror, name, split, lang):
    """A .tgz laid out like statmt.org's, built from the mirror's text: extraction reproduces the
    registry checksum (unicode spaces kept, and so on)."""
    source = DATASETS[name].source(split, lang)
    lines = list(read_lines(mirror / name / source.mirror))
    archive = tmp_path / "remote" / "wmt14" / Path(source.url).name
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        data = make_sgml(lines).encode()
        member = tarfile.TarInfo(source.member)
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    files = dict(DATASETS[name].files)
    files[("raw", split, lang)] = dataclasses.replace(source, url=archive.as_uri())
    monkeypatch.setitem(DATASETS, name, dataclasses.replace(DATASETS[name], files=files))

    path = fetch(name, split, lang, cache_dir=tmp_path / "cache")
    assert path == tmp_path / "cache" / name / f"{split}.{lang}"
    assert sha256_text(path) == source.sha256
    assert (tmp_path / "cache" / "archives" / f"wmt14-{archive.name}").is_file()  # kept for the other files


def test_registry_urls_are_the_official_sources():
    de = DATASETS["wmt14-en-de"]
    assert de.source("newstest2013", "de").url == "http://www.statmt.org/wmt14/dev.tgz"
    assert de.source("newstest2013", "de").member == "dev/newstest2013-ref.de.sgm"
    assert de.source("newstest2014", "en").url == "http://www.statmt.org/wmt14/test-full.tgz"
    assert de.source("newstest2014", "en").member == "test-full/newstest2014-deen-src.en.sgm"
    assert DATASETS["wmt14-en-fr"].source("newstest2014", "fr").member == "test-full/newstest2014-fren-ref.fr.sgm"
    assert de.source("newstest2014-filtered", "de").member == "test/newstest2014-deen-ref.de.sgm"
    tok = DATASETS["multi30k"].source("train", "de", "tok")
    assert tok.url.endswith("/data/task1/tok/train.lc.norm.tok.de") and tok.cache_name == "tok/train.lc.norm.tok.de"


def test_wmt14_training_corpus_needs_huggingface(monkeypatch, tmp_path, no_mirror):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError) as e:
        fetch("wmt14-en-de", "train", "de", cache_dir=tmp_path)
    message = str(e.value)
    assert "pip install datasets" in message and "wmt/wmt14 de-en" in message and "--train-src" in message
    assert "\n" not in message


def test_wmt14_training_corpus_from_local_files(tmp_path):
    for lang in ("en", "fr"):
        (tmp_path / "wmt14-en-fr").mkdir(exist_ok=True)
        (tmp_path / "wmt14-en-fr" / f"train-full.{lang}.gz").write_bytes(gzip.compress(b"x\n"))
    assert fetch("wmt14-en-fr", "train", "fr", data_dir=tmp_path).name == "train-full.fr.gz"


def test_wmt14_training_corpus_through_huggingface(monkeypatch, tmp_path, no_mirror):
    """The Hugging Face path with a stand-in `datasets` module."""
    rows = [{"translation": {"de": "Hallo\nWelt", "en": "Hello world"}}, {"translation": {"de": "Ja", "en": "Yes"}}]
    calls = []

    class FakeDatasets:
        @staticmethod
        def load_dataset(name, config, split):
            calls.append((name, config, split))
            return rows

    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets)
    de = fetch("wmt14-en-de", "train", "de", cache_dir=tmp_path)
    assert calls == [("wmt/wmt14", "de-en", "train")]
    assert list(read_lines(de)) == ["Hallo Welt", "Ja"]  # one sentence per line, always
    en = fetch("wmt14-en-de", "train", "en", cache_dir=tmp_path)  # written in the same pass
    assert list(read_lines(en)) == ["Hello world", "Yes"] and len(calls) == 1
    assert sorted(os.listdir(tmp_path / "wmt14-en-de")) == ["train-full.de", "train-full.en"]


def test_wmt14_training_corpus_through_huggingface_offline(monkeypatch, tmp_path, no_mirror):
    """Hugging Face cannot reach the hub: one line saying so and where a mirror's files would go;
    nothing written."""

    class OfflineDatasets:
        @staticmethod
        def load_dataset(name, config, split):
            raise ConnectionError("Couldn't reach 'wmt/wmt14' on the Hub (LocalEntryNotFoundError)\nsecond line")

    monkeypatch.setitem(sys.modules, "datasets", OfflineDatasets)
    with pytest.raises(DataError) as e:
        fetch("wmt14-en-de", "train", "en", cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert message.startswith("loading wmt/wmt14 de-en train with Hugging Face datasets failed (Couldn't reach")
    assert message.endswith("without network, put train-full.<lang>.gz files in DIR/wmt14-en-de/ with --data-dir DIR")
    assert "\n" not in message
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_archive_without_the_member(monkeypatch, tmp_path, no_mirror):
    archive = tmp_path / "remote" / "wmt14" / "dev.tgz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        data = make_sgml(["x"]).encode()
        member = tarfile.TarInfo("dev/other.sgm")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    register(monkeypatch, archive.as_uri(), None, member="dev/newstest2013-src.en.sgm", mirror="newstest2013.en.gz")
    with pytest.raises(DataError, match="archive has no member dev/newstest2013-src.en.sgm"):
        fetch("toy", "train", "en", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "toy" / "newstest2013.en").exists()


def test_damaged_archive_is_deleted_for_a_fresh_download(monkeypatch, tmp_path, no_mirror):
    archive = tmp_path / "remote" / "wmt14" / "dev.tgz"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"this is not a tar.gz file")
    register(monkeypatch, archive.as_uri(), None, member="dev/x.sgm", mirror="x.en.gz")
    with pytest.raises(DataError, match="cannot extract dev/x.sgm"):
        fetch("toy", "train", "en", cache_dir=tmp_path / "cache")
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
