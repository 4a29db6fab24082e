"""The files of a model directory or checkpoint: their names, atomic writes, and checksums.

Atomicity: every file is written to a temporary name, fsync'ed and moved into place with
`os.replace` (`atomic_write_text`, `atomic_dir`). Integrity: `verify` checks a directory's files
against the SHA-256 and size recorded beside them and raises `DamagedCheckpoint`, one line naming
the file. The layouts these files make are described in `transduce.checkpoint`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
STATE = "trainer_state.json"
CHECKSUMS = "checksums.json"
LOCK = ".lock"
DAMAGED = ".damaged"
FORMAT = 1


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, fsync and `os.replace`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike):
    """A directory written whole or not at all (the exports, a model directory made from another
    format): yields a hidden temporary directory beside `out`, which replaces `out` (an existing
    one included) when the block ends without an error; on an error it is removed and `out` is
    left as it was."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_dir(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (where directories can be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def readable(path: Path) -> None:
    """Give a file the permissions the umask allows (safetensors creates files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write tensors as a safetensors file, fsync'ed and readable (not moved: callers write into
    a temporary directory)."""
    save_file(tensors, str(path), metadata={"format": "pt", "transduce": str(FORMAT)})
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    readable(path)


def file_digest(path: Path) -> dict:
    """{"sha256": hex digest, "bytes": size} of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def digests(directory: Path, names) -> dict[str, dict]:
    return {name: file_digest(directory / name) for name in names if (directory / name).is_file()}


def as_os_error(e: Exception, path: Path) -> OSError:
    """safetensors reports a failed write as "... I/O error: No space left on device (os error
    28)": the OSError it stands for."""
    m = re.search(r"os error (\d+)", str(e))
    if m:
        code = int(m.group(1))
        return OSError(code, os.strerror(code), str(path))
    return OSError(0, str(e), str(path))


class DamagedCheckpoint(ValueError):
    """A model directory or checkpoint whose files are missing, truncated or altered: one line
    naming the file."""


def expected_digests(directory: Path) -> dict[str, dict] | None:
    """The checksums recorded in a directory: a checkpoint's trainer_state.json, else a model
    directory's checksums.json; None for a directory written before checksums (nothing to check)."""
    for name, key in ((STATE, "files"), (CHECKSUMS, None)):
        path = directory / name
        if path.is_file():
            try:
                recorded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise DamagedCheckpoint(f"{path}: damaged (not readable JSON)") from None
            recorded = recorded.get(key) if key else recorded
            if recorded:
                return recorded
    return None


def verify(directory: str | os.PathLike, names=None) -> None:
    """Check the files of a model directory or checkpoint (all, or `names`) against their
    recorded SHA-256 and size; raise DamagedCheckpoint naming the first that differs."""
    directory = Path(directory)
    expected = expected_digests(directory)
    if expected is None:
        return
    for name, want in expected.items():
        if names is not None and name not in names:
            continue
        path = directory / name
        if not path.is_file():
            raise DamagedCheckpoint(f"{path}: missing (the checkpoint is incomplete)")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise DamagedCheckpoint(f"{path}: damaged ({size:,} bytes, {want['bytes']:,} written: truncated?)")
        if file_digest(path)["sha256"] != want["sha256"]:
            raise DamagedCheckpoint(f"{path}: damaged (its SHA-256 differs from the one written with it)")
