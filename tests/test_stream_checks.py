"""Runtimes cross-checked (issue 27): without a tokenizer, a runtime's ``usage`` count is
checked against the streamed text (chunks and characters); an implausible one (doubled)
is flagged and not used for rates; a stream whose split surrogate pairs were repaired is
flagged in its event and shown on the sweep page."""

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.httpengine import Stream, token_count, trace_of
from orchestrator.store import open_store
from tests.browser import dump_dom
from tests.history import new_sweep
from tests.store_templates import fresh_sqlite
from tests.test_planted_runtimes import of, run


def test_doubled_usage_without_a_tokenizer_is_flagged_and_not_used(model_pair, tmp_path):
    """The planted runtime streams 12 one-token chunks and reports 24 (before: believed,
    decode tok/s twice the truth, no flag): counted by chunks, flagged, and the
    non-streamed request's count (the same usage) is not taken either."""
    proc, ev = run(model_pair, tmp_path, "double-usage", tokenizer=False)
    assert proc.returncode == 0, proc.stderr
    (g,) = of(ev, "generation")
    assert g["chunks"] == 12 and g["usage_tokens"] == 24
    assert g["token_source"] == "chunks" and g["generated_tokens"] == 12
    assert g["usage_implausible"] is True
    assert g["usage_problem"].startswith("the runtime reports 24 tokens for 12 streamed chunks")
    assert g["nonstreamed_token_source"] == "unverified" and g["nonstreamed_tok_s"] is None
    # the decode rate is the chunks' own: the 11 tokens after the first over the stream,
    # not 23 (the mean rate: a busy host may deliver chunks in bunches, which tilts the
    # slope of so few points either way)
    span = (g["chunk_times_us"][-1] - g["chunk_times_us"][0]) / 1e6
    assert g["decode_tok_s_mean"] == pytest.approx(11 / span, rel=0.02)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    sid = new_sweep(store, datetime.now(timezone.utc))
    store.ingest(sid, "local", ev)
    from orchestrator.review.sweep_page import render_review

    text = dump_dom(render_review(store, tmp_path / "review.html", sid))
    assert "usage implausible against the streamed text, not used for rates in 1 " \
           "generation(s): the runtime reports 24 tokens for 12 streamed chunks" in text


def test_a_correct_runtime_without_a_tokenizer_is_believed(model_pair, tmp_path):
    proc, ev = run(model_pair, tmp_path, "correct", tokenizer=False)
    (g,) = of(ev, "generation")
    assert g["token_source"] == "usage" and g["generated_tokens"] == g["usage_tokens"] == 12
    assert "usage_implausible" not in g and "stream_repaired" not in g


def test_a_repaired_stream_is_flagged_and_shown_on_the_sweep_page(model_pair, tmp_path):
    """The planted runtime splits U+1F600 into its two UTF-16 halves, one event each
    (before: repaired silently)."""
    proc, ev = run(model_pair, tmp_path, "surrogate")
    assert proc.returncode == 0, proc.stderr
    (g,) = of(ev, "generation")
    assert g["output_text"].endswith("\U0001F600")
    assert g["stream_repaired"] == 1
    assert g["stream_repair"] == "1 surrogate pair(s) split across events rejoined"
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    sid = new_sweep(store, datetime.now(timezone.utc))
    store.ingest(sid, "local", ev)
    from orchestrator.review.sweep_page import render_review

    text = dump_dom(render_review(store, tmp_path / "review.html", sid))
    assert "stream repaired in 1 generation(s): 1 surrogate pair(s) split across events " \
           "rejoined" in text


def test_lone_halves_are_counted_as_repairs():
    s = Stream()
    s.add_text(0.01, "ok ")
    s.add_text(0.02, "\ud83d")    # a high half ...
    s.add_text(0.03, "next")      # ... whose partner never comes
    s.add_text(0.04, "\ude00!")   # a low half alone
    s.close(0.05)
    assert s.replaced == 2 and s.rejoined == 0
    t = trace_of(s)
    assert t.fields["stream_repaired"] == 2
    assert t.fields["stream_repair"] == "2 lone surrogate half(s) replaced by U+FFFD"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=30),
       st.integers(0, 400), st.booleans())
def test_a_count_taken_from_usage_is_always_possible(chunks, usage, drafting):
    """For any streamed chunks and any usage: a count taken from usage is at most the
    output's bytes and at least the chunks (less a tenth), and, without drafting, at most
    1.5× (chunks + bytes of non-ASCII characters), and said unverified over 1.5× the
    chunks; otherwise the chunks are counted and the disagreement said."""
    text = "".join(chunks)
    n, source, problem = token_count(text, usage, None, len(chunks), drafting)
    if source == "usage":
        over = not drafting and usage > 1.5 * len(chunks)
        assert n == usage and (problem is not None) == over, (problem, over)
        assert problem is None or problem.startswith("unverified")
        assert usage <= len(text.encode("utf-8", "replace"))
        assert usage >= len(chunks) - max(1, len(chunks) // 10)
        wide = sum(len(c.encode("utf-8", "replace")) for c in text if ord(c) > 127)
        assert drafting or usage <= 1.5 * (len(chunks) + wide)
    else:
        assert source == "chunks" and n == len(chunks) and problem
