"""Deciding through the noise: a config the agent set aside for its decode-rate spread
alone (a noisy host, nothing wrong with the machine's state) is still judged where the
answer does not hang on that noise.

- A gate whose reading does not depend on timing (acceptance, exact output, task pass
  rate, swap) is judged as for any config: failing it fails whatever the noise.
- A timing gate (speedup, TTFT change, ITL p95) is judged on a 95% interval, never the
  point: it passes when the whole interval clears the limit, fails when none of it does,
  and is otherwise undecided (``passed`` None, ``undecided`` True). A pass is read on the
  interval at level 1 − 0.05/m, m the configs judged through the noise in the series
  (Bonferroni): the verdict takes the fastest that passes, so m 95% intervals would make a
  false candidate up to m times as often (audit 34n: 8.7% of weeks at six widths).
- The night (one sweep on one node) is the unit: only nights with both sides count, and
  with two or more the ratio's interval is Student's t on each night's log ratio, so a
  night with more trials on one side weighs no more on that side (audit 34n, Simpson).

Both pages (the weekly review and the sweep page) judge through this module, and a
decision reached so is marked wherever it is shown (``through_noise``)."""

from __future__ import annotations

import math
import statistics

from agent.stats import repetition_spread

from .compare import POOL_BELOW, night_ratio

LEVEL = 0.95
NOISE_MARK = "decided through the noise: "  # a config's classification, judged so
TIMING_GATES = ("speedup", "ttft_change", "itl_p95_ms")
# what a gate's interval is, as the pages name it (``interval_words``; else "95% interval")
INTERVAL_WORDS = {2: "span of both nights' 95% intervals"}
SPREAD = "decode tok/s spread "  # agent.summary.config_summary's words for the spread


# each gate in words, as every cell says it (never its identifier)
GATE_WORDS = {"speedup": "speedup", "itl_p95_ms": "ITL p95", "acceptance": "acceptance",
              "ttft_change": "time to first token", "swap_peak_bytes": "swap",
              "exact": "identical output", "streaming_parity": "streaming parity",
              "task_pass_rate": "task pass rate", "not_failed": "sustained acceptance"}


def undecided_text(name: str) -> str:
    """A gate no interval could settle, in words: "ITL p95 undecided"."""
    return f"{GATE_WORDS.get(name, name)} undecided"


def spread_alone(summary: dict | None) -> dict | None:
    """The spread ({value, limit}) that set a config's run aside when it is the run's only
    reason (None: another reason too, or a run stored before events 1.9; see
    ``stored_spread``)."""
    s = summary or {}
    return stored_spread(s) if spread_only(s.get("unreliable_reasons") or []) else None


def spread_only(reasons: list[str]) -> bool:
    """Whether the decode-rate spread is a run's (or config's) one reason to be set aside."""
    return len(reasons) == 1 and reasons[0].startswith(SPREAD)


def baseline_of(configs: list[dict], sampling, noisy_too: bool) -> dict | None:
    """The baseline at ``sampling`` among ``configs`` (in config-key order): the reliable
    one measured on the most nights beside a speculative config at those settings in one
    sweep (a speedup pairs within a sweep), then with the most reliable nights, then runs,
    then the first; else, with ``noisy_too``, the one set aside for its decode-rate spread alone on
    the most nights beside a speculative run (a night through the noise pairs those), then
    on the most nights (audit 43: a variant on more nights, none beside the speculative
    config, left it unpaired). One rule for the judging (``series``), the ladder, the
    rules and the pages: with two autoregressive variants at one sampling the speedup was
    judged against the first by run order while the memory read the first by key (audit
    41), and the first by key, measured on one night of three, then judged all three
    (audit 42: a TTFT of +12% every night read −5.9%)."""
    base = [c for c in configs if c["mode"] == "baseline" and c.get("sampling") == sampling]
    reliable = [c for c in base if not c["set_aside"]]
    if reliable or not noisy_too:
        return min(reliable, key=lambda c: (-c.get("paired_nights", 0),
                                            -c.get("reliable_nights", 0), -c.get("runs", 0)),
                   default=None)
    noisy = [c for c in base if _spread_nights(c)]
    return min(noisy, key=lambda c: (-c.get("spread_paired", 0), -_spread_nights(c)),
               default=None)


def _spread_nights(c: dict) -> int:
    """A baseline's nights set aside for the spread alone; a section stored before the count
    was kept: one where any of its reasons is the spread."""
    if "spread_nights" in c:
        return c["spread_nights"]
    return int(any(r.startswith(SPREAD) for r in c.get("unreliable_reasons") or []))


