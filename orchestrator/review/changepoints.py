"""Change points in a nightly series: where its level moved, not only whether this week
differs from a fixed window.

The nightly levels (relative to their median) are fitted by exact optimal partitioning into
segments that are each either flat or a straight line, with a penalty per segment scaled by
the series' own noise. Each finding is then confirmed against that noise, taken as AR(1)
(a night's level leans on the last one's: a machine's state carries over), so its
*long-run* variance, not the night-to-night one, says how far a level wanders by itself:

- a **step**: the levels on either side of a break differ by at least ``MIN_CHANGE`` and by
  ``Z`` standard errors; dated at the first night of the new level, and at the night an
  identity field changed when that is within a night of it (the cause is the step's date);
- a **possible step**: the same in the window's last 2-3 nights (the last night alone when
  the identity changed that night), reported so, "confirm on the next nights" (too few
  nights after it to be sure); each of its nights must sit at the new level and its
  weekdays must not have read so a week before (``tailstep``: a late outlier, a weekly
  pattern coming round);
- a **drift**: a straight segment whose change over its span is at least ``MIN_CHANGE`` and
  ``Z`` standard errors of the slope: one finding, from its first night to its last; a
  jump beside it the way it goes is its edge, unless no continuous bend fits the jump
  (``ramps.sharp_jump``): then a step and the drift after it are both reported;
- a short segment inside the window (fewer than ``MIN_NIGHTS`` nights: a one- or two-night
  dip or spike) whose neighbours agree is no finding; one night at the very end is none
  either (an outlier cannot be told from a step on one night), unless it is caused; nor
  is a first level of fewer than ``MIN_NIGHTS``: the window's first nights may be the end
  of a dip the week before saw whole (a three-night head as a level read the last three
  nights of such a dip as a step in 196 of 200 windows, audit 27b). One
  between two moves the same way is a stair (two sudden moves: steps, not a drift); moves
  the same way that one ramp explains are one drift (``cpjoin``).

The noise's memory (φ) and spread (σ) come from the residuals of the fit, refitted until
they hold: the first pass assumes no memory (σ from the spread of one-night differences,
which a step or a drift barely moves), each later one uses what the last fit left over.
Last, every break and slope must pay for itself in a likelihood with AR(1) noise (each
model's own φ, BIC's log n per parameter, weighted: ``arselect``): a level that wanders
by the noise's memory is explained by it, not by a step; what remains is confirmed once
more against the noise it leaves. Standard errors use the exact variance of a
least-squares mean, end or slope under AR(1) correlation (not the long-run rule, which
overstates a short segment's by up to 10× at φ 0.9), so φ up to 0.9 is believed: strongly
remembering noise (φ 0.7-0.9) wanders without being called a step.
``bench/changepoints.py`` scores it against planted series.
"""

from __future__ import annotations

import math
import statistics
from datetime import date

import numpy as np

from .arnoise import (
    Noise,
    end_se,
    noise,
    residual_noise,
    slope_z,
)
from .arselect import quiet, select
from .cpjoin import join_drifts, one_move
from .ramps import ramp_or_step, sharp_jump, staircase
from .season import weekday_offsets
from .segfit import MIN_CHANGE, MIN_DRIFT, MIN_NIGHTS, Sums, partition
from .taildrift import MAX_RAMP, tail_drift
from .tailstep import held, recurring

MIN_TAIL = 2         # nights at the window's end that can show a possible step
MIN_HISTORY = MIN_NIGHTS + MIN_TAIL  # fewer nights are not looked at: no finding, no "held"
Z = 4.0  # standard errors (long-run) a step or a drift must clear
# times one parameter's price (long-run variance × log n) a jump beside a drift must save
# over a continuous bend: at 1×, 2.5× the bench's drifts gained 3, 2 false edge steps; at 5× none
JUMP_WEIGHT = 5.0
POSSIBLE = "confirm on the next nights"


def transients(x: np.ndarray, sigma: float) -> list[int]:
    """Nights of one- or two-night dips and spikes inside the window: runs that stand out
    from the nights on both sides (four each) while those agree with each other, and are
    not the middle of a longer level (``_held``). Never the window's first or last two
    nights: there a run cannot be told from a step."""
    n, out = len(x), set[int]()
    found: list[tuple[float, range]] = []
    xs = [float(v) for v in x]
    for length in (1, 2):
        for i in range(2, n - length - 1):
            left, right = xs[max(0, i - 4):i], xs[i + length:i + length + 4]
            if len(left) < 2 or len(right) < 2:
                continue
            ref_l, ref_r = statistics.median(left), statistics.median(right)
            ref = (ref_l + ref_r) / 2
            dev = abs(sum(xs[i:i + length]) / length - ref)
            if dev >= MIN_CHANGE * abs(ref) and dev >= Z * sigma / math.sqrt(length) \
                    and abs(ref_l - ref_r) < dev / 3 and not _held(xs, i, length, ref):
                found.append((dev, range(i, i + length)))
    for _, nights in sorted(found, key=lambda f: -f[0]):
        if len(out) + len(nights) <= n // 5 and not out.intersection(nights):
            out.update(nights)
    return sorted(out)


