"""`specfleet compare A B`: two sets of runs side by side, per config and metric.

A side is a selector: a sweep id, an ISO week (``2026-W20``), or ``key=value`` filters
joined by commas (``node=mac-01,week=2026-W20``, ``mlx_lm_version=0.33.0``, ``chip=Apple
M4``). Configs are matched by workload, context bucket, runtime, background profile and
the ingest's config key (every knob: sampling settings, draft width, lineup pair), and by
model pair where a side holds several (one pair a side is an identity difference, compared),
so two nodes, two weeks or two identities compare like for like and no two pairs pool.
Runs flagged unreliable are set aside and listed, never compared. The identity differences
come first: they are the likeliest explanation of any difference below them.

The unit is the night (one config on one node, the median of that night's runs), not the
repetition nor the sweep: nights differ more than repetitions do, and repetitions (and
sweeps) of one night share its state. Each night gives its median; the two sides' log
medians are compared by Welch's t (ratio of geometric means, 95% interval, p), so a night's
luck is not counted as many samples. A busy night (far off what its neighbours predict:
review/busy_nights) is set aside from its side's level, as an unreliable run is, and
listed on its row; the row is read with it kept too, and claims only what both readings see.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace

from agent.engines import DEFAULT_ENGINE
from agent.stats import median

from ..errors import ConfigError
from ..store import Store, queries
from ..store.runs import RUN_FILTERS, selected_runs
from .configs import config_label, knobs_of_key
from .nightmemory import mean_gain, mean_variance, read_memory, spread_df
from .side_level import Busy, mean_level, side_variance
from .side_level import reading as reading_of
from .week_runs import iso_week_bounds
from .week_sweeps import calibration_marks, target_role

METRICS = ("decode_tok_s", "ttft_ms", "itl_p95_ms", "acceptance_rate")
HIGHER_IS_BETTER = {"decode_tok_s": True, "ttft_ms": False, "itl_p95_ms": False,
                    "acceptance_rate": True}
IDENTITY_KEYS = RUN_FILTERS  # node, chip, versions, fingerprints, tiers, prompts, pair …
FILTERS = {"sweep", "week", "trigger", *IDENTITY_KEYS}
SIGNIFICANT_P = 0.01
# a side of this many nights or fewer pools its spread with the other side's (Student's t
# on the pooled df), as one night always borrowed the other side's: its own rests on ≤ 1 df
POOL_BELOW = 2
# one node's two sides whose nearest nights are at most this many days apart (a weekend
# between weeks) are one series, not independent sides (``_apart``); read as one series,
# weeks four nights apart at φ 0.9 cover 89.6-90.3% (3-8 nights, tests/test_audit_27r.py)
JOINED_DAYS = 3


@dataclass
class Side:
    selector: str
    runs: list  # Run rows (reliable)
    set_aside: list
    nights: dict | None = None  # run id → (node, the date of its sweep): the unit compared


def _parse(selector: str) -> dict[str, str]:
    if "=" not in selector:
        if selector in ("this-week", "last-week"):
            return {"week": selector.removesuffix("-week")}
        return {"week" if re.fullmatch(r"\d{4}-W\d{2}", selector) else "sweep": selector}
    out = {}
    for part in selector.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in FILTERS or not value.strip():
            raise ConfigError(f"{selector!r}: {part.strip()!r} is not a filter; use a sweep id, "
                              "an ISO week like 2026-W20 (or this-week, last-week), or "
                              f"KEY=VALUE with KEY one of {', '.join(sorted(FILTERS))}")
        out[key] = value.strip()
    return out


def select_side(store: Store, selector: str) -> Side:
    filters = _parse(selector)
    week = filters.pop("week", None)
    start, end, _ = iso_week_bounds(week) if week is not None else (None, None, None)
    got = selected_runs(store, sweep=filters.pop("sweep", None),
                        trigger=filters.pop("trigger", None), since=start, until=end,
                        columns=filters)
    if not got:
        raise ConfigError(f"{selector!r} selects no runs in the store")
    rows = [r for r, _ in got]
    return Side(selector, [r for r in rows if not r.unreliable],
                [r for r in rows if r.unreliable],
                {r.id: (r.node, at.date()) for r, at in got})


def _key(r, by_pair: bool, marks: dict, by_node: bool = False) -> tuple:
    # the config as the ingest keyed it (every knob, a lineup's pair), in its runtime and
    # background; and its model pair where a side holds several (each its own row: one
    # pair on each side is an identity difference, compared like any other); a calibration
    # target's runs (its sweep's lock marks it) are rows of their own, whatever their name;
    # and its node where a side holds several: a fleet's weeks compared whole would
    # otherwise read the mix of nodes (more nights of a faster node) as a change
    return (r.workload, r.context_bucket or "short", r.engine or DEFAULT_ENGINE,
            r.background or "", (r.model_pair or "?") if by_pair else "",
            (r.sweep_id, target_role(r.pair)) in marks, r.mode, r.num_draft_tokens,
            r.config_key, r.node if by_node else "")


def _values(runs: list, metric: str) -> list[float]:
    return [v for r in runs for v in ((r.summary or {}).get("values") or {}).get(metric) or []
            if v is not None]


def _per_night(runs: list, metric: str, nights: dict | None = None) -> list[tuple]:
    """(night, value), one a night on a node (the median of its runs' medians), the unit
    compare tests: several sweeps of one night share its state; they are not several
    nights. The night is a (node, date), or a run id where nights are unknown."""
    by: dict = defaultdict(list)
    for r in runs:
        if (m := median(_values([r], metric))) is not None:
            by[(nights or {}).get(r.id, r.id)].append(m)
    # in night order (node, then date): the interval reads the nights' memory from neighbours;
    # sorted as (node, date), not as text ("…date(2026, 5, 10)" sorts before "…5, 4)")
    return [(k, m) for k, vs in sorted(by.items(), key=lambda kv: _night_order(kv[0]))
            if (m := median(vs)) is not None]


def _rated(x) -> bool:
    """A night night_ratio reads: a positive finite rate (no log otherwise)."""
    import math

    return bool(x) and 0 < x < math.inf


def _night_label(key) -> str:
    """'mac-01 2026-05-06' (a night), 'run 12' where nights are unknown."""
    return f"{key[0]} {key[1].isoformat()}" if isinstance(key, tuple) else f"run {key}"


def _night_order(key) -> tuple:
    """(node, ISO date) for a night; (the run id's text, zero-padded) where nights are unknown."""
    if isinstance(key, tuple):
        return (str(key[0]), key[1].isoformat())
    return ("", f"{key:>20}")


def night_ratio(a: list[float], b: list[float], level: float = 0.95, memory: bool = True,
                few: int | None = None, apart: bool = False, few_df: str = "pooled") -> dict:
    """B/A from one value per night a side, each side in night order: the ratio of geometric
    means, its ``level`` interval and a two-sided p, by Welch's t on the logs (Student's on
    the sides' pooled spread when a side has one or two nights, ``POOL_BELOW``), with each
    side's variance of its mean taken under the nights' memory (``nightmemory``: φ 0, plain
    Welch, where the nights show none; ``memory=False``: φ 0, and only one night borrows
    unless ``few`` says how many pool, as through_noise's trials do). One night
    on each side leaves night-to-night noise unmeasured: the ratio only, no interval, no p.
    ``apart``: the sides are independent (two nodes, or weeks not back to back, ``_apart``):
    φ at its wider bound and each spread's df under it (two nodes at φ 0.9, eight nights a
    side, 86.0% → 94.1% covered).

    The pooled rule for few nights (independent AR(1) sides, σ 5%, 3,000 pairs, seed 1,
    drawn as tests/test_audit_27r.py draws them): 2 v 20 at φ 0 covers 97.8% (0.3%
    false claims; Welch 91.6%, 4.2%), at φ 0.5 96.3%; 2 v 5 98.6% / 96.2%; 1 v 5 (the rule
    before) 98.1% / 96.8%. A two-night side twice as noisy as twenty nights: 89.9% (Welch
    90.8%; the plain pooled spread 80.3%, hence a few-night side's own where larger).

    ``few_df``: the df a few-night side's interval is read on: "pooled" (the sides' df
    summed, compare's), "spread" (the pooled spread's own, Satterthwaite's: the summed df
    where the sides' spreads agree, down to the few side's own where its spread is all
    there is; through_noise's trials), "own" (Welch's spread on the few side's own df,
    Hsu's rule, no interval for a side of one: a pass through the noise).

    Busy nights (``nightmemory.read_memory``) are set aside from a side of ``MIN_QUIET``
    quiet nights or more (``busy``: indices into each side's positive finite nights; the
    ratio is the quiet nights'), else counted as noise (``side_level``): counted so, a week
    with a night in five busy read as slower (10.6% false claims; set aside 3.4%, audit
    27b). But a slowdown on some nights reads exactly so: read again with them kept
    (``all_nights``), a difference is claimed only where both readings see it, and the
    interval spans both (an intermittent 0.7x: 69% covered at the quiet level, audit 41b)."""
    import math

    # a night without a positive finite rate is no night (no log; an infinite rate read 0.0)
    la = [math.log(x) for x in a if _rated(x)]
    lb = [math.log(x) for x in b if _rated(x)]
    out: dict = {"ratio": None, "ci": None, "p": None}
    if not la or not lb:
        return out
    va = statistics.variance(la) if len(la) > 1 else None
    vb = statistics.variance(lb) if len(lb) > 1 else None
    if va is None and vb is None:
        out["ratio"] = math.exp(sum(lb) / len(lb) - sum(la) / len(la))
        return out
    phi, busy = read_memory([la, lb], apart) if memory else (0.0, [[], []])
    out["memory"] = phi
    # memory=False keeps the rule before (only one night borrows) unless ``few`` is given:
    # the bench's side-by-side; through_noise's trials pool as few nights do
    few = few if few is not None else POOL_BELOW if memory else 1
    # (a side of few nights pools its spread with the other's: nothing is set aside there)
    parts = [Busy.of(x, b) if min(len(la), len(lb)) > few else None
             for x, b in zip((la, lb), busy)]
    # busy nights set aside leave their side's level to its quiet nights: a busy night is
    # a spike, the quiet nights' level is what the config kept (as contended runs are set
    # aside); the caller is told which (``busy``: indices into a and b)
    if any(p is not None and p.aside for p in parts):
        out["busy"] = [p.at if p is not None and p.aside else [] for p in parts]
    if few_df == "own" and min(len(la), len(lb)) <= few and (va is None or vb is None):
        out["ratio"] = math.exp(mean_level(lb, parts[1]) - mean_level(la, parts[0]))
        return out  # a side of one has no spread of its own to read

    def reading(sides: list) -> tuple[float, list[float], float]:
        se2, df = _mean_variance((va, vb), (len(la), len(lb)), phi, few, apart and memory,
                                 few_df, sides)
        return reading_of(mean_level(lb, sides[1]) - mean_level(la, sides[0]), se2, df, level)

    out["ratio"], out["ci"], out["p"] = reading(parts)
    if "busy" in out:
        # the same nights read with the busy ones kept (their excess as noise): an
        # intermittent slowdown (B 0.7x on 6 of 20 nights) looks exactly like a busy
        # machine, and read at the quiet level alone its interval covered the true 0.90 in
        # 69% of pairs (audit 41b). A difference is claimed only where both readings see
        # it, and the interval spans both (the level shown stays the quiet nights')
        ratio, ci, p_all = reading([replace(x, set_aside=False) if x else None
                                    for x in parts])
        out["all_nights"] = {"ratio": ratio, "ci": ci, "p": p_all}
        out["ci"] = [min(out["ci"][0], ci[0]), max(out["ci"][1], ci[1])]
        out["p"] = max(out["p"], p_all)
    return out


def level(xs: list[float], busy: list[int] | None = None) -> float | None:
    """A side's level as ``night_ratio`` reads it, the centre B/A is the ratio of: the
    geometric mean of its nights with a positive finite rate, its busy ones (``busy``:
    indices into those, night_ratio's) set aside; by construction B/A > 1 exactly where
    B's level is above A's. A side with no such night: its median (no ratio is read)."""
    import math

    logs = [math.log(x) for i, x in enumerate(v for v in xs if _rated(v))
            if i not in (busy or ())]
    return math.exp(statistics.fmean(logs)) if logs else median(xs)


CENTRE = ("A and B (a, b in JSON): each side's level, the geometric mean of its nights (one "
          "median a night, busy nights set aside), the centre B/A is the ratio of")


def _mean_variance(vs: tuple, ns: tuple[int, int], phi: float, few: int,
                   apart: bool, few_df: str = "pooled",
                   busy: list | None = None) -> tuple[float, float]:
    """(variance of B's mean log minus A's, its df) from the sides' sample variances ``vs``
    (None for one night) under memory ``phi``; a side's spread rests on n − 1 df, or on
    ``spread_df`` under that memory where the sides are ``apart``. ``few_df``: see
    ``night_ratio``; ``busy``: each side's ``Busy`` (None: no busy night)."""
    dfs = [(spread_df(n, phi) if apart else n - 1) if n > 1 else 0 for n in ns]
    if min(ns) <= few and few_df == "own":
        # Welch's spread on the few side's own df (Hsu): what a pass must clear
        return sum(mean_variance(v, n, phi) for v, n in zip(vs, ns)), min(dfs)
    if min(ns) <= few:
        # few nights on a side (one or two): its own spread rests on at most one df. Both
        # sides' night σ² are pooled (weighted by their df: a single night adds none, the
        # rule for one night before), a few-night side keeps its own where that is larger
        # (a noisier side is not narrowed to the other's), Student's t on the pooled df.
        # Welch here credited the many-night side's df to a one-df spread: 2 v 20 covered
        # 91.0%, now 97.8%; and a second night widened the interval (5 v 1 → 5 v 2, median
        # log-width 0.469 → 0.637, now 0.455); see night_ratio's figures
        own = [mean_variance(v, n, phi) / mean_gain(n, phi) if v is not None else None
               for v, n in zip(vs, ns)]
        pooled = sum(o * (n - 1) for o, n in zip(own, ns) if o is not None) / (sum(ns) - 2)
        se2 = sum((pooled if o is None or n > few else max(o, pooled))
                  * mean_gain(n, phi) for o, n in zip(own, ns))
        if few_df == "spread" and pooled > 0:
            # the pooled spread's own df (Satterthwaite): its parts' df summed where they
            # agree, falling to the few side's where its spread is all there is. Summed, a
            # noisy side's one df was credited with a quiet side's seven, and a third trial
            # (Welch, ~2 df) widened the interval two gave (audit 34p)
            parts = [(f, o) for f, o in zip(dfs, own) if o is not None]
            return se2, sum(f * o for f, o in parts) ** 2 / sum(f * o * o for f, o in parts)
        return se2, sum(dfs)
    (ea, fa), (eb, fb) = (side_variance(v, n, phi, part, apart)
                          for v, n, part in zip(vs, ns, busy or [None, None]))
    se2 = ea + eb
    return se2, (se2 ** 2 / (ea ** 2 / fa + eb ** 2 / fb) if se2 > 0 else fa + fb)


def _apart(ra: list, rb: list, nights_a: dict | None, nights_b: dict | None) -> bool:
    """Whether two sides' nights are independent for night_ratio: not one node's nights
    in one unbroken run, no two consecutive nights more than JOINED_DAYS apart (two
    nodes, weeks not back to back, or a side whose other nights lie months away from the
    one night that touches the other side), or unknown. One node's weeks a weekend apart
    share its state: their means correlate (0.48 at φ 0.9 for eight nights), which the
    interval's narrower bound on φ leans on; a run broken anywhere shares none across
    the break."""
    na, nb = ([nights.get(r.id) for r in runs] if nights else [None]
              for nights, runs in ((nights_a, ra), (nights_b, rb)))
    known = [n for n in na + nb if n is not None]
    if len(known) < len(na) + len(nb) or len({node for node, _ in known}) != 1:
        return True
    days = sorted({d for _, d in known})
    return any((y - x).days > JOINED_DAYS for x, y in zip(days, days[1:]))


def _identity(runs: list, aside: list) -> dict[str, list[str]]:
    """Each identity key's values on a side: those of its compared runs, then any seen only
    in its set-aside runs, marked so (no row holds such a run: it explains no row)."""
    def seen(rs: list) -> dict[str, set]:
        out: dict[str, set] = defaultdict(set)
        for r in rs:
            for k in IDENTITY_KEYS:
                out[k].add(str(getattr(r, k)) if getattr(r, k) is not None else "?")
        return out

    own, extra = seen(runs), seen(aside)
    return {k: sorted(own[k]) + [f"{v} (set aside only)" for v in sorted(extra[k] - own[k])]
            for k in IDENTITY_KEYS}


def compare(store: Store, a_sel: str, b_sel: str) -> dict:
    a, b = select_side(store, a_sel), select_side(store, b_sel)
    ia, ib = _identity(a.runs, a.set_aside), _identity(b.runs, b.set_aside)
    differences = [{"key": k, "a": ia[k], "b": ib[k]} for k in IDENTITY_KEYS if ia[k] != ib[k]]
    by_pair = any(len({r.model_pair for r in s.runs}) > 1 for s in (a, b))
    by_node = any(len({r.node for r in s.runs}) > 1 for s in (a, b))
    by_a: dict[tuple, list] = defaultdict(list)
    by_b: dict[tuple, list] = defaultdict(list)
    # a calibration pair (its sweep's lock marks the target) is an instrument: its rows
    # are its own and say so, on the side(s) that swept it
    marks = calibration_marks(store)
    for r in a.runs:
        by_a[_key(r, by_pair, marks, by_node)].append(r)
    for r in b.runs:
        by_b[_key(r, by_pair, marks, by_node)].append(r)
    rows = []
    for key in sorted(set(by_a) | set(by_b), key=lambda k: tuple(map(str, k))):
        workload, bucket, engine, background, pair, cal, mode, k, config_key, node = key
        config = config_label(mode, k, knobs_of_key(config_key))
        for metric in METRICS:
            na = _per_night(by_a.get(key, []), metric, a.nights)
            nb = _per_night(by_b.get(key, []), metric, b.nights)
            va, vb = [v for _, v in na], [v for _, v in nb]
            if not va and not vb:
                continue
            row = {"workload": workload, "context_bucket": bucket,
                   "engine": engine + (f" · {background}" if background else ""),
                   "pair": pair or None, "series": engine + (f" · {background}" if background
                                                             else "") + (f" · {pair}" if pair
                                                                         else "")
                   + (f" · {node}" if node else ""),
                   **({"node": node} if node else {}),
                   # each side's level B/A is the ratio of (``levels``), not its median
                   # night: a median beside a ratio of means read the other way round
                   "config": config, "metric": metric, "a": level(va), "b": level(vb),
                   "n": [len(va), len(vb)], "ratio": None, "ci": None, "p": None,
                   "verdict": "only in " + ("A" if va else "B") if not (va and vb) else "",
                   **_calibration(cal, by_a.get(key, []), by_b.get(key, []))}
            if va and vb and row["a"]:
                apart = _apart(by_a.get(key, []), by_b.get(key, []), a.nights, b.nights)
                got = night_ratio(va, vb, apart=apart)
                row.update(got, apart=apart)
                busy = got.get("busy") or [[], []]
                row["a"], row["b"] = level(va, busy[0]), level(vb, busy[1])
                row["busy"] = _busy_nights(got.get("busy"), na, nb)
                if row["p"] is None:
                    row["verdict"] = "one night a side: not testable"
                elif row["p"] < SIGNIFICANT_P and not (row["ci"][0] <= 1.0 <= row["ci"][1]):
                    better = (row["ratio"] > 1) == HIGHER_IS_BETTER[metric]
                    row["verdict"] = "B better" if better else "B worse"
                else:
                    row["verdict"] = "same within noise"
            rows.append(row)
    aside = [{"side": side, "sweep_id": r.sweep_id, "node": r.node, "workload": r.workload,
              "config": config_label(r.mode, r.num_draft_tokens, knobs_of_key(r.config_key)),
              "reasons": (r.summary or {}).get("unreliable_reasons") or ["unreliable"]}
             for side, s in (("A", a), ("B", b)) for r in s.set_aside]
    # stored events of these sweeps that an older boundary let in malformed: the runs
    # compared come from the runs table, but a reader is told the sweep's store is not whole
    sweeps = sorted({r.sweep_id for s in (a, b) for r in s.runs + s.set_aside})
    return {"a": a_sel, "b": b_sel, "runs": [len(a.runs), len(b.runs)], "centre": CENTRE,
            "identity_differences": differences, "rows": rows, "set_aside": aside,
            "unreadable_events": [f"{u.sweep_id} {u.node}: {u.message()}"
                                  for u in queries.unreadable(store, sweeps)]}


def _busy_nights(busy: list | None, na: list, nb: list) -> dict[str, list[str]]:
    """Each side's busy nights set aside from its level (night_ratio's ``busy``: indices
    into its nights with a positive finite rate), as 'node date'."""
    out: dict[str, list[str]] = {"A": [], "B": []}
    for side, at, nights in zip("AB", busy or [[], []], (na, nb)):
        rated = [k for k, v in nights if _rated(v)]  # the nights night_ratio reads
        out[side] = [_night_label(rated[i]) for i in at]
    return out


def _busy_text(busy: dict | None) -> str:
    """' (busy nights set aside: A 3, B 1)' where a side's level left some out."""
    parts = [f"{side} {len(nights)}" for side, nights in (busy or {}).items() if nights]
    return f" (busy nights set aside: {', '.join(parts)})" if parts else ""


def _kept_text(kept: dict | None) -> str:
    """'; with them kept B/A is 0.899 (0.85–0.95): the interval spans both readings', as
    an intermittent slowdown reads the same as a busy machine."""
    if not kept or not kept.get("ci"):
        return ""
    lo, hi = kept["ci"]
    return (f"; with them kept B/A is {kept['ratio']:.3f} ({lo:.3f}–{hi:.3f}): the interval "
            "spans both readings (a slowdown on some nights reads as busy nights)")


def _calibration(cal: bool, a: list, b: list) -> dict:
    """``calibration``: the sides whose runs of this row swept a calibration target."""
    sides = [side for side, runs in (("A", a), ("B", b)) if cal and runs]
    return {"calibration": sides} if sides else {}


def _f(v, spec: str = ".4g") -> str:
    return "–" if v is None else format(v, spec)


def as_text(c: dict) -> str:
    lines = [f"A: {c['a']} ({c['runs'][0]} reliable runs)",
             f"B: {c['b']} ({c['runs'][1]} reliable runs)", ""]
    if c["identity_differences"]:
        lines.append("identity differences (the likeliest causes of what follows):")
        lines += [f"  {d['key']}: {', '.join(d['a'])} → {', '.join(d['b'])}"
                  for d in c["identity_differences"]]
    else:
        lines.append("identity: the same on both sides")
    lines.append("")
    # the runtime (and pair) column only where rows would otherwise read alike
    wide = max((len(r["series"]) for r in c["rows"]), default=0) + 2 \
        if len({r["series"] for r in c["rows"]}) > 1 else 0
    head = f"{'workload':<12}{'runtime · pair' if wide else '':<{wide}}{'config':<17}" \
           f"{'metric':<16}{'A gmean':>10}{'B gmean':>10}{'B/A':>7}{'95% CI':>15}{'p':>9}  verdict"
    lines.append(head)
    for r in c["rows"]:
        ci = f"{r['ci'][0]:.3f}–{r['ci'][1]:.3f}" if r["ci"] else "–"
        lines.append(f"{r['workload'][:11]:<12}{r['series'] if wide else '':<{wide}}"
                     f"{r['config']:<17}{r['metric']:<16}"
                     f"{_f(r['a']):>10}{_f(r['b']):>10}{_f(r['ratio'], '.3f'):>7}{ci:>15}"
                     f"{_f(r['p'], '.2g'):>9}  {r['verdict']}"
                     # its interval's premise: independent sides are read more widely
                     + (" (sides apart: independent nights)" if r.get("apart") else "")
                     + (f" (calibration pair: {'/'.join(r['calibration'])})"
                        if r.get("calibration") else "")
                     + _busy_text(r.get("busy")))
    lines.append(CENTRE)
    for s in c["set_aside"]:
        lines.append(f"SET ASIDE {s['side']} {s['node']} {s['workload']} {s['config']}: "
                     f"{'; '.join(s['reasons'])}")
    for r in c["rows"]:
        for side, nights in (r.get("busy") or {}).items():
            if nights:
                lines.append(f"BUSY NIGHTS SET ASIDE {side} {r['workload']} {r['config']} "
                             f"{r['metric']}: {len(nights)} ({', '.join(nights)}), far off "
                             "what their neighbours predict: the level compared is the "
                             "quiet nights'" + _kept_text(r.get("all_nights")))
    lines += [f"UNREADABLE {u}" for u in c["unreadable_events"]]
    return "\n".join(lines)