def baseline_at(section: dict, sampling) -> dict | None:
    """The section's baseline at ``sampling``: its reliable one, or, where its verdict was
    decided through the noise, the one set aside for its spread that the verdict was
    judged against (on a noisy VM every config's spread can pass 10%). One answer for the
    ladder and the rules: the rules once read no baseline there, so a through-the-noise
    pick's memory beside it went unread while the ladder showed it."""
    pick = noisy_pick(section)
    against = ((pick or {}).get("through_noise") or {}).get("against")
    if against is not None and pick.get("sampling") == sampling:  # type: ignore[union-attr]
        # the one the verdict's nights were paired with (series._noisy_base)
        return next((c for c in section["configs"] if c["mode"] == "baseline"
                     and c.get("config_id") == against), None)
    return baseline_of(section["configs"], sampling,
                       bool((section.get("verdict") or {}).get("through_noise")))


def noisy_pick(section: dict) -> dict | None:
    """The config the section's verdict switched on through the noise (set aside for its
    spread alone, passed on intervals), or None: the one the ladder walks to and the rules
    read (``ladder``, ``series.read_served``)."""
    v = section.get("verdict") or {}
    on = v.get("enable") if v.get("through_noise") else None
    if not on:
        return None
    return next((c for c in section["configs"] if c["mode"] == "speculative"
                 and c["set_aside"] and c["k"] == on["num_draft_tokens"]
                 and (c.get("through_noise") or {}).get("outcome") == "pass"
                 and (c.get("knobs") or {}) == (on.get("config") or {})), None)


def stored_spread(summary: dict | None) -> dict | None:
    """The spread ({value, limit}) that set a config's run aside (events 1.9's fields; None
    before them). The node's value is a claim: where the run's per-repetition decode rates
    are stored the spread is recomputed from them (the agent's own ``repetition_spread``),
    and a spread under its limit set nothing aside (None): a node could otherwise send
    'varied 1%' as a reason."""
    s = summary or {}
    claim = s.get("spread")
    if not claim:
        return None
    decode = [x for x in (s.get("values") or {}).get("decode_tok_s") or []
              if isinstance(x, (int, float))]
    if len(decode) == 1:  # one repetition has no spread: the claim is false (audit 34q)
        return None
    value = repetition_spread(decode)
    if value is None:  # none stored (or unreadable): nothing to check the claim with
        return claim
    return {"value": value, "limit": claim["limit"]} if value >= claim["limit"] else None


def _positive(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and 0 < x < math.inf]


def _whole(xs) -> list[float] | None:
    """The trials as numbers, or None when one is not a positive finite rate: a trial at
    0 tok/s (a stall) or beyond floats' range is never dropped to let the rest decide
    (audit 34p: [0, 150] read as a 1.50x candidate); the config gets no interval, so its
    timing gates stay undecided. A reading not taken (None) is dropped, as everywhere."""
    got = [x for x in xs if x is not None]
    return [float(x) for x in got] if all(0 < x < math.inf for x in got) else None


def ratio_interval(base: list[float], spec: list[float], level: float = LEVEL
                   ) -> tuple[float, float, float] | None:
    """spec/base as (ratio of geometric means, low, high): Welch's t on the logs of the
    trials; a side with one or two trials pools its spread with the other side's (its own
    where larger), Student's t on the pooled spread's own df (``night_ratio``,
    ``POOL_BELOW``, few_df "spread"). Welch credited two trials' one-df spread with the
    other side's df: 2 v 10 trials covered 90.3% (audit 27r); and a second repetition
    widened the interval, so the demo's trained pair stayed undecided with two. The pooled
    df summed (8 for 2 v 8) credited a noisy pair's one df with a quiet baseline's seven:
    91.3% covered, and a third trial (Welch, ~2 df) widened the interval by 41% (audit
    34p); the pooled spread's df is 8 where the spreads agree and ~2 there. None: no
    interval (a stalled or absurd trial, or too few), so the gate is undecided."""
    return _interval(base, spec, level, "spread")


def pass_interval(base: list[float], spec: list[float], level: float
                  ) -> tuple[float, float, float] | None:
    """The interval a pass is read on. Where a side has two trials or fewer its own spread
    is what a pass must clear, so the interval is Welch's with the smaller side's df
    (Hsu's conservative rule; few_df "own") and a one-trial side never passes: pooled, a
    quiet baseline lent its 7 df to two noisy trials and 3.3-6.2% of weeks on the gate made
    a false candidate at 1-6 widths (audit 34p; the level promises 2.5%). A fail is still
    read on the pooled 95% interval (``ratio_interval``): keeping the default needs less
    proof."""
    return _interval(base, spec, level, "own")


