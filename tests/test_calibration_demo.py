"""The demo's calibration plan swept for real on the local node, and the weekly review read
back through Chromium: the calibration series as a production candidate at its measured
best width, the ladder walked from rung 0, the adaptive sweep's stops on both pages, the
policy on (the demo asks calibration in; provisional: 1 of 3 nights), and why its TTFT
limit is raised, each marked as calibration."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.demo import (
    CALIBRATION_ADAPTIVE,
    CALIBRATION_FOLDER,
    CALIBRATION_REPETITIONS,
    CALIBRATION_TTFT_LIMIT,
    CALIBRATION_WIDTHS,
    build_demo_calibration,
    build_demo_tiers,
    calibration_plan,
    write_demo_review,
)
from orchestrator.fleet.inventory import load_inventory
from orchestrator.review.sweep_page import render_review
from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement, Run
from orchestrator.sweep.dispatch import SweepOptions, start_sweep
from orchestrator.sweep.lock import load_lock, write_lock
from orchestrator.sweep.plan import load_plan
from tests.browser import dump_dom

ROOT = Path(__file__).resolve().parents[1]
# a busy shared 2-core box: its spread, others' CPU and its inter-token latency would set
# aside or fail every run; declared in the plan (and shown on the page as its own gates)
SHARED_MACHINE = "  cv_threshold: 1.0\n  contention_threshold: 1.0\n"


# judges the win and reads the adaptive stops: the parallel part's load scatters the
# paired speedups (measured here under a load average of 13 on 2 cores: 0.37-11.8x round to
# round, and a width's every run over the 100% spread threshold)
@pytest.mark.alone
def test_the_demos_calibration_sweep_reviews_as_a_marked_win_with_ladder_stops_and_policy(
        model_pair, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(model_pair / "draft", models / "draft")
    build_demo_tiers(models, log=lambda m: None)
    build_demo_calibration(models, log=lambda m: None)
    text = calibration_plan(models, max_tokens=32).replace("sweep:\n", "sweep:\n"
                                                           + SHARED_MACHINE, 1)
    plan = tmp_path / "demo-calibration.yml"
    # this box's ITL under the parallel part's load: the plan's own ceiling, raised further
    plan.write_text(re.sub(r"  itl_p95_ceiling_ms: .*\n", "", text)
                    + "  itl_p95_ceiling_ms: 10000\n")
    doc = load_lock(write_lock(load_plan(plan), lambda m: None))
    assert doc["models"]["target"]["calibration"]["expected_acceptance"] == 1.0
    store = open_store(f"sqlite:///{tmp_path / 'demo.db'}")
    hosts = [replace(h, root=str(tmp_path / "node"))
             for h in load_inventory(ROOT / "orchestrator" / "inventory" / "local.yml").hosts]
    result = start_sweep(doc, hosts, store, opts=SweepOptions(provision=False))
    assert result.status == "ok", result.outcomes

    full = f"{CALIBRATION_FOLDER} (calibration) / models/draft"
    with store.engine.connect() as c:
        pairs = set(c.execute(select(Run.model_pair)).scalars())
        rows = c.execute(select(Measurement.pair, Measurement.mode,
                                Measurement.num_draft_tokens, Measurement.decode_tok_s)).all()
        notices = [p["message"] for p in c.execute(
            select(Event.payload).where(Event.type == "notice")).scalars()
            if p.get("adaptive")]
    assert pairs == {full, f"{CALIBRATION_FOLDER} (calibration) / draft-4bit"}
    # the adaptive sweep: every width measured at least min_repetitions and at most the
    # plan's repetitions times
    lo, most = CALIBRATION_ADAPTIVE["min_repetitions"], CALIBRATION_REPETITIONS
    mine = [r for r in rows if r.pair == "target+draft"]  # the lineup's first pair
    ran = {k: sum(r.num_draft_tokens == k for r in mine) for k in CALIBRATION_WIDTHS}
    assert all(lo <= n <= most for n in ran.values()), ran
    # the best width, picked here from the stored measurements (every gate but the
    # speedup's is declared off or passes by construction: acceptance 1.0, exact output)
    base = statistics.median(r.decode_tok_s for r in mine if r.mode == "baseline")
    speedup = {k: statistics.median(r.decode_tok_s for r in mine if r.num_draft_tokens == k)
               / base for k in CALIBRATION_WIDTHS}
    best = max(speedup, key=speedup.__getitem__)
    assert speedup[best] >= 1.16, f"acceptance 1.0 and no width won: {speedup}"

    # the demo's own review: the weekly page and the policy it asks calibration into
    dom = dump_dom(write_demo_review(store, tmp_path))
    row = next(r for r in dom.split('<tr data-decision="')[1:] if f"{full} · code" in r
               or full in r.split("</tr>")[0])
    assert row.startswith("production candidate")
    assert (f"calibration pair (an instrument, not a model): production candidate at draft "
            f"width {best}, provisional: 1 of 3 nights") in row.split("</tr>")[0]
    # the ladder of the calibration target, from rung 0: the draft at its widest width
    ladder = dom.split('<table class="ladder"')[1].split("</table>")[0]
    steps = re.findall(r'<tr data-step="(\d)" data-passes="(yes|no)"', ladder)
    # the rung names the pair short, its full identity on hover
    assert steps[0][0] == "0" and f'title="{full}">current width · ' in ladder
    assert f"<td>{max(CALIBRATION_WIDTHS)}</td>" in ladder.split("</tr>")[1]
    # the demo asks calibration into the policy: its one-night candidate is switched on
    # there, marked provisional with its count (the page says so: on, 1 of 3 nights)
    policy = dom.split('id="calibration-policy" data-asked="yes">')[1].split("</p>")[0]
    assert (f'<span data-series="{full}" data-policy="on">{full} · code: speculation <b>on at '
            f"draft width {best}</b> (provisional: 1 of 3 nights)</span>") in policy
    assert "asked with <code>--policy-calibration</code>" in policy
    entry = {p["model_pair"]: p for p in json.loads(
        (tmp_path / "policy.json").read_text())["series"]}[full]
    assert (entry["speculation"], entry["num_draft_tokens"], entry["provisional"],
            entry["calibration"]) == (True, best, {"nights": 1, "needed": 3}, True)
    # the raised TTFT limit, justified beside the gates that judged it
    assert f"TTFT ≤ +{round(CALIBRATION_TTFT_LIMIT * 100)}%" in dom
    assert "a cost of the construction, not of any model" in dom
    # the knee: the speedup-by-width chart is drawn
    assert 'id="chart-speedup_vs_width"' in dom
    # the adaptive sweep's stops, the same on the review and on the sweep page, each after
    # the rounds it ran of the plan's maximum. Whether the winner settles before the last
    # round is the machine's noise (CI's load kept width 2 within reach of width 4 for all
    # 12 rounds once): the stop logic itself is judged on planted rounds in
    # tests/test_adaptive*.py; here, what the agent journaled is what both pages say, and a
    # width stopped early only as the settled best or as slower with confidence.
    sweep_dom = dump_dom(render_review(store, tmp_path / "calibration.html", result.sweep_id))
    rounds = _paired_rounds(store)  # what the stops rested on, said when one is missing
    item = "(?:(?!</li>).)*?"  # within one list item
    for page in (dom, sweep_dom):
        if not notices:
            assert '<ul id="adaptive-stops">' not in page, (rounds, ran)
            continue
        assert '<ul id="adaptive-stops">' in page, ("no adaptive stop", rounds, ran)
        listed = page.split('<ul id="adaptive-stops">')[1].split("</ul>")[0]
        stops = re.findall(r'<li data-best="(yes|no)" data-calibration="yes">local · '
                           rf"calibration pair \(an instrument, not a model\){item} · workload "
                           rf"<code>code</code>: (?:<b>)?draft width (\d) stopped after "
                           rf"(\d+) of {most} repetitions: ({item})(?:</b>)?</li>", listed)
        assert len(stops) == len(notices) == listed.count("<li"), (listed, notices)
        settled = [s for s in stops if s[3].startswith("settled as the best: faster than its "
                                                       "baseline beyond the tolerance with 80% "
                                                       "confidence")]
        assert all(s[3].startswith("slower than ") for s in stops if s not in settled), stops
        assert all(s[0] == "yes" for s in settled) and len(settled) <= len(set(
            r.pair for r in rows)), stops
        mine_settled = [s for s in settled if int(s[1]) == best and int(s[2]) == ran[best]]
        if ran[best] < most:  # the best stopped early: only as the settled winner
            assert mine_settled, (stops, ran, speedup, rounds)
        else:  # it ran every round: no stop claims it settled
            assert not mine_settled, (stops, ran, speedup, rounds)
    # each stop the agent journaled is said once, in the stops' list above: not again, raw,
    # among the review's notices
    shown = re.findall(rf"<li[^>]*>{item}: (adaptive: {item})</li>", dom)
    assert shown == [], shown
    print("speedups", speedup, "ran", ran, "adaptive stops", notices)


def _paired_rounds(store) -> dict:
    """Per pair and width, the paired speedups round by round (each speculative trial over
    the baseline measured just before it), as the adaptive sweep saw them, rounded."""
    with store.engine.connect() as c:
        gens = [p for p in c.execute(select(Event.payload).where(Event.type == "generation")
                                     .order_by(Event.seq)).scalars()]
    out: dict = {}
    last: dict = {}
    for g in gens:
        pair = json.dumps(g.get("models"), sort_keys=True)
        if g["mode"] == "baseline":
            last[pair] = g
        elif pair in last:
            out.setdefault(pair, {}).setdefault(g["num_draft_tokens"], []).append(
                round(g["decode_tok_s"] / last[pair]["decode_tok_s"], 2))
    return out
