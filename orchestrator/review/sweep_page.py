"""The review page: per node and workload, baseline vs each draft width.

Speedup is the candidate's median decode tok/s over the median of the baselines
measured in the same sweep, on the same node and prompt, with the same sampling.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from agent.engines import DEFAULT_ENGINE
from agent.events import GenerationFailed, Quality, SoakSample
from agent.protocol import DRAFT_FREE_METHODS, baseline_key
from agent.stats import median

from ..errors import SpecfleetError
from ..store import Store, queries
from ..store import runs as stored
from ..store.db import result_pair
from ..store.models import Measurement
from .busy import busy_who
from .gatewords import speedup_text
from .sweep_baselines import (
    Choice,
    baseline_choices,
    choice_runs,
    named,
    not_chosen,
    other_key,
    split_baselines,
)
from .sweep_noise import noise_sentence, verdicts_of, weekly_sections
from .sweep_reasons import reasons_said, spread_note
from .through_noise import SPREAD, stored_spread
from .week_sweeps import target_role

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@dataclass(frozen=True)
class Row:
    label: str
    mode: str
    num_draft_tokens: int
    runs: int
    decode_tok_s: float | None
    speedup: float | None
    acceptance_rate: float | None
    itl_p95_ms: float | None
    ttft_ms: float | None
    peak_memory_mb: float | None
    exactness: str
    sample_output: str
    task_pass_rate: float | None = None
    unreliable: int = 0
    unreliable_reasons: tuple[str, ...] = ()
    streaming_parity: str | None = None  # http runtimes: streamed vs non-streamed output
    knob: str | None = None               # the knob this row's setting came from
    knob_value: str | None = None
    set_aside: str | None = None          # why no conclusion is drawn from this row
    kv_cache_mb: float | None = None      # the KV caches at the end (median of its summary)
    # ``set_aside`` as its row says it: the spread's explanation is the section's, said once
    aside_mark: str | None = None
    aside_spreads: tuple[dict, ...] = ()  # the spreads that set this row's own config aside
    # a baseline config beside the one the weekly review chose at its sampling: shown, never
    # compared with; its marks (flags, parity, KV cache) are its own (``sweep_baselines``)
    config_key: str | None = None


def _exactness(runs: list[Measurement]) -> str:
    flags = [r.exact_match for r in runs]
    if any(f is False for f in flags):
        first = min((r.first_divergence, r.first_divergence_unit or "token")
                    for r in runs if r.exact_match is False)
        return f"diverged at {first[1]} {first[0]}"
    if flags and all(f is True for f in flags):
        return "identical"
    return "reference" if all(r.mode == "baseline" for r in runs) else "not checked"


def review_data(store: Store, sweep_id: str | None = None) -> dict:
    sweep_id = sweep_id or store.latest_sweep_id()
    if sweep_id is None:
        raise SpecfleetError("the store holds no sweeps yet; run `specfleet sweep` first")
    sweep = store.sweep(sweep_id)
    if sweep is None:
        raise SpecfleetError(f"no sweep {sweep_id!r} in the store")
    runs = stored.sweep_measurements(store, sweep_id)
    outcomes = stored.node_outcomes(store, sweep_id)
    # typed (store.queries): an event an older boundary let in malformed is left out
    # here and shown among the notices, never a KeyError
    failed = [{"node": s.node, "seq": s.event.seq, "what": " · ".join(
        v for v in (s.event.variant, s.event.workload, s.event.mode) if v),
               "error": s.event.error[:500]}
              for s in queries.typed(queries.events(
                  store, [sweep_id], ("generation_failed",), order=("node", "seq")))
              if isinstance(s.event, GenerationFailed)]
    quality = {(s.node, result_pair(s.event), s.event.num_draft_tokens): s.event.pass_rate
               for s in queries.typed(queries.events(store, [sweep_id], ("quality",)))
               if isinstance(s.event, Quality)}
    summaries = stored.sweep_runs(store, sweep_id)
    # a lineup's pairs are sections of their own, named as the weekly review names them
    pair_names = {r.pair: r.model_pair for r in summaries if r.pair is not None}
    from .weekly import DEFAULT_GATES

    # the sweep's lock, read once: its calibration targets, the gates its plan declared
    # (over the defaults) and the adaptive sweep's repetitions
    lock = stored.plan_lock(store, sweep.plan_id) or {}
    marked = _calibrations(lock)  # each calibration target's record, by role
    # a section set aside for its spread is decided through the noise only where the
    # weekly review's judgement of these same runs is, and in its words: one judgement
    judged = weekly_sections(store, sweep, lock, {**DEFAULT_GATES, **(lock.get("gates") or {})})
    weekly = verdicts_of(judged)
    # its speedups are read against the baseline the weekly review chose at each sampling
    choices = baseline_choices(judged)
    chose, others = choice_runs(store, sweep_id, choices), not_chosen(choices)
    kv_mb = _kv_cache_mb(summaries, others)
    engines, flagged, parity = _config_marks(summaries, others)
    groups: dict[tuple, list] = {}
    for r in runs:
        groups.setdefault((r.node, (r.workload, r.pair)), []).append(r)
    sections = []
    for (node, workload), rs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1][0], kv[0][1][1] or "")):
        pair = workload[1]
        rows = _set_aside(_rows(rs, chose), flagged, node, workload)
        rows = [replace(r, task_pass_rate=quality.get((node, _quality_pair(pair, r.mode),
                                                       r.num_draft_tokens)),
                        streaming_parity=parity.get(_marks_key(node, workload, r)),
                        kv_cache_mb=kv_mb(node, workload, r))
                for r in rows]
        engine = engines.get((node, workload))
        sections.append({"node": node, "workload": workload[0], "rows": rows,
                         "pair": pair_names.get(pair) if pair else None,
                         # its target is a calibration target: an instrument's rows
                         "calibration": target_role(pair) in marked,
                         "engine": engine or DEFAULT_ENGINE,
                         "has_parity": any(r.streaming_parity for r in rows),
                         "context_bucket": rs[0].context_bucket or "short",
                         "prompt_sha256": rs[0].prompt_sha256,
                         "verdict": noise_sentence(weekly.get((node, workload)))
                         or _verdict(rows),
                         # what every row set aside for its spread shares, said once
                         "spread_note": spread_note(rows),
                         "verdict_short": _busy_verdict(rows)})
    from .adaptive_stops import adaptive_stops, marked_stops
    from .load import load_ramps
    from .runtimes import agent_notices, stream_checks

    cal = marked.get("target")
    return {"sweep": sweep, "sections": sections, "outcomes": outcomes,
            # a busy node is said once, at the top; rows keep a short mark (figures on hover)
            "busy": _busy(sections),
            "calibration": cal,
            "notices": agent_notices(store, [sweep_id]) + stream_checks(store, sweep_id),
            "adaptive_stops": marked_stops(adaptive_stops(store, [sweep_id], {sweep_id: lock}),
                                           {sweep_id: set(marked)}),
            "soaks": soak_results(store, sweep_id),
            "loads": load_ramps(store, [sweep_id]),
            "set_aside": store.quarantined(sweep_id), "failed_generations": failed}


def _config_marks(summaries, others: dict[tuple, set[str]]) -> tuple[dict, dict, dict]:
    """From the config summaries: each (node, workload)'s runtime; the configs whose
    repetitions the agent flagged, each reason with its spread's fields (a spread over the
    threshold: their rows are shown but never concluded from; a flagged baseline voids its
    section's speedups); and, for http
    runtimes, streamed vs non-streamed output per config. A baseline the weekly review did
    not choose (``others``: config keys by section) is marked apart: its flags void no
    speedup read against the chosen one."""
    merged: dict[tuple, dict] = {}
    engines: dict[tuple, str] = {}
    flagged: dict[tuple, list[tuple[str, dict | None]]] = {}
    # a baseline's summary names no knob: it is the baseline of the candidates that
    # share its settings (kv_bits 4's baseline is not the draft widths')
    paired = {(r.node, (r.workload, r.pair), baseline_key(r.config)): _baseline_of(
        r.knob, r.knob_value) for r in summaries if r.mode == "speculative"}
    for r in summaries:
        n, m, x, w = r.node, r.mode, r.summary, (r.workload, r.pair)
        other = m == "baseline" and r.config_key in others.get((n, w), ())
        key = other_key(n, w, r.config_key) if other else (n, w, m) + (
            (None, None) if m == "baseline" else (r.knob, r.knob_value))
        engines.setdefault((n, w), r.engine)
        if x.get("unreliable_reasons"):
            # each reason with the spread behind it, as fields (events 1.9; recomputed from
            # the stored repetitions): a row says its own figure, the section the words
            sp = stored_spread(x)
            # a chosen (or only) baseline under the baseline of its candidates' settings
            fkey = key if other or m != "baseline" else (n, w, m) + paired.get(
                (n, w, baseline_key(r.config)), ("baseline", baseline_key(r.config)))
            flagged.setdefault(fkey, []).extend(
                (why, sp if why.startswith(SPREAD) else None)
                for why in x["unreliable_reasons"])
        p = x.get("parity")
        if p:  # every config in the row counts, not only the last one read
            into = merged.setdefault(key, {"checked": 0, "mismatches": 0,
                                           "tool_mismatches": 0, "first_difference": None})
            into["checked"] += p["checked"]
            into["mismatches"] += p["mismatches"]
            into["tool_mismatches"] += p.get("tool_mismatches") or 0
            offs = [o for o in (into["first_difference"], p.get("first_difference"))
                    if o is not None]
            into["first_difference"] = min(offs) if offs else None
    return engines, flagged, {key: _parity_text(p) for key, p in merged.items()}


def _kv_cache_mb(summaries, others: dict[tuple, set[str]]
                 ) -> Callable[[str, tuple, Row], float | None]:
    """A row's KV cache memory (MB, median of its config's generations), found through the
    config summaries: a candidate's by its knob and value, a baseline row's as the baseline
    of its candidates' settings (``baseline_key``: every knob but the draft width), a
    baseline the weekly review did not choose (``others``) by its own config."""
    spec: dict[tuple, dict] = {}
    base: dict[tuple, float | None] = {}
    for r in summaries:
        n, w0, m, kn, kv, x, pr, cfg = (r.node, r.workload, r.mode, r.knob, r.knob_value,
                                        r.summary, r.pair, r.config)
        mb = ((x.get("metrics") or {}).get("kv_cache_bytes") or {}).get("median")
        mb = mb / 1e6 if isinstance(mb, (int, float)) else None
        if m == "baseline" and r.config_key in others.get((n, (w0, pr)), ()):
            base[other_key(n, (w0, pr), r.config_key)] = mb
        elif m == "baseline":
            base[(n, (w0, pr), baseline_key(cfg or {}))] = mb
        else:
            spec[(n, (w0, pr), kn, kv)] = {"config": cfg or {}, "mb": mb}

    def find(node: str, workload: tuple, r: Row) -> float | None:
        if r.config_key:
            return base.get(other_key(node, workload, r.config_key))
        if r.mode == "speculative":
            return (spec.get((node, workload, r.knob, r.knob_value)) or {}).get("mb")
        for (n, w, kn, kv), c in spec.items():  # the candidates this baseline is paired with
            if (n, w) == (node, workload) and (
                    (kn, kv) == (r.knob, r.knob_value) if r.knob
                    else kn in SPECULATION_SETTINGS or kn is None):
                return base.get((node, workload, baseline_key(c["config"])))
        return None
    return find


def _calibrations(lock: dict) -> dict[str, dict]:
    """{role: its calibration record} for the models the sweep's lock marks as
    calibration targets."""
    return {role: m["calibration"] for role, m in (lock.get("models") or {}).items()
            if isinstance(m, dict) and isinstance(m.get("calibration"), dict)}


def _quality_pair(pair: str | None, mode: str) -> str | None:
    """Quality tasks run once per target baseline ("target+None"; an http baseline: no
    pair) and once per pair."""
    if not pair or mode != "baseline":
        return pair
    target, other = pair.split("+", 1)
    return None if other in DRAFT_FREE_METHODS else f"{target}+None"


SOAK_SHOWN = ("workload", "num_draft_tokens", "duration_s", "peak_rss_bytes", "swap_in_bytes")


def soak_results(store: Store, sweep_id: str) -> list[dict]:
    """Per node: the soak verdict, and decode speed early vs late in the run (sustained
    load shows throttling that a short sweep never reaches)."""
    rows = queries.typed(queries.events(store, [sweep_id], ("soak_sample", "soak_result"),
                                        order=("node", "seq")))
    samples: dict[str, list[SoakSample]] = {}
    out = []
    for s in rows:
        node, e = s.node, s.event
        if isinstance(e, SoakSample):
            samples.setdefault(node, []).append(e)
            continue
        # every field the page reads, present (optional ones may be absent from the event)
        p = {**dict.fromkeys(SOAK_SHOWN), "reasons": [], **e.to_json()}
        p["reasons"] = p["reasons"] or []
        rates = [x.decode_tok_s for x in samples.get(node, []) if x.decode_tok_s]
        third = len(rates) // 3
        early = median(rates[:third]) if third else None
        late = median(rates[-third:]) if third else None
        out.append({"node": node, **p, "decode_early": early, "decode_late": late,
                    "late_over_early": late / early if early and late else None})
    return out


def _parity_text(p: dict) -> str:
    if not p["mismatches"]:
        return f"ok ({p['checked']}/{p['checked']})"
    where = (f", first at offset {p['first_difference']}"
             if p.get("first_difference") is not None else "")
    tools = f", {p['tool_mismatches']} in tool calls" if p.get("tool_mismatches") else ""
    return f"{p['mismatches']} of {p['checked']} differ{where}{tools}"


# Settings that choose how to speculate (a draft width; an http runtime's variant): every
# baseline run shares their sampling. Any other knob changes sampling, so its baseline too.
SPECULATION_SETTINGS = ("num_draft_tokens", "variant")


def _baseline_of(knob: str | None, value: str | None) -> tuple[str | None, str | None]:
    """Which baseline a run of (knob, value) is compared with: the shared one for a way of
    speculating (a draft width, a variant), that value's own for any other knob."""
    return (None, None) if (knob or "num_draft_tokens") in SPECULATION_SETTINGS \
        else (knob, value)


