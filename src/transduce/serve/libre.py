"""A LibreTranslate-compatible API beside the native one, for the clients written for that de-facto
standard of self-hosted translation: `POST /translate` (a request that carries a field of
LibreTranslate's: q, source, target, format, alternatives, api_key or apiKey; any other is the
native API's), `GET /languages`, `POST /detect`, `GET /frontend/settings`, `GET /health`, and the
same under /libretranslate/. This layer maps shapes only: LibreTranslate's fields into sentences
and search settings, the candidates into its answer, a `common.Problem` into its error (its
app.py's fields, messages and status codes); the body (`serve.fields`), the key, the limits, which
engine decodes and the waiting are the server's plumbing (`serve.common`), the native API's too.
What differs from LibreTranslate: docs/serve.md.

The model was trained on sentence pairs (Section 5.1): a text is translated a sentence at a time
(`split_sentences`, as DeepL spells it: "1" by default, "0", "nonewlines"), its whitespace and line
breaks kept, and HTML (`format: "html"`) a sentence at a time with its inline tags placed by the
engine's alignment, its markup kept as it was sent (`serve.splitting`).
"""

from dataclasses import replace

from starlette.responses import JSONResponse

from ..decoding.settings import SearchSettings
from ..documents import installed_formats
from .common import Limits, Problem, Server, languages, name, scrub
from .fields import Fields, read_fields
from .splitting import decode_texts, mode_of, source_language, translate_html

PREFIX = "/libretranslate"  # the same routes again, for a client given a base URL of their own
# LibreTranslate's /translate fields, and the npm client's spelling of the key
FIELDS = frozenset(("q", "source", "target", "format", "alternatives", "api_key", "apiKey"))

# LibreTranslate's own messages, which clients may show or match
MISSING = "Invalid request: missing {} parameter"
TOO_LONG = "Invalid request: request ({}) exceeds text limit ({})"
NEED_KEY = "Please contact the server operator to get an API key"
BAD_KEY = "Invalid API key"


def fail(status: int, message: str, headers: dict | None = None):
    """An error as LibreTranslate answers it: {"error": MESSAGE} (no path of the server's in it)."""
    return JSONResponse({"error": scrub(message)}, status_code=status, headers=headers)


def render(problem: Problem):
    """The server's `Problem` as LibreTranslate answers it: a request it refuses is its 400
    ("Invalid request: ..."), a full queue its 429 ("Slowdown: ..."), a decoding failure its 500
    ("Cannot translate text: ..."); 503 and Retry-After as they are."""
    status, message = problem.status, problem.message
    if problem.code in ("invalid_request", "limit_exceeded"):
        status, message = 400, f"Invalid request: {message}"
    elif problem.code == "unsupported_language":
        status = 400
    elif status == 429:
        message = f"Slowdown: {message}"
    elif status == 500:
        message = f"Cannot translate text: {message}"
    kept = {k: v for k, v in (problem.headers or {}).items() if k.lower() in ("retry-after", "connection")}
    return fail(status, message, kept or None)


def is_libretranslate(fields: Fields) -> bool:
    """Whether a request carries a field of LibreTranslate's /translate (none is the native API's):
    a key of its JSON object, else a field of its form body or its query string."""
    return bool(FIELDS.intersection(fields.keys()))


def check_fields(fields: Fields, server: Server, given: list, *required: str):
    """None, or LibreTranslate's answer to fields it cannot read (a JSON body that is not an
    object: 400), to a request without the server's key (400) or with another (403), to a
    `required` field missing. The key comes as api_key, apiKey or in the native API's headers."""
    if fields.json and not isinstance(fields.value, dict):
        return fail(400, "Invalid JSON format")
    if fields.problem is not None:
        return render(fields.problem)
    values = fields.value
    verdict = server.key_problem([*given, *(values.get(k) for k in ("api_key", "apiKey"))])
    if verdict is not None:
        return fail(400, NEED_KEY) if verdict == "missing" else fail(403, BAD_KEY)
    for field in required:
        if not values.get(field):
            return fail(400, MISSING.format(field))
    return None


def check_texts(q, from_json: bool, limits: Limits):
    """(the texts, whether q was a list, None) or (None, False, the 400): q a string or a list of
    strings, at most max_sentences of them, their characters summed at most max_chars (as
    LibreTranslate's batch and char limits). A form's line endings become \\n, as LibreTranslate makes them."""
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        return None, False, fail(400, "Invalid request: q must be a string or a list of strings")
    if not from_json:  # a browser's form sends \r\n
        texts = [t.replace("\r\n", "\n") for t in texts]
    if batch and len(texts) > limits.max_sentences:
        return None, False, fail(400, TOO_LONG.format(len(texts), limits.max_sentences))
    chars = sum(len(t) for t in texts)
    if chars > limits.max_chars:
        return None, False, fail(400, TOO_LONG.format(chars, limits.max_chars))
    return texts, batch, None


def search_for(fields: dict, fmt: str, defaults: SearchSettings, limits: Limits):
    """(the search settings, whether alternatives were asked for, None) or (None, False, the 400):
    the server's defaults, with a beam of at least alternatives + 1 and that n-best for that many
    alternatives (none for HTML, as LibreTranslate gives none)."""
    try:
        alternatives = max(0, int(fields.get("alternatives") or 0))
    except (TypeError, ValueError, OverflowError):
        return None, False, fail(400, "Invalid request: alternatives parameter is not a number")
    if alternatives > limits.max_beam - 1:
        return None, False, fail(400, f"Invalid request: alternatives parameter must be <= {limits.max_beam - 1}")
    n = 1 if fmt == "html" or defaults.greedy else alternatives + 1
    return (replace(defaults, beam=max(defaults.beam, n), n_best=n) if n > 1 else defaults), alternatives > 0, None


