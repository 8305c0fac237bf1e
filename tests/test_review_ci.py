"""The weekly review as a CI gate: --fail-on exit codes with one line per finding,
JUnit XML per series × gate, and a webhook summary (retried, never blocking)."""

import json
import random
import threading
import xml.etree.ElementTree as ET
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.store import open_store
from tests.history import config_values as V
from tests.history import night, week_nights
from tests.store_templates import planted_sqlite
from tests.test_weekly_review import W17, W19, W20

COMMON = dict(node="mac-01", chip="Apple M2 Max", bucket="short")


def _good(rng):
    return {("baseline", 0): V(100.0, rng=rng),
            ("speculative", 4): V(130.0, acceptance=0.70, ttft=51.5, itl_p95=20.0, swap=0,
                                  rng=rng)}


def _plant_week(url: str) -> None:
    """One week with one of each cause."""
    rng = random.Random(11)
    store = open_store(url)
    for at in week_nights(W19):
        night(store, at, pair="llama", workload="bump", **COMMON,
              configs={("baseline", 0): V(400, rng=rng)})
    for at in week_nights(W20):
        night(store, at, pair="llama", workload="bump", **COMMON,
              configs={("baseline", 0): V(300, rng=rng)}, identity={"mlx_lm_version": "0.33.0"})
        night(store, at, pair="gemma", workload="good", **COMMON, configs=_good(rng))
        night(store, at, pair="gemma", workload="slow", **COMMON,
              configs={("baseline", 0): V(100.0, rng=rng),
                       ("speculative", 3): V(105.0, acceptance=0.7, rng=rng)})
    night(store, W17, pair="old", workload="forgotten", **COMMON,
          configs={("baseline", 0): V(100, rng=rng)})
    store.record_failed_start("nightly-x", "the lock no longer matches", trigger="nightly")
    from orchestrator.store.models import Sweep

    with store.engine.begin() as c:  # the failed start happened in the reviewed week
        c.execute(Sweep.__table__.update().where(Sweep.id == "nightly-x").values(
            created_at=W20 + timedelta(days=2)))
    store.engine.dispose()


def _plant_clean(url: str) -> None:
    """A store with only a good series (its own seed: it was planted after the week's)."""
    rng = random.Random(12)
    store = open_store(url)
    for at in week_nights(W20):
        night(store, at, pair="gemma", workload="good", **COMMON, configs=_good(rng))
    store.engine.dispose()


@pytest.fixture
def week(tmp_path):
    """One week with one of each cause, and a store with only a good series: copies of
    stores planted once per worker (tests/store_templates.py), each test's its own."""
    return (planted_sqlite("test_review_ci.week", _plant_week, tmp_path / "bad.db"),
            planted_sqlite("test_review_ci.clean", _plant_clean, tmp_path / "clean.db"))


def _review(url, tmp_path, *args):
    return CliRunner().invoke(main, ["review", "--week", "2026-W20", "--db", url, "--out",
                                     str(tmp_path / "out"), "--format", "json", *args])


def test_fail_on_exits_1_with_one_line_per_finding_of_the_causes_asked(week, tmp_path):
    url, clean = week
    r = _review(url, tmp_path, "--fail-on", "regression")
    assert r.exit_code == 1, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("regression: ")]
    # a quarter slower after the mlx-lm bump: against last week's nights and against
    # the nights before (7 vs 7, which the exact rank test can confirm)
    assert [x.split(": ")[2] for x in lines] == ["baseline week over week",
                                                  "baseline vs last 4 weeks"]
    assert all("bump" in x and "changed: mlx-lm 0.32.2 → 0.33.0" in x for x in lines)
    assert "review 2026-W20: 2 finding(s) for --fail-on regression" in r.stderr
    assert (tmp_path / "out" / "review-2026-W20.json").exists()  # the review is written first

    r = _review(url, tmp_path, "--fail-on", "gate-miss,stale,failed-sweep")
    assert r.exit_code == 1
    found = sorted(x.split(": ", 1)[0] for x in r.stderr.splitlines() if ": " in x
                   and not x.startswith("review "))
    assert found == ["failed-sweep", "gate-miss", "stale"]
    # the comparison the gate made, not just the value (1.05×)
    assert "slow" in r.stderr and "best speculative k=3 misses speedup 1.0" in r.stderr
    assert "< 1.16" in r.stderr
    assert "sweep nightly-x (nightly" in r.stderr and "the lock no longer matches" in r.stderr
    assert "forgotten" in r.stderr and "no run since 2026-04-20" in r.stderr

    r = _review(clean, tmp_path, "--fail-on", "regression,gate-miss,stale,failed-sweep")
    assert r.exit_code == 0, r.output
    assert "0 finding(s)" in r.stderr
    assert _review(url, tmp_path).exit_code == 0  # without --fail-on, a report only


