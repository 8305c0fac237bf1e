"""OpenTelemetry GenAI semantic-convention names for what the review exports, so a
dashboard that reads OTel GenAI metrics can put speculative and autoregressive runs side
by side. OTel's names are used where one exists (in OTel's units: seconds); what OTel has
no name for (draft width, acceptance, speedup) is namespaced ``specfleet.*``.

Names from the GenAI semantic conventions (development status): ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.operation.name``, ``gen_ai.server.time_to_first_token``
and ``gen_ai.server.time_per_output_token`` (histograms, in s).
"""

from __future__ import annotations


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def config_attributes(series: dict, config: dict) -> dict:
    """One config of a series, as OTel GenAI attributes and metric values."""
    decode = config.get("decode_p50")
    speculative = config["mode"] == "speculative"
    return {
        "gen_ai.provider.name": series["engine"],
        "gen_ai.request.model": series["model_pair"],
        "gen_ai.operation.name": "text_completion",
        "gen_ai.server.time_to_first_token": _s(config.get("ttft_p50")),
        "gen_ai.server.time_per_output_token": (1.0 / decode) if decode else None,
        "specfleet.speculative": speculative,
        "specfleet.speculative.num_draft_tokens": config["k"] if speculative else 0,
        "specfleet.speculative.acceptance_rate": config.get("acceptance_p50"),
        "specfleet.speedup": config.get("speedup"),
        "specfleet.decode.tokens_per_second": decode,
        "specfleet.inter_token_latency.p95": _s(config.get("itl_p95")),
        "specfleet.node.chip": series["chip"],
        "specfleet.workload": series["workload"],
        "specfleet.context_bucket": series["context_bucket"],
        "specfleet.runs": config.get("runs"),
        "specfleet.runs.unreliable": config.get("unreliable"),
        # every run of the config unreliable: its numbers are shown, never concluded from
        "specfleet.set_aside": bool(config.get("set_aside")),
        "specfleet.config": config.get("label") or None,
    }


def annotate(a: dict) -> dict:
    """The analysis with an ``otel`` block on each config (for the JSON export)."""
    for s in a["series"]:
        for c in s.get("configs") or []:
            c["otel"] = config_attributes(s["series"], c)
    return a
