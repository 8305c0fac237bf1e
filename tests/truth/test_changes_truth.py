"""Planted change points (tests/truth/changes.py) through `specfleet review` on SQLite and
PostgreSQL: a step in the window's last nights is a possible step at its own night, "confirm
on the next nights", the identity change named; a step inside the window is a step with its
cause; a drift is labelled drift; a two-night dip and a flat level are no change point. The
JSON, the Markdown table and the HTML table each give the planted answer."""

from __future__ import annotations

import re

import pytest

from orchestrator.store import open_store
from tests.truth.changes import CASES, SPEC, plant
from tests.truth.weeks import cells, reviewed


def _matches(got: str, want) -> bool:
    return got in want if isinstance(want, tuple) else got == want


def test_every_change_point_is_the_planted_one(any_url, tmp_path):
    store = open_store(any_url)
    plant(store)
    a, md, html = reviewed(any_url, tmp_path / "out")
    page = html
    (table,) = re.findall(r'<table id="change-points">(.*?)</table>', page, re.S)
    html_rows = [cells(row) for row in re.findall(r"<tr data-kind[^>]*>(.*?)</tr>", table,
                                                   re.S)]
    md_rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in md.splitlines()
               if line.startswith("| ") and re.search(r" \| \d{4}-\d\d-\d\d \| ", line)
               and "% |" in line]
    by_workload = {s["series"]["workload"]: s for s in a["series"]}
    assert len(html_rows) == len(md_rows) == sum(len(c.expect) for c in CASES)
    for case in CASES:
        got = by_workload[case.workload]["change_points"]
        assert len(got) == len(case.expect), (case.workload, got)
        mine_html = [c for c in html_rows if c[0] == case.workload
                     or f" · {case.workload} · " in c[0]]
        # the page names a series by what tells it apart (here its workload), in full on
        # hover
        mine_md = [c for c in md_rows if c[0] == case.workload
                   or f" · {case.workload} · " in c[0]]
        assert len(mine_html) == len(mine_md) == len(case.expect), case.workload
        for cp, want, h, m in zip(got, case.expect, mine_html, mine_md):
            assert cp["config"] == SPEC and cp["metric"] == "decode_tok_s"
            assert cp["kind"] == want["kind"], (case.workload, cp)
            assert _matches(cp["date"], want["date"]), (case.workload, cp)
            if "until" in want:
                assert _matches(cp["until"], want["until"]), (case.workload, cp)
            assert cp["size"] == pytest.approx(want["size"], abs=want.get("size_within", 1e-9))
            if "changed" in want:
                assert cp["changed"] == want["changed"]
            if "note" in want:
                assert cp["note"] == want["note"]
            # the tables: the night, the kind with its note, the change, what changed
            kind = cp["kind"] + (f" ({cp['note']})" if cp["note"] else "")
            change = f"{cp['size'] * 100:+.1f}%"
            what = "; ".join(cp["changed"]) if cp["changed"] else "no identity change"
            assert (h[1], h[2], h[3], h[6], h[9]) == (SPEC, cp["date"], kind, change, what), h
            assert (m[1], m[2], m[3], m[4], m[6]) == (SPEC, cp["date"], kind, change, what), m
    # the planted drift is shown as a drift, a step as what it is: never a dip
    assert "possible step (confirm on the next nights)" in md
    assert 'data-kind="drift"' in page