def _held(xs: list[float], i: int, length: int, ref: float) -> bool:
    """Whether the run of ``length`` nights from ``i`` is the middle of a level held
    ``MIN_NIGHTS`` nights or more: the nights beyond the midpoint of the run's level and
    ``ref`` around it, entered and left by a jump of half the run's distance from ``ref``
    (a 4-night dip's middle two nights stand out from the four nights each side like a
    two-night dip; a slow cycle's trough, entered and left gently, stays a transient)."""
    level = sum(xs[i:i + length]) / length
    mid, dev = (level + ref) / 2, abs(level - ref)
    side = 1.0 if level > ref else -1.0
    lo, hi = i, i + length
    while lo > 0 and (xs[lo - 1] - mid) * side > 0:
        lo -= 1
    while hi < len(xs) and (xs[hi] - mid) * side > 0:
        hi += 1
    return hi - lo >= MIN_NIGHTS and all(
        abs(xs[a] - xs[b]) >= dev / 2 for a, b in ((lo - 1, lo), (hi - 1, hi))
        if 0 <= a and b < len(xs))


def analyse(values: list[float], causes: frozenset[int] = frozenset(),
            weekdays: list[int] | None = None) -> list[dict]:
    """The findings in a series (indices): steps, possible steps and drifts, each with its
    index, levels before and after and z. ``causes``: nights where the identity changed (a
    step there, or a night off, is its own finding, never part of a drift). ``weekdays``:
    each night's weekday (default: consecutive nights); a weekly pattern the history shows
    is taken out first (``season``), so levels are the week's mean."""
    n = len(values)
    if n < MIN_HISTORY:
        return []
    raw = np.asarray(values, dtype=float)
    scale = float(np.median(raw)) or 1.0
    full = raw / scale
    # a weekly pattern scales the level (a weekend load takes a share of it): in logs
    days = weekdays or [i % 7 for i in range(n)]
    pattern = weekday_offsets(np.log(full), days) if (full > 0).all() else None
    full = full if pattern is None else full * np.exp(-pattern)
    # the pattern's offsets (one per weekday but their mean) took out some of the noise
    spent = 0 if pattern is None else 2 * (len(set(days)) - 1)
    sigma, _ = noise(full)
    sigma *= math.sqrt(n / (n - spent)) if n > 2 * spent else 1.0
    drop = set(transients(full, sigma))
    keep = [i for i in range(n) if i not in drop]  # index in x → night
    x = full[keep]
    log_n = math.log(len(x))
    sums = Sums(x)
    if quiet(x, sums, log_n):
        return []
    # the noise's memory from the residuals of the fit, refitted until it holds: starting
    # from none (every wander a change), each pass finds less of the noise a change
    # an identity change on the last night: that night alone may be a (possible) step
    tail = 1 if keep[-1] in causes else MIN_TAIL
    nz, seen = Noise(sigma), set()
    for _ in range(6):
        lr = nz.lr
        segs = _confirm(partition(sums, len(x), 2 * lr ** 2 * log_n, 4 * lr ** 2 * log_n),
                        sums, nz, tail)
        nz = Noise(*residual_noise(x, segs, sums, spent))
        if tuple(segs) in seen or segs == [(0, len(x), "flat")] and nz.lr >= lr:
            break  # (nothing found, and more noise finds nothing more)
        seen.add(tuple(segs))
    segs = select(x, segs, sums, log_n)
    for _ in range(6):  # what the selection kept, confirmed against the noise it leaves
        nz = Noise(*residual_noise(x, segs, sums, spent))
        kept = _confirm(segs, sums, nz, tail)
        if kept == segs:
            break
        segs = kept
    caused = {i for i, night in enumerate(keep)
              if night in causes or night - 1 in causes or night + 1 in causes}
    out = _breaks(x, segs, sums, nz, log_n, caused)
    for i, j, kind in segs:
        if kind == "line":
            level, slope = sums.fit(i, j, kind)
            end = level + slope * (j - 1 - i)
            out.append({"index": i, "until": j - 1, "kind": "drift", "before": level,
                        "after": end, "size": end / level - 1,
                        "z": slope_z(j - i, slope, nz), "nights": [j - i]})
    # one parameter's price against the nights' own noise (from differences): the fit's
    # residuals may hold a level merged away as a transient
    pen = min(nz.lr, noise(x)[0]) ** 2 * log_n
    out = join_drifts(sorted(out, key=lambda f: f["index"]), caused, x, pen)
    out = _end_drift(x, one_move(x, out, caused, pen), caused)
    # on every night (the transients too: a weekend dip each week is one, until the last)
    out = [f for f in out if f["kind"] != "possible step" or _tail_holds(
        full, keep[f["index"]], days, f, f["index"] in caused)]
    for f in out:  # back to nights and to the series' own units
        f.pop("sharp", None)
        f["index"] = keep[f["index"]]
        if "until" in f:
            f["until"] = keep[f["until"]]
        f["before"] *= scale
        f["after"] *= scale
    return out


