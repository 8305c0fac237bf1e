"""OpenTelemetry GenAI semantic-convention names on the review's JSON export and webhook, so a
dashboard that reads OTel GenAI data can put speculative and autoregressive runs side by
side. Attributes use OTel's names; what OTel has no name for (draft width, acceptance,
speedup) is namespaced ``specfleet.*``.

The JSON holds one number per config, not a histogram: the values sit under ``medians``
(each the median over the config's requests, in OTel's units: seconds), keyed by the metric
they summarise. The histograms themselves go out with ``specfleet export otlp``.
"""

from __future__ import annotations


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def operation_name(engine: str | None) -> str:
    """``chat`` for a runtime reached on its chat endpoint, else ``text_completion``."""
    return "chat" if str(engine or "").endswith(" (chat)") else "text_completion"


def provider_name(engine: str | None) -> str:
    return str(engine or "mlx-lm").removesuffix(" (chat)")


def target_name(model_pair: str | None) -> str | None:
    """The target's name: the first of "target / draft"."""
    return model_pair.split(" / ")[0] if model_pair else None


def config_attributes(series: dict, config: dict, calibration: bool = False) -> dict:
    """One config of a series, as OTel GenAI attributes and its medians; ``calibration``:
    the series is a calibration pair (an instrument, not a model), marked so a dashboard
    that sees only the attributes never shows it as a model."""
    speculative = config["mode"] == "speculative"
    # judged through the noise (set aside for its spread alone): marked, with the speedup's
    # 95% interval, so a dashboard never reads its point as a reliable speedup
    tn = config.get("through_noise")
    sp = (config.get("gates") or {}).get("speedup") or {}
    return {
        **({"specfleet.decided_through_the_noise": True,
            "specfleet.speculative.speedup.interval": sp.get("interval")} if tn else {}),
        **({"specfleet.calibration": True} if calibration else {}),
        "gen_ai.provider.name": provider_name(series.get("engine")),
        "gen_ai.request.model": target_name(series.get("model_pair")),
        "gen_ai.operation.name": operation_name(series.get("engine")),
        "specfleet.speculative": speculative,
        "specfleet.speculative.num_draft_tokens": config["k"] if speculative else 0,
        "specfleet.node.chip": series["chip"],
        "specfleet.workload": series["workload"],
        "specfleet.context_bucket": series["context_bucket"],
        "specfleet.runs": config.get("runs"),
        "specfleet.runs.unreliable": config.get("unreliable"),
        # every run of the config unreliable: its numbers are shown, never concluded from
        "specfleet.set_aside": bool(config.get("set_aside")),
        "specfleet.config": config.get("label") or None,
        "medians": {
            "gen_ai.server.time_to_first_token": _s(config.get("ttft_p50")),
            # per request (E2E − TTFT)/(tokens − 1), as the conventions define it; None
            # for runs stored before the agent reported E2E
            "gen_ai.server.time_per_output_token": _s(config.get("tpot_p50")),
            "specfleet.speculative.acceptance_rate": config.get("acceptance_p50"),
            "specfleet.speculative.speedup": config.get("speedup"),
            "specfleet.decode.tokens_per_second": config.get("decode_p50"),
            "specfleet.inter_token_latency.p95": _s(config.get("itl_p95")),
        },
    }


def annotate(a: dict) -> dict:
    """The analysis with an ``otel`` block on each config (for the JSON export)."""
    for s in a["series"]:
        for c in s.get("configs") or []:
            c["otel"] = config_attributes(s["series"], c, bool(s.get("calibration")))
    return a
