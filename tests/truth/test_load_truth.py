"""Planted load levels (tests/truth/loads.py) through `specfleet review` on SQLite and
PostgreSQL: ITL is the gap between chunks, TPOT (E2E − TTFT)/(tokens − 1), a level is
saturated when it serves below 95% of the rate its schedule realised or its queue grows
(closed and open loop alike), and the rules read the realised rate, not the nominal one.
The JSON, the Markdown table and the HTML table each give the planted answer."""

from __future__ import annotations

import re

import pytest

from orchestrator.store import open_store
from tests.truth.loads import LEVELS, SIGNALS, VARIANT, WORKLOAD, plant
from tests.truth.weeks import cells, reviewed


def _html_levels(page: str) -> dict[tuple[str, float], dict[str, str]]:
    """{(load, level): {column header: cell}} from the page's load tables."""
    out = {}
    for load, table in re.findall(r'<table class="load" data-node="[^"]*" data-load="([^"]+)">'
                                  r"(.*?)</table>", page, re.S):
        heads = cells(re.search(r"<thead>(.*?)</thead>", table, re.S)[1], "th")
        for level, row in re.findall(rf'<tr data-variant="{VARIANT}" data-level="([^"]+)">'
                                     r"(.*?)</tr>", table, re.S):
            out[(load, float(level))] = dict(zip(heads, cells(row)))
    return out


def test_every_load_level_gives_the_planted_answer(any_url, tmp_path):
    store = open_store(any_url)
    plant(store)
    a, md, html = reviewed(any_url, tmp_path / "out")
    page = _html_levels(html)
    got = {(g["load"], e["level"]): e for g in a["loads"] for v in g["variants"]
           if v["variant"] == VARIANT for e in v["levels"]}
    assert set(got) == {(lv.load, lv.level) for lv in LEVELS} == set(page)
    md_rows = {}
    for line in md.splitlines():
        if line.startswith(f"| {VARIANT} (speculative) | "):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            md_rows.setdefault(float(cells[1].split()[0]), []).append(cells)
    for lv in LEVELS:
        e, h = got[(lv.load, lv.level)], page[(lv.load, lv.level)]
        for name, want in lv.expect.items():
            assert e[name] == (want if want is None or isinstance(want, str)
                               else pytest.approx(want, abs=1e-9)), (lv.load, lv.level, name)
        # the page: status, ITL, TPOT, offered / served and the reason, as planted
        assert h["status"] == lv.expect["status"]
        assert h["ITL p95 ms"] == f"{lv.expect['itl_ms_p95']:.1f}"
        if "tpot_ms_p50" in lv.expect:
            assert h["TPOT p50 ms"] == f"{lv.expect['tpot_ms_p50']:.1f}"
        if "offered_rps" in lv.expect:
            assert h["offered / served req/s"] == \
                f"{lv.expect['offered_rps']:.2f} / {lv.expect['served_rps']:.2f}"
        assert (lv.expect["stop_reason"] or "") in h["knee / cap / why"]
        # the Markdown: the level's row, its status and why
        (m,) = [c for c in md_rows[lv.level]]
        assert m[2] == lv.expect["status"] and m[-1] == (lv.expect["stop_reason"] or "")
    # the cap is the level before saturation, on either loop; the rules read it
    caps = {g["load"]: v["cap"] for g in a["loads"] for v in g["variants"]}
    assert caps == {"concurrency": 1, "request_rate": 7}
    (s,) = [s for s in a["series"] if s["series"]["workload"] == WORKLOAD]
    assert {k: s["metrics"][k] for k in SIGNALS} == SIGNALS
