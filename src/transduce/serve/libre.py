"""A LibreTranslate-compatible API beside the native one, for the clients written for that de-facto
standard of self-hosted translation: `POST /translate` (a request that carries a field of
LibreTranslate's: q, source, target, format, alternatives, api_key; any other is the native
API's), `GET /languages`, `POST /detect`, `GET /frontend/settings`, and the same under
/libretranslate/. Their fields, answers, error messages and status codes are LibreTranslate's (its
app.py); the requests are decoded by the server's own batcher and engine, within its limits,
behind its API key. What differs from LibreTranslate: docs/serve.md.

The model was trained on sentence pairs (Section 5.1): a text is translated line by line, and HTML
(`format: "html"`) text node by text node, its markup kept as it was sent.
"""

import hmac
import json
import math
from dataclasses import dataclass, replace
from html import escape
from html.parser import HTMLParser
from urllib.parse import parse_qsl

from .common import Limits, is_json, run_job, unavailable
from .backend import Search, scrub

PREFIX = "/libretranslate"  # the same routes again, for a client given a base URL of their own
FORM = "application/x-www-form-urlencoded"
FIELDS = frozenset(("q", "source", "target", "format", "alternatives", "api_key"))  # LibreTranslate's /translate

# English names of ISO 639-1 codes, for /languages (a code not here is named by itself)
NAMES = {
    "af": "Afrikaans", "ar": "Arabic", "az": "Azerbaijani", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan",
    "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English", "eo": "Esperanto",
    "es": "Spanish", "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish", "fr": "French",
    "ga": "Irish", "gl": "Galician", "gu": "Gujarati", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian",
    "hu": "Hungarian", "id": "Indonesian", "is": "Icelandic", "it": "Italian", "ja": "Japanese", "kk": "Kazakh",
    "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "ms": "Malay", "nb": "Norwegian", "nl": "Dutch",
    "pl": "Polish", "ps": "Pashto", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak",
    "sl": "Slovenian", "sq": "Albanian", "sr": "Serbian", "sv": "Swedish", "ta": "Tamil", "th": "Thai",
    "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese", "zh": "Chinese",
}

# LibreTranslate's own messages, which clients may show or match
MISSING = "Invalid request: missing {} parameter"
TOO_LONG = "Invalid request: request ({}) exceeds text limit ({})"
NEED_KEY = "Please contact the server operator to get an API key"
BAD_KEY = "Invalid API key"


