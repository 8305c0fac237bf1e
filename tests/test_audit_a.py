"""Adversarial audit of issues 28 and 29 (audit-a): lines a hostile node could write that
pass the decode boundary and still stop a node or break a reader, and Mac inputs.

Each case starts from the real recorded journal (``tests/hostile``), changes one event the
way a damaged or hostile node could, follows it with the controller's own follower and
renders every reader. What must hold (issue 28, 4 and 5): no line stops the node; what
passed the boundary does not break a reader.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from orchestrator.store import open_store
from orchestrator.store.models import Event, QuarantinedEvent
from tests.hostile import (
    _gen,
    _next_seq,
    _replace,
    dump,
    follow_journal,
    journal,
    render_all,
    seq_of,
)
from tests.store_templates import fresh_sqlite


def _quarantined(store, sweep_id: str) -> dict[int | None, str]:
    with store.engine.connect() as c:
        return dict(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sweep_id)).all())


def _stored_seqs(store, sweep_id: str) -> list[int]:
    with store.engine.connect() as c:
        return sorted(c.execute(select(Event.seq).where(Event.sweep_id == sweep_id)).scalars())


def _extra(fields: dict):
    """One more event after the last generation, with the next seq (the end renumbered:
    job_finished keeps the journal's last seq)."""
    def make(lines: list[bytes]) -> list[bytes]:
        i = seq_of(lines, "job_finished")
        seq = _next_seq(lines) - 1  # job_finished's seq: the extra event takes it
        end = {**json.loads(lines[i]), "seq": seq + 1}
        return [*lines[:i], dump({"schema": 1, "seq": seq, "ts": 1.0, **fields}), dump(end)]
    return make


@pytest.mark.parametrize("ts", [1e20, -1e15, 253402300800.0])
def test_a_generation_with_an_unrepresentable_ts_is_set_aside_and_the_node_goes_on(
        ts, tmp_path):
    # a finite ts passed the boundary; ingest's datetime.fromtimestamp then raised
    # (OverflowError / "year is out of range") and stopped the node on every --attach
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _replace(_gen(0), lambda e: {**e, "ts": ts})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    q = _quarantined(store, f.sweep_id)
    assert q == {5: f"ts {ts!r} is not a time between 1970 and 9999"}
    assert _stored_seqs(store, f.sweep_id) == [s for s in range(1, 29) if s != 5]
    render_all(store, f.sweep_id, tmp_path / "out")


LOAD = {"type": "load_level", "workload": "code", "variant": "v", "mode": "baseline",
        "load": "concurrency", "level": 1, "status": "ok"}


@pytest.mark.parametrize("extra, reason", [
    ({"rss_peak_bytes": "lots"}, "rss_peak_bytes 'lots' is not a non-negative number"),
    ({"swap_in_bytes": -1}, "swap_in_bytes -1 is not a non-negative number"),
    ({"rss_peak_bytes": 1e300}, "rss_peak_bytes 1e+300 is not a non-negative number"),
    ({"acceptance_rate": "x"}, "acceptance_rate 'x' is not a non-negative number"),
    ({"slo": 5}, "slo must be an object of numbers"),
    ({"slo": {"e2e_ms": "fast"}}, "slo must be an object of numbers"),
    ({"unreliable_reasons": [1]}, "unreliable_reasons must be a list of strings"),
])
def test_a_load_level_whose_numbers_are_not_numbers_is_set_aside(extra, reason, tmp_path):
    # these passed the boundary, then the review failed for good: TypeError in
    # _load.html.j2 (rss / 1048576), AttributeError in review/load.py (slo.get); on
    # PostgreSQL the grafana_load_levels view casts them (::float8::bigint)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    f = follow_journal(store, _extra({**LOAD, **extra})(journal()), tmp_path / "node")
    assert f.stopped is None
    assert _quarantined(store, f.sweep_id) == {28: f"load_level: {reason}"}
    render_all(store, f.sweep_id, tmp_path / "out")


def test_a_valid_load_level_with_every_number_is_stored_and_rendered(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    e = {**LOAD, "rss_peak_bytes": 2**40, "swap_in_bytes": 0, "acceptance_rate": 0.5,
         "cpu_other_share": 0.1, "slo": {"e2e_ms": 500}, "unreliable_reasons": []}
    f = follow_journal(store, _extra(e)(journal()), tmp_path / "node")
    assert _quarantined(store, f.sweep_id) == {}
    assert 28 in _stored_seqs(store, f.sweep_id)
    out = render_all(store, f.sweep_id, tmp_path / "out")
    assert "1048576" in out["review"]  # 2**40 bytes = 1048576 MiB, shown


def test_a_soak_result_without_its_optional_fields_renders(tmp_path):
    # workload, num_draft_tokens, reasons … are optional in the schema: a soak_result
    # without them passed the boundary, then the sweep page failed (StrictUndefined
    # 'workload') on every render
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _extra({"type": "soak_result", "status": "pass", "generations": 16})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    assert _quarantined(store, f.sweep_id) == {}
    out = render_all(store, f.sweep_id, tmp_path / "out")
    assert "<h2>Soak</h2>" in out["sweep page"]


@pytest.mark.parametrize("parity, reason", [
    ({"a": 1}, "parity must be {checked, mismatches: counts, first_difference, "
               "tool_mismatches}"),
    ({"checked": 2, "mismatches": "1"}, "parity must be {checked, mismatches: counts, "
                                        "first_difference, tool_mismatches}"),
    ({"checked": 2, "mismatches": 1, "first_difference": "x"},
     "parity must be {checked, mismatches: counts, first_difference, tool_mismatches}"),
])
def test_a_config_summary_with_a_malformed_parity_is_set_aside(parity, reason, tmp_path):
    # parity {"a": 1} passed (declared only as "an object"); the weekly review then
    # failed with KeyError 'mismatches' (review/weekly.py) on every render
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _replace(lambda ls: seq_of(ls, "config_summary"),
                     lambda e: {**e, "parity": parity})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    assert _quarantined(store, f.sweep_id) == {21: f"config_summary: {reason}"}
    render_all(store, f.sweep_id, tmp_path / "out")


def test_a_config_summary_with_a_real_parity_is_stored(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    p = {"checked": 2, "mismatches": 1, "first_difference": 7, "tool_mismatches": 0}
    lines = _replace(lambda ls: seq_of(ls, "config_summary"),
                     lambda e: {**e, "parity": p})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert _quarantined(store, f.sweep_id) == {}
    render_all(store, f.sweep_id, tmp_path / "out")


@pytest.mark.parametrize("name, value, reason", [
    ("verify_rounds", "x", "generation: verify_rounds 'x' is not a non-negative number"),
    ("kv_cache_bytes", [1], "generation: kv_cache_bytes [1] is not a non-negative number"),
    ("ttft_ms", -5.0, "generation: ttft_ms -5.0 is not a non-negative number"),
    ("decode_tok_s", -1, "generation: decode_tok_s -1 is not a non-negative number"),
    ("e2e_ms", True, "generation: e2e_ms True is not a non-negative number"),
])
def test_a_generation_metric_that_is_not_a_measurable_number_is_set_aside(
        name, value, reason, tmp_path):
    # verify_rounds "x" passed the boundary (only store columns were checked) and then
    # `specfleet export otlp` failed on every run (TypeError in acceptance_length); a
    # negative time or rate passed too and fed the medians as if measured
    from orchestrator.export.points import Selection, read_points

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _replace(_gen(1), lambda e: {**e, name: value})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    assert _quarantined(store, f.sweep_id) == {6: reason}
    _, points = read_points(store, Selection(sweep_ids=[f.sweep_id]))
    assert points
    render_all(store, f.sweep_id, tmp_path / "out")


# -- issue 29: a careless user's store URL for the nightly ----------------------------------

@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://"])
def test_schedule_install_refuses_an_in_memory_store(url, tmp_path):
    # accepted before: the nightly wrote every result into memory and lost it at exit
    from orchestrator.errors import ConfigError
    from orchestrator.sweep.schedule import store_for_schedule

    with pytest.raises(ConfigError) as e:
        store_for_schedule(url, tmp_path / "secrets", "n")
    assert str(e.value) == (f"schedule install: the store {url!r} is in memory: the nightly's "
                            "results would be gone when it exits; name a file "
                            "(sqlite:////abs/path.db) or a PostgreSQL URL")


def test_a_password_for_a_socket_in_the_query_goes_to_a_pgpass_line_for_that_socket(tmp_path):
    # libpq matches a .pgpass line's host against the host parameter when one is given
    # (libpq-pgpass): ?host=/var/run/postgresql needs that path there, not "localhost",
    # or the nightly fails at 02:00 with "no password supplied"
    from orchestrator.sweep.schedule import store_for_schedule

    url, env = store_for_schedule("postgresql+psycopg://ci:s3cret@/specfleet?host=/var/run/"
                                  "postgresql", tmp_path / "secrets", "n")
    assert "s3cret" not in url
    assert (tmp_path / "secrets" / "n.pgpass").read_text() == \
        "/var/run/postgresql:5432:specfleet:ci:s3cret\n"


# -- issue 29: the closest lock, for a node the locks do not fit ----------------------------

@pytest.mark.parametrize("libc", [["", ""], ["musl", "1.2.4"], ["glibc", ""]])
def test_a_linux_node_without_a_glibc_version_fits_no_lock_instead_of_crashing(libc):
    # platform.libc_ver() is ('', '') on musl (Alpine): closest_platform raised ValueError
    # (int('')) in provision, instead of "no locked environment fits this node"
    from orchestrator.fleet.platforms import closest_platform, platform_node

    node = platform_node("linux-x86_64-glibc2.36", "3.11") | {"libc": libc}
    assert closest_platform(["linux-x86_64-glibc2.28", "macos-14-arm64"], node) is None


# -- issue 28: seq games --------------------------------------------------------------------

def test_a_line_whose_seq_jumps_past_the_journal_is_set_aside(tmp_path):
    # it was stored: the node then reported "the agent stopped before finishing (last
    # event: notice)" with 2,147,483,618 seqs "missing" that the journal never had
    import sys

    from orchestrator.fleet.inventory import Host
    from orchestrator.store.coverage import coverage
    from orchestrator.sweep.verify import verify_sweep

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = journal()
    i = seq_of(lines, "job_finished")
    forged = dump({"schema": 1, "seq": 2**31 - 1, "type": "notice", "ts": 1.0,
                   "message": "hi"})
    f = follow_journal(store, [*lines[:i], forged, *lines[i:]], tmp_path / "node")
    assert f.stopped is None
    assert f.outcome.startswith("ok")
    assert coverage(store, f.sweep_id, "n1").missing == 0
    assert _quarantined(store, f.sweep_id) == {2**31 - 1: (
        f"past the journal: seq {2**31 - 1} is {2**31 - 1 - 28} past seq 28, where its "
        "numbered lines end (an agent numbers its events one by one; at most 64 lines in a "
        "row may be unreadable)")}
    assert _stored_seqs(store, f.sweep_id) == list(range(1, 29))
    host = Host(name="n1", address="localhost", connection="local", python=sys.executable,
                root=str(tmp_path / "node"))
    assert verify_sweep(store, f.sweep_id, [host]).complete


def test_export_otlp_leaves_out_a_stored_generation_that_does_not_read_as_its_type(tmp_path):
    # issue 28, 5: exports read through the typed decode. `export otlp` read the payload
    # column raw, so a generation an older boundary let in (verify_rounds "x") made it fail
    # with a TypeError for the whole selection
    from sqlalchemy import update

    from orchestrator.export.points import Selection, read_points

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    f = follow_journal(store, journal(), tmp_path / "node")
    _, before = read_points(store, Selection(sweep_ids=[f.sweep_id]))
    with store.engine.begin() as c:  # as an older, weaker boundary stored it
        payload = c.execute(select(Event.payload).where(
            Event.sweep_id == f.sweep_id, Event.seq == 6)).scalar()
        assert payload["mode"] == "speculative" and payload["accepted_tokens"]
        c.execute(update(Event).where(Event.sweep_id == f.sweep_id, Event.seq == 6)
                  .values(payload={**payload, "verify_rounds": "x"}))
    _, after = read_points(store, Selection(sweep_ids=[f.sweep_id]))
    # its request points are left out, nothing else: ttft, duration, tpot, acceptance and
    # acceptance length (each present in this real speculative generation)
    from orchestrator.store.db import e2e_ms

    assert None not in (payload["ttft_ms"], e2e_ms(payload), payload["acceptance_rate"],
                        payload["verify_rounds"]) and payload["generated_tokens"] >= 2
    assert len(after) == len(before) - 5


# -- issue 29: a Mac's readings over a long run ---------------------------------------------

class _LibSystem:
    """Stand-in for libSystem's two calls machine_cpu makes (Apple's, not ours): it counts
    the send rights mach_host_self hands out, as the kernel does."""

    def __init__(self):
        self.host_rights = 0

    def mach_host_self(self) -> int:
        self.host_rights += 1  # each call: one more user reference on the host port
        return 0x103

    def host_statistics(self, host, flavor, info, count) -> int:
        for i, v in enumerate((100, 50, 800, 50)):  # user, system, idle, nice ticks
            info[i] = v
        return 0


def test_sampling_machine_cpu_does_not_leak_a_host_port_right_per_reading():
    # mach_host_self() returns a new send right on each call, to be released with
    # mach_port_deallocate (psutil issue 333: "Leak of Mach ports on OS X"). The sampler
    # reads machine_cpu ~2 times a second: a soak of hours took tens of thousands of
    # references on one port (its user-reference count tops out at 65,534)
    from agent.telemetry import darwin

    lib = _LibSystem()
    readings = [darwin.machine_cpu(lib) for _ in range(1000)]
    assert readings[0] is not None and readings[0][1] == pytest.approx(1000 / darwin_hz())
    assert lib.host_rights <= 1


def darwin_hz() -> float:  # host_cpu_load_info ticks per second, as machine_cpu reads it
    import os

    return float(os.sysconf("SC_CLK_TCK"))


@pytest.mark.parametrize("values", [{"swap_in_bytes": 5}, {"decode_tok_s": 5},
                                    {"decode_tok_s": ["a", "b"]}, {"ttft_ms": {"a": 1}}])
def test_a_config_summary_whose_values_are_not_lists_of_numbers_is_set_aside(values, tmp_path):
    # values is declared only "an object"; the weekly review iterates and takes medians of
    # each list: an int there (TypeError: not iterable) or strings broke it for good
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _replace(lambda ls: seq_of(ls, "config_summary"),
                     lambda e: {**e, "values": values})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    assert _quarantined(store, f.sweep_id) == {
        21: "config_summary: values must be an object of lists of numbers (or nulls)"}
    render_all(store, f.sweep_id, tmp_path / "out")


def test_a_config_summary_whose_values_hold_nulls_is_stored(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _replace(lambda ls: seq_of(ls, "config_summary"), lambda e: {
        **e, "values": {**e["values"], "ttft_ms": [None, 1.5]}})(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert _quarantined(store, f.sweep_id) == {}
    render_all(store, f.sweep_id, tmp_path / "out")


def test_a_notice_with_terminal_escapes_reaches_the_markdown_review_inert(tmp_path):
    # a node's notice "\x1b]0;pwned\x07\x1b[2J…" passed (it is a string) and went into the
    # Markdown review byte for byte: `cat review.md` retitled and cleared the reader's
    # terminal. Control characters are shown as U+FFFD there, the words kept
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    evil = "\x1b]0;pwned\x07\x1b[2Jcleared\x9b31m"
    f = follow_journal(store, _extra({"type": "notice", "message": evil, "workload": "code"})(
        journal()), tmp_path / "node")
    assert _quarantined(store, f.sweep_id) == {}
    md = render_all(store, f.sweep_id, tmp_path / "out")["md"]
    assert "\ufffd\\]0;pwned\ufffd\ufffd\\[2Jcleared\ufffd31m" in md
    assert not any(ord(c) < 0x20 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in md)
