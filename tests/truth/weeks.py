"""Planted weeks declared as data, each with the answer the review's outputs must give.

A week is series × nights × configs (every knob), with the nights a config's runs are set
aside and why; ``plant`` puts it into a store through the real ingest (tests/history.py).
Numbers are planted without jitter, so every expected speedup is the ratio of two planted
numbers, known without the code under test. ``EXPECT`` says, per week, what each output
must show; tests/truth/test_review_truth.py checks it on SQLite and PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from orchestrator.store import Store
from tests.history import C, config_values, generation, ingest_lines, night, week_nights

W20 = datetime(2026, 5, 11, tzinfo=timezone.utc)  # Monday of 2026-W20
WEEK = "2026-W20"
POISON = 7777.0  # a set-aside run's decode tok/s: must never show without its marker


@dataclass(frozen=True)
class Config:
    mode: str
    k: int = 0
    knobs: tuple = ()              # sampling knobs away from their defaults
    decode: float = 100.0
    acceptance: float | None = None
    ttft: float = 50.0
    itl_p95: float = 20.0
    swap: float = 0.0
    aside: tuple[int, ...] = ()    # nights (0-based) whose runs are set aside
    reason: str = "contended: 40% of the CPU taken by other processes"
    positions: tuple[int, int] | None = None  # accepted of 10 drafted, positions 1 and 2

    @property
    def key(self) -> tuple:
        return C(self.mode, self.k, **dict(self.knobs))

    def values(self, poisoned: bool) -> dict:
        return config_values(POISON if poisoned else self.decode, 3, jitter=0.0,
                             acceptance=0.0777 if poisoned and self.acceptance else
                             self.acceptance, ttft=self.ttft, itl_p95=self.itl_p95,
                             swap=2.5e9 if poisoned else self.swap)


@dataclass(frozen=True)
class Series:
    workload: str
    configs: tuple[Config, ...]
    engine: str = "mlx-lm"
    node: str = "mac-01"
    chip: str = "Apple M2 Max"
    pair: str = "gemma-9b / gemma-2b"
    lineup: str | None = None      # the pair's roles in a lineup ("target+draft-2"); the
    #                                lineup's series of a night share one sweep
    background: str | None = None  # a co-tenant load profile: a busy series of its own
    identity: tuple = ()           # identity fields away from tests/history's BASE_IDENTITY


@dataclass(frozen=True)
class Week:
    name: str
    series: tuple[Series, ...]
    nights: int = 5
    expect: dict = field(default_factory=dict)


def plant(store: Store, week: Week) -> None:
    """Each night, each series: its reliable runs in one sweep, its set-aside runs in the
    same sweep flagged unreliable (as the agent flags a contended run), and for configs
    with ``positions`` one speculative generation event carrying acceptance by position
    (a set-aside night's with positions 1/10 and 0/10: the poison). A lineup's series
    (several target/draft pairs) share each night's sweep on their node."""
    for i, at in enumerate(week_nights(W20, week.nights)):
        lineups: dict[str, str] = {}  # node → this night's lineup sweep
        for s in week.series:
            where = dict(node=s.node, chip=s.chip, pair=s.pair, workload=s.workload,
                         engine=s.engine, lineup=s.lineup, background=s.background,
                         identity=dict(s.identity))
            ok = {c.key: c.values(False) for c in s.configs if i not in c.aside}
            bad = {c.key: c.values(True) for c in s.configs if i in c.aside}
            shared = lineups.get(s.node) if s.lineup else None
            sid = night(store, at, **where, sweep_id=shared, configs=ok) if ok else shared
            for c in s.configs:
                if i in c.aside:
                    sid = night(store, at, **where, sweep_id=sid, unreliable=c.reason,
                                configs={c.key: bad.pop(c.key)})
            if s.lineup and sid:
                lineups[s.node] = sid
            for c in s.configs:
                if c.positions and sid:
                    a1, a2 = (1, 0) if i in c.aside else c.positions
                    ingest_lines(store, sid, s.node, [generation(
                        c.mode, c.k, c.knobs, workload=s.workload, lineup=s.lineup,
                        acceptance_rate=0.6,
                        acceptance_by_position=[
                            {"position": 1, "drafted": 10, "accepted": a1},
                            {"position": 2, "drafted": 10, "accepted": a2}])],
                        at.timestamp())


BASE = Config("baseline", decode=100.0)
GOOD = dict(acceptance=0.7, ttft=51.0)

WEEKS = (
    # issue 27: a runtime measured plain beside mlx-lm crashed the HTML review
    Week("plain runtime beside mlx-lm", (
        Series("code", (BASE, Config("speculative", 3, decode=150.0, **GOOD))),
        Series("code", (Config("baseline", decode=120.0),), engine="ollama")),
        expect={
            "speedups": {("code", "mlx-lm", "speculative k=3"): 1.5},
            "verdicts": {("code", "mlx-lm"): "production candidate at draft width 3",
                         ("code", "ollama"): "needs more data: measured without "
                                             "speculation this week"},
            "side_by_side": {"code": (("ollama", "mlx-lm", 1.2), ("mlx-lm", None, None))},
            "runtime_verdict": "fastest without speculation: ollama, 1.20× mlx-lm; with "
                               "speculation: mlx-lm at k=3 (the only runtime measured)",
            "policy": {("code", "mlx-lm"): (True, 3), ("code", "ollama"): (False, None)},
            "fail_on_gate_miss": 0}),
    # issue 27: temperature 0.0 and 0.7 at width 3 pooled into one "speculative k=3"
    Week("sampling settings apart", (
        Series("code", (BASE, Config("baseline", knobs=(("temperature", 0.7),)),
                        Config("speculative", 3, decode=150.0, **GOOD),
                        Config("speculative", 3, knobs=(("temperature", 0.7),), decode=90.0,
                               **GOOD))),),
        expect={
            "speedups": {("code", "mlx-lm", "speculative k=3"): 1.5,
                         ("code", "mlx-lm", "speculative k=3 · temperature 0.7"): 0.9},
            "runs": {("code", "mlx-lm", "speculative k=3"): 5,
                     ("code", "mlx-lm", "speculative k=3 · temperature 0.7"): 5,
                     ("code", "mlx-lm", "baseline · temperature 0.7"): 5},
            "verdicts": {("code", "mlx-lm"): "production candidate at draft width 3"},
            "policy": {("code", "mlx-lm"): (True, 3)},
            "policy_sampling": {("code", "mlx-lm"): {"temperature": 0.0}},
            "fail_on_gate_miss": 0}),
    # issue 27: set-aside runs leaked into the runtimes table, the swap rule, the
    # acceptance charts and the otel block
    Week("set-aside runs never leak", (
        Series("code", (BASE, Config("speculative", 3, decode=130.0, aside=(4,),
                                     positions=(9, 7), **GOOD),
                        Config("speculative", 4, decode=140.0, aside=(0, 1, 2, 3, 4),
                               **GOOD))),
        Series("code", (Config("baseline", decode=300.0, aside=(0, 1, 2, 3, 4)),
                        Config("speculative", 3, decode=200.0, **GOOD)),
               engine="llama-server")),
        expect={
            "speedups": {("code", "mlx-lm", "speculative k=3"): 1.3},
            "runs": {("code", "mlx-lm", "speculative k=3"): 5},
            "set_aside": {("code", "mlx-lm", "speculative k=4"): True,
                          ("code", "llama-server", "baseline"): True},
            "side_by_side": {"code": (("mlx-lm", None, None), ("mlx-lm", None, None))},
            "positions": {("code", "mlx-lm"): [0.9, 0.7, None]},  # position 3 not planted
            "trend_nights": {("code", "mlx-lm"): 4},
            "not_fired": {("code", "mlx-lm"): "swap-pressure"},
            # llama-server's baseline is all set aside: nothing to judge its speculation by
            "no_data": 1, "fail_on_gate_miss": 1}),
    # issue 27: the policy enabled what failed; evidence contradicted itself at the edges
    Week("policy edges", (
        Series("swap-miss", (BASE, Config("speculative", 3, decode=140.0, swap=1.6e9,
                                          **GOOD))),
        Series("speed-edge", (BASE, Config("speculative", 3, decode=115.99, **GOOD))),
        Series("ttft-edge", (Config("baseline", decode=100.0, ttft=50.0),
                             Config("speculative", 3, decode=140.0, acceptance=0.7,
                                    ttft=54.01))),
        Series("two-widths", (BASE, Config("speculative", 2, decode=125.0, acceptance=0.8,
                                           ttft=51.0),
                              Config("speculative", 4, decode=135.0, swap=1.6e9, **GOOD)))),
        expect={
            "verdicts": {("swap-miss", "mlx-lm"): "graded fallback step 2: serve "
                                                  "autoregressive",
                         ("speed-edge", "mlx-lm"): "graded fallback step 2: serve "
                                                   "autoregressive",
                         ("two-widths", "mlx-lm"): "production candidate at draft width 2"},
            "evidence": {("swap-miss", "mlx-lm"): "peak swap 1600.0 MB > 1500 MB",
                         ("speed-edge", "mlx-lm"): "speedup 1.1599 < 1.16",
                         ("ttft-edge", "mlx-lm"): "TTFT +8.02% > +8%"},
            # JUnit: a case per series × gate, the failure stating the comparison
            "junit": {("speed-edge", "speedup"): "speedup 1.1599 < 1.16",
                      ("swap-miss", "swap_peak_bytes"): "peak swap 1600.0 MB > 1500 MB",
                      ("ttft-edge", "ttft_change"): "TTFT +8.02% > +8%",
                      ("two-widths", "speedup"): None, ("two-widths", "swap_peak_bytes"): None},
            "policy": {("swap-miss", "mlx-lm"): (False, None),
                       ("speed-edge", "mlx-lm"): (False, None),
                       ("ttft-edge", "mlx-lm"): (False, None),
                       ("two-widths", "mlx-lm"): (True, 2)},
            "fail_on_gate_miss": 1}),
    # issue 27: every series "needs more data" and --fail-on gate-miss exited 0
    Week("no reliable evidence", (
        Series("code", (BASE, Config("speculative", 3, decode=150.0, aside=(0, 1, 2, 3, 4),
                                     **GOOD))),),
        expect={
            "verdicts": {("code", "mlx-lm"): "needs more data: no reliable speculative "
                                             "config this week"},
            "policy": {("code", "mlx-lm"): (False, None)},
            "fail_on_gate_miss": 1, "no_data": 1, "nothing_compared": True}),
)


def cells(row: str, tag: str = "td") -> list[str]:
    """The text of a table row's cells, markup and entities removed."""
    import html
    import re

    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", row, re.S)]


def reviewed(url: str, out) -> tuple[dict, str, str]:
    """`specfleet review` of WEEK in html, md and json, as a user runs it: (json, md, html)."""
    import json

    from click.testing import CliRunner

    from orchestrator.cli import main

    r = CliRunner().invoke(main, ["review", "--week", WEEK, "--db", url, "--out", str(out),
                                  "--format", "html,md,json"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    return (json.loads((out / f"review-{WEEK}.json").read_text()),
            (out / f"review-{WEEK}.md").read_text(), (out / f"review-{WEEK}.html").read_text())