def _rows(rs: list[Measurement], chose: dict[tuple[str, int], Choice] | None = None
          ) -> list[Row]:
    """One row per setting of a knob: a draft width, a runtime variant, or a sampling knob's
    value (its runs are never pooled with another value's). Each candidate is compared with
    the baseline runs of the same sampling: where there are several baseline configs, those
    of the one the weekly review chose (``chose``: each baseline run's choice, by (node,
    seq)); each other one is a row of its own, compared with nothing."""
    def setting(r: Measurement) -> tuple[str, str]:
        return r.knob or "num_draft_tokens", r.knob_value or ""

    chose = chose or {}
    base, aside = split_baselines([r for r in rs if r.mode == "baseline"], chose)
    shared = [r for r in base if setting(r)[0] in SPECULATION_SETTINGS]
    rows = []
    if shared or not base:
        rows.append(_row(named("baseline (autoregressive)", shared, chose), "baseline", 0,
                         shared, median(r.decode_tok_s for r in _reliable(shared))))
    for (knob, value) in sorted({setting(r) for r in base} - {setting(r) for r in shared}):
        runs = [r for r in base if setting(r) == (knob, value)]
        rows.append(_row(named(f"baseline, {knob}={value}", runs, chose), "baseline", 0,
                         runs, median(r.decode_tok_s for r in _reliable(runs)), knob, value))
    rows += [replace(_row(f"baseline, {name} (not the baseline compared with)", "baseline",
                          0, runs, None), config_key=ck)
             for ck, name, runs in aside]
    for knob, value in sorted({setting(r) for r in rs if r.mode == "speculative"},
                              key=lambda kv: (kv[0] not in SPECULATION_SETTINGS, kv)):
        cand = [r for r in rs if r.mode == "speculative" and setting(r) == (knob, value)]
        k = cand[0].num_draft_tokens
        paired = shared if knob in SPECULATION_SETTINGS else [
            r for r in base if setting(r) == (knob, value)]
        label = {"num_draft_tokens": f"speculative, draft width {k}",
                 "variant": f"speculative, variant {value} (draft width {k})"}.get(
            knob, f"speculative, {knob}={value} (draft width {k})")
        rows.append(_row(label, "speculative", k, cand,
                         median(r.decode_tok_s for r in _reliable(paired)), knob, value))
    return rows


