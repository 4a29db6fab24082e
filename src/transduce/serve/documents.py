"""Files, as LibreTranslate translates them: `POST /translate_file` (a multipart form: file,
source, target, api_key) answers {"translatedFileUrl": ".../download_file/ID"}, and `GET
/download_file/ID` gives the translated file as an attachment named as LibreTranslate names it
(report.docx -> report_de.docx); the same under /libretranslate/. The formats are those of
`transduce.documents`; a file's sentences are decoded as one job of the server's batcher, its tags
placed by the engine's alignment (`Engine.align`, on the decoding thread), or in proportion where
the engine has none (`serve.splitting`). The translated files wait in a directory of their own, each for `ttl` seconds
(LibreTranslate's 30 minutes), at most `max_files` of them and `max_bytes` in all, the oldest
going first. What differs from LibreTranslate: docs/serve.md, "Documents"."""

import asyncio
import mimetypes
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import replace
from pathlib import Path

from .common import Problem, Server
from .libre import BAD_KEY, MISSING, NEED_KEY, PREFIX, fail, render
from .splitting import decode_job, off_loop, source_language

MAX_FILE_SENTENCES = 10_000
"""Sentences a file may hold (a request of the native API: `Limits.max_sentences`)."""

_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[A-Za-z0-9_][A-Za-z0-9._-]{0,200}")


class Downloads:
    """The translated files waiting to be downloaded: a directory (a temporary one, removed with
    this object, unless given), each file kept `ttl` seconds, at most `max_files` files and
    `max_bytes` bytes in all (the oldest go first to make room)."""

    def __init__(
        self,
        directory: str | os.PathLike | None = None,
        *,
        ttl: float = 1800.0,
        max_files: int = 100,
        max_bytes: int = 256 << 20,
    ):
        if directory is None:
            directory = tempfile.mkdtemp(prefix="transduce-files-")
            weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ttl, self.max_files, self.max_bytes = ttl, max_files, max_bytes
        self._lock = threading.Lock()

    def put(self, name: str, data: bytes) -> str:
        """Keep `data` for download as `name`: its id (a UUID, then the name made safe)."""
        if len(data) > self.max_bytes:
            raise Problem(
                413,
                "limit_exceeded",
                f"the translated file ({len(data)} bytes) is larger than the "
                f"{self.max_bytes} bytes the server keeps for download",
            )
        ident = f"{uuid.uuid4()}.{safe_name(name)}"
        with self._lock:
            files = self._files()
            while files and (len(files) >= self.max_files or sum(f[2] for f in files) + len(data) > self.max_bytes):
                files.pop(0)[0].unlink(missing_ok=True)
            tmp = self.directory / f".{ident}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, self.directory / ident)
        return ident

    def get(self, ident: str) -> Path | None:
        """The file of `ident`, if it is still kept."""
        with self._lock:
            self._files()
        path = self.directory / ident
        return path if _ID.fullmatch(ident) and path.is_file() else None

    def _files(self) -> list[tuple[Path, float, int]]:
        """(path, modification time, size) of the files kept, oldest first, the expired removed."""
        now, kept = time.time(), []
        for entry in os.scandir(self.directory):
            if not entry.is_file() or not _ID.fullmatch(entry.name):
                continue
            st = entry.stat()
            if now - st.st_mtime > self.ttl:
                Path(entry.path).unlink(missing_ok=True)
            else:
                kept.append((Path(entry.path), st.st_mtime, st.st_size))
        return sorted(kept, key=lambda f: f[1])


def safe_name(name: str) -> str:
    """A file name with only letters, digits, '.', '_' and '-' (as werkzeug's secure_filename)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name.replace("\\", "/")).name).strip("._")
    return name[-200:] or "file"


def translated_name(name: str, target: str) -> str:
    """LibreTranslate's name of a translated file: report.docx -> report_de.docx."""
    path = Path(safe_name(name))
    return f"{path.stem}_{safe_name(target)}{path.suffix}"