def _interval(base: list[float], spec: list[float], level: float, few_df: str
              ) -> tuple[float, float, float] | None:
    b, s = _whole(base), _whole(spec)
    if b is None or s is None:
        return None
    try:
        r = night_ratio(b, s, level, memory=False, few=POOL_BELOW, few_df=few_df)
    except OverflowError:  # rates apart by hundreds of orders of magnitude: no interval
        return None
    # a side of one trial borrows the other's spread: two identical trials there made a
    # zero-width interval under a spread claimed and never shown (audit 34p); both sides
    # repeated and identical is a spread measured as none
    if r["ci"] is None or (r["ci"][0] == r["ci"][1] and min(len(b), len(s)) < 2):
        return None
    return r["ratio"], r["ci"][0], r["ci"][1]


def level_interval(values: list[float], level: float = LEVEL
                   ) -> tuple[float, float, float] | None:
    """The geometric mean of ``values`` and its interval (Student's t on the logs)."""
    logs = [math.log(x) for x in _positive(values)]
    return _t_interval(logs, level)


def _t_interval(logs: list[float], level: float) -> tuple[float, float, float] | None:
    from scipy.special import stdtrit  # stats.t's own quantile, at half the import

    if len(logs) < 2:
        return None
    m, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    q = float(stdtrit(len(logs) - 1, 0.5 + level / 2))
    try:  # math.exp raises past floats' range: no interval
        return math.exp(m), math.exp(m - q * se), math.exp(m + q * se)
    except OverflowError:
        return None


def _log_mean(xs: list[float]) -> float | None:
    logs = [math.log(x) for x in _positive(xs)]
    return statistics.fmean(logs) if logs else None


Night = tuple[list[float], list[float]]  # (baseline's trials, speculative's) of one night


def nights_ratio_interval(nights: list[Night], level: float = LEVEL, passing: bool = False
                          ) -> tuple[float, float, float] | None:
    """spec/base over paired nights. One night: on its trials (``ratio_interval``, or
    ``pass_interval`` for the one a pass is read on). Two: the hull of each night's own
    (``_hull``). Three or more: each night's log ratio of geometric means is one
    observation, Student's t on them (df nights − 1): a night's trial counts never weigh
    one side only, and the night-to-night wobble of the ratio, which trials within a night
    cannot see, is in it. A stalled or absurd trial on any night: no interval."""
    if any(_whole(b) is None or _whole(s) is None for b, s in nights):
        return None
    both = [(b, s) for b, s in nights if _positive(b) and _positive(s)]
    one = pass_interval if passing else ratio_interval
    if len(both) == 1:
        return one(*both[0], level=level)
    if len(both) == 2:
        return _hull([one(b, s, level=level) for b, s in both])
    diffs = [_log_mean(s) - _log_mean(b) for b, s in both]  # type: ignore[operator]
    return _t_interval(diffs, level)


def _hull(ivs: list) -> tuple[float, float, float] | None:
    """Two nights: the span of each night's own interval, the geometric mean of their
    points. A gate on it passes only where both nights pass on their own and fails only
    where both fail (an intersection-union test: each night at the level, no correction
    needed), so a second night never makes the answer more certain than its less certain
    night. Student's t on two nightly ratios has one degree of freedom (t 12.7): it turned
    a clear 2x decisive on 98.9% of single nights into 41.1% of pairs of nights (6 v 6
    trials a night, CV 20%; now 97.4%, three nights 97.0%).
    Two nights cannot measure their wobble; from three, t on the nightly ratios does. At a
    true ratio on the gate, each night's wobbling by 10%: false passes 6.5% of single
    nights, 0.35% of pairs, 2.35% of threes (tests/test_through_noise.py)."""
    if any(iv is None for iv in ivs):
        return None
    try:
        point = math.exp(statistics.fmean(math.log(iv[0]) for iv in ivs))
    except (OverflowError, ValueError):
        return None
    return point, min(iv[1] for iv in ivs), max(iv[2] for iv in ivs)


def nights_level_interval(nights: list[list[float]], level: float = LEVEL
                          ) -> tuple[float, float, float] | None:
    """A level (ITL p95) over nights: one night's trials, two nights' hull (``_hull``), else
    one geometric mean a night."""
    have = [xs for xs in nights if _positive(xs)]
    if len(have) == 1:
        return level_interval(have[0], level)
    if len(have) == 2:
        return _hull([level_interval(xs, level) for xs in have])
    return _t_interval([m for xs in have if (m := _log_mean(xs)) is not None], level)