def _set_aside(rows: list[Row], flagged: dict, node: str, workload: tuple) -> list[Row]:
    """Rows whose config the agent flagged unreliable keep their numbers but lose their
    speedup; so does every row when the baseline it is compared with is flagged."""
    out = []
    for r in rows:
        # each row's baseline is the one of its own sampling settings (kv_bits 4's, not all)
        base = flagged.get(other_key(node, workload, r.config_key) if r.config_key else
                           (node, workload, "baseline") + _baseline_of(r.knob, r.knob_value))
        own = flagged.get((node, workload, r.mode, r.knob, r.knob_value)) \
            if r.mode == "speculative" else base
        why, mark, spreads = r.set_aside, r.set_aside, ()
        if own:
            why, mark = reasons_said(own)
            spreads = tuple(sp for _, sp in own if sp)
        elif base and r.mode == "speculative":
            why, mark = ("its baseline is unreliable: " + x for x in reasons_said(base))
        out.append(replace(r, set_aside=why, aside_mark=mark, aside_spreads=spreads,
                           speedup=None if why else r.speedup))
    return out


def _marks_key(node: str, workload: tuple, r: Row) -> tuple:
    """How a row's config is keyed among ``_config_marks``' parity."""
    if r.config_key:
        return other_key(node, workload, r.config_key)
    return (node, workload, r.mode) + (
        (None, None) if r.mode == "baseline" else (r.knob, r.knob_value))