async def translate_file(server: Server, downloads: Downloads, request, given: list):
    """POST /translate_file: LibreTranslate's checks in its order (the fields, the file name and
    format, the languages), then the file read, its sentences decoded as one job, and written."""
    from starlette.datastructures import UploadFile

    from ..documents import DocumentError, format_of, installed_formats, read
    from ..text.markup import plan

    formats = installed_formats(upload=True)
    if not formats:
        return fail(403, "Files translation are disabled on this server: pip install 'transduce[documents]'")
    form = await request.form()
    verdict = server.key_problem([*given, form.get("api_key"), form.get("apiKey")])
    if verdict is not None:
        return fail(400, NEED_KEY) if verdict == "missing" else fail(403, BAD_KEY)
    upload = form.get("file")
    for field, value in (("file", upload), ("source", form.get("source")), ("target", form.get("target"))):
        if not value:
            return fail(400, MISSING.format(field))
    if not isinstance(upload, UploadFile) or not upload.filename:
        return fail(400, "Invalid request: empty file")
    source, target = str(form["source"]), str(form["target"])
    try:
        fmt = format_of(upload.filename)
    except DocumentError:
        fmt = None
    if fmt not in formats:
        return fail(400, "Invalid request: file format not supported")
    try:
        auto = source.lower() == "auto"  # detected over the file's text, once it is read
        engine, batcher = server.lookup(source, target) if not auto else (None, None)
        doc = await asyncio.to_thread(read, await upload.read(), fmt, safe_name(upload.filename))
        if auto:
            engine, batcher = server.lookup(source, target, doc.segments)
        job = await off_loop(plan, doc.segments, source_language(engine, source), html=doc.html)
        files = replace(server, limits=replace(server.limits, max_sentences=MAX_FILE_SENTENCES))
        outputs, links = await decode_job(
            server,
            engine,
            batcher,
            job,
            replace(server.defaults, n_best=1),
            request,
            counter=files,
            where=lambda i: f"the file's sentence {i + 1}",
        )
        doc.fill(await off_loop(job.render, outputs, links))
        data = await asyncio.to_thread(doc.save)
        ident = downloads.put(translated_name(upload.filename, target), data)
    except DocumentError as e:
        return fail(400, f"Invalid request: {e}")
    except Problem as p:
        return render(p)
    base = request.url.path[: -len("translate_file")]
    return {"translatedFileUrl": f"{str(request.base_url).rstrip('/')}{base}download_file/{ident}"}


def download_file(downloads: Downloads, ident: str):
    """GET /download_file/ID: the file, as an attachment named as it was translated."""
    from fastapi.responses import FileResponse

    if not _ID.fullmatch(ident):
        return fail(400, "Invalid filename")
    path = downloads.get(ident)
    if path is None:
        kept = f"{downloads.ttl / 60:g} minutes"
        return fail(404, f"Invalid request: no such file (a translated file is kept for {kept})")
    name = ident.split(".", 1)[1]
    return FileResponse(path, filename=name, media_type=mimetypes.guess_type(name)[0] or "application/octet-stream")


def add_document_routes(app, server: Server, keys, downloads: Downloads | None = None) -> Downloads:
    """POST /translate_file and GET /download_file/ID, and both under /libretranslate/; kept out of
    the OpenAPI document, as the LibreTranslate API's other routes. `keys`: the dependency that
    reads the headers' keys (`ops.key_reader`). Returns the downloads' store."""
    from fastapi import Depends, Request

    downloads = downloads or Downloads()

    async def translate_route(request: Request, given: list = Depends(keys)):
        return await translate_file(server, downloads, request, given)

    async def download_route(ident: str):
        return download_file(downloads, ident)

    for prefix in ("", PREFIX):
        app.add_api_route(prefix + "/translate_file", translate_route, methods=["POST"], include_in_schema=False)
        app.add_api_route(prefix + "/download_file/{ident}", download_route, methods=["GET"], include_in_schema=False)
    return downloads
