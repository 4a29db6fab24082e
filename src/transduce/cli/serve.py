"""`transduce serve`: a trained model behind an HTTP JSON API (`transduce.serve.app`), requests
batched dynamically; the endpoints, limits, API key, shutdown and logs: docs/serve.md. Several
models behind one server: `cli.serve_models`."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from pathlib import Path

from ..errors import TransduceError, UsageError
from ..extras import require
from ..parsing import parse
from .common import check_search_args, fill_decoding_defaults, library_length_penalty, load_from_args, model_metadata
from ..defaults import (
    ALPHA,
    BATCH_SIZE,
    BEAM,
    MAX_LEN_OFFSET,
    PARSE_ALPHA,
    PARSE_BEAM,
    PARSE_MAX_LEN_OFFSET,
    SERVE_GRACEFUL_TIMEOUT,
    SERVE_MAX_BEAM,
    SERVE_MAX_BODY_BYTES,
    SERVE_MAX_CHARS,
    SERVE_MAX_LEN_OFFSET,
    SERVE_MAX_QUEUE,
    SERVE_MAX_SENTENCES,
    SERVE_MAX_TOKENS,
    SERVE_MAX_WAIT,
)
from .options import add_batch_args, add_hardware_args, add_model_args, add_search_args, epilog
from .serve_models import open_set, several

DESCRIPTION = """\
Serve MODEL (several: each on demand) over HTTP: a JSON API, LibreTranslate's, a
demo page; requests batched; SIGTERM drains what is in flight.
details: transduce docs serve"""
EPILOG = epilog(
    "transduce serve runs/multi30k-en-de                 # http://127.0.0.1:8000",
    "transduce serve models/ --max-memory 2G --pivot en   # every model in models/",
    "transduce serve m30k-ct2 --engine ct2",
)
PROG = "transduce serve"


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument(
        "model_path", type=Path, nargs="+", metavar="MODEL", help="run or model dirs, or a dir of them (ct2: an export)"
    )
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, printed)")
    g.add_argument(
        "--engine", choices=("torch", "ct2"), default="torch", metavar="E", help="torch or ct2 (default torch)"
    )
    g.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        metavar="L",
        help="critical ... debug (default info: a line a request)",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("TRANSDUCE_API_KEY") or None,
        metavar="KEY",
        help="required on the API (default $TRANSDUCE_API_KEY)",
    )
    g.add_argument(
        "--cors-origin", action="append", default=[], metavar="URL", help="a site whose pages may call the API (*: any)"
    )
    g.add_argument(
        "--graceful-timeout",
        type=float,
        default=SERVE_GRACEFUL_TIMEOUT,
        metavar="S",
        help=f"SIGTERM: finish requests for S s (default {SERVE_GRACEFUL_TIMEOUT:g})",
    )
    g.add_argument("--max-memory", metavar="SIZE", help="memory of the models loaded at once (e.g. 2G)")
    g.add_argument("--pivot", metavar="LANG", help="a pair no model serves: through LANG (e.g. en)")
    g = parser.add_argument_group("model and search defaults (a request may override them)")
    add_model_args(g)
    add_search_args(
        g,
        beam=None,
        alpha=None,
        max_len_offset=None,
        greedy=False,
        note=(
            f"{BEAM}; parser {PARSE_BEAM}",
            f"{ALPHA}; parser {PARSE_ALPHA}",
            f"{MAX_LEN_OFFSET}; parser {PARSE_MAX_LEN_OFFSET}",
        ),
    )
    add_hardware_args(g)
    g.add_argument(
        "--ct2-compute-type", default="default", metavar="TYPE", help="ct2: its precision (default: exported)"
    )
    g = parser.add_argument_group("batching and limits (beyond them a request is refused)")
    add_batch_args(g, batch_size=BATCH_SIZE)
    g.add_argument(
        "--max-wait-ms",
        type=float,
        default=SERVE_MAX_WAIT * 1000,
        metavar="MS",
        help=f"the first request waits for others (default {SERVE_MAX_WAIT * 1000:g})",
    )
    g.add_argument("--no-batching", action="store_true", help="decode each request on its own")
    for flags, default, what in (
        (["--max-body-bytes"], SERVE_MAX_BODY_BYTES, "request size"),
        (["--max-sentences"], SERVE_MAX_SENTENCES, "sentences per request"),
        (["--max-chars"], SERVE_MAX_CHARS, "characters per sentence"),
        (["--max-input-tokens"], SERVE_MAX_TOKENS, "subword tokens a sentence, never cut"),
        (["--max-queue"], SERVE_MAX_QUEUE, "requests waiting"),
    ):
        g.add_argument(*flags, type=int, default=default, metavar="N", help=f"{what} (default {default})")
    g.add_argument(
        "--max-beam", type=int, metavar="K", help=f"largest beam asked for (default {SERVE_MAX_BEAM} or --beam)"
    )
    g.add_argument(
        "--max-len-offset-limit",
        type=int,
        metavar="N",
        help=f"largest max_len_offset (default {SERVE_MAX_LEN_OFFSET} or more)",
    )


def resolve_defaults(args: argparse.Namespace) -> None:
    """Search defaults not given: the paper's for the model's task (6.1, or 6.3 for a parser); the
    limits on beam and max_len_offset at least as large as them."""
    try:  # a data.json that cannot be read is the loader's to report
        first = args.model_path[0] if isinstance(args.model_path, list) else args.model_path  # as parsed, a list
        parsing = args.engine == "torch" and parse.is_parsing_model(model_metadata(first))
    except (OSError, ValueError, AttributeError):
        parsing = False
    model_defaults(args, first, parsing)
    fill_decoding_defaults(args, parsing)
    if args.max_beam is None:
        args.max_beam = max(SERVE_MAX_BEAM, args.beam)
    if args.max_len_offset_limit is None:
        args.max_len_offset_limit = max(SERVE_MAX_LEN_OFFSET, args.max_len_offset)


def model_defaults(args: argparse.Namespace, path, parsing: bool) -> None:
    """One model served by the torch engine, imported with its own generation settings: the search
    `generate` runs by default (beam, length penalty), each where its flag is not given, as
    `translate` decodes it (`common.fill_model_search_defaults`)."""
    from ..checkpoint.generation import find_generation

    several = isinstance(args.model_path, list) and len(args.model_path) > 1
    if args.engine != "torch" or parsing or several or not Path(path).is_dir():
        return
    own = find_generation([Path(path), Path(path).parent, Path(path).parent.parent])
    if own is None:
        return
    search = own.search()
    if args.beam is None:
        args.beam = search["beam"]  # 1: greedy, as generate's num_beams 1
    if args.alpha is None and args.length_penalty == "gnmt":  # --length-penalty not given
        args.length_penalty, args.alpha = search["length_penalty"], search["alpha"]


def limits_from_args(args: argparse.Namespace):
    from ..serve.common import Limits

    limits = Limits(
        args.max_body_bytes,
        args.max_sentences,
        args.max_chars,
        args.max_input_tokens,
        args.max_queue,
        args.max_beam,
        args.max_len_offset_limit,
    )
    for name, value in vars(limits).items():
        if value < 1:
            flag = "max_input_tokens" if name == "max_tokens" else name  # the Limits field's flag
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
    check_search_args(args, "batch_tokens", "batch_size")
    from .translate import ENGINE_PENALTIES  # the formulas each engine decodes with, as translate's

    args.penalty = library_length_penalty(args, f"--engine {args.engine}", ENGINE_PENALTIES[args.engine])
    if args.beam > limits.max_beam:
        raise ValueError(f"--beam must be between 1 and --max-beam ({limits.max_beam})")
    if args.max_len_offset > limits.max_len_offset:
        raise ValueError(f"--max-len-offset must be between 0 and --max-len-offset-limit ({limits.max_len_offset})")
    for flag, value, scale in (
        ("--max-wait-ms", args.max_wait_ms, 1000),
        ("--graceful-timeout", args.graceful_timeout, 1),
    ):
        # a wait that can end: not NaN, not infinite, not past what Python can wait for (an error at shutdown)
        if not 0 <= value <= threading.TIMEOUT_MAX * scale:
            raise ValueError(
                f"{flag} must be a finite number >= 0 (at most {threading.TIMEOUT_MAX * scale:.0f}), not {value}"
            )
    return limits


def engine_loader(args: argparse.Namespace, limits):
    """A function that loads the engine the flags choose (run on a thread once the server is up)."""
    from ..serve.app import ct2_engine, torch_engine

    def load():
        if getattr(args, "models", None) is not None:  # several: each loaded when a request first needs it
            print(
                f"{PROG}: {len(args.models.models)} models ({', '.join(args.models.models)}), loaded on demand",
                flush=True,
            )
            return args.models.engine()
        if args.engine == "ct2":
            from ..decoding.engines import load_ct2

            model = load_ct2(
                args.model_path, device=args.device, compute_type=args.ct2_compute_type, threads=args.threads or 0
            )
            engine = ct2_engine(
                model, batch_tokens=args.batch_tokens, batch_size=args.batch_size, max_tokens=limits.max_tokens
            )
        else:
            loaded = load_from_args(args)
            engine = torch_engine(
                loaded,
                batch_tokens=args.batch_tokens,
                batch_size=args.batch_size,
                max_tokens=limits.max_tokens,
                bf16=args.bf16,
            )
            print(f"{PROG}: {loaded.precision.line()}", flush=True)
            if loaded.precision.warning:  # e.g. bf16 asked for where the CPU emulates it (hundreds of times slower)
                print(f"{PROG}: warning: {loaded.precision.warning}", file=sys.stderr, flush=True)
        print(f"{PROG}: model {engine.info['model']} loaded", flush=True)
        return engine

    return load


def run(args: argparse.Namespace) -> int:
    for module in ("fastapi", "uvicorn", "prometheus_client", "pysbd", "sentencex"):  # the serve extra's
        require(module, "transduce serve")
    from ..serve.listen import bind_sockets

    limits = check_args(args)
    args.models = open_set(args, limits) if args.several else None
    try:  # before the model loads: a port in use is one line, not a traceback from inside uvicorn
        sockets = bind_sockets(args.host, args.port)
    except OSError as e:
        reason = (e.strerror or str(e)).lower()
        raise UsageError(f"cannot listen on {address(args.host, args.port)}: {reason}") from None
    try:
        return serve(args, limits, sockets)
    finally:
        for sock in sockets:
            sock.close()


def check_args(args: argparse.Namespace):
    """The limits; every flag checked, and the model directory found, before anything is bound or loaded."""
    from ..checkpoint import check_model_path
    from ..device import resolve_device

    args.model_paths, args.model_path = list(args.model_path), args.model_path[0]
    args.several = several(args)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535 (0: a free port the system chooses), not {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise UsageError("--api-key is empty")
    for origin in args.cors_origin:  # what a browser sends as Origin: scheme://host[:port], nothing after it
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise UsageError(f"--cors-origin {origin}: a site is http(s)://HOST[:PORT], without a path (or *: any)")
    resolve_defaults(args)
    limits = limits_from_args(args)
    if args.engine == "torch" and args.precision == "int8" and resolve_device(args.device).type != "cpu":
        raise ValueError("--precision int8 runs on the CPU only: add --device cpu")
    if not args.model_path.is_dir():
        raise FileNotFoundError(f"{args.model_path}: no such directory")
    if args.engine == "torch" and args.checkpoint is None and args.average is None and not args.several:
        # not a model: one line now, not after the server has started and announced itself
        check_model_path(args.model_path)
    if args.engine == "ct2":
        require("ctranslate2", "--engine ct2")
        from ..export.ct2 import is_ct2_dir

        if not is_ct2_dir(args.model_path):
            raise FileNotFoundError(f"{args.model_path}: not a directory written by `transduce export ct2`")
    return limits


def address(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve(args: argparse.Namespace, limits, sockets: list) -> int:
    """The server on the bound sockets until SIGTERM / Ctrl-C, or until the model fails to load."""
    from ..decoding.settings import SearchSettings
    from ..serve.app import create_app
    from ..serve.listen import server

    def stop(_error: BaseException) -> None:  # the model cannot be loaded: stop the server, report below
        uv.should_exit = True

    app = create_app(
        engine_loader(args, limits),
        limits=limits,
        defaults=SearchSettings(
            beam=args.beam, alpha=args.alpha, length_penalty=args.penalty, max_len_offset=args.max_len_offset
        ),
        max_batch_tokens=1 if args.no_batching else args.batch_tokens,  # 1: one request a round
        max_wait=0.0 if args.no_batching else args.max_wait_ms / 1000,
        on_load_error=stop,
        api_key=args.api_key,
        cors_origins=args.cors_origin,
    )
    port = sockets[0].getsockname()[1]  # the port the system chose, for --port 0
    uv = server(app, host=args.host, port=port, log_level=args.log_level, graceful_timeout=args.graceful_timeout)
    what = (
        f"{len(args.models.models)} models, each on demand" if args.models is not None else f"loading {args.model_path}"
    )
    print(
        f"{PROG}: http://{address(args.host, port)} ({what}; GET /health says when it is ready; "
        f"the demo page is at /)" + ("; an API key is required on /translate and /attention" if args.api_key else ""),
        flush=True,
    )
    try:
        uv.run(sockets=sockets)
    except SystemExit as e:  # uvicorn could not start (it said why above)
        raise TransduceError(f"the server could not start (uvicorn's exit status {e.code})") from None
    except KeyboardInterrupt:  # Ctrl-C: uvicorn ended, then raised it again
        end_if_decoding(app, signal.SIGINT)
        raise
    finally:
        # An interpreter that exits while torch is busy on the daemon loading thread aborts
        # (std::terminate, SIGABRT): let the loading finish first.
        if app.state.loader is not None:
            app.state.loader.join()
    # uvicorn ended on a signal it raised again, and this process ignores that signal (started with
    # SIGINT ignored, as `serve &` in a script is): the same end as with the signal's own handler
    captured = getattr(uv, "_captured_signals", None) or [signal.SIGINT]
    end_if_decoding(app, captured[-1])
    if app.state.error:
        raise TransduceError(app.state.error)
    return 0


def end_if_decoding(app, sig: int) -> None:
    """With a round still decoding on its daemon thread (a grace period over, Ctrl-C twice), end as
    the signal ends a command (SIGINT: "interrupted", status 130; SIGTERM: 143) without the
    interpreter's exit, which would abort (std::terminate, SIGABRT) with torch busy in the thread."""
    batcher = app.state.batcher
    if batcher is None or not batcher.running:
        return
    if sig == signal.SIGINT:
        print("interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130 if sig == signal.SIGINT else 128 + int(sig))