def test_fail_on_an_unknown_cause_is_a_usage_error(week, tmp_path):
    r = _review(week[0], tmp_path, "--fail-on", "regression,slowness")
    assert r.exit_code == 2
    assert "--fail-on" in r.output and "slowness is not a cause" in r.output
    assert "regression,gate-miss,no-data,stale,failed-sweep" in r.output
    assert "Traceback" not in r.output


def test_junit_has_a_case_per_series_and_gate(week, tmp_path):
    url, _ = week
    junit = tmp_path / "junit.xml"
    r = _review(url, tmp_path, "--junit", str(junit))
    assert r.exit_code == 0, r.output
    suite = ET.parse(junit).getroot()
    cases = {((c.get("classname").split(" · ") + ["sweeps"] * 3)[2], c.get("name")): c
             for c in suite}
    assert cases[("sweeps", "sweep nightly-x")].find("failure") is not None
    message = cases[("slow", "speedup")].find("failure").get("message")
    assert message.startswith("speculative k=3: speedup 1.0") and message.endswith("< 1.16")
    assert cases[("good", "speedup")].find("failure") is None
    assert cases[("bump", "no regression")].find("failure") is not None
    assert cases[("bump", "gates")].find("skipped") is not None  # baseline only
    assert cases[("forgotten", "not stale")].find("failure") is not None
    gates = {name for (wl, name) in cases if wl == "good"}
    assert {"speedup", "itl_p95_ms", "acceptance", "ttft_change", "swap_peak_bytes",
            "exact"} <= gates
    assert int(suite.get("tests")) == len(suite) and int(suite.get("failures")) == sum(
        1 for c in suite if c.find("failure") is not None)


class _Hook(BaseHTTPRequestHandler):
    fail_first = 1
    bodies: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(json.loads(body))
        if len(type(self).bodies) <= type(self).fail_first:
            self.send_response(503)
        else:
            self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_notify_posts_a_summary_retrying_and_never_blocks(week, tmp_path):
    url, _ = week
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hook = f"http://127.0.0.1:{server.server_port}/hook"
        r = _review(url, tmp_path, "--notify", hook, "--fail-on", "regression")
        assert r.exit_code == 1  # the findings decide the exit, not the webhook
        assert f"notified {hook}" in r.output
        first, second = _Hook.bodies  # 503 once, then delivered
        assert first == second
        assert second["text"].startswith("specfleet review 2026-W20: 2 finding(s) to act on")
        assert "regression: " in second["text"] and second["fail_on"] == ["regression"]
        assert second["findings"]["regression"][0].startswith("Apple M2 Max · llama · bump")
        assert {s["series"]["workload"] for s in second["series"]} >= {"bump", "good"}
    finally:
        server.shutdown()
    r = _review(url, tmp_path, "--notify", "http://127.0.0.1:1/hook")  # nothing listens
    assert r.exit_code == 0, r.output
    assert "warning: could not notify http://127.0.0.1:1/hook" in r.stderr
    assert "after 3 attempt(s)" in r.stderr


class _Trickle(BaseHTTPRequestHandler):
    """Reads the request, then sends its status line a byte every 0.3 s (bounded: 200
    bytes): each read finishes within urllib's socket timeout, the request never does."""

    def do_POST(self):
        import time

        self.rfile.read(int(self.headers["Content-Length"]))
        for b in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 180:
            try:
                self.wfile.write(bytes([b]))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.3)

    def log_message(self, *a):
        pass


