"""What a reader of the weekly review sees first: a headline (what changed, what to do),
short series labels (the full identity on hover), what every series shares stated once
(a busy node, why the numbers may not transfer), and rules and metrics in words.

The analysis is left as it is (the JSON export and the CI gate read it); this module adds
a ``page`` key for the templates and a ``short_label`` / ``full_label`` per series.
"""

from __future__ import annotations

import re

from agent.protocol import contention_text

from .busy import busy_who
from .week_sweeps import calibration_words

PARTS = ("chip", "model_pair", "workload", "context_bucket", "engine")

# a rule's id is the rules file's handle; a reader gets what it says
RULE_WORDS = {
    "draft-mismatch": "the draft often disagrees with the target (low acceptance)",
    "stop-widening": "acceptance is low: wider drafts will not help",
    "net-loss": "speculation is slower than the baseline",
    "bursty-rollbacks": "rejected drafts make latency spiky",
    "fallback-order": "no config passes every gate",
    "swap-pressure": "the node swapped",
    "draft-memory": "the draft adds memory on a node that swapped",
    "prefill-bound": "most of the time goes to the prompt, not decoding",
    "shrink-concurrency": "memory grows with concurrent streams and the node swapped",
    "cap-concurrency": "the runtime saturated under load",
    "dedicated-node": "tail latency is spiky beside a busy desktop",
}

# a metric's name in a rule → (words, how its value reads)
METRIC_WORDS = {
    "best_acceptance": ("acceptance of the fastest config", "{:.2f}"),
    "best_k": ("its draft width", "{:g}"),
    "widest_k": ("widest draft width measured", "{:g}"),
    "best_speedup": ("best speedup", "{:.2f}×"),
    "swap_peak_bytes": ("peak swap", "MB"),
    "swap_in_nights": ("nights with swap-ins", "{:g}"),
    "mem_increase": ("memory the draft adds", "{:+.0%}"),
    "mem_added_bytes": ("that is", "MB"),
    "decode_share": ("share of time decoding", "{:.0%}"),
    "itl_spike": ("ITL p99 over the baseline's p95", "{:.1f}×"),
    "acceptance_cv": ("acceptance spread (CV)", "{:.2f}"),
    "candidates": ("configs that pass every gate", "{:g}"),
    "load_mem_growth": ("memory growth under load", "{:+.0%}"),
    "load_swap_levels": ("load levels that swapped", "{:g}"),
    "load_cap": ("streams before saturation", "{:g}"),
    "load_saturated_at": ("saturated at streams", "{:g}"),
    "busy_itl_p99_ratio": ("ITL p99 busy / idle", "{:.2f}×"),
}


def rule_words(rule_id: str, action: str = "") -> str:
    """A rule in words: ours from the table, a user's own rule by its action."""
    return RULE_WORDS.get(rule_id) or action or rule_id.replace("-", " ")


def metric_words(name: str, value) -> str:
    words, how = METRIC_WORDS.get(name, (name.replace("_", " "), "{}"))
    if value is None:
        return f"{words}: not measured"
    if how == "MB":
        return f"{words} {value / 1e6:.1f} MB"
    try:
        return f"{words} {how.format(value)}"
    except (TypeError, ValueError):
        return f"{words} {value}"


def short_chip(chip: str) -> str:
    """"Intel(R) Xeon(R) Processor" → "Intel Xeon"; "Apple M4 Max" stays."""
    text = re.sub(r"\((R|TM|C)\)", "", str(chip), flags=re.I)
    text = re.sub(r"\b(Processor|CPU)\b", "", text)
    text = re.sub(r"@.*$", "", text)
    return " ".join(text.split()) or str(chip)


def short_pair(pair: str) -> str:
    """"models/target / draft-4bit" → "target / draft-4bit": the folders are in the hover."""
    return " / ".join(p.strip().rstrip("/").rsplit("/", 1)[-1] or p.strip()
                      for p in str(pair).split(" / "))


def full_label(s: dict) -> str:
    x = s["series"]
    cal = calibration_words(s.get("calibration") or x.get("calibration"))
    return " · ".join(str(x.get(p) or "") for p in PARTS) + (f" · {cal}" if cal else "")