def _reliable(runs: list[Measurement]) -> list[Measurement]:
    return [r for r in runs if not r.unreliable]


def _row(label, mode, k, runs, base_rate, knob=None, knob_value=None) -> Row:
    # medians from trials on a sound machine only; the others are counted, not averaged
    ok = _reliable(runs)
    rate = median(r.decode_tok_s for r in ok)
    mem = median(r.peak_mlx_memory_bytes for r in ok)
    return Row(label=label, mode=mode, num_draft_tokens=k, knob=knob, knob_value=knob_value,
               runs=len(runs), decode_tok_s=rate,
               speedup=rate / base_rate if rate and base_rate else None,
               set_aside=None if ok else "every trial unreliable",
               acceptance_rate=median(r.acceptance_rate for r in ok),
               itl_p95_ms=median(r.itl_p95_ms for r in ok),
               ttft_ms=median(r.ttft_ms for r in ok),
               peak_memory_mb=mem / 1e6 if mem else None, exactness=_exactness(runs),
               sample_output=runs[0].output_text if runs else "",
               unreliable=sum(1 for r in runs if r.unreliable),
               unreliable_reasons=tuple(sorted({x for r in runs
                                                for x in r.unreliable_reasons or []})))


def _busy(sections: list[dict]) -> dict | None:
    """The rows set aside for contention alone, of all, and who took the CPU from them."""
    busy = [r for s in sections for r in s["rows"] if busy_row(r)]
    if not busy:
        return None
    return {"rows": len(busy), "of": sum(len(s["rows"]) for s in sections),
            "who": busy_who(reasons=[x for r in busy for x in r.unreliable_reasons
                                     if x.startswith("contended")])}