def _tail_holds(full: np.ndarray, at: int, days: list[int], f: dict, caused: bool) -> bool:
    """Whether a possible step from night ``at`` is one (``tailstep``): every night of the
    tail at the new level, and (unless the identity changed there) not the same weekdays'
    level a week earlier coming round again."""
    return held(full, at, f["before"], f["after"]) and (
        caused or not recurring(full, at, days, f["before"], f["after"]))


def _end_drift(x: np.ndarray, found: list[dict], caused: set[int]) -> list[dict]:
    """A drift up to the window's last night the fit missed (the noise's memory explained
    it) or cut into steps: ``taildrift``, over the nights since the last finding before
    it. Steps in its span go when the ramp fits better and goes their way; a step at an
    identity change stays, and so does a drift already reaching the end."""
    n = len(x)
    if found and found[-1]["kind"] == "drift" and found[-1]["until"] >= n - 2:
        return found
    keep = list(found)
    while keep and "step" in keep[-1]["kind"] and keep[-1]["index"] >= n - MAX_RAMP \
            and keep[-1]["index"] not in caused:
        keep.pop()
    lo = keep[-1].get("until", keep[-1]["index"] - 1) + 1 if keep else 0
    # twice the smallest change: with no nights after it, strongly remembering noise
    # wanders 3-4% in a week (the bench's AR(1) φ 0.9 series: four such, none beyond 4.1%)
    drift = tail_drift(x, lo, 2 * MIN_CHANGE, Z, [f["index"] for f in found[len(keep):]])
    if drift is None or any((f["size"] > 0) != (drift["size"] > 0) for f in found[len(keep):]):
        return found
    return [*keep, drift]


def _breaks(x: np.ndarray, segs: list, sums: Sums, nz: Noise, log_n: float,
            caused: set[int]) -> list[dict]:
    """The findings at the breaks between segments: steps (possible steps at the end), and
    drifts where a step's shape is a ramp. A jump the way a drift beside it goes is the
    drift's edge unless no continuous bend fits it (then ``sharp``: a step of its own) or
    the identity changed that night (``caused``)."""
    out: list[dict] = []
    # the nights' own noise (from differences): the fit's residuals may hold a level the
    # selection stretched a drift over, or the middle level a transient was merged away from
    own = min(nz.lr, noise(x)[0]) ** 2 * log_n if len(segs) > 1 else 0.0
    for n, (a, b) in enumerate(zip(segs, segs[1:])):
        (i0, i1, k0), (j0, j1, k1) = a, b
        l0, s0 = sums.fit(i0, i1, k0)
        l1, s1 = sums.fit(j0, j1, k1)
        before, after = l0 + s0 * (i1 - 1 - i0), l1
        size = after / before - 1
        se = math.hypot(end_se(i1 - i0, k0, nz), end_se(j1 - j0, k1, nz))
        if abs(size) < MIN_CHANGE or abs(after - before) / se < Z:
            continue  # a drift's start or end
        drifting = [sums.fit(i, j, k)[1] for i, j, k in (a, b) if k == "line"]
        lo, hi = max(i0, j0 - 40), min(j1, j0 + 40)
        # (a 15% step after a drift and a hold read as its edge in 34 of 200 at the fit's)
        pen = JUMP_WEIGHT * own
        sharp = sharp_jump(x[lo:hi], j0 - lo, (k0, k1), pen) if drifting else \
            _sharp_before_drift(x, segs, n, pen)
        if drifting and all((s > 0) == (size > 0) for s in drifting) and not sharp \
                and j0 not in caused:
            continue  # a jump the way a drift beside it goes: the drift's edge, not a step
        if k0 == k1 == "flat" and j1 - j0 >= MIN_NIGHTS:
            ramp = ramp_or_step(x[lo:hi], j0 - lo, nz.lr ** 2 * log_n, MIN_DRIFT)
            stair = None if ramp is None else staircase(x[lo:hi], ramp, own)
            if stair is not None:  # two sudden moves a ramp only averages: the first
                j0 = lo + stair
            elif ramp is not None:
                # the move is confirmed (above); its shape says drift, not step
                out.append({"index": lo + ramp[0], "until": lo + ramp[1], "kind": "drift",
                            "before": before, "after": after, "size": size,
                            "z": abs(after - before) / se, "nights": [i1 - i0, j1 - j0]})
                continue
        # sharp: a step a drift beside it cannot explain; it stays a step (``cpjoin.join_drifts``)
        last = n + 2 == len(segs)  # (a short level inside the window: a stair, ``_stair``)
        out.append({"index": j0, "kind": "possible step" if last and j1 - j0 < MIN_NIGHTS
                    else "step",
                    "before": before, "after": after, "size": size, "sharp": sharp,
                    "z": abs(after - before) / se, "nights": [i1 - i0, j1 - j0]})
    return out


