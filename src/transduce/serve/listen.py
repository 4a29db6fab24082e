"""The app on uvicorn: its sockets bound before the model loads (`bind_sockets`: a port in use is
one line), the server (`server`) whose shutdown (SIGTERM, Ctrl-C) gives the requests in flight the
grace period (`app.begin_drain`) and Ctrl-C again answers them 503 at once (`app.end_grace`), and
the server's own log lines on stderr. The app itself: `serve.app`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..defaults import SERVE_GRACEFUL_TIMEOUT

log = logging.getLogger("transduce.serve")


def bind_sockets(host: str, port: int) -> list:
    """Sockets bound to HOST:PORT, one per address of the host (as uvicorn binds them), for
    `server(...).run(sockets=...)`: bound before the model loads, a port in use is an OSError the
    caller reports in one line (inside uvicorn: a traceback, std::terminate with torch busy loading).
    Port 0: one free port for every address (`sockets[0].getsockname()[1]`)."""
    import socket

    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # :: and 0.0.0.0 are two sockets, as asyncio makes them
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def server(
    app,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    graceful_timeout: float = SERVE_GRACEFUL_TIMEOUT,
):
    """A uvicorn server for the app (its own request log, not uvicorn's): `.run()` blocks until
    Ctrl-C / SIGTERM or `.should_exit`. A shutdown gives the requests in flight `graceful_timeout`
    seconds (`app.begin_drain`), then answers them 503; Ctrl-C again answers them 503 at once."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.begin_drain(graceful_timeout)
            await super().shutdown(sockets)
            if not self.force_exit:
                return
            # Ctrl-C again: uvicorn stops waiting, and asyncio would cancel what is left. Answer the
            # requests still in flight 503 (cancelled, they would get a bare 500 and a traceback
            # each), then stop the decoding thread, as the lifespan uvicorn skips does.
            app.end_grace(forced=True)
            deadline = time.monotonic() + 1.0  # each notices within its poll interval
            while self.server_state.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if not self.lifespan.shutdown_event.is_set():
                await self.lifespan.shutdown()

    _log_requests(log_level)
    return Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=graceful_timeout + 5,
        )
    )


def _log_requests(level: str) -> None:
    """The server's own lines (the request log, shutting down, failures) on stderr, timestamped."""
    log.setLevel(level.upper())
    if not any(getattr(h, "transduce", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler.transduce = True
        log.addHandler(handler)
        log.propagate = False