def unique(items: list[str], best: str) -> list[str]:
    """Alternatives as LibreTranslate gives them: in order, each once, none empty or the translation."""
    seen, out = {best, ""}, []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


# -- the routes -------------------------------------------------------------------------------------


async def translate(server: Server, request, fields: Fields, given: list):
    """POST /translate: LibreTranslate's checks in its order (the key, the fields, alternatives,
    the batch and char limits, the language pair, the format), then the texts decoded, every
    sentence of every text as one job."""
    if (problem := check_fields(fields, server, given, "q", "source", "target")) is not None:
        return problem
    values = fields.value
    if not all(isinstance(values.get(k) or "", str) for k in ("source", "target", "format")):
        return fail(400, "Invalid request: source, target and format must be strings")
    fmt = values.get("format") or "text"
    search, asked, problem = search_for(values, fmt, server.defaults, server.limits)
    if problem is None:
        texts, batch, problem = check_texts(values["q"], fields.json, server.limits)
    if problem is not None:
        return problem
    try:
        mode = mode_of(values.get("split_sentences"), "on")
    except ValueError as e:
        return fail(400, f"Invalid request: {e}")
    try:
        engine, batcher = server.lookup(values["source"], values["target"], texts)
        if fmt not in ("text", "html"):
            return fail(400, f"{fmt} format is not supported")
        lang = source_language(engine, values["source"])
        if fmt == "html":
            answer = [
                (doc, []) for doc in await translate_html(server, engine, batcher, texts, lang, mode, search, request)
            ]
        else:
            candidates = await decode_texts(server, engine, batcher, texts, lang, mode, search, request)
            answer = [(cands[0].text, unique([c.text for c in cands[1:]], cands[0].text)) for cands in candidates]
    except Problem as p:
        return render(p)
    result: dict = {"translatedText": [a[0] for a in answer] if batch else answer[0][0]}
    pair = languages(engine)
    if values["source"].lower() == "auto" and pair is not None:
        detected = {"confidence": engine.info.get("confidence", 100.0), "language": pair[0]}
        result["detectedLanguage"] = [detected] * len(answer) if batch else detected
    if engine.info.get("pivot"):  # no model for the pair: two, through this language
        result["pivot"] = engine.info["pivot"]
    if asked:
        result["alternatives"] = [a[1] for a in answer] if batch else answer[0][1]
    return JSONResponse(result)  # as it is: POST /translate's response model is the native API's


async def languages_route(server: Server):
    """GET /languages: the model's source language with its one target, and the target (several
    models: every source with all its targets)."""
    try:
        engine, _ = server.lookup()
    except Problem as p:
        return render(p)
    if engine.models is not None:
        return engine.models.languages()
    pair = languages(engine)
    if pair is None:
        return []
    src, tgt = pair
    return [{"code": src, "name": name(src), "targets": [tgt]}] + (
        [{"code": tgt, "name": name(tgt), "targets": []}] if tgt.lower() != src.lower() else []
    )


async def detect(server: Server, request, given: list):
    """POST /detect: the model's source language (several models: their sources, ranked by the
    detector, `serve.catalog.Detector`)."""
    fields = await read_fields(request)
    if (problem := check_fields(fields, server, given, "q")) is not None:
        return problem
    try:
        engine, _ = server.lookup()
        if engine.models is not None:
            q = fields.value["q"]
            return [
                {"confidence": c, "language": lang}
                for lang, c in engine.models.detect(" ".join(q) if isinstance(q, list) else str(q))
            ]
    except Problem as p:
        return render(p)
    pair = languages(engine)
    return [] if pair is None else [{"confidence": 100.0, "language": pair[0]}]


async def settings(server: Server):
    """GET /frontend/settings: what LibreTranslate's own page (and clients that ask) learn of a
    server, for this one: its character limit, whether it wants a key, no files and no
    suggestions, its language pair."""
    try:
        engine, _ = server.lookup()
    except Problem as p:
        return render(p)
    pair = languages(engine)
    key = server.api_key is not None
    files = installed_formats(upload=True)  # serve.documents translates them
    answer = {
        "charLimit": server.limits.max_chars,
        "frontendTimeout": 500,
        "apiKeys": key,
        "keyRequired": key,
        "suggestions": False,
        "filesTranslation": bool(files),
        "supportedFilesFormat": files,
    }
    if pair is not None:
        answer["language"] = {
            side: {"code": code, "name": name(code)} for side, code in zip(("source", "target"), pair)
        }
    return answer


def add_libre_routes(app, server: Server, keys) -> None:
    """POST PREFIX/translate (POST /translate is the native route's, which hands LibreTranslate's
    requests to `translate`), GET /languages, POST /detect and GET /frontend/settings, and the last
    three under PREFIX too; kept out of the OpenAPI document, the native API's. `keys`: the
    dependency that reads the headers' keys (`ops.key_reader`)."""
    from fastapi import Depends, Request

    async def translate_route(request: Request, given: list = Depends(keys)):
        return await translate(server, request, await read_fields(request), given)

    async def detect_route(request: Request, given: list = Depends(keys)):
        return await detect(server, request, given)

    async def languages_get():
        return await languages_route(server)

    async def settings_get():
        return await settings(server)

    app.add_api_route(PREFIX + "/translate", translate_route, methods=["POST"], include_in_schema=False)
    for prefix in ("", PREFIX):
        app.add_api_route(prefix + "/languages", languages_get, methods=["GET"], include_in_schema=False)
        app.add_api_route(prefix + "/detect", detect_route, methods=["POST"], include_in_schema=False)
        app.add_api_route(prefix + "/frontend/settings", settings_get, methods=["GET"], include_in_schema=False)