def fail(status: int, message: str, headers: dict | None = None):
    """An error as LibreTranslate answers it: {"error": MESSAGE} (no path of the server's in it)."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": scrub(message)}, status_code=status, headers=headers)


def as_libre(response):
    """A native API's JSON error (`common.error`) as LibreTranslate's: 422 is its 400, a full queue
    its 429 ("Slowdown: ..."), a decoding failure its 500 ("Cannot translate text: ..."); 503 and
    Retry-After as they are."""
    status, message = response.status_code, json.loads(response.body)["message"]
    if status == 422:
        status, message = 400, f"Invalid request: {message}"
    elif status == 429:
        message = f"Slowdown: {message}"
    elif status == 500:
        message = f"Cannot translate text: {message}"
    kept = {k: v for k, v in response.headers.items() if k in ("retry-after", "connection")}
    return fail(status, message, kept or None)


# -- which API a POST /translate is for ------------------------------------------------------------


def is_libretranslate(scope: dict, body: bytes) -> bool:
    """Whether a request carries a field of LibreTranslate's /translate (none is the native API's):
    a key of its JSON object (a JSON body), else a field of its form body
    (application/x-www-form-urlencoded) or of its query string."""
    content_type = dict(scope.get("headers", [])).get(b"content-type", b"").decode("latin-1")
    if is_json(content_type):
        try:
            return bool(FIELDS.intersection(json.loads(body))) if body.lstrip().startswith(b"{") else False
        except ValueError:
            return False
    form = body.decode("utf-8", "replace") if content_type.split(";")[0].strip().lower() == FORM else ""
    query = scope.get("query_string", b"").decode("latin-1")
    return any(k in FIELDS for text in (query, form) for k, _ in parse_qsl(text, keep_blank_values=True))


class Dispatch:
    """ASGI middleware (inside the body-size limit, which has read the body): a POST /translate
    that carries a field of LibreTranslate's goes to PREFIX/translate; any other stays the native
    API's, untouched (its answers, its 415 for a body not sent as JSON)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/translate":
            return await self.app(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if is_libretranslate(scope, bytes(body)):
            path = PREFIX + "/translate"
            scope = {**scope, "path": path, "raw_path": path.encode()}
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# -- a request's fields -----------------------------------------------------------------------------


async def read_fields(request) -> tuple[dict | None, bool, object]:
    """(the fields, whether they came as JSON, None) or (None, False, the 400): a JSON object, or
    the query string's fields and a form body's (the query's first, as LibreTranslate reads them)."""
    body = await request.body()
    content_type = request.headers.get("content-type") or ""
    if is_json(content_type):
        try:
            fields = json.loads(body)
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            return None, False, fail(400, "Invalid JSON format")
        return fields, True, None
    media = content_type.split(";")[0].strip().lower()
    if media == "multipart/form-data":
        return None, False, fail(400, "Invalid request: multipart/form-data is not read here: send the fields as "
                                      f"JSON, as {FORM} or in the query string")
    fields: dict = {}
    try:
        form = body.decode("utf-8") if media == FORM else ""
    except UnicodeDecodeError:
        return None, False, fail(400, "Invalid request: the form body is not UTF-8")
    for text in (request.url.query, form):
        for k, v in parse_qsl(text, keep_blank_values=True):
            fields.setdefault(k, v)
    return fields, False, None


def check_key(key: str | None, fields: dict, request):
    """None, or LibreTranslate's answer to a request without the server's key (400) or with another
    (403). The key may come as `api_key` or as the native API's headers (Bearer, X-API-Key)."""
    if key is None:
        return None
    bearer = request.headers.get("authorization", "")
    given = (fields.get("api_key") or (bearer[7:].strip() if bearer[:7].lower() == "bearer " else None)
             or request.headers.get("x-api-key"))
    if not given:
        return fail(400, NEED_KEY)
    if not isinstance(given, str) or not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode()):
        return fail(403, BAD_KEY)
    return None


def model_pair(engine) -> tuple[str, str] | None:
    """(source, target) language codes the model serves, from its data.json (None: not named)."""
    languages = engine.info.get("languages") or {}
    src, tgt = languages.get("src"), languages.get("tgt")
    return (str(src), str(tgt)) if src and tgt else None


def name(code: str) -> str:
    return NAMES.get(code.lower(), code)


def check_pair(source: str, target: str, pair: tuple[str, str] | None):
    """None if the model translates `source` ("auto": its own source language) into `target`, else
    the 400 that says what it serves. A model whose data.json names no languages takes any codes."""
    if pair is None:
        return None
    src, tgt = pair
    serves = f"this server translates {name(src)} ({src}) into {name(tgt)} ({tgt})"
    if source.lower() not in ("auto", src.lower()):
        return fail(400, f"{source} is not supported: {serves}")
    if target.lower() != tgt.lower():
        return fail(400, f"{name(target)} ({target}) is not available as a target language from "
                         f"{name(src)} ({src}): {serves}")
    return None


def check_texts(q, from_json: bool, limits: Limits):
    """(the texts, whether q was a list, None) or (None, False, the 400): q a string or a list of
    strings, each within max_chars, at most max_sentences of them (LibreTranslate's char and batch
    limits). A form's line endings become \\n, as LibreTranslate makes them."""
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        return None, False, fail(400, "Invalid request: q must be a string or a list of strings")
    if not from_json:
        texts = ["\n".join(t.splitlines()) for t in texts]
    if batch and len(texts) > limits.max_sentences:
        return None, False, fail(400, TOO_LONG.format(len(texts), limits.max_sentences))
    for t in texts:
        if len(t) > limits.max_chars:
            return None, False, fail(400, TOO_LONG.format(len(t), limits.max_chars))
    return texts, batch, None


