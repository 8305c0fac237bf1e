"""What an OTLP export sends, read from the store: one record per measured request and one
per config (width, speedup), each with the GenAI semantic-convention attributes and the
resource (node, chip, OS build, environment) it was measured on.

Definitions (see docs/metrics.md):
- request duration (E2E) = the last output's arrival after the request was sent;
- time per output token = (E2E − TTFT) / (output tokens − 1), as the GenAI conventions and
  vLLM define TPOT; a request of fewer than two tokens has none;
- speedup = a speculative config's median decode tok/s over the median of the baseline of
  its own sampling settings, in the same sweep, node, workload and pair.

A set-aside number (an unreliable generation, or a config whose baseline or own runs were
all unreliable) carries ``specfleet.set_aside`` with the reason; nothing is dropped. A
calibration sweep's points (its lock marks a calibration target) carry
``specfleet.calibration``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.engines import is_runtime

from ..review import otel
from ..review.configs import config_label, sampling_key
from ..review.week_sweeps import calibration_marks, target_role
from ..store import runs as stored
from ..store.db import Store, config_key, result_pair
from ..store.eventcheck import event_problem
from ..store.models import Measurement, Run

# GenAI semantic-convention metric names (development status), in seconds
TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
DURATION = "gen_ai.server.request.duration"
# what the conventions have no name for
ACCEPTANCE = "specfleet.speculative.acceptance_rate"
ACCEPTANCE_LEN = "specfleet.speculative.acceptance_length"
WIDTH = "specfleet.speculative.num_draft_tokens"
SPEEDUP = "specfleet.speculative.speedup"


@dataclass(frozen=True)
class Point:
    """One value of one metric, with its data-point attributes and its resource."""

    metric: str
    value: float
    attributes: dict[str, Any]
    resource: tuple[tuple[str, str], ...]


@dataclass
class Selection:
    """Which sweeps to export: ids, and/or those created in [since, until)."""

    sweep_ids: list[str] = field(default_factory=list)
    since: datetime | None = None
    until: datetime | None = None


def operation_name(payload: dict) -> str:
    """``chat`` for a runtime reached on /v1/chat/completions, else ``text_completion``
    (/v1/completions, or mlx-lm in process on the prompt's token ids)."""
    return otel.operation_name(payload.get("runtime"))


def provider_name(payload: dict, run_engine: str | None) -> str:
    """What served the request: ``mlx-lm`` in process, or the http runtime's name."""
    return otel.provider_name(payload.get("runtime") or run_engine)


def target_name(model_pair: str | None, fingerprint: str | None) -> str:
    """The target's name ("gemma" of "gemma / gemma-draft"); its fingerprint if unnamed."""
    return otel.target_name(model_pair) or fingerprint or "unknown"


def tpot_s(e2e: float | None, ttft: float | None, tokens: int) -> float | None:
    """(E2E − TTFT) / (tokens − 1); None below two tokens or without both times."""
    if e2e is None or ttft is None or tokens < 2:
        return None
    return (e2e - ttft) / (tokens - 1)


def acceptance_length(accepted: int | None, rounds: int | None) -> float | None:
    """vLLM's mean acceptance length: 1 + accepted draft tokens per verify round (the
    target's bonus token counted)."""
    if accepted is None or not rounds:
        return None
    return 1.0 + accepted / rounds


def _resource(node: str, run: Run | None, ident: dict) -> tuple[tuple[str, str], ...]:
    def get(k: str) -> Any:
        return getattr(run, k, None) or ident.get(k)

    attrs = {"service.name": "specfleet", "host.name": node, "specfleet.node": node,
             "specfleet.node.chip": get("chip"), "os.build_id": get("os_build"),
             "specfleet.environment.id": get("env_id"),
             "specfleet.mlx.version": get("mlx_version"),
             "specfleet.mlx_lm.version": get("mlx_lm_version")}
    return tuple(sorted((k, str(v)) for k, v in attrs.items() if v is not None))


def _key(payload: dict) -> str:
    return config_key(result_pair(payload), payload["config"])


def _sweeps(store: Store, sel: Selection) -> list[str]:
    return stored.sweep_ids(store, sel.sweep_ids, sel.since, sel.until)


def _set_aside(unreliable: bool | None, reasons: Iterable[str] | None) -> str | None:
    if not unreliable:
        return None
    return "unreliable: " + ("; ".join(str(r) for r in reasons or []) or "no reason given")


def _run_aside(run: Run, whose: str) -> str:
    """Why a config (or its baseline) was set aside as a whole, in its own words (a decode
    rate too variable, trials set aside), as its config_summary gave them."""
    reasons = (run.summary or {}).get("unreliable_reasons") or []
    return f"unreliable: {'; '.join(map(str, reasons)) or f'every trial of {whose}'}"


def read_points(store: Store, sel: Selection) -> tuple[list[str], list[Point]]:
    """The selected sweeps and every point they export, request ones first."""
    ids = _sweeps(store, sel)
    points: list[Point] = []
    for sid in ids:
        points += _sweep_points(store, sid)
    return ids, points


def _sweep_points(store: Store, sid: str) -> list[Point]:
    runs = stored.sweep_runs(store, sid)
    idents = stored.node_identities(store, sid)
    rows = stored.measurements_with_payloads(store, sid)
    by_key = {(r.node, r.workload, r.mode, r.config_key): r for r in runs}
    out: list[Point] = []
    for m, payload in rows:
        # read through the boundary's check, as every reader does: an event an older
        # boundary let in is left out, not computed with (store.queries)
        if event_problem(payload, json.dumps(payload)):
            continue
        run = by_key.get((m.node, m.workload, m.mode, _key(payload)))
        ident = idents.get(m.node, {})
        base = _request_attributes(sid, m, payload, run, ident)
        res = _resource(m.node, run, ident)
        ttft = None if m.ttft_ms is None else m.ttft_ms / 1e3
        e2e = None if m.e2e_ms is None else m.e2e_ms / 1e3  # see db.e2e_ms
        values = {TTFT: ttft, DURATION: e2e, TPOT: tpot_s(e2e, ttft, m.generated_tokens)}
        if m.mode == "speculative":
            values[ACCEPTANCE] = m.acceptance_rate
            values[ACCEPTANCE_LEN] = acceptance_length(m.accepted_tokens,
                                                       payload.get("verify_rounds"))
        out += [Point(k, float(v), base, res) for k, v in values.items() if v is not None]
    out += _config_points(sid, runs, idents)
    # an instrument, not a model: every point of a calibration target's runs is marked (a
    # lineup's other targets' are not)
    roles = {role for s, role in calibration_marks(store, sweep_id=sid) if s == sid}
    if roles:
        out = [Point(p.metric, p.value, {**p.attributes, "specfleet.calibration": True},
                     p.resource)
               if target_role(p.attributes.get("specfleet.pair")) in roles else p
               for p in out]
    return out


def _common(sid: str, run: Run | None, payload: dict, ident: dict, workload: str, mode: str,
            k: int, config: dict | None, context_bucket: str | None) -> dict[str, Any]:
    engine = run.engine if run else None
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation_name(payload),
        "gen_ai.provider.name": provider_name(payload, engine),
        "gen_ai.request.model": target_name(
            (run.model_pair if run else None) or ident.get("model_pair"),
            (run.target_fingerprint if run else None) or ident.get("target_fingerprint")),
        "specfleet.sweep.id": sid, "specfleet.workload": workload,
        "specfleet.speculative": mode == "speculative",
        WIDTH: k if mode == "speculative" else 0,
        "specfleet.config": config_label(mode, k, config)}
    # an http variant is a config of its own (its server command), yet the label omits it:
    # without it two variants of one width would share every attribute and be pooled
    for name, v in (("specfleet.variant", (config or {}).get("variant")),
                    ("specfleet.context_bucket", context_bucket),
                    ("specfleet.pair", result_pair(payload)),
                    ("specfleet.background", run.background if run else None)):
        if v is not None:
            attrs[name] = v
    return attrs


