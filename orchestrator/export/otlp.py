"""`specfleet export otlp`: the store's measurements as OTLP/HTTP metrics, through the
official OpenTelemetry SDK and its OTLP exporter.

Each resource (node, chip, OS build, environment) gets its own MeterProvider; the points
are recorded into the SDK's instruments (histograms with the GenAI conventions' advisory
buckets, gauges per config), collected once and sent in one request. The store is only
read: an endpoint that refuses or cannot be reached costs nothing stored.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError, SpecfleetError
from ..store.db import Store
from .points import (
    ACCEPTANCE,
    ACCEPTANCE_LEN,
    DURATION,
    SPEEDUP,
    TPOT,
    TTFT,
    WIDTH,
    Point,
    Selection,
    read_points,
)

# name → (kind, unit, description, advisory bucket boundaries)
# The boundaries are the GenAI semantic conventions' ExplicitBucketBoundaries advice.
_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                     20.48, 40.96, 81.92]
INSTRUMENTS: dict[str, tuple[str, str, str, list[float] | None]] = {
    TTFT: ("histogram", "s", "Time to generate first token for successful responses.",
           [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0]),
    TPOT: ("histogram", "s", "Time per output token generated after the first token for "
           "successful responses: (E2E - TTFT) / (output tokens - 1).",
           [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]),
    DURATION: ("histogram", "s", "Request duration: the last output's arrival after the "
               "request.", _DURATION_BUCKETS),
    ACCEPTANCE: ("histogram", "1", "Accepted draft tokens / drafted tokens, per request.",
                 [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
    ACCEPTANCE_LEN: ("histogram", "{token}", "Mean acceptance length per request as vLLM "
                     "counts it: 1 + accepted draft tokens per verify round (bonus token "
                     "included).", [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16]),
    WIDTH: ("gauge", "{token}", "Draft width (num_draft_tokens) of a speculative config.",
            None),
    SPEEDUP: ("gauge", "1", "Median decode tok/s of a speculative config over its own "
              "baseline's.", None),
}


class ExportError(SpecfleetError):
    """The OTLP endpoint did not take the metrics (unreachable, or it refused them)."""


@dataclass(frozen=True)
class ExportResult:
    endpoint: str
    sweeps: list[str]
    values: int       # numbers read from the store
    data_points: int  # OTLP data points they made (requests of one config share one)
    set_aside: int    # values marked specfleet.set_aside


def metrics_url(endpoint: str) -> str:
    """The OTLP/HTTP metrics URL of ``endpoint``: a collector's base URL
    (http://host:4318) gets ``/v1/metrics``; a full signal URL is kept as it is."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--endpoint: {endpoint!r} is not an http(s) URL, like "
                          "http://collector:4318")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1/metrics"):
        path += "/v1/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class _Collect(logging.Handler):
    """The exporter logs why a request failed instead of raising: keep the words."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _session():
    """A requests session (the exporter's own transport) that remembers the last failure:
    the exporter only logs "timeout, max retries", and a user needs "connection refused"."""
    import requests

    class Recording(requests.Session):
        last_problem: str | None = None
        rejected: tuple[int, str] | None = None  # an OTLP partial success


        def request(self, *args, **kwargs):
            try:
                resp = super().request(*args, **kwargs)
            except requests.RequestException as e:
                found = re.search(r"\[Errno -?\d+\][^'\")]*", str(e))
                self.last_problem = found.group(0).strip() if found else type(e).__name__
                raise
            if resp.status_code >= 400:
                self.last_problem = f"HTTP {resp.status_code} {resp.reason}".strip()
            elif resp.status_code == 200 and resp.content:
                self.rejected = _partial_success(resp.content)
            return resp

    return Recording()


def _partial_success(body: bytes) -> tuple[int, str] | None:
    """A 200 answer may still reject points (OTLP's partial success): how many, and why.
    The SDK's exporter reports such an answer as a success."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceResponse,
    )

    reply = ExportMetricsServiceResponse()
    try:
        reply.ParseFromString(body)
    except DecodeError:
        return None
    part = reply.partial_success
    if part.rejected_data_points or part.error_message:
        return part.rejected_data_points, part.error_message
    return None


def _metrics_data(points: list[Point]):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
    from opentelemetry.sdk.resources import Resource

    by_resource: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        by_resource[p.resource].append(p)
    resource_metrics: list = []
    for res, pts in by_resource.items():
        reader = InMemoryMetricReader()
        provider = MeterProvider(resource=Resource.create(dict(res)), metric_readers=[reader])
        meter = provider.get_meter("specfleet")
        record: dict[str, Callable[[float, dict], None]] = {}
        for name, (kind, unit, desc, buckets) in INSTRUMENTS.items():
            if kind == "histogram":
                record[name] = meter.create_histogram(
                    name, unit=unit, description=desc,
                    explicit_bucket_boundaries_advisory=buckets).record
            else:
                record[name] = meter.create_gauge(name, unit=unit, description=desc).set
        for p in pts:
            record[p.metric](p.value, p.attributes)
        data = reader.get_metrics_data()
        provider.shutdown()
        if data is not None:
            resource_metrics += data.resource_metrics
    return MetricsData(resource_metrics=resource_metrics)


def send(points: list[Point], endpoint: str, timeout_s: float = 10.0) -> int:
    """Send the points to ``endpoint`` in one OTLP/HTTP request; returns how many data
    points it held (a histogram point aggregates the requests sharing its attributes).
    ``ExportError`` if the endpoint does not take them."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    url = metrics_url(endpoint)
    data = _metrics_data(points)
    session = _session()
    exporter = OTLPMetricExporter(endpoint=url, timeout=timeout_s, session=session)
    collect = _Collect()
    log = logging.getLogger("opentelemetry.exporter.otlp")
    log.addHandler(collect)
    try:
        result = exporter.export(data, timeout_millis=timeout_s * 1000)
    finally:
        log.removeHandler(collect)
        exporter.shutdown()
    if result != MetricExportResult.SUCCESS:
        why = session.last_problem or (collect.messages[-1] if collect.messages
                                       else "no answer")
        raise ExportError(f"OTLP export to {url} failed: {why}. Nothing in the store changed; "
                          "run `specfleet export otlp` again when the endpoint is up")
    sent = sum(len(m.data.data_points) for rm in data.resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics)
    if session.rejected is not None:
        n, why = session.rejected
        raise ExportError(f"OTLP export to {url}: the endpoint took the request but rejected "
                          f"{n} of {sent} data points ({why or 'no reason given'}). Nothing "
                          "in the store changed")
    return sent


def export(store: Store, sel: Selection, endpoint: str,
           timeout_s: float = 10.0) -> ExportResult:
    """Export the selected sweeps' points to ``endpoint`` (see ``send``)."""
    url = metrics_url(endpoint)  # a malformed URL is refused before the store is read
    sweeps, points = read_points(store, sel)
    if sel.sweep_ids and len(sweeps) < len(set(sel.sweep_ids)):
        missing = sorted(set(sel.sweep_ids) - set(sweeps))
        raise ConfigError(f"no sweep {', '.join(missing)} in the store (see `specfleet "
                          "sweeps list`)")
    sent = send(points, url, timeout_s) if points else 0
    return ExportResult(url, sweeps, len(points), sent,
                        sum("specfleet.set_aside" in p.attributes for p in points))