def search_for(fields: dict, fmt: str, defaults: Search, limits: Limits):
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


# -- text and HTML as sentences ---------------------------------------------------------------------

# HTML elements with no end tag, and those whose text is never translated (also: translate="no")
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
KEEP = frozenset(("script", "style", "code", "pre", "textarea", "template"))


class _TextNodes(HTMLParser):
    """The spans of an HTML document: (offset where it starts, its text if translatable, else None)."""

    def __init__(self, doc: str):
        super().__init__(convert_charrefs=True)
        self.starts = [0] + [i + 1 for i, c in enumerate(doc) if c == "\n"]  # HTMLParser counts lines by \n
        self.spans: list[tuple[int, str | None]] = []
        self.open: list[tuple[str, bool]] = []  # (tag, kept: its text and its children's left as they are)

    def _at(self, text: str | None = None) -> None:
        line, column = self.getpos()
        self.spans.append((self.starts[line - 1] + column, text))

    def handle_starttag(self, tag, attrs):
        self._at()
        if tag not in VOID:
            kept = tag in KEEP or dict(attrs).get("translate") == "no" or bool(self.open and self.open[-1][1])
            self.open.append((tag, kept))

    def handle_startendtag(self, tag, attrs):
        self._at()

    def handle_endtag(self, tag):
        self._at()
        for k in range(len(self.open) - 1, -1, -1):
            if self.open[k][0] == tag:
                del self.open[k:]
                break

    def handle_data(self, data):
        self._at(None if self.open and self.open[-1][1] else data)

    def handle_comment(self, data):
        self._at()

    handle_decl = handle_pi = unknown_decl = handle_comment


def html_layout(doc: str) -> list:
    """The document as pieces: markup and untranslated text as they were sent (str), and each text
    node with words as (its leading whitespace, its text on one line, its trailing whitespace)."""
    parser = _TextNodes(doc)
    parser.feed(doc)
    parser.close()
    ends = [start for start, _ in parser.spans[1:]] + [len(doc)]
    pieces: list = []
    text, raw = "", ""
    for (start, data), end in zip(parser.spans, ends):
        if data is not None:  # adjacent text spans ("a < b" comes in three) are one node
            text, raw = text + data, raw + doc[start:end]
            continue
        pieces += _text_node(text, raw) + [doc[start:end]]
        text, raw = "", ""
    pieces += _text_node(text, raw)
    return [p for p in pieces if p != ""]


def words(text: str) -> bool:
    """Whether a text has anything to translate: a letter or a digit (not only punctuation, symbols,
    emoji or whitespace, which are kept as they are, as LibreTranslate keeps emoji)."""
    return any(c.isalnum() for c in text)


def _text_node(text: str, raw: str) -> list:
    if not words(text):
        return [raw]
    core = text.strip()
    return [(text[: len(text) - len(text.lstrip())], " ".join(core.split()), text[len(text.rstrip()):])]


def text_layout(text: str) -> list:
    """A text as pieces: each line with words (leading whitespace, the line, trailing whitespace),
    the rest as it is."""
    pieces: list = []
    for i, line in enumerate(text.split("\n")):
        if i:
            pieces.append("\n")
        core = line.strip()
        pieces.append((line[: len(line) - len(line.lstrip())], core, line[len(line.rstrip()):]) if words(core) else line)
    return pieces


def render(pieces: list, outputs: list[str], html: bool) -> str:
    """The pieces with each sentence's translation (escaped in HTML) in its place."""
    return "".join(p if isinstance(p, str) else p[0] + (escape(outputs[p[1]], quote=False) if html else outputs[p[1]])
                   + p[2] for p in pieces)


