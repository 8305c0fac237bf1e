"""A night's date from its sweep's time (review.levels.night_dates): the same night for
every sweep of one schedule across a DST change, whatever the schedule's hour or zone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.levels import day_shift, night_dates

START = datetime(2026, 3, 1, tzinfo=timezone.utc)


def _schedule(minute: int, nights: int, dst_at: int, dst: int) -> dict[str, datetime]:
    """One sweep a night at ``minute`` past UTC midnight, the clock moving ``dst`` hours
    from night ``dst_at`` on (a DST change of the zone the schedule keeps)."""
    return {f"s{i}": START + timedelta(days=i, minutes=minute, hours=dst if i >= dst_at else 0)
            for i in range(nights)}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 24 * 60 - 1), st.integers(8, 60), st.integers(1, 59),
       st.sampled_from([-1, 1]))
def test_one_schedule_across_a_dst_change_keeps_one_sweep_a_night(minute, nights, dst_at, dst):
    """Property: a nightly schedule at any time of day, its clock moved an hour either way
    on any night: every night holds one sweep and no night is skipped."""
    dated = night_dates(_schedule(minute, nights, min(dst_at, nights - 1), dst))
    days = [dated[f"s{i}"] for i in range(nights)]
    assert all((b - a).days == 1 for a, b in zip(days, days[1:])), days


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 24 * 60 - 1), st.integers(8, 40), st.integers(1, 39),
       st.integers(-23, 23))
def test_moving_every_sweep_by_some_hours_keeps_its_nights(minute, nights, dst_at, hours):
    """Property: the same schedule run a constant number of hours earlier or later (another
    zone) puts the same sweeps on one night; their dates move together, by a day at most."""
    base = _schedule(minute, nights, min(dst_at, nights - 1), 1)
    moved = {sid: at + timedelta(hours=hours) for sid, at in base.items()}
    a, b = night_dates(base), night_dates(moved)
    offsets = {(b[sid] - a[sid]).days for sid in base}
    assert len(offsets) == 1 and offsets <= {-1, 0, 1}, offsets


def test_small_hours_keep_their_utc_date_and_a_busy_day_keeps_utc():
    """Sweeps at 02:00 UTC keep their date (no shift: 02:00 is already in the small hours'
    middle side); sweeps every four hours leave no quiet stretch: UTC's midnight stays."""
    two = [START + timedelta(days=i, hours=2) for i in range(5)]
    assert all((at + day_shift(two)).date() == at.date() for at in two)
    busy = [START + timedelta(hours=4 * i) for i in range(30)]
    assert day_shift(busy) == timedelta(0)
