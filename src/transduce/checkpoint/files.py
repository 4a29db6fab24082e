"""The files of a model directory or checkpoint: their names, atomic writes (a temporary name,
fsync, `os.replace`), and checksums (`verify`). The commands' output files go through
`AtomicOutput`, which treats a name as the shell's `>` does (`output_target`)."""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import threading
from pathlib import Path
from typing import BinaryIO

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
METADATA = {"format": "pt", "transduce": str(FORMAT)}  # in every safetensors file written


IN_PLACE = ("/dev/", "/proc/")
"""Names under these are written in place, whatever they resolve to: /dev/stdout, /dev/fd/N and
/proc/self/fd/N stand for an open file (perhaps a pipe, or a file the shell appends to)."""


def _error(code: int, path: str | os.PathLike) -> OSError:
    return OSError(code, os.strerror(code), str(path))


def output_target(path: str | os.PathLike) -> Path | None:
    """Where an output file named `path` is written, as the shell's `>` would write it: the
    regular file to replace atomically (a symlink followed to its target, dangling or not), or
    None for a name to write in place, streaming (a FIFO, a device, anything under /dev or /proc).
    Raises OSError naming `path` (never a temporary name) where it cannot be written."""
    name = str(path)
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        st = None
    except OSError as e:  # a component that is a file, a symlink loop, no permission to look
        raise _error(e.errno, name) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _error(errno.EISDIR, name)
    if st is not None and (not stat.S_ISREG(st.st_mode) or os.path.abspath(name).startswith(IN_PLACE)):
        if not os.access(path, os.W_OK):
            raise _error(errno.EACCES, name)
        return None
    target = Path(os.path.realpath(path))
    _check_parent(target.parent, name)  # the temporary file is made beside the target
    if st is not None and not os.access(path, os.W_OK):  # as `>` refuses a read-only file
        raise _error(errno.EACCES, name)
    return target


def _check_parent(parent: Path, name: str) -> None:
    """Raise OSError naming `name` unless a new file can be made in the directory `parent`."""
    if not parent.is_dir():
        raise _error(errno.ENOTDIR if parent.exists() else errno.ENOENT, name)
    if not os.access(parent, os.W_OK | os.X_OK):
        read_only = hasattr(os, "statvfs") and os.statvfs(parent).f_flag & os.ST_RDONLY
        raise _error(errno.EROFS if read_only else errno.EACCES, name)


def check_output(path: str | os.PathLike | None) -> None:
    """Before the work: raise OSError naming `path` if it cannot be an output file ("-" passes)."""
    if path is not None and str(path) != "-":
        output_target(path)


class AtomicOutput:
    """An output file written whole or not at all: a temporary file beside the target
    (`output_target`), renamed into place by `commit()`, removed by `discard()`. A name that is
    not a regular file is written in place. gzip if the name ends in .gz. Every OSError names the
    user's path, not the temporary one."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.target = output_target(self.path)
        self.tmp = None if self.target is None else self.target.with_name(f".{self.target.name}.tmp-{os.getpid()}")
        self._raw = raw = self._do(open, self.tmp or self.path, "wb")
        self.f: BinaryIO = (
            gzip.GzipFile(fileobj=raw, mode="wb", filename="", mtime=0) if self.path.name.endswith(".gz") else raw
        )

    def _do(self, fn, *args):
        """fn(*args), an OSError made to name the user's path."""
        try:
            return fn(*args)
        except OSError as e:
            raise _error(e.errno, self.path) if e.errno else e from None

    def write(self, data: bytes) -> None:
        self._do(self.f.write, data)

    def commit(self, sync: bool = False) -> None:
        """Close, and (a regular file) rename into place; `sync`: fsync before the rename."""
        if self.f is not self._raw:
            self._do(self.f.close)  # the gzip trailer
        if sync and self.tmp is not None:
            self._do(self._raw.flush)
            self._do(os.fsync, self._raw.fileno())
        self._do(self._raw.close)
        if self.tmp is not None:
            with contextlib.suppress(OSError):  # keep the mode of the file replaced
                os.chmod(self.tmp, stat.S_IMODE(os.stat(self.target).st_mode))
            self._do(os.replace, self.tmp, self.target)

    def discard(self) -> None:
        """Remove the temporary file (a name written in place keeps what was written)."""
        with contextlib.suppress(OSError):
            self.f.close()
            self._raw.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` whole or not at all, fsync'ed (`AtomicOutput`)."""
    out = AtomicOutput(path)
    try:
        out.write(text.encode("utf-8"))
        out.commit(sync=True)
    except BaseException:
        out.discard()
        raise


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike):
    """A directory written whole or not at all: yields a hidden temporary directory beside `out`,
    which replaces `out` when the block ends without an error (removed on an error). Raises
    OSError naming `out` where it cannot be made."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise _error(errno.ENOTDIR, out)
    _check_parent(out.absolute().parent, str(out))
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_dir(tmp)
        replace_dir(tmp, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(tmp: Path, out: Path) -> None:
    """Rename the finished directory `tmp` to `out`, replacing an existing `out`."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (where directories can be opened)."""
    with contextlib.suppress(OSError):  # e.g. Windows: directories cannot be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def synced(path: str | os.PathLike) -> None:
    """fsync a file just written and give it the permissions the umask allows (safetensors creates
    files 0600)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write tensors as a safetensors file, fsync'ed and readable (into a temporary directory)."""
    save_file(tensors, str(path), metadata=METADATA)
    synced(path)


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
    """The OSError a safetensors write error ("... (os error 28)") stands for."""
    m = re.search(r"os error (\d+)", str(e))
    return _error(int(m.group(1)), path) if m else OSError(0, str(e), str(path))


class DamagedCheckpoint(ValueError):
    """A model directory or checkpoint whose files are missing, truncated or altered."""


def expected_digests(directory: Path) -> dict[str, dict] | None:
    """The checksums in a checkpoint's trainer_state.json, else checksums.json; None if neither."""
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
    """Raise DamagedCheckpoint naming the first file (of all, or `names`) that is not as recorded."""
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


@contextlib.contextmanager
def verifying(directory: str | os.PathLike, names=None):
    """`verify` in a thread while the body reads the files (hashing a model's weights took as long as
    quantizing them): DamagedCheckpoint is raised as the body ends, or in place of the body's own
    error where a file is damaged (a truncated file's read fails first)."""
    errors: list[BaseException] = []

    def check() -> None:
        try:
            verify(directory, names)
        except BaseException as e:  # raised in the caller's thread
            errors.append(e)

    thread = threading.Thread(target=check, name="transduce-verify", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        thread.join()
        if errors:
            raise errors[0] from None
        raise
    thread.join()
    if errors:
        raise errors[0]
