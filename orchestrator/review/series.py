"""One series' week judged: its configs (one per ingest config key) against the baseline
of their own sampling settings, gates, the metrics its rules read, signals, regressions,
change points, the trend of its best config and acceptance by draft position."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from agent.stats import cv, median

from ..store.db import result_pair
from .busy import contention_readings
from .changepoints import MIN_HISTORY, change_points
from .config_stats import ConfigStats, classify, config_stats, evaluate_gates
from .configs import ConfigId, canonical, group_configs
from .load import load_signals
from .regression import regression
from .rules import Rule, fire
from .through_noise import (
    GATE_WORDS,
    NOISE_MARK,
    baseline_at,
    baseline_of,
    night_timing_gates,
    noisy_pick,
    outcome,
    spread_alone,
    spread_text,
)
from .week_runs import RunRow, identity_changes, vals
from .windows import GenRow


@dataclass(frozen=True)
class Week:
    """What every series of the week is judged with."""

    start: datetime
    quality: dict            # windows.quality_rates
    failed: set              # windows.failed_window_configs
    levels: dict             # levels.nightly_levels (empty: no change points)
    ramps: list              # load.load_ramps
    rules: list[Rule]
    regressions_too: bool


@dataclass(frozen=True)
class Best:
    """The series' best speculative config, the baseline it is compared with, and the
    configs that share its sampling settings."""

    best: ConfigStats | None
    best_id: ConfigId | None
    base: ConfigStats | None
    base_id: ConfigId | None
    family: list[ConfigStats]


def judge(section: dict, key: tuple, runs: list[RunRow], cur: list[RunRow], latest: RunRow,
          series_gates: dict, week: Week) -> None:
    """A series' configs this week (one per ingest config key), gates, metrics, signals,
    regressions and change points, into ``section``."""
    configs, shaky, stats = _config_table(cur, week.quality)
    section["set_aside"] = [
        {"config": stats[ck].label, "runs": len(rs), "of": len(rs) + len(configs[ck]),
         "reasons": sorted({x for r in rs for x in
                            r.summary.get("unreliable_reasons") or ["unknown"]}),
         **({"contention": cr} if (cr := contention_readings(rs)) else {}),
         # events 1.9: the spread that set each run aside, as fields (None: another reason
         # too, or a run stored before 1.9)
         **({"spreads": sp} if any(sp := [spread_alone(r.summary) for r in rs]) else {})}
        for ck, rs in sorted(shaky.items(), key=lambda kv: kv[0].order()) if rs]
    # each speculative config against the baseline of its own sampling settings
    # (a dict in config-key order: _best falls back on the first)
    bases = {s: stats[k] for s in dict.fromkeys(stats[k].sampling for k in
                                                sorted(stats, key=ConfigId.order))
             if (k := base_key(stats, s, noisy_too=False)) is not None}
    # the configs judged through the noise, paired night by night with their baseline: how
    # many there are sets the level a pass is read at (Bonferroni over them)
    # one reference per sampling, the baseline pairing the most nights over them all:
    # widths judged against different baselines made a width 40% slower the pick (audit 44)
    cands = [ck for ck, c in stats.items() if c.mode == "speculative"
             and (bases.get(c.sampling) is None or c.set_aside)]
    refs = {sp: _noisy_base(sp, [k for k in cands if stats[k].sampling == sp], stats,
                            configs, shaky) for sp in {stats[k].sampling for k in cands}}
    noisy = {ck: (p, ref) for ck in cands if (ref := refs[stats[ck].sampling]) is not None
             and (p := _nights_with(ck, ref, configs, shaky))}
    for ck, c in sorted(stats.items(), key=lambda kv: kv[0].order()):
        base = bases.get(c.sampling)
        if c.mode == "speculative" and base is not None and not c.set_aside:
            fw = any((r.sweep_id, r.node, key[2], r.pair, canonical(r.config)) in week.failed
                     for r in configs[ck])
            c.gates = evaluate_gates(c, base, key[3], series_gates, fw)
            c.classification = classify(c)
        elif ck in noisy:
            _judge_through_noise(c, noisy[ck][0], len(noisy), key[3], series_gates, week)
            c.through_noise["against"] = stats[noisy[ck][1]].config_id  # type: ignore
        section["configs"].append(c.__dict__)
    b = _best(stats, bases)
    metrics = _metrics(b, stats, configs)
    metrics.update(load_signals(week.ramps, {r.sweep_id for r in cur}, latest.node, key[2]))
    section["metrics"] = metrics
    section["signals"] = fire(week.rules, metrics)
    if week.regressions_too:
        _regressions(section, runs, configs, stats, week.start, latest.identity)
    levels = week.levels.get(key, {})
    section["change_points"] = [
        {"config": stats[ck].label, "metric": "decode_tok_s", **cp}
        for ck in sorted(configs, key=ConfigId.order)
        for cp in change_points(levels.get(ck, []), identity_changes)]
    # configs with nights enough to look at: "every series held its level" needs one
    section["cp_examined"] = sum(len(levels.get(ck, [])) >= MIN_HISTORY for ck in configs)
    section["trend"] = _trend(runs, b.best_id)
    section["speedup_by_k"] = {c.k: c.speedup for c in b.family}
    section["itl_p95_values"] = {
        "baseline": vals(configs[b.base_id], "itl_p95_ms") if b.base_id else [],
        "best": vals(configs[b.best_id], "itl_p95_ms") if b.best_id else []}


def read_served(section: dict, rules: list) -> bool:
    """Where the verdict switches on a width judged through the noise, the rules read that
    width (its memory beside its baseline's, its speedup and acceptance through the noise),
    not the fastest reliable one (audit 34q: +100% memory read as width 2's +10%): the
    metrics say so (``best_through_noise``) and so does each signal they fire. True when
    the metrics were re-read (the verdict is then decided again on the new signals)."""
    metrics, c = section.get("metrics"), noisy_pick(section)
    if c is None or metrics is None:
        return False
    base = baseline_at(section, c.get("sampling"))
    mem, bmem = c.get("peak_memory"), (base or {}).get("peak_memory")
    tn = c["through_noise"]
    metrics.update(best_k=c["k"], best_config=c.get("config_id"), best_label=c["label"],
                   best_speedup=tn["speedup"],
                   best_acceptance=tn["acceptance"], best_through_noise=True,
                   mem_increase=mem / bmem - 1 if mem and bmem else None,
                   mem_added_bytes=mem - bmem if mem and bmem else None,
                   # the width served swaps as it swaps: its readings count beside the
                   # reliable configs' (swap is no decode rate: its spread did not touch it)
                   swap_peak_bytes=max(metrics.get("swap_peak_bytes") or 0,
                                       c.get("swap_peak") or 0),
                   swap_in_nights=max(metrics.get("swap_in_nights") or 0,
                                      c.get("swap_in_nights") or 0))
    section["signals"] = [{**s, "through_noise": True} for s in fire(rules, metrics)]
    return True


def _usable(rs: list[RunRow]) -> tuple[list[RunRow], bool]:
    """One night's runs of one config to judge by: its reliable ones, else those set aside
    for their spread alone (marked: True); a run set aside for anything else never counts.
    Chosen night by night: one reliable night must not discard the other nights' noisy
    runs and leave every night's trials judged against that one night (audit 34n)."""
    ok = [r for r in rs if not r.shaky]
    return (ok, False) if ok else ([r for r in rs if spread_alone(r.summary)], True)


def base_key(stats: dict[ConfigId, ConfigStats], sampling: str,
             noisy_too: bool) -> ConfigId | None:
    """The key of the baseline configs at ``sampling`` are judged against, by the rule the
    pages read it back with (``through_noise.baseline_of``, in config-key order)."""
    keys = sorted((k for k, b in stats.items() if b.mode == "baseline"), key=ConfigId.order)
    chosen = baseline_of([stats[k].__dict__ for k in keys], sampling, noisy_too)
    return next((k for k in keys if stats[k].__dict__ is chosen), None)


Paired = list[tuple[list[RunRow], list[RunRow]]]  # (baseline runs, speculative) a night


def _noisy_base(sampling: str, specs: list[ConfigId], stats: dict[ConfigId, ConfigStats],
                configs: dict, shaky: dict) -> ConfigId | None:
    """The baseline at ``sampling`` that pairs the most nights over ``specs`` (the
    speculative configs judged through the noise there), base_key's first, then key order,
    where they tie: a variant reliable in one sweep of its own was chosen over one beside
    the config every night, and the verdict rested on one night (audit 43)."""
    first = base_key(stats, sampling, noisy_too=True)
    keys = sorted((k for k, b in stats.items() if b.mode == "baseline"
                   and b.sampling == sampling), key=lambda k: (k != first, k.order()))
    if not keys:
        return None
    return max(keys, key=lambda b: (sum(len(_nights_with(ck, b, configs, shaky))
                                        for ck in specs), -keys.index(b)))


def _nights_with(ck: ConfigId, base_ck: ConfigId, configs: dict, shaky: dict) -> Paired:
    """The nights (node, date) on which both the config and its baseline have usable runs,
    one of them set aside for the spread alone: a night with one side only is no evidence
    (its trials pooled against another night's would measure the drift between nights).
    Sweeps of one night pool into that night, as the review counts nights: keyed by sweep,
    three sweeps an hour apart made three 'nights' and a t interval of 1.30-1.30 where
    the night's trials give 1.05-1.61 (audit 34p)."""
    def by_night(rs: list[RunRow]) -> dict[tuple, list[RunRow]]:
        out: dict[tuple, list[RunRow]] = defaultdict(list)
        for r in rs:
            out[(r.node, r.at.date())].append(r)
        return out

    spec = by_night(configs[ck] + shaky.get(ck, []))
    base = by_night(configs[base_ck] + shaky.get(base_ck, []))
    out, noisy = [], False
    for night in sorted(spec.keys() & base.keys()):
        (b, b_noisy), (s, s_noisy) = _usable(base[night]), _usable(spec[night])
        if b and s:
            out.append((b, s))
            noisy |= b_noisy or s_noisy
    return out if noisy else []


def _judge_through_noise(c: ConfigStats, nights: Paired, family: int, bucket: str,
                         gates: dict, week: Week) -> None:
    """A speculative config without a reliable verdict, because it or its baseline was
    set aside for the decode-rate spread alone: gates that do not hang on timing as
    always, timing gates on intervals over the paired nights (``through_noise``), a pass
    read at the level for ``family`` such configs, marked."""
    spec = [r for _, s in nights for r in s]
    base = [r for b, _ in nights for r in b]
    st, bst = config_stats(spec, {}, week.quality), config_stats(base, {}, week.quality)
    fw = any((r.sweep_id, r.node, bucket, r.pair, canonical(r.config)) in week.failed
             for r in spec)
    g = evaluate_gates(st, bst, bucket, gates, fw)
    g.update(night_timing_gates(
        [({m: vals(b, m) for m in ("decode_tok_s", "ttft_ms")},
          {m: vals(s, m) for m in ("decode_tok_s", "ttft_ms", "itl_p95_ms")})
         for b, s in nights], bucket, gates, family))
    c.gates, res = g, outcome(g)
    spreads = [sp for r in spec + base if (sp := spread_alone(r.summary))]
    c.through_noise = {"outcome": res, "spreads": spreads, "text": spread_text(spreads),
                       # the nights behind it are the paired ones (provisional counts them)
                       "runs": len(spec), "nights": len({b[0].at.date() for b, _ in nights}),
                       "speedup": g["speedup"]["value"], "acceptance": st.acceptance_p50,
                       "exact": st.exact, "sampling": c.sampling, "k": c.k, "family": family}
    c.classification = NOISE_MARK + (
        classify(c) if res != "undecided" else "undecided: " + ", ".join(
            GATE_WORDS.get(n, n) for n, v in g.items() if v.get("undecided")))


def _config_table(cur: list[RunRow], quality: dict
                  ) -> tuple[dict[ConfigId, list[RunRow]], dict[ConfigId, list[RunRow]],
                             dict[ConfigId, ConfigStats]]:
    """This week's runs by config, reliable and set aside, and each config's numbers: an
    unreliable trial is reported, never averaged in."""
    configs = group_configs((r for r in cur if not r.shaky), RunRow.whole.fget)  # type: ignore
    shaky = group_configs((r for r in cur if r.shaky), RunRow.whole.fget)  # type: ignore
    # each sampling's baseline by base_key's rule (through_noise.baseline_of), read from
    # the reliable runs: with two autoregressive variants at one sampling, runs took
    # whichever came last in their sweep
    sweeps, nights = _speculative_places(cur)
    keys = sorted((k for k in configs if k.mode == "baseline"), key=ConfigId.order)
    brief = [{"mode": "baseline", "sampling": configs[k][0].sampling, "set_aside": False,
              "paired_nights": _paired(configs[k], sweeps),
              "reliable_nights": len({r.at.date() for r in configs[k]}),
              "runs": len(configs[k]) + len(shaky.get(k, []))} for k in keys]
    chosen = [k for k, b in zip(keys, brief)
              if baseline_of(brief, b["sampling"], noisy_too=False) is b]
    base_by_sweep = {}
    for r in (r for ck in chosen for r in configs[ck]):
        v = r.summary.get("values") or {}
        d, t = median(v.get("decode_tok_s") or []), median(v.get("ttft_ms") or [])
        if d:
            base_by_sweep[(r.sweep_id, r.node, r.sampling)] = {"decode": d, "ttft": t}
    for ck in shaky:
        configs.setdefault(ck, [])
    stats: dict[ConfigId, ConfigStats] = {}
    for ck, rs in configs.items():
        st = config_stats(rs or shaky[ck], base_by_sweep, quality)
        aside = shaky.get(ck, [])
        if rs:
            st.unreliable = len(aside)
            st.unreliable_reasons = sorted({x for r in aside for x in
                                            r.summary.get("unreliable_reasons") or []})
            st.contention = contention_readings(aside)
            st.runs = len(rs) + len(aside)
            st.trials += len(vals(aside, "decode_tok_s"))
        else:  # nothing reliable to conclude from: its numbers are shown only
            st.set_aside, st.speedup = True, None
            st.classification = "set aside: every run unreliable"
        # nights it could be judged through the noise on (_usable), and of those the ones
        # beside a speculative config: baseline_of's rank
        spread = [r for r in aside if spread_alone(r.summary)]
        st.spread_nights = len({r.at.date() for r in spread})
        st.spread_paired = len({(r.node, r.at.date(), r.sampling) for r in spread} & nights)
        if st.mode == "baseline" and rs:
            st.paired_nights = _paired(rs, sweeps)
        stats[ck] = st
    return configs, shaky, stats


def _speculative_places(cur: list[RunRow]) -> tuple[set, set]:
    """Where speculative runs were measured, each with its sampling settings: the (sweep,
    node) a reliable baseline pairs in, and the (node, night) one set aside for its spread
    pairs on (``_nights_with``)."""
    spec = [r for r in cur if r.mode == "speculative"]
    return ({(r.sweep_id, r.node, r.sampling) for r in spec},
            {(r.node, r.at.date(), r.sampling) for r in spec})


def _paired(runs: list[RunRow], sweeps: set) -> int:
    """The nights on which a baseline's reliable runs sit beside a speculative config's in
    one sweep (nights, not sweeps: four sweeps of one night outranked two nights and the
    speedup rested on that night, audit 44)."""
    return len({(r.node, r.at.date()) for r in runs if (r.sweep_id, r.node, r.sampling)
                in sweeps})


def _best(stats: dict[ConfigId, ConfigStats], bases: dict[str, ConfigStats]) -> Best:
    spec = [c for c in stats.values() if c.mode == "speculative" and c.speedup
            and not c.set_aside]
    best = max(spec, key=lambda c: c.speedup or 0.0) if spec else None
    base = bases.get(best.sampling) if best else next(iter(bases.values()), None)
    return Best(best, next((ck for ck, c in stats.items() if c is best), None), base,
                next((ck for ck, c in stats.items() if c is base), None),
                [c for c in spec if best and c.sampling == best.sampling])  # best's settings


def _metrics(b: Best, stats: dict[ConfigId, ConfigStats],
             configs: dict[ConfigId, list[RunRow]]) -> dict:
    """What the series' rules read."""
    best, base = b.best, b.base
    acc4 = next((c for c in b.family if c.k == 4), None)
    return {
        "best_k": best.k if best else None,
        "best_config": best.config_id if best else None,
        "best_label": best.label if best else None,
        "best_speedup": best.speedup if best else None,
        "best_acceptance": best.acceptance_p50 if best else None,
        "acceptance_at_4": acc4.acceptance_p50 if acc4 else None,
        "widest_k": max((c.k for c in b.family), default=None),
        # the swap rule reads reliable configs only: a set-aside config's swap is shown
        # beside it, never a rule's evidence
        "swap_peak_bytes": max((c.swap_peak or 0 for c in stats.values() if not c.set_aside),
                               default=0),
        "swap_in_nights": max((c.swap_in_nights for c in stats.values() if not c.set_aside),
                              default=0),
        "mem_increase": (best.peak_memory / base.peak_memory - 1)
        if best and base and best.peak_memory and base.peak_memory else None,
        "mem_added_bytes": (best.peak_memory - base.peak_memory)
        if best and base and best.peak_memory and base.peak_memory else None,
        "decode_share": _decode_share(configs[b.base_id] if b.base_id else []),
        "itl_spike": (best.itl_p99 / max(base.itl_p95 or 1e-9, 1e-9))
        if best and base and best.itl_p99 else None,
        "acceptance_cv": cv(vals(configs[b.best_id], "acceptance_rate"))
        if b.best_id else None,
        "candidates": sum(1 for c in stats.values()
                          if c.classification == "production candidate"),
    }


def _regressions(section: dict, runs: list[RunRow], configs: dict[ConfigId, list[RunRow]],
                 stats: dict[ConfigId, ConfigStats], start: datetime, ident: dict) -> None:
    """Each config this week against last week and the four before (reliable runs, one
    value a night), with the identity changes that may explain a difference."""
    for ck in sorted(configs, key=ConfigId.order):
        earlier = [r for r in runs if r.cid == ck and r.at < start and not r.shaky]
        recent = [r for r in earlier if r.at >= start - timedelta(days=7)]
        for period, then in (("week over week", recent), ("vs last 4 weeks", earlier)):
            reg = regression(configs[ck], then, per_night=True)  # the night is the unit
            section["compared"] += reg["verdict"] != "no data"
            if reg["verdict"] in ("regression", "improvement", "unconfirmed"):
                prev = max(then, key=lambda r: r.at).identity if then else {}
                reg.update(config=stats[ck].label, period=period,
                           cause=identity_changes(prev, ident) if then else [])
                section["regressions"].append(reg)


def _decode_share(base_runs: list[RunRow]) -> float | None:
    """Share of a request's time spent decoding (the rest is TTFT), from the baseline."""
    shares = []
    for r in base_runs:
        v = r.summary.get("values") or {}
        for ttft, rate, n in zip(v.get("ttft_ms") or [], v.get("decode_tok_s") or [],
                                 v.get("generated_tokens") or []):
            if ttft is not None and rate and n:
                decode_s = n / rate
                shares.append(decode_s / (decode_s + ttft / 1000))
    return median(shares)


def _trend(runs: list[RunRow], best: ConfigId | None) -> list[dict]:
    """Per night over the whole window: acceptance and decode tok/s of the series' best
    config (reliable runs only: a set-aside night is no point on the chart)."""
    nights: dict[date, list[RunRow]] = defaultdict(list)
    for r in runs:
        if r.cid == best and not r.shaky:
            nights[r.at.date()].append(r)
    return [{"date": d.isoformat(), "acceptance": median(vals(rs, "acceptance_rate")),
             "decode_tok_s": median(vals(rs, "decode_tok_s"))} for d, rs in sorted(nights.items())]


def positions(sections: list[dict], rows: list[GenRow], run_of: dict[tuple, RunRow],
               top: int = 6) -> None:
    """Acceptance by draft position for the best config of each series (the busiest
    ``top`` series this week): drafted and accepted tokens are summed per series and
    config, so chips, model pairs, runtimes, context buckets and sampling settings never
    share one curve, and a set-aside run's generations are no part of it."""
    want = [s for s in sections if s.get("metrics", {}).get("best_k")][:top]

    def key(s: dict) -> tuple:
        d = s["series"]
        return tuple(d.values()), s["metrics"]["best_config"]  # the runs' own series key

    totals = {key(s): ([0] * s["metrics"]["best_k"], [0] * s["metrics"]["best_k"])
              for s in want}
    for sid, node, _, p in rows:  # one pass over the events, not one per section
        r = run_of.get((sid, node, p.workload, p.get("context_bucket") or "short",
                        result_pair(p), canonical(p.config)))
        t = totals.get((r.series, r.cid.key)) if r is not None and not r.shaky else None
        if t is None:
            continue
        for pos in p.acceptance_by_position or []:
            i = pos["position"] - 1
            if i < len(t[0]):
                t[0][i] += pos["drafted"]
                t[1][i] += pos["accepted"]
    for s in want:
        drafted, accepted = totals[key(s)]
        s["acceptance_by_position"] = [a / d if d else None for a, d in zip(accepted, drafted)]