def _request_attributes(sid: str, m: Measurement, payload: dict, run: Run | None,
                        ident: dict) -> dict[str, Any]:
    attrs = _common(sid, run, payload, ident, m.workload, m.mode, m.num_draft_tokens,
                    payload.get("config"), m.context_bucket)
    why = _set_aside(m.unreliable, m.unreliable_reasons)
    if why is None and run is not None and run.unreliable:
        why = _run_aside(run, "its config")
    if why is not None:
        attrs["specfleet.set_aside"] = why
    return attrs


def _config_points(sid: str, runs: list[Run], idents: dict) -> list[Point]:
    """Per speculative config: its draft width, and its speedup over its own baseline."""
    def group(r: Run) -> tuple:
        return (r.node, r.workload, r.context_bucket, r.background,
                (r.pair or "").split("+")[0], r.engine, sampling_key(r.config))

    bases = {group(r): r for r in runs if r.mode == "baseline"}
    out = []
    for r in runs:
        if r.mode != "speculative":
            continue
        ident = idents.get(r.node, {})
        payload = {"config": r.config, "models": (r.summary or {}).get("models"),
                   "method": (r.summary or {}).get("method")}
        if is_runtime(r.engine):  # measured over http
            payload.update(engine="http", runtime=r.engine)
        attrs = _common(sid, r, payload, ident, r.workload, r.mode, r.num_draft_tokens,
                        r.config, r.context_bucket)
        res = _resource(r.node, r, ident)
        base = bases.get(group(r))
        why = (_run_aside(r, "this config") if r.unreliable else
               "no baseline of its sampling settings" if base is None else
               "its baseline " + _run_aside(base, "its baseline") if base.unreliable
               else None)
        if why:
            attrs = {**attrs, "specfleet.set_aside": why}
        out.append(Point(WIDTH, float(r.num_draft_tokens), attrs, res))
        if base is not None and base.decode_tok_s_median and r.decode_tok_s_median:
            out.append(Point(SPEEDUP, r.decode_tok_s_median / base.decode_tok_s_median,
                             attrs, res))
    return out