def pass_level(family: int) -> float:
    """The level a pass is read at when ``family`` configs are judged through the noise and
    the best passing one is taken (Bonferroni: at most 2.5% false passes over them all)."""
    return 1 - (1 - LEVEL) / max(1, family)


def decisive(low: float, high: float, limit: float, higher_is_better: bool) -> bool | None:
    """True when the whole interval clears the limit, False when none of it does, None
    (undecided) when the limit lies inside it."""
    good, bad = (low >= limit, high < limit) if higher_is_better else (high <= limit,
                                                                       low > limit)
    return True if good else False if bad else None


def interval_gate(ivs: tuple, limit: float, higher_is_better: bool,
                  offset: float = 0.0, level: float = LEVEL) -> dict:
    """A timing gate judged on intervals (``ivs``: the 95% one, then the one at the pass
    ``level``; ``offset`` moves a ratio to a change: −1). It fails when none of the 95%
    interval clears the limit, passes when all of the pass-level one does; without a
    pass-level interval (a side with one trial) it can fail, never pass."""
    iv, wide = ivs
    if iv is None:
        return {"value": None, "passed": None, "undecided": True}
    point, lo, hi = (x + offset for x in iv)
    wlo, whi = (x + offset for x in wide[1:]) if wide is not None else (-math.inf, math.inf)
    ok = True if decisive(wlo, whi, limit, higher_is_better) else \
        False if decisive(lo, hi, limit, higher_is_better) is False else None
    return {"value": point, "passed": ok, "interval": [lo, hi],
            **({"pass_interval": [wlo, whi], "pass_level": level}
               if level != LEVEL and wide is not None else {}),
            **({"undecided": True} if ok is None else {})}


def night_timing_gates(nights: list[tuple[dict, dict]], bucket: str, gates: dict,
                       family: int = 1) -> dict:
    """The timing gates over paired nights ((base, spec) trials a night), a pass read at
    ``pass_level(family)``."""
    lv = pass_level(family)

    def ratio(m: str) -> tuple:
        pairs = [(b[m], s[m]) for b, s in nights]
        return nights_ratio_interval(pairs), nights_ratio_interval(pairs, lv, passing=True)

    itl = [s["itl_p95_ms"] for _, s in nights]
    g = {"speedup": interval_gate(ratio("decode_tok_s"), gates["min_speedup"], True, level=lv),
         "itl_p95_ms": interval_gate((nights_level_interval(itl),
                                      nights_level_interval(itl, lv)),
                                     gates["itl_p95_ceiling_ms"], False, level=lv)}
    if bucket == "short":
        g["ttft_change"] = interval_gate(ratio("ttft_ms"), gates["ttft_regression_limit"],
                                         False, -1.0, lv)
    if len(nights) == 2:  # the hull is no 95% interval: it covers 99.95% (audit 43)
        for v in g.values():
            if v.get("interval"):
                v["interval_words"] = INTERVAL_WORDS[2]
    return g


def outcome(gates: dict) -> str:
    """"fail" when any gate fails (decisively, for a timing gate), "pass" when every gate
    passes and none is undecided, else "undecided"."""
    if any(v.get("passed") is False for v in gates.values()):
        return "fail"
    return "undecided" if any(v.get("undecided") for v in gates.values()) else "pass"


def spread_text(spreads: list[dict]) -> str:
    """'decode tok/s varied 36% (the plan allows under 10%)' over a config's spreads."""
    return (f"decode tok/s varied {spread_range(spreads)} (the plan allows under "
            f"{spread_limits(spreads)})")


def spread_range(spreads: list[dict]) -> str:
    """'36%', '10.2–22%': the spreads' values as percents, lowest to highest."""
    # a spread just over its limit must not read as the limit ("varied 10%, allows under
    # 10%"): one decimal where the whole percent would not show it over
    vs = sorted((f"{100 * s['value']:.0f}" if round(100 * s["value"]) > round(100 * s["limit"])
                 else f"{100 * s['value']:.1f}" for s in spreads), key=float)
    return f"{vs[0]}%" if vs[0] == vs[-1] else f"{vs[0]}–{vs[-1]}%"


def spread_limits(spreads: list[dict]) -> str:
    """'10%', '10%/20%': the limits the spreads were judged against."""
    return "/".join(f"{x}%" for x in sorted({round(100 * s["limit"]) for s in spreads}))
