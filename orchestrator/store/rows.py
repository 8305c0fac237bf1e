"""How an event becomes store rows: a generation's measurement row, a config summary's run
row, and the keys both are filed under (config key, result pair). One derivation, used by
ingest and again by ``sweeps verify`` and the derived-column backfills."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

MEASUREMENT_COLUMNS = ("run_index", "workload", "prompt_sha256", "mode", "knob", "num_draft_tokens",
               "repetition", "generated_tokens", "ttft_ms", "decode_tok_s", "itl_p50_ms",
               "itl_p95_ms", "drafted_tokens", "accepted_tokens", "acceptance_rate",
               "peak_mlx_memory_bytes", "exact_match", "first_divergence", "output_text",
               "context_bucket", "itl_p99_ms", "swap_in_bytes", "bandwidth_utilisation",
               "unreliable", "unreliable_reasons", "first_divergence_unit")


EVENT_COLUMNS = ("sweep_id", "node", "seq", "type", "ts", "payload")
MEASUREMENT_TABLE_COLUMNS = ("sweep_id", "node", "seq", "knob_value", "temperature", "pair",
                             "measured_at", "e2e_ms", *MEASUREMENT_COLUMNS)


_REASONS_AT = MEASUREMENT_COLUMNS.index("unreliable_reasons")
_UTC = timezone.utc


def measurement_tuple(sweep_id: str, node: str, e: dict) -> tuple:
    get = e.get
    values = tuple(map(get, MEASUREMENT_COLUMNS))  # hot path: once per generation ingested
    if values[_REASONS_AT] is not None:
        values = (*values[:_REASONS_AT], json.dumps(values[_REASONS_AT]),
                  *values[_REASONS_AT + 1:])
    kv = get("knob_value")
    return (sweep_id, node, e["seq"], None if kv is None else str(kv),
            e["config"]["temperature"], result_pair(e), measured_at(e["ts"]), e2e_ms(e),
            *values)


_HOURS: dict[int, str] = {}  # hour since the epoch -> "YYYY-MM-DD HH" (UTC)


def measured_at(ts: float) -> str:
    """An event's time as text both drivers store as timestamptz / SQLAlchemy's SQLite
    DateTime (UTC, microseconds): the bulk insert bypasses SQLAlchemy's own conversion.
    What ``datetime.fromtimestamp(ts, UTC).isoformat(" ", "microseconds")`` gives, with
    the microseconds rounded as it rounds them (half to even, carried into the second);
    the date and hour are formatted once per hour, the rest by arithmetic (a third of
    a generation's row: ingest's hot path; tests/test_ingest_rows.py holds it to datetime).
    """
    frac, whole = math.modf(ts)
    us, sec = round(frac * 1e6), int(whole)
    if us >= 1_000_000:
        us, sec = us - 1_000_000, sec + 1
    hour, s = divmod(sec, 3600)
    head = _HOURS.get(hour)
    if head is None:
        if len(_HOURS) >= 4096:  # a journal spans hours, not thousands of them
            _HOURS.clear()
        head = _HOURS[hour] = datetime.fromtimestamp(hour * 3600, _UTC).isoformat(" ")[:13]
    m, s = divmod(s, 60)
    return f"{head}:{m:02d}:{s:02d}.{us:06d}+00:00"


def e2e_ms(e: dict) -> float | None:
    """The request's end-to-end time: the agent's ``e2e_ms``, or for journals written
    before it reported one, its last token's arrival (``token_times_us``)."""
    v = e.get("e2e_ms")
    if isinstance(v, int | float):
        return float(v)
    times = e.get("token_times_us")
    if isinstance(times, list) and times and isinstance(times[-1], int | float):
        return times[-1] / 1e3
    return None


def measurement_row(sweep_id: str, node: str, e: dict) -> dict:
    """A generation event's measurement row, as ingest derives it (and verify again)."""
    row = dict(zip(MEASUREMENT_TABLE_COLUMNS, measurement_tuple(sweep_id, node, e)))
    row["measured_at"] = datetime.fromisoformat(row["measured_at"])
    text = row.get("output_text")
    if type(text) is str and "\x00" in text:
        # the stored event keeps the journal's line, NUL and all; ingest stored the text
        # with it replaced (eventcheck._check_generation): derived again alike, or verify
        # calls the row edited and --attach writes a NUL PostgreSQL's text cannot hold
        row["output_text"] = text.replace("\x00", "\ufffd")
    return row


