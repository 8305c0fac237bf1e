"""A real OTLP/HTTP metrics receiver for the tests, on the published opentelemetry-proto
messages (the OpenTelemetry Collector does not install here by package).

It listens on a loopback port, takes ``POST /v1/metrics`` with a protobuf
``ExportMetricsServiceRequest`` body, as a collector does, and keeps every data point
decoded: metric name, unit, kind, resource and point attributes, and the numbers.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


def _value(v) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Received:
    metric: str
    unit: str
    kind: str                  # histogram | gauge | sum
    resource: dict[str, Any]
    attributes: dict[str, Any]
    count: int | None = None   # histogram
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bounds: list[float] | None = None
    bucket_counts: list[int] | None = None
    value: float | None = None  # gauge / sum


def decode(body: bytes) -> list[Received]:
    req = ExportMetricsServiceRequest()
    req.ParseFromString(body)
    out = []
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind == "histogram":
                    for p in m.histogram.data_points:
                        out.append(Received(
                            m.name, m.unit, kind, res, _attrs(p.attributes), count=p.count,
                            sum=p.sum, min=p.min, max=p.max, bounds=list(p.explicit_bounds),
                            bucket_counts=list(p.bucket_counts)))
                elif kind in ("gauge", "sum"):
                    for p in getattr(m, kind).data_points:
                        v = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                        out.append(Received(m.name, m.unit, kind, res, _attrs(p.attributes),
                                            value=v))
                else:
                    raise AssertionError(f"{m.name}: unexpected metric kind {kind}")
    return out


class Receiver:
    """``with Receiver() as r``: r.url is the base URL; r.points what arrived; r.status
    what it answers (set 503 to refuse)."""

    def __init__(self) -> None:
        self.points: list[Received] = []
        self.requests = 0
        self.paths: list[str] = []
        self.status = 200
        self.partial: tuple[int, str] | None = None  # answer 200 rejecting (count, why)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                outer.paths.append(self.path)
                outer.requests += 1
                if outer.status != 200 or self.path != "/v1/metrics" or \
                        self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(outer.status if outer.status != 200 else 404)
                    self.end_headers()
                    return
                outer.points += decode(body)
                answer = ExportMetricsServiceResponse()
                if outer.partial:  # OTLP's partial success: taken, yet some points refused
                    answer.partial_success.rejected_data_points = outer.partial[0]
                    answer.partial_success.error_message = outer.partial[1]
                reply = answer.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