def number_sentences(layouts: list[list]) -> list[str]:
    """The sentences of every layout, in order; each layout's sentence pieces then hold its index."""
    sentences: list[str] = []
    for pieces in layouts:
        for k, p in enumerate(pieces):
            if not isinstance(p, str):
                pieces[k] = (p[0], len(sentences), p[2])
                sentences.append(p[1])
    return sentences


def check_tokens(encode, sentences: list[str], limits: Limits):
    """(None, source tokens with EOS) or (the 400, 0): at most max_sentences sentences in all (lines
    and text nodes: the native API's bound on a request's work), each valid Unicode and within the
    server's max_tokens (`--max-input-tokens`)."""
    if len(sentences) > limits.max_sentences:
        return fail(400, f"Invalid request: {len(sentences)} sentences (lines and HTML text nodes) exceed the limit of "
                         f"{limits.max_sentences} sentences a request (max_sentences)"), 0
    tokens = 0
    for s in sentences:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return fail(400, "Invalid request: q is not valid Unicode (a lone surrogate)"), 0
        n = len(encode(s))
        if n > limits.max_tokens:
            return fail(400, f"Invalid request: a sentence of {n} subword tokens exceeds the limit of "
                             f"{limits.max_tokens} subword tokens a sentence (max_input_tokens)"), 0
        tokens += n + 1
    return None, tokens


def unique(items: list[str], best: str) -> list[str]:
    """Alternatives as LibreTranslate gives them: in order, each once, none empty or the translation."""
    seen, out = {best, ""}, []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


# -- the routes -------------------------------------------------------------------------------------


@dataclass
class Server:
    """What the routes share with the native API: its state (engine, batcher), limits, search
    defaults, API key, and how often a waiting request looks for its client's disconnect."""

    state: dict
    limits: Limits
    defaults: Search
    api_key: str | None
    poll: float


async def translate(server: Server, request):
    """POST /translate: LibreTranslate's checks in its order (the key, the fields, alternatives,
    the char and batch limits, the language pair, the format), then the texts decoded."""
    fields, from_json, problem = await read_fields(request)
    if problem is None:
        problem = check_key(server.api_key, fields, request)
    if problem is not None:
        return problem
    for field in ("q", "source", "target"):
        if not fields.get(field):
            return fail(400, MISSING.format(field))
    if not all(isinstance(fields.get(k) or "", str) for k in ("source", "target", "format")):
        return fail(400, "Invalid request: source, target and format must be strings")
    fmt = fields.get("format") or "text"
    search, asked, problem = search_for(fields, fmt, server.defaults, server.limits)
    if problem is not None:
        return problem
    texts, batch, problem = check_texts(fields["q"], from_json, server.limits)
    if problem is None and (problem := unavailable(server.state)) is not None:
        problem = as_libre(problem)
    pair = model_pair(server.state["engine"]) if problem is None else None
    if problem is None:
        problem = check_pair(fields["source"], fields["target"], pair)
    if problem is None and fmt not in ("text", "html"):
        problem = fail(400, f"{fmt} format is not supported")
    if problem is not None:
        return problem
    answer, problem = await decode(server, texts, fmt == "html", search, request)
    if problem is not None:
        return problem
    result: dict = {"translatedText": [a[0] for a in answer] if batch else answer[0][0]}
    if fields["source"].lower() == "auto" and pair is not None:
        detected = {"confidence": 100.0, "language": pair[0]}
        result["detectedLanguage"] = [detected] * len(answer) if batch else detected
    if asked:
        result["alternatives"] = [a[1] for a in answer] if batch else answer[0][1]
    return result


