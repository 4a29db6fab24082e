"""Watching the server: its Prometheus metrics (a registry per app, with the process's own; several
models' figures by model, `models_collector`), one log line per request with its id (X-Request-ID),
and the keys a request's headers carry (`Authorization: Bearer KEY` or `X-API-Key: KEY`). Every
metric, the log line and the key: docs/serve.md.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import deque

# Paths counted by name in the metrics; any other is counted as "other"
ENDPOINTS = (
    "/",
    "/translate",
    "/attention",
    "/health",
    "/info",
    "/metrics",
    "/openapi.json",
    "/languages",
    "/detect",
    "/frontend/settings",
    "/libretranslate/translate",
    "/libretranslate/languages",
    "/libretranslate/detect",
    "/libretranslate/frontend/settings",
    "/libretranslate/health",
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
SPEED_WINDOW = 60.0  # Seconds of rounds the tokens/s gauge is computed over

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

request_log = logging.getLogger("transduce.serve.requests")


class Metrics:
    """The server's Prometheus metrics, in a registry of their own."""

    def __init__(self, queue_depth):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # resident and virtual memory, CPU seconds, open files
        self.requests = Counter(
            "transduce_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "transduce_request_duration_seconds",
            "Time to answer a request, by endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("transduce_requests_in_flight", "Requests being answered", registry=r)
        Gauge("transduce_queue_depth", "Requests waiting for the decoding thread", registry=r).set_function(queue_depth)
        self.batch_sentences = Histogram(
            "transduce_batch_sentences",
            "Sentences decoded together in one round of the decoding thread",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "transduce_batch_requests", "Requests decoded together in one round", buckets=BATCH_BUCKETS, registry=r
        )
        self.source_tokens = Counter(
            "transduce_source_tokens", "Source subword tokens decoded, EOS included", registry=r
        )
        self.output_tokens = Counter(
            "transduce_output_tokens",
            "Output tokens of the best hypothesis of each sentence decoded, EOS included",
            registry=r,
        )
        self.decode_seconds = Counter(
            "transduce_decode_seconds", "Seconds the decoding thread spent decoding", registry=r
        )
        self.failures = Counter("transduce_decode_failures", "Decoding rounds that failed", registry=r)
        self._recent: deque[tuple[float, int, float]] = deque()  # (ended, output tokens, seconds)
        Gauge(
            "transduce_output_tokens_per_second",
            f"Output tokens per second of decoding, over the rounds of the last {SPEED_WINDOW:g} s (0 when idle)",
            registry=r,
        ).set_function(self._speed)

    def round(self, jobs, seconds: float, results, error) -> None:
        """A round of the decoding thread (`Batcher(on_round=...)`)."""
        self.decode_seconds.inc(seconds)
        if error is not None:
            self.failures.inc()
            return
        out = sum(len(cands[0].tokens) + 1 for cands in results if cands)
        self.batch_sentences.observe(len(results))
        self.batch_requests.observe(len(jobs))
        self.source_tokens.inc(sum(j.tokens for j in jobs))
        self.output_tokens.inc(out)
        now = time.monotonic()
        self._recent.append((now, out, seconds))
        while self._recent and self._recent[0][0] < now - SPEED_WINDOW:
            self._recent.popleft()

    def _speed(self) -> float:
        now = time.monotonic()
        recent = [(n, s) for t, n, s in list(self._recent) if t >= now - SPEED_WINDOW]
        seconds = sum(s for _, s in recent)
        return sum(n for n, _ in recent) / seconds if seconds > 0 else 0.0

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RequestLog:
    """ASGI middleware, outermost: gives each request its id (echoed in X-Request-ID), counts it in
    the metrics and writes its one log line when it is answered."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        status = [500]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        started = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(seconds)
            client = scope.get("client") or ("-", 0)
            extra = " ".join(x for x in (state.get("log_sentences"), state.get("log_note")) if x)
            request_log.info(
                "id=%s %s %s %d %.3fs client=%s%s",
                rid,
                scope.get("method", "-"),
                path,
                status[0],
                seconds,
                client[0],
                f" {extra}" if extra else "",
            )


def key_reader(key: str | None):
    """A FastAPI dependency -> the keys a request carries in its headers (`Authorization: Bearer
    KEY`, `X-API-Key: KEY`), both schemes stated in the OpenAPI document when the server has a
    `key`; none read when it has none. `common.Server.key_problem` checks them."""
    from fastapi import Depends
    from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

    if key is None:
        return lambda: []
    bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY (--api-key, $TRANSDUCE_API_KEY)")
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the key (--api-key, $TRANSDUCE_API_KEY)")

    async def keys(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer), given: str | None = Depends(header)
    ) -> list:
        return [k for k in (credentials.credentials if credentials else None, given) if k is not None]

    return keys


def models_collector(models):
    """A Prometheus collector of the figures of several models behind one server
    (`serve.models.ModelSet`), labelled by model; read under the set's lock."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self):
            with models._lock:
                rows = [
                    (
                        m.name,
                        m.engine is not None,
                        m.memory if m.engine is not None else 0,
                        m.loads,
                        m.unloads,
                        m.requests,
                        m.sentences,
                    )
                    for m in models.models.values()
                ]
            families = [
                GaugeMetricFamily(
                    "transduce_model_loaded", "Whether the model is loaded (1) or not (0)", labels=["model"]
                ),
                GaugeMetricFamily(
                    "transduce_model_memory_bytes",
                    "Memory of the model while loaded: the resident set's "
                    "growth at its load, at least its parameters' bytes (0 when unloaded)",
                    labels=["model"],
                ),
                CounterMetricFamily("transduce_model_loads", "Times the model was loaded", labels=["model"]),
                CounterMetricFamily(
                    "transduce_model_unloads",
                    "Times the model was unloaded (least recently used, under the memory cap)",
                    labels=["model"],
                ),
                CounterMetricFamily(
                    "transduce_model_requests",
                    "Requests routed to the model (a pivoted one to both of its models)",
                    labels=["model"],
                ),
                CounterMetricFamily("transduce_model_sentences", "Sentences the model decoded", labels=["model"]),
            ]
            for name, loaded, memory, *counts in rows:
                for family, value in zip(families, (int(loaded), memory, *counts)):
                    family.add_metric([name], value)
            yield from families
            if models.max_memory is not None:
                yield GaugeMetricFamily(
                    "transduce_models_memory_cap_bytes",
                    "The cap on the loaded models' memory (--max-memory)",
                    value=models.max_memory,
                )

    return Collector()
