"""Any name a user writes renders literally (issue 30, item 6): a workload named with
Markdown, HTML, math or template syntax reads back as written from the review's HTML (its
text and its charts), Markdown (rendered as CommonMark tables) and JSON."""

from __future__ import annotations

import json
import random
import tempfile
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from orchestrator.cli import main
from orchestrator.store import open_store
from tests.history import config_values as V
from tests.history import night, week_nights

WEEK = datetime(2026, 5, 11)  # a Monday: ISO 2026-W20
NASTY = ["$x$", "cost $5", "a|b", "*bold* _it_", "<script>alert(1)</script>", "&amp; &lt;",
         "{{ 7*7 }}", "{% raw %}", "~~gone~~", "[link](http://x)", "`code`", "back\\slash",
         "100%", "${HOME}", "日本語 ✓", "#heading"]


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)


def _text_of(html: str) -> str:
    p = _Text()
    p.feed(html)
    return "".join(p.parts)


names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF,
                              blacklist_categories=("Cs", "Cc", "Zl", "Zp", "Zs")),
                min_size=1, max_size=16) | st.sampled_from(NASTY)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names)
@example(name="$x$")
@example(name="<b>&amp;|*_`$~</b>")
def test_a_workload_name_reads_back_literally_from_every_format(name):
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 's.db'}"
        store = open_store(url)
        for at in week_nights(WEEK, nights=3):
            night(store, at, node="mac-01", chip="Apple M2", pair="llama", workload=name,
                  configs={("baseline", 0): V(100.0, rng=rng),
                           ("speculative", 3): V(130.0, acceptance=0.7, rng=rng)})
        out = Path(d) / "out"
        r = CliRunner().invoke(main, ["review", "--week", "2026-W20", "--db", url,
                                      "--out", str(out)])
        assert r.exit_code == 0, r.output
        doc = json.loads((out / "review-2026-W20.json").read_text())
        assert name in {s["series"]["workload"] for s in doc["series"]}
        html = (out / "review-2026-W20.html").read_text()
        assert name in _text_of(html)  # page text and the charts' SVG <text> alike
        md = (out / "review-2026-W20.md").read_text()
        rendered = MarkdownIt("commonmark").enable("table").render(md)
        assert name in _text_of(rendered), md