async def decode(server: Server, texts: list[str], html: bool, search: Search, request):
    """(per text: its translation and its alternatives, None) or (None, the error): the sentences
    of every text decoded as one job of the server's batcher."""
    state, limits = server.state, server.limits
    layouts = [html_layout(t) if html else text_layout(t) for t in texts]
    sentences = number_sentences(layouts)
    problem, tokens = check_tokens(state["engine"].encode, sentences, limits)
    if problem is not None:
        return None, problem
    request.scope.setdefault("state", {})["log_sentences"] = f"sentences={len(sentences)} tokens={tokens}"
    results: list = []
    if sentences:
        batcher = state["batcher"]
        retry_after = max(1, math.ceil(batcher.queued * batcher.max_wait))  # as the native API's
        results, problem = await run_job(lambda: batcher.submit(sentences, search, tokens), state, limits, request,
                                         server.poll, retry_after)
        if problem is not None:
            return None, as_libre(problem)
    ranked = [[c.text for c in cands] for cands in results]  # per sentence, best first
    answer = []
    for pieces in layouts:
        n = max((len(ranked[p[1]]) for p in pieces if not isinstance(p, str)), default=1)
        options = [render(pieces, [r[min(k, len(r) - 1)] for r in ranked], html) for k in range(n)]
        answer.append((options[0], unique(options[1:], options[0])))
    return answer, None


def languages(server: Server):
    """GET /languages: the model's source language with its one target, and the target."""
    if (problem := unavailable(server.state)) is not None:
        return as_libre(problem)
    pair = model_pair(server.state["engine"])
    if pair is None:
        return []
    src, tgt = pair
    return [{"code": src, "name": name(src), "targets": [tgt]}] + (
        [{"code": tgt, "name": name(tgt), "targets": []}] if tgt.lower() != src.lower() else [])


async def detect(server: Server, request):
    """POST /detect: the model's source language (the server detects none)."""
    fields, _, problem = await read_fields(request)
    if problem is None:
        problem = check_key(server.api_key, fields, request)
    if problem is None and not fields.get("q"):
        problem = fail(400, MISSING.format("q"))
    if problem is None and (problem := unavailable(server.state)) is not None:
        problem = as_libre(problem)
    if problem is not None:
        return problem
    pair = model_pair(server.state["engine"])
    return [] if pair is None else [{"confidence": 100.0, "language": pair[0]}]


def settings(server: Server):
    """GET /frontend/settings: what LibreTranslate's own page (and clients that ask) learn of a
    server, for this one: its character limit, whether it wants a key, no files and no
    suggestions, its language pair."""
    if (problem := unavailable(server.state)) is not None:
        return as_libre(problem)
    pair = model_pair(server.state["engine"])
    key = server.api_key is not None
    answer = {"charLimit": server.limits.max_chars, "frontendTimeout": 500, "apiKeys": key, "keyRequired": key,
              "suggestions": False, "filesTranslation": False, "supportedFilesFormat": []}
    if pair is not None:
        answer["language"] = {side: {"code": code, "name": name(code)} for side, code in zip(("source", "target"), pair)}
    return answer


def add_libre_routes(app, state: dict, limits: Limits, defaults: Search, api_key: str | None, poll: float) -> None:
    """POST PREFIX/translate (where `Dispatch` sends LibreTranslate's POST /translate), GET
    /languages, POST /detect and GET /frontend/settings, and the last three under PREFIX too; kept
    out of the OpenAPI document, the native API's."""
    from fastapi import Request

    server = Server(state, limits, defaults, api_key, poll)

    async def translate_route(request: Request):
        return await translate(server, request)

    async def detect_route(request: Request):
        return await detect(server, request)

    async def languages_route():
        return languages(server)

    async def settings_route():
        return settings(server)

    app.add_api_route(PREFIX + "/translate", translate_route, methods=["POST"], include_in_schema=False)
    for prefix in ("", PREFIX):
        app.add_api_route(prefix + "/languages", languages_route, methods=["GET"], include_in_schema=False)
        app.add_api_route(prefix + "/detect", detect_route, methods=["POST"], include_in_schema=False)
        app.add_api_route(prefix + "/frontend/settings", settings_route, methods=["GET"], include_in_schema=False)