def pair_identity(e: dict, identity: dict) -> dict:
    """A lineup result's own models: fingerprints, tiers and name of the pair it names; a
    draft-free method's result has no draft weights, and is named by its method."""
    method = e.get("method")
    if method:
        target = str(identity.get("model_pair") or "target").split(" / ")[0]
        return {**identity, "draft_fingerprint": None, "draft_quant": f"no draft: {method}",
                "model_pair": f"{target} / {method}"}
    pair, roles = e.get("models"), identity.get("roles")
    if not pair or not roles:
        return identity
    t, d = roles.get(pair["target"]) or {}, roles.get(pair.get("draft") or "") or {}
    names = identity.get("role_names") or {}
    return {**identity, "target_fingerprint": t.get("fingerprint"),
            "draft_fingerprint": d.get("fingerprint"), "target_quant": t.get("quant"),
            "draft_quant": d.get("quant"),
            "model_pair": " / ".join(names.get(r) or r for r in (pair["target"], pair["draft"])
                                     if r) if names else identity.get("model_pair")}


def run_row(sweep_id: str, node: str, e: dict, identity: dict) -> dict:
    m = e["metrics"]
    identity = pair_identity(e, identity)
    return {
        "sweep_id": sweep_id, "node": node, "workload": e["workload"],
        "context_bucket": e.get("context_bucket"), "mode": e["mode"], "knob": e.get("knob"),
        "knob_value": None if e.get("knob_value") is None else str(e["knob_value"]),
        "num_draft_tokens": e["num_draft_tokens"],
        # a lineup's pairs share configs: the pair is part of what makes a run one run
        "config_key": config_key(result_pair(e), e["config"]), "config": e["config"],
        "trials": e["trials"], "decode_tok_s_median": m["decode_tok_s"]["median"],
        "decode_tok_s_p95": m["decode_tok_s"]["p95"], "decode_tok_s_cv": m["decode_tok_s"]["cv"],
        "acceptance_median": m["acceptance_rate"]["median"], "unreliable": e["unreliable"],
        "summary": {k: e.get(k) for k in ("metrics", "values", "unreliable_reasons", "exact",
                                          "distribution", "parity", "models", "method",
                                          "contention", "spread")},
        "env_id": identity.get("env_id"), "mlx_version": identity.get("mlx_version"),
        "mlx_lm_version": identity.get("mlx_lm_version"),
        "target_fingerprint": identity.get("target_fingerprint"),
        "draft_fingerprint": identity.get("draft_fingerprint"),
        "prompt_sha256": e.get("prompt_sha256"), "os_build": identity.get("os_build"),
        "chip": identity.get("chip"), "power_source": identity.get("power_source"),
        "model_pair": identity.get("model_pair"), "engine": e.get("engine") or "mlx-lm",
        "target_quant": identity.get("target_quant"), "draft_quant": identity.get("draft_quant"),
        "pair": result_pair(e), "background": identity.get("background")}


def config_key(pair: str | None, config: dict) -> str:
    """A run's stored config key: its pair and every knob, as sorted JSON. The column holds
    255 characters; a longer key (a config with many knobs set) ends in a hash of the whole,
    since two configs cut to the same 255 characters were one run: the second was dropped."""
    import hashlib

    whole = (f"{pair} " if pair else "") + json.dumps(config, sort_keys=True)
    if len(whole) <= 255:
        return whole
    return whole[:238] + " #" + hashlib.sha256(whole.encode()).hexdigest()[:15]


def result_pair(e) -> str | None:
    """What a result was measured with, beyond the plan's one pair: a lineup pair
    ("target+draft-2") or a draft-free method ("target+prompt-lookup")."""
    method = e.get("method")  # a dict, or a typed event (agent.events), alike
    return f"target+{method}" if method else pair_name(e.get("models"))


def pair_name(models: dict | None) -> str | None:
    """A lineup result's pair as stored and reviewed: "target+draft-2"; a target's own
    baseline (quality tasks) is "target+None"."""
    if not isinstance(models, dict) or not models:
        return None
    return f"{models.get('target')}+{models.get('draft')}"