def busy_row(r: Row) -> bool:
    """A row set aside because other processes competed for the CPU (and for nothing
    else): the page says so once at the top instead of repeating the figures per row."""
    reasons = [x for x in r.unreliable_reasons if x]
    return bool(r.set_aside) and bool(reasons) and all("contended" in x for x in reasons)


def _busy_verdict(rows: list[Row]) -> str | None:
    """"No conclusion: the node was busy" when every speculative row is set aside for
    contention alone (``_verdict`` keeps the figures, for the JSON and the tests)."""
    spec = [r for r in rows if r.mode == "speculative"]
    if spec and all(r.speedup is None for r in spec) and all(busy_row(r) for r in spec):
        return ("No conclusion: every speculative row was set aside because the node was "
                "busy (see the top of the page).")
    return None


def _verdict(rows: list[Row]) -> str:
    """One sentence a reader can act on: does speculation pay here, and at which width."""
    spec = [r for r in rows if r.mode == "speculative" and r.speedup is not None]
    aside = [r for r in rows if r.mode == "speculative" and r.set_aside]
    # changed output is a fact about correctness, whatever the machine's noise did to speed
    inexact = [r for r in rows if r.mode == "speculative" and r.exactness.startswith("diverged")]
    if inexact:
        widths = ", ".join(str(r.num_draft_tokens) for r in inexact)
        return f"Output changed under speculation (draft width {widths}): do not ship."
    note = (f" {len(aside)} speculative row{'s' if len(aside) > 1 else ''} set aside as "
            "unreliable." if aside else "")
    if not spec and aside:
        n = len(aside)
        return (f"No conclusion: {'the' if n == 1 else f'all {n}'} speculative "
                f"row{'s are' if n > 1 else ' is'} set aside as unreliable "
                f"({aside[0].aside_mark or aside[0].set_aside}).")
    if not spec:
        return "No speculative runs measured."
    best = max(spec, key=lambda r: r.speedup or 0.0)
    assert best.speedup is not None
    if best.speedup < 1:
        return (f"Speculation is a net loss here: best is draft width {best.num_draft_tokens} "
                f"at {speedup_text(best.speedup)} the baseline. Keep autoregressive "
                f"decoding.{note}")
    return (f"Best: draft width {best.num_draft_tokens} at {speedup_text(best.speedup)} the "
            f"baseline (acceptance {fmt_value(best.acceptance_rate, '.2f')}).{note}")


def fmt_value(value, spec: str = ".1f", missing: str = "–") -> str:
    """``value`` as ``spec``; a value that rounds to zero reads 0 ("0.00", "+0%"), never
    "-0.00" (a sign on nothing reads as a loss)."""
    if value is None:
        return missing
    text = format(value, spec)
    if text.startswith("-") and not re.search(r"[1-9]", text):
        text = ("+" if "+" in spec else "") + text[1:]
    return text


def times(value, spec: str = ".2f") -> str:
    """A ratio with its sign of multiplication; nothing measured is "–", never "–×"."""
    return "–" if value is None else fmt_value(value, spec) + "×"


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(
        ["html", "j2"], default_for_string=True, default=True), undefined=StrictUndefined)
    from .load import chart

    env.filters.update(fmt=fmt_value, times=times, load_chart=chart, busy_row=busy_row,
                       speedup=speedup_text)
    return env


def render_review(store: Store, out: Path, sweep_id: str | None = None) -> Path:
    """Write the HTML review for a sweep (default: the latest) to ``out``."""
    data = review_data(store, sweep_id)
    html = environment().get_template("review.html.j2").render(**data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