def label_series(sections: list[dict]) -> list[str]:
    """Give each series a ``short_label`` (only the parts that tell the page's series
    apart, shortened) and a ``full_label`` (every part, as stored); returns the parts
    every series shares, in words, for the page's header."""
    if not sections:
        return []
    values = {p: {str(s["series"].get(p)) for s in sections} for p in PARTS}
    common = [p for p in PARTS if len(values[p]) == 1]
    # the workload names what was measured: it stays even when it is the only one
    differ = [p for p in PARTS if p not in common or p == "workload"]
    for s in sections:
        x = s["series"]
        bits = []
        for p in differ:
            v = str(x.get(p))
            bits.append(short_chip(v) if p == "chip" else short_pair(v) if p == "model_pair"
                        else f"{v} context" if p == "context_bucket" else v)
        # an instrument's series is marked in every label (a real pair may share its names);
        # why it is stale or unverified is said in its row and in the full label's hover
        cal = calibration_words(s.get("calibration") or x.get("calibration"), short=True)
        s["short_label"] = " · ".join(bits + ([cal] if cal else []))
        s["full_label"] = full_label(s)
    # shortening must not merge two series ("Intel(R) Xeon" and "Intel Xeon"): those keep
    # their full names
    seen: dict[str, set] = {}
    for s in sections:
        seen.setdefault(s["short_label"], set()).add(s["full_label"])
    for s in sections:
        if len(seen[s["short_label"]]) > 1:
            s["short_label"] = s["full_label"]
    x = sections[0]["series"]
    said = {"chip": f"node {short_chip(x['chip'])}", "model_pair":
            f"pair {short_pair(x['model_pair'])}", "context_bucket":
            f"{x['context_bucket']} context", "engine": f"runtime {x['engine']}"}
    return [said[p] for p in common if p in said]


BUSY = "competed for the CPU"  # the busy caveat, whoever competed (busy.busy_who)


def _contended(x: dict) -> bool:
    """A set-aside entry with contention readings; one stored before events 1.8 has no
    field, and its reasons' text says it."""
    return bool(x.get("contention")) or any("contended" in r for r in x["reasons"])


def collapse_reasons(reasons, contention=None) -> list[str]:
    """One line for a config's contention readings instead of one per run ("contended:
    other processes used 56–66% of the CPU (limit 25%)"), its range taken from the runs'
    fields; every other reason as it is (so are the lines of runs stored before 1.8)."""
    covered = {contention_text(c["low"], c["high"], c["limit"], c.get("parts"))
               for c in contention or ()}
    limits: dict[float, list[dict]] = {}
    for c in contention or ():
        limits.setdefault(c["limit"], []).append(c)
    merged = [contention_text(min(c["low"] for c in cs), max(c["high"] for c in cs), limit,
                              _merged_parts(cs))
              for limit, cs in limits.items()]
    out = [r for r in reasons or () if r not in covered]
    return out + [m for m in merged if m not in out]


def _merged_parts(readings: list[dict]) -> dict | None:
    """Per cause, the range over several runs' readings (None when none names a cause)."""
    out: dict = {}
    for c in readings:
        for k, (lo, hi) in (c.get("parts") or {}).items():
            was = out.get(k, (lo, hi))
            out[k] = (min(was[0], lo), max(was[1], hi))
    return out or None


def _busy_runs(sections: list[dict]) -> tuple[int, int]:
    aside = sum(x["runs"] for s in sections for x in s.get("set_aside") or []
                if _contended(x))
    total = sum(c["runs"] for s in sections for c in s.get("configs") or [])
    return aside, total


# how an agent before events 1.9 worded a config whose decode rate varied too much
_CV = re.compile(r"^decode tok/s CV (\d+)% ≥ (\d+)%: ")


def _noisy(x: dict) -> list[tuple[int, int]] | None:
    """(spread %, limit %) of a set-aside entry whose every run was set aside for its spread
    alone; None when any other reason set one aside. Runs since events 1.9 carry the spread
    as fields; older ones only as the agent's words."""
    spreads = x.get("spreads") or []
    if spreads and all(spreads):
        return [(round(100 * s["value"]), round(100 * s["limit"])) for s in spreads]
    found = [_CV.match(r) for r in x["reasons"]]
    if not found or not all(found):
        return None
    return [(int(m.group(1)), int(m.group(2))) for m in found if m]