def _sharp_before_drift(x: np.ndarray, segs: list, n: int, pen: float) -> bool:
    """Whether the step between flat segments ``n`` and ``n + 1`` stands apart from a drift
    that starts a few nights after it: the nights from the step to the drift's end taken
    as one line, the jump must beat every continuous bend (the staircase a ramp cut into
    flat pieces leaves fits one; a step the drift then continues from does not). The
    other way round (a drift, a short hold, a step) stays the drift's edge: on the bench,
    noise at a ramp's end made such false steps."""
    (i0, _, _), (j0, j1, _) = segs[n], segs[n + 1]
    if n + 2 < len(segs) and segs[n + 2][2] == "line" and j1 - j0 <= MIN_DRIFT:
        lo = max(i0, j0 - 40)
        return sharp_jump(x[lo:segs[n + 2][1]], j0 - lo, ("flat", "line"), pen)
    return False


def _confirm(segs: list[tuple[int, int, str]], sums: Sums, nz: Noise,
             tail: int = MIN_TAIL) -> list[tuple[int, int, str]]:
    """Drop what the noise explains, one weakest finding at a time, refitting as it goes:
    a straight segment whose change is small becomes flat; a short segment inside the window
    (or a single night at its end) joins its neighbours; a break too small joins its two
    sides. ``tail``: the fewest nights a last segment needs (one at an identity change)."""
    segs = list(segs)
    while True:
        # a line that does not move enough is flat
        for s, (i, j, kind) in enumerate(segs):
            if kind == "line":
                level, slope = sums.fit(i, j, kind)
                change = abs(slope * (j - 1 - i)) / abs(level or 1)
                if change < MIN_CHANGE or slope_z(j - i, slope, nz) < Z:
                    segs[s] = (i, j, "flat")
        # transient segments: inside the window shorter than MIN_NIGHTS, or one last night
        short = [s for s, (i, j, _) in enumerate(segs)
                 if (j - i < MIN_NIGHTS and 0 < s < len(segs) - 1 and not _stair(segs, s, sums, nz))
                 or (s == 0 and len(segs) > 1 and j - i < MIN_NIGHTS)
                 or (s == len(segs) - 1 and s > 0 and j - i < tail)]
        if short:
            segs = _merge_transient(segs, short[0], sums)
            continue
        weakest, worst = None, math.inf
        for s, (a, b) in enumerate(zip(segs, segs[1:])):
            (i0, i1, k0), (j0, j1, k1) = a, b
            l0, s0 = sums.fit(i0, i1, k0)
            l1, _ = sums.fit(j0, j1, k1)
            before = l0 + s0 * (i1 - 1 - i0)
            se = math.hypot(end_se(i1 - i0, k0, nz), end_se(j1 - j0, k1, nz))
            z = abs(l1 - before) / se
            small = abs(l1 / (before or 1) - 1) < MIN_CHANGE
            score = z if not small else -1.0
            # beside a straight segment a break without a jump is where a drift starts or
            # ends: its shape, kept (it is no step, and is not reported as one)
            if (small or z < Z) and k0 == k1 == "flat" and score < worst:
                weakest, worst = s, score
        if weakest is None:
            return segs
        a, b = segs[weakest], segs[weakest + 1]
        segs[weakest:weakest + 2] = [_joined(a[0], b[1], sums, nz)]


