"""§4.9 with E-05."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.core import MaxAgeError, derive
from reference.core.maxage import HOUR_MS, capped_max_age_at, margin_hours, max_age_at


@pytest.mark.parametrize(("days", "hours"), [(3, 71), (4, 72), (7, 144), (30, 648), (365, 7884)])
def test_section_4_9_examples(days, hours):
    # §4.9 gives 72 h at 3 days; E-05 lowers it to 71 h so it stays inside the 72 h window.
    assert derive("retention_scoped", days).hours == hours


def test_permanent_mode():
    assert derive("permanent").hours == 168
    assert derive("permanent", config_default_hours=1000).hours == 720
    assert derive("permanent", override_hours=720).source == "override"
    with pytest.raises(MaxAgeError):
        derive("permanent", override_hours=721)
    with pytest.raises(MaxAgeError):
        derive("permanent", config_default_hours=0)


@given(st.integers(min_value=3, max_value=100_000))
def test_always_inside_the_window(days):
    result = derive("retention_scoped", days)
    assert result.hours <= days * 24 - 1
    assert result.hours >= min(72, days * 24 - 1)
    assert margin_hours(days) >= 24


def test_override_bounds():
    assert derive("retention_scoped", 3, override_hours=71).hours == 71
    with pytest.raises(MaxAgeError) as caught:
        derive("retention_scoped", 3, override_hours=72)
    assert caught.value.code == "outbox_max_age_above_dedupe_window"
    with pytest.raises(MaxAgeError) as caught:
        derive("retention_scoped", 3, override_hours=0)
    assert caught.value.code == "invalid_config"


@pytest.mark.parametrize(("mode", "days"), [("retention_scoped", 2), ("retention_scoped", None), ("weird", 5)])
def test_invalid_inputs(mode, days):
    with pytest.raises(MaxAgeError):
        derive(mode, days)


def test_max_age_at_is_enqueued_at_plus_whole_hours():
    assert max_age_at(1_700_000_000_000, 72) == 1_700_000_000_000 + 72 * 3_600_000
    assert HOUR_MS == 3_600_000


@pytest.mark.parametrize(("current", "expected"), [
    (None, 1_000 + HOUR_MS),  # no deadline yet: the negotiated one
    (1_000 + HOUR_MS + 1, 1_000 + HOUR_MS),  # one ms later than the cap: lowered
    (1_000 + HOUR_MS, None),  # exactly the cap: kept
    (1_000 + HOUR_MS - 1, None),  # one ms earlier: kept (never raised)
])
def test_capped_max_age_at_lowers_and_never_raises(current, expected):
    assert capped_max_age_at(1_000, current, 1) == expected
