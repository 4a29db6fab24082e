"""The text files of the datasets known by name (`corpora.DATASETS`), fetched and checked.

`fetch(name, split, lang)` returns the path of one side of one split, as a (possibly .gz) text
file, from the first of: a local mirror (`mirror_dir`: `data_dir`, else $TRANSDUCE_DATA_DIR, else
`../shared/data` beside the repository unless $TRANSDUCE_NO_SHARED_DATA is set), laid out as `<data_dir>/<name>/<mirror path>` (a plain
file may stand in for a .gz one and vice versa); the cache (`cache_dir`, else
$TRANSDUCE_CACHE_DIR, else ~/.cache/transduce); a download into the cache, written under a
temporary name, checked, then renamed into place. Every file with a known checksum is verified
by the sha256 of its *uncompressed* text, so a gzip mirror copy and the plain original agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

from ..errors import DataError
from .corpora import DATASETS, DatasetInfo
from .text import open_text

ENV_DATA_DIR = "TRANSDUCE_DATA_DIR"
ENV_NO_SHARED_DATA = (
    "TRANSDUCE_NO_SHARED_DATA"  # set (not "" or "0"): `shared/data` beside the repository is not looked for
)
ENV_CACHE_DIR = "TRANSDUCE_CACHE_DIR"


def get_dataset(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    return DATASETS[name]


def default_data_dir() -> Path | None:
    """`shared/data` beside the repository, if it exists and $TRANSDUCE_NO_SHARED_DATA is not set
    (set, a checkout sees what a clone elsewhere would: the tests' mirror-free world)."""
    if os.environ.get(ENV_NO_SHARED_DATA, "") not in ("", "0"):
        return None
    mirror = Path(__file__).resolve().parents[4] / "shared" / "data"  # [4]: the repository's parent
    return mirror if mirror.is_dir() else None


def mirror_dir(data_dir: str | Path | None = None) -> Path | None:
    """The local mirror `fetch` reads first: `data_dir`, else $TRANSDUCE_DATA_DIR, else `default_data_dir()`."""
    explicit = data_dir or os.environ.get(ENV_DATA_DIR)
    return Path(explicit) if explicit else default_data_dir()


def default_cache_dir() -> Path:
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transduce"


def fetch(
    name: str,
    split: str,
    lang: str,
    *,
    variant: str = "raw",
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """Path to the `lang` side of `split` of dataset `name` (see the module docstring)."""
    info = get_dataset(name)
    source = info.source(split, lang, variant)

    explicit = data_dir or os.environ.get(ENV_DATA_DIR)
    mirror = mirror_dir(data_dir)
    if mirror is not None:
        want = mirror / name / source.mirror  # or its plain / .gz counterpart
        other = want.with_name(want.name[:-3]) if want.name.endswith(".gz") else want.with_name(want.name + ".gz")
        path = next((p for p in (want, other) if p.is_file()), None)
        if path is not None:
            verify(path, source.sha256)
            return path
        if explicit and not source.hf:
            where = f"it is at {source.url}" if source.url else "licensed data, not downloadable"
            raise DataError(f"no such file in the data directory ({where})", mirror / name / source.mirror)

    if source.url is None and not source.hf:  # licensed data: there is nowhere to download it from
        where = mirror / name if mirror is not None else Path(f"<data-dir>/{name}")
        raise DataError(
            f"{info.description}: not downloadable; put {source.mirror} in {where} "
            f"(or give --data-dir / ${ENV_DATA_DIR})"
        )
    cache_root = Path(cache_dir or default_cache_dir())
    cached = cache_root / name / source.cache_name
    if cached.is_file():
        return cached
    if source.hf:
        cached.parent.mkdir(parents=True, exist_ok=True)
        _fetch_huggingface(info, split, source.hf, cached.parent, mirror)
        return cached
    try:
        if source.member:  # a .tgz downloaded once (archives/wmt14-dev.tgz), its members verified when extracted
            archive = cache_root / "archives" / "-".join(Path(urllib.parse.urlparse(source.url).path).parts[-2:])
            if not archive.is_file():
                download(source.url, archive)
            _extract_sgml(archive, source.member, cached, source.sha256)
        else:
            download(source.url, cached, source.sha256)
    except DataError as e:
        if not e.message.startswith("download failed"):
            raise
        raise DataError(
            f"{e.message}; without network, put {source.mirror} in DIR/{name}/ and pass --data-dir DIR "
            f"(or set ${ENV_DATA_DIR}=DIR)",
            e.path,
        ) from None
    return cached


def sha256_text(path: str | Path) -> str:
    """sha256 of a file's uncompressed content (gunzipped if it is gzip)."""
    digest = hashlib.sha256()
    with open_text(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: str | Path, sha256: str | None) -> None:
    """Raise DataError unless the uncompressed content of `path` has this sha256 (None: skip)."""
    if sha256 is None:
        return
    try:
        got = sha256_text(path)
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read for checksum ({e})", path) from None
    if got != sha256:
        raise DataError(f"checksum mismatch: sha256 of the text is {got}, expected {sha256}", path)


def download(url: str, dest: str | Path, sha256: str | None = None) -> Path:
    """Download `url` to `dest` atomically: into a temporary file, verified, then renamed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _replacing(dest, "download") as tmp:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
            verify(tmp, sha256)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataError(f"download failed ({reason})", url) from None
    except DataError as e:
        raise DataError(f"downloaded file is corrupt: {e.message}", url) from None
    return dest


@contextlib.contextmanager
def _replacing(dest: Path, tag: str) -> Iterator[Path]:
    """A temporary path beside `dest`, renamed onto it if the block succeeds, else removed (also on
    Ctrl-C or a timeout's signal: no partial file left behind)."""
    tmp = dest.with_name(f".{dest.name}.{tag}-{os.getpid()}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)


_SEG = re.compile(r"^\s*<seg\b[^>]*>(.*)</seg>")
_ASCII_SPACES = re.compile(r"[ \t\r\f\v]+")


def sgml_to_lines(text: str) -> list[str]:
    """The sentences of a WMT "SGML" file, line-based as Moses' input-from-sgm.perl and sacreBLEU:
    the text of each <seg> line, entities left as they are, runs of ASCII whitespace made one space
    and the ends stripped (Unicode spaces are part of the reference text: kept)."""
    matches = (_SEG.match(line) for line in text.splitlines())
    return [_ASCII_SPACES.sub(" ", m.group(1)).strip(" ") for m in matches if m]


def _extract_sgml(archive: Path, member: str, dest: Path, sha256: str | None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _replacing(dest, "extract") as tmp:
            with tarfile.open(archive, "r:gz") as tar:
                f = tar.extractfile(member)
                if f is None:
                    raise KeyError(member)
                lines = sgml_to_lines(f.read().decode("utf-8"))
            tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            verify(tmp, sha256)
    except KeyError:
        raise DataError(f"archive has no member {member}", archive) from None
    except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError) as e:
        archive.unlink(missing_ok=True)  # damaged: download it again next time
        raise DataError(f"cannot extract {member} ({e}); archive deleted, try again", archive) from None
    except DataError as e:
        raise DataError(f"text extracted from {member} does not match: {e.message}", archive) from None


def _fetch_huggingface(
    info: DatasetInfo, split: str, hf: tuple[str, str], out_dir: Path, mirror: Path | None = None
) -> None:
    """Write both sides of a Hugging Face translation dataset split as plain text files."""
    folder = f"{mirror / info.name}/" if mirror is not None else f"DIR/{info.name}/ with --data-dir DIR"
    try:
        import datasets  # optional dependency
    except ImportError:
        sample = (
            " (or --train-split train-sample for a 10,000-pair smoke test)" if "train-sample" in info.splits else ""
        )
        raise DataError(
            f"{info.name} {split} is the full WMT14 training corpus, which is not downloaded here: "
            f"install Hugging Face `datasets` (pip install datasets) to load {hf[0]} {hf[1]}, "
            f"put train-full.<lang>.gz files in {folder}, "
            f"or pass your own files with --train-src/--train-tgt{sample}"
        ) from None
    try:
        corpus = datasets.load_dataset(hf[0], hf[1], split=split)
    except Exception as e:  # network, hub or cache errors of an optional package
        raise DataError(
            f"loading {hf[0]} {hf[1]} {split} with Hugging Face datasets failed ({e}); "
            f"without network, put train-full.<lang>.gz files in {folder}"
        ) from None
    with contextlib.ExitStack() as stack:  # each file closed, then renamed into place (removed on error)
        files = {}
        for lang in info.langs:
            tmp = stack.enter_context(_replacing(out_dir / info.source(split, lang).cache_name, "hf"))
            files[lang] = stack.enter_context(open(tmp, "w", encoding="utf-8"))
        for row in corpus:
            for lang, f in files.items():
                f.write(row["translation"][lang].replace("\r", " ").replace("\n", " ") + "\n")
