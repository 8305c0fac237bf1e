"""`specfleet site OUT/`: a static history site with every series (200 here, no cap),
filtered and sorted in headless Chromium, and links that resolve."""

import random
import re
from datetime import timedelta

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.store import open_store
from tests.browser import dump_dom, screenshot
from tests.history import config_values as V
from tests.history import new_sweep, night
from tests.test_weekly_review import W20

CHIPS = ("Apple M2 Max", "Apple M4", "Apple M3 Pro", "Apple M1 Ultra")


def test_two_hundred_series_filter_sort_and_link(tmp_path):
    rng = random.Random(3)
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    nights = [W20 - timedelta(days=6 - i, hours=-2) for i in range(12)]  # 12 nights
    for n, at in enumerate(nights):
        sid = new_sweep(store, at)  # one sweep a night holds every series' runs
        # series 7 (the one that steps) every night; the other 199, which only have to be
        # listed, filtered, sorted and linked, the last 4 (planting all 12 was 80% of the cost)
        for i in range(200) if n >= 8 else [7]:
            chip = CHIPS[i % 4]
            slower = i == 7 and at >= nights[6]  # one series steps down
            night(store, at, node=f"mac-{i:03d}", chip=chip, pair=f"pair-{i // 4:02d}",
                  workload="code", sweep_id=sid,
                  configs={("baseline", 0): V(70.0 if slower else 100.0, rng=rng, reps=1),
                           ("speculative", 3): V(125.0, acceptance=0.7, rng=rng, reps=1)},
                  identity={"mlx_lm_version": "0.33.0"} if slower else None)
    out = tmp_path / "site"
    r = CliRunner().invoke(main, ["site", str(out), "--db", url, "--week", "2026-W20"])
    assert r.exit_code == 0, r.output
    index = out / "index.html"
    dom = dump_dom(index)
    rows = re.findall(r'<tr data-label="([^"]+)"', dom)
    assert len(rows) == 200 and "200 of 200 shown" in dom
    hrefs = re.findall(r'<a href="(series/[^"]+\.html)">', dom)
    assert len(set(hrefs)) == 200 and all((out / h).is_file() for h in hrefs)
    # the filter, from the URL as a reader would share it: every word must match
    m4 = dump_dom(index, "?q=m4+pair-01")
    visible = re.findall(r'<tr data-label="([^"]+)"(?![^>]*hidden)', m4)
    assert visible == ["Apple M4 · pair-01 · code · short · mlx-lm"]
    assert "1 of 200 shown" in m4
    # sorting by a column, from the URL too: change points first
    by_cps = dump_dom(index, "?sort=cps&dir=descending")
    first = re.search(r'<tr data-label="([^"]+)"', by_cps.split("<tbody>", 1)[1]).group(1)
    assert first == "Apple M1 Ultra · pair-01 · code · short · mlx-lm"  # series 7
    # the series page: its history, the change point and the identity change annotated
    (page,) = [h for h in hrefs if "apple-m1-ultra-pair-01" in h]
    series = dump_dom(out / page)
    assert 'class="change-point"' in series and 'class="identity-change"' in series
    assert "mlx-lm 0.32.2 → 0.33.0" in series and '<a href="../index.html">' in series
    png = screenshot(index, tmp_path / "index.png", "1280,900")
    assert png.stat().st_size > 10_000