def test_notify_has_a_total_deadline_against_a_server_that_answers_slowly(week, tmp_path):
    import time

    url, _ = week
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hook = f"http://127.0.0.1:{server.server_port}/hook"
        t0 = time.monotonic()
        r = _review(url, tmp_path, "--notify", hook, "--notify-timeout", "2")
        took = time.monotonic() - t0
    finally:
        server.shutdown()
    assert r.exit_code == 0, r.output
    assert f"warning: could not notify {hook}: no complete answer within the 2 s deadline" \
        in r.stderr
    assert took < 20, took  # the trickle alone would take 60 s; the review's own work is less
    assert list((tmp_path / "out").glob("*.json"))  # the review was written all the same


def test_policy_is_the_verdicts_for_a_gateway_and_diffs_week_to_week(week, tmp_path):
    url, _ = week
    first, again = tmp_path / "p1.json", tmp_path / "p2.json"
    assert _review(url, tmp_path, "--policy", str(first)).exit_code == 0
    assert _review(url, tmp_path, "--policy", str(again)).exit_code == 0
    assert first.read_bytes() == again.read_bytes()  # deterministic: a change is a real diff
    doc = json.loads(first.read_text())
    assert doc["schema"] == "specfleet-policy/1" and doc["week"] == "2026-W20"
    by = {s["workload"]: s for s in doc["series"]}
    assert by["good"]["speculation"] is True and by["good"]["num_draft_tokens"] == 4
    assert by["good"]["decision"] == "production candidate"
    assert by["good"]["fallback"]["ladder"] == [{"step": 2, "action": "lighter_draft_tier"},
                                                {"step": 3, "action": "autoregressive"}]
    assert by["good"]["fallback"]["when"] == {"acceptance_below": 0.55,
                                              "swap_peak_bytes_above": 1.5e9,
                                              "ttft_change_above": 0.08}
    # a graded fallback never switches on the config that failed (issue 27)
    assert by["slow"]["decision"] == "graded fallback" and by["slow"]["speculation"] is False
    assert by["slow"]["num_draft_tokens"] is None
    assert by["bump"]["speculation"] is False and by["bump"]["num_draft_tokens"] is None
    assert by["bump"]["decision"] == "needs more data"
    assert by["forgotten"]["because"] == "needs more data: no run this week"


def test_json_and_webhook_carry_opentelemetry_genai_names(week, tmp_path):
    url, _ = week
    assert _review(url, tmp_path).exit_code == 0
    data = json.loads((tmp_path / "out" / "review-2026-W20.json").read_text())
    (good,) = [s for s in data["series"] if s["series"]["workload"] == "good"]
    base, spec = good["configs"]
    assert spec["otel"]["gen_ai.request.model"] == "gemma"
    assert spec["otel"]["gen_ai.provider.name"] == "mlx-lm"
    assert spec["otel"]["gen_ai.operation.name"] == "text_completion"
    medians = spec["otel"]["medians"]
    assert medians["gen_ai.server.time_to_first_token"] == __import__("pytest").approx(
        spec["ttft_p50"] / 1000)
    # planted without E2E (as runs stored before the agent reported it): no TPOT, not 1/rate
    assert medians["gen_ai.server.time_per_output_token"] is None
    assert "gen_ai.server.time_to_first_token" not in spec["otel"]  # a median, not a histogram
    assert spec["otel"]["specfleet.speculative.num_draft_tokens"] == 4
    assert base["otel"]["specfleet.speculative"] is False


@pytest.mark.parametrize("label,ahead", [("2026-W21", False), ("2099-W10", True)])
def test_an_empty_or_future_week_is_no_data_for_every_cause(week, tmp_path, label, ahead):
    """A week without runs (after the planted ones, or years ahead) once said "nothing
    regressed" and passed every --fail-on cause; it is no data, whatever was asked."""
    url, _ = week
    for cause in ("regression", "stale", "failed-sweep", "gate-miss"):
        r = CliRunner().invoke(main, ["review", "--week", label, "--db", url, "--out",
                                      str(tmp_path / "out"), "--format", "json",
                                      "--fail-on", cause])
        assert r.exit_code == 1, r.output
        said = f"no-data: week {label}: no runs at all" + (
            " (the week has not begun)" if ahead else "")
        assert [x for x in r.stderr.splitlines() if x.startswith("no-data:")] == [said]
    # a week with runs keeps to the causes asked: W20 has no stale series to fail on
    r = _review(url, tmp_path, "--fail-on", "failed-sweep")
    assert "no-data:" not in r.stderr