def _spread_range(spreads: list[tuple[int, int]]) -> str:
    """'28%' or '11–26%': the range of set-aside runs' spreads (``_noisy``'s pairs)."""
    lo, hi = min(c for c, _ in spreads), max(c for c, _ in spreads)
    return f"{lo}%" if lo == hi else f"{lo}–{hi}%"


def _noisy_evidence(aside: list[dict]) -> str | None:
    """One short line for a series whose runs were all set aside for their spread."""
    cvs = [_noisy(x) for x in aside]
    if not aside or not all(cvs):
        return None
    spreads = [c for cs in cvs for c in cs or ()]
    limits = sorted({lim for _, lim in spreads})
    n, of = sum(x["runs"] for x in aside), sum(x["of"] for x in aside)
    return (f"{n} of {of} runs set aside (decode tok/s varied {_spread_range(spreads)} "
            f"across repetitions; the plan allows under "
            f"{'/'.join(f'{x}%' for x in limits)})")


def _busy_evidence(aside: list[dict]) -> str | None:
    """One short line for a series whose runs were set aside on a busy node: contended,
    or (the rest) for their spread alone, as a busy node's runs often are (a demo beside
    another job printed every run's reasons in full for such rows)."""
    busy = [x for x in aside if _contended(x)]
    rest = [x for x in aside if not _contended(x)]
    cvs = [_noisy(x) for x in rest]
    if not busy or not all(cvs):
        return None
    n, of = sum(x["runs"] for x in aside), sum(x["of"] for x in aside)
    if not rest:
        return f"{n} of {of} runs set aside (busy node)"
    k = sum(x["runs"] for x in rest)
    return (f"{n} of {of} runs set aside (busy node; {k} of them for their decode-rate "
            f"spread alone, {_spread_range([c for cs in cvs for c in cs or ()])})")


def shared_once(sections: list[dict]) -> dict:
    """Caveats every series shares move to the page's top; each row keeps its own. A
    series whose only evidence is runs set aside as contended says so briefly (the
    figures are in its section below and the node's state at the top)."""
    cav = [s["verdict"].get("caveats") or [] for s in sections]
    common = [c for c in cav[0] if all(c in x for x in cav[1:])] if len(cav) > 1 else []
    busy_runs, total = _busy_runs(sections)
    noisy = 0  # series whose runs were all set aside for their spread alone
    for s in sections:
        v = s["verdict"]
        # the busy node is said once, at the top: a row keeps only what is its own
        v["own_caveats"] = [c for c in v.get("caveats") or [] if c not in common
                            and not (busy_runs and BUSY in c)]
        v["short_evidence"] = v.get("evidence") or ""
        aside = s.get("set_aside") or []
        if v["decision"] == "needs more data" and (short := _busy_evidence(aside)):
            v["short_evidence"] = short  # the node's state is said once, at the top
        elif v["decision"] == "needs more data" and (short := _noisy_evidence(aside)):
            v["short_evidence"] = short  # the advice is said once, at the top
            noisy += 1
    return {"common_caveats": [c for c in common if BUSY not in c],
            "noisy": noisy,
            "any_own_caveats": any(s["verdict"]["own_caveats"] for s in sections),
            "any_rules": any(s["verdict"].get("rules") for s in sections),
            "busy": {"runs": busy_runs, "of": total, "who": busy_who(
                [c for s in sections for x in s.get("set_aside") or [] if _contended(x)
                 for c in x.get("contention") or ()])} if busy_runs else None}


def classification_words(c: dict, gates: dict) -> str:
    """"just misses: ttft_change" → "misses: TTFT +10.2% > +8%": each gate as the
    comparison it made, never its identifier; a config decided through the noise keeps
    that mark, and its timing gates their 95% intervals (never a bare point)."""
    from .ci import gate_words
    from .through_noise import NOISE_MARK as NOISE

    cls = c.get("classification") or ""
    noisy = cls.startswith(NOISE)
    missed = [(n, g) for n, g in (c.get("gates") or {}).items() if g["passed"] is False]
    if not missed or cls.removeprefix(NOISE).startswith(("failed", "set aside")):
        return cls
    head = "just misses" if len(missed) == 1 else "not a candidate, misses"
    return (NOISE if noisy else "") + f"{head}: " + "; ".join(
        gate_words(n, g, gates) for n, g in missed)


