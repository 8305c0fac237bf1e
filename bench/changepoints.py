"""Change points against planted truth: precision and recall within a night.

A bench of planted nightly series (tests/history.planted_nightly: 35 nights, AR(1) noise
with φ up to 0.5 and σ 1-2%): steps of 10-25% anywhere from night 4 to two nights before
the window's end, drifts of 10-30% over 12 nights or more, drifts of 10-25% over the last
8-12 nights (to the window's end), two-night dips, two steps the same way with a level
held 4-7 nights between them, no-change series, and a weekly pattern (one to three
weekdays 8-15% off every week) alone and with a step, in equal numbers.
A step is found when a step (or a possible step, at the end) is reported within a night of
it; a drift when a drift is reported over its span; anything else reported is false (one
drift over two steps: both steps missed, the drift false). Goal: precision ≥ 0.95 and
recall ≥ 0.95. Run: ``.venv/bin/python bench/changepoints.py [--per-kind 50] [--show 5]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.review.changepoints import analyse  # noqa: E402
from tests.history import planted_nightly, score_change_points  # noqa: E402

KINDS = ("step", "drift", "late-drift", "dip", "steps", "none", "weekly", "weekly-step")
PHIS = (0.7, 0.9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-kind", type=int, default=50, help="series of each kind")
    ap.add_argument("--nights", type=int, default=35)
    ap.add_argument("--ar", type=int, default=60, help="series of each AR(1) group")
    ap.add_argument("--show", type=int, default=5, help="print this many misses")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    print(f"planted nightly series: {args.per_kind} of each of {', '.join(KINDS)}, "
          f"{args.nights} nights")
    for kind in KINDS:
        series = []
        for seed in range(args.per_kind):
            values, truth = planted_nightly(seed, kind, args.nights)
            series.append((analyse(values), truth))
        s = score_change_points(series)
        rows += series
        print(f"  {kind:<11} found {s['found']:>3} of {s['events']:>3}, false {s['false']:>3}")
    for phi in PHIS:
        for kind in ("none", "step", "drift"):
            series = [(analyse(v), t) for v, t in (planted_nightly(seed, kind, args.nights, phi)
                                                   for seed in range(args.ar))]
            s = score_change_points(series)
            rows += series if kind == "none" else []
            print(f"  {kind + f' φ{phi}':<10} found {s['found']:>3} of {s['events']:>3}, "
                  f"false {s['false']:>3}" + (
                      f", {sum(bool(f) for f, _ in series)} of {args.ar} series with one"
                      if kind == "none" else " (shown apart)"))
    s = score_change_points(rows)
    print(f"  all (the {len(KINDS)} kinds and the AR(1) no-change series): precision "
          f"{s['precision']:.3f}, recall {s['recall']:.3f} "
          f"({len(rows)} series, {time.perf_counter() - t0:.1f} s)")
    for truth, found in s["wrong"][:args.show]:
        print("  miss:", truth, [(f["kind"], f["index"], round(f["size"], 3)) for f in found])


if __name__ == "__main__":
    main()