def _joined(i: int, j: int, sums: Sums, nz: Noise) -> tuple[int, int, str]:
    """One segment over [i, j): straight if a line explains it by more than the noise."""
    if j - i >= MIN_DRIFT:
        level, slope = sums.fit(i, j, "line")
        if slope_z(j - i, slope, nz) >= Z and abs(slope * (j - 1 - i)) >= MIN_CHANGE * abs(
                level or 1):
            return (i, j, "line")
    return (i, j, "flat")


def _stair(segs: list, s: int, sums: Sums, nz: Noise) -> bool:
    """Whether short inner segment ``s`` is a stair between two moves the same way, each
    clearing ``MIN_CHANGE`` and ``Z``: two sudden drops two nights apart are two steps (the
    first the move's date), not a transient; merged into either side, its nights would be
    left in the residuals as noise (σ and φ tripled: the whole move read as the noise's
    memory, or as one ramp)."""
    (i0, i1, k0), (i, j, _), (j0, j1, k1) = segs[s - 1], segs[s], segs[s + 1]
    l0, s0 = sums.fit(i0, i1, k0)
    before, mid, after = l0 + s0 * (i1 - 1 - i0), sums.fit(i, j, "flat")[0], sums.fit(j0, j1, k1)[0]
    if (before - mid) * (mid - after) <= 0:
        return False
    m = end_se(j - i, "flat", nz)
    return all(abs(a - b) >= MIN_CHANGE * abs(b or 1) and abs(a - b) / math.hypot(se, m) >= Z
               for a, b, se in ((before, mid, end_se(i1 - i0, k0, nz)),
                                (after, mid, end_se(j1 - j0, k1, nz))))


def _merge_transient(segs: list, s: int, sums: Sums) -> list:
    """Fold transient segment ``s`` into a neighbour: the one whose level is closer (a dip
    between two equal levels then leaves one break the next pass removes)."""
    i, j, _ = segs[s]
    mid = sums.fit(i, j, "flat")[0]
    if s == 0:
        side = 1
    elif s == len(segs) - 1:
        side = -1
    else:
        left = segs[s - 1]
        right = segs[s + 1]
        ll = sums.fit(*left)
        lv = ll[0] + ll[1] * (left[1] - 1 - left[0])
        rv = sums.fit(*right)[0]
        side = -1 if abs(lv - mid) <= abs(rv - mid) else 1
    if side == -1:
        (a, _, kind), rest = segs[s - 1], segs[s + 1:]
        return [*segs[:s - 1], (a, j, kind), *rest]
    (_, b, kind) = segs[s + 1]
    return [*segs[:s], (i, b, kind), *segs[s + 2:]]


def change_points(nights: list[tuple[date, float, dict]], labels) -> list[dict]:
    """``nights``: (night, level of its reliable runs, identity), in date order.
    ``labels(a, b)`` words the identity differences between two identities. Each finding:
    its night (``date``; a drift also ``until``), ``kind`` (step, possible step, drift),
    levels ``before`` and ``after``, relative ``size``, ``z`` and ``confidence`` (its normal
    two-sided level), ``note`` and ``changed`` (the identity fields that changed that night;
    over a drift's span for a drift)."""
    values = [v for _, v, _ in nights]
    causes = frozenset(i for i in range(1, len(nights)) if labels(nights[i - 1][2], nights[i][2]))
    out = []
    found = analyse(values, causes, [night.weekday() for night, _, _ in nights])
    stepped = {f["index"] for f in found if f["kind"] != "drift"}
    for f in found:
        at = f["index"]
        if f["kind"] != "drift":
            # the cause is the date: an identity change within a night of the break moves it
            near = [i for i in (at, at - 1, at + 1)
                    if 0 < i < len(nights) and labels(nights[i - 1][2], nights[i][2])]
            at = near[0] if near else at
            changed = labels(nights[at - 1][2], nights[at][2]) if at > 0 else []
        else:  # over its span; a step the night it starts names that night's change
            changed = labels(nights[max(at - 1 + (at in stepped), 0)][2], nights[f["until"]][2])
        p = math.erfc(f["z"] / math.sqrt(2))
        cp = {"date": nights[at][0].isoformat(), "kind": f["kind"], "before": f["before"],
              "after": f["after"], "size": f["size"], "z": round(f["z"], 2), "p": p,
              "confidence": 1 - p, "changed": changed, "nights": f["nights"],
              "note": POSSIBLE if f["kind"] == "possible step" else None}
        if f["kind"] == "drift":
            cp["until"] = nights[f["until"]][0].isoformat()
            cp["nights"] = [f["until"] - at + 1]
            cp["note"] = f"a slow move over {f['until'] - at + 1} nights, to {cp['until']}"
        out.append(cp)
    return out