def _calibration_news(series: list[dict]) -> list[str]:
    """The calibration pair's win, said as its record judged it (a stale pair's win is no
    known answer, and an unverified one is not checked against it); a win decided through
    the noise (runs set aside for their spread) says so."""
    won = [s for s in series if s.get("calibration")
           and s["verdict"]["decision"] == "production candidate"]
    if not won:
        return []
    cal = [s["calibration"] for s in won if isinstance(s["calibration"], dict)]
    noisy = " (decided through the noise)" if any(
        s["verdict"].get("through_noise") for s in won) else ""
    if any(c.get("no_longer_holds") for c in cal):
        return ["the calibration pair is stale (its record no longer holds)"]
    if any(c.get("unverified") for c in cal):
        return [f"the calibration pair measured a win{noisy}, unverified against its record"]
    return [f"the calibration pair measured its known win{noisy}"]


def headline(a: dict, busy: bool = False) -> dict:
    """One sentence of what changed this week and one of what to do."""
    series = a["series"]
    n = a["counts"]["verdicts"]
    changed = []
    regs = [(s, r) for s in series for r in s.get("regressions") or []]
    worse = [r for _, r in regs if r["verdict"] == "regression"]
    better = [r for _, r in regs if r["verdict"] == "improvement"]
    if worse:
        changed.append(f"{len(worse)} regression{'s' if len(worse) > 1 else ''}")
    if better:
        changed.append(f"{len(better)} improvement{'s' if len(better) > 1 else ''}")
    if a["counts"]["failed_sweeps"]:
        changed.append(f"{a['counts']['failed_sweeps']} sweep(s) did not finish ok")
    todo = []
    # a calibration pair is an instrument: its win says the node measures speculation
    # well, never "switch it on"
    cands = [s for s in series if s["verdict"]["decision"] == "production candidate"
             and not s.get("calibration")]
    changed += _calibration_news(series)
    if cands:
        todo.append("switch on speculation for " + ", ".join(
            f"{s.get('short_label') or full_label(s)} (draft width {s['verdict']['k']}"
            + (", decided through the noise" if s["verdict"].get("through_noise") else "")
            + ")" for s in cands[:3]) + (f" and {len(cands) - 3} more" if len(cands) > 3 else ""))
    decided = ", ".join(f"{k} {d}" for d, k in n.items() if k)
    # a decision from runs set aside for their spread alone is never unmarked here either
    if noisy := sum(1 for s in series if s["verdict"].get("through_noise")):
        decided += f" ({noisy} decided through the noise: runs set aside for their spread)"
    what = (f"{len(series)} series: {decided}" if series else "no series measured") + (
        "; " + ", ".join(changed) if changed else
        ("; nothing regressed" if a["counts"].get("compared") else ""))
    if n.get("keep autoregressive") or n.get("graded fallback"):
        todo.append("keep the others autoregressive" if cands else
                    "keep serving autoregressive")
    if any(s["verdict"].get("provisional") for s in series):
        todo.append("rerun to confirm (decisions marked provisional rest on fewer nights "
                    "than the review needs)")
    if worse:
        todo.append("look at the regressions below")
    if a["counts"]["failed_sweeps"]:
        todo.append("see why the sweeps failed (top of the page)")
    if k := n.get("needs more data"):
        todo.append(f"run again when the node is quiet ({k} series had no reliable runs: "
                    "it was busy, see below)" if busy else
                    f"measure again ({k} series {'has' if k == 1 else 'have'} no reliable "
                    "runs yet)")
    return {"changed": what, "todo": "; ".join(todo) or "nothing: keep going as you are"}


def prepare(a: dict) -> dict:
    """The page's extras (headline, shared facts, busy node), computed once per render."""
    common = label_series(a["series"])
    shared = shared_once(a["series"])
    for s in a["series"]:
        for c in s.get("configs") or []:
            c["classification_text"] = classification_words(c, s["gates"])
    return {"common_parts": common, **shared,
            "headline": headline(a, busy=shared["busy"] is not None)}
