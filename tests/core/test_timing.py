"""spec/tables/timing.yaml: the retry and reconnect schedules and the keepalive are the spec's, and the core's retry
policy defaults to them."""

from __future__ import annotations

import re

import pytest

from reference.core import OutboxPolicy, backoff_ms
from spec import SPEC_DIR, load_table, load_yaml, validator

TIMING = load_table("timing")
REQUIREMENTS = {r["id"]: r for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}


def test_the_table_holds_its_schema():
    assert list(validator("tables/timing").iter_errors(TIMING)) == []


def test_the_reconnect_schedule_is_the_one_section_13_quotes():
    """WS-RECONNECT-SCHEDULE cites §13's [reconnect] settings; jitter_pct is the table's fraction in percent."""
    quoted = dict(re.findall(r"(\w+) = ([0-9.]+)", REQUIREMENTS["WS-RECONNECT-SCHEDULE"]["cite"]["text"]))
    reconnect = TIMING["backoff"]["reconnect"]
    assert {key: float(value) for key, value in quoted.items()} == {
        "initial_backoff_ms": reconnect["base_ms"], "max_backoff_ms": reconnect["max_ms"],
        "backoff_multiplier": reconnect["multiplier"], "jitter_pct": reconnect["jitter"] * 100}


def test_the_retry_schedule_is_e14s():
    retry = TIMING["backoff"]["outbox_retry"]
    assert (retry["base_ms"], retry["max_ms"], retry["multiplier"], retry["jitter"]) == (500, 30000, 2, 0.25)
    assert TIMING["sse_keepalive_s"]["value"] == 15


@pytest.mark.parametrize(("attempts", "wait"), [(1, 500), (2, 1000), (6, 16000), (7, 30000), (40, 30000)])
def test_the_cores_default_policy_backs_off_by_the_table(attempts, wait):
    """OBX-BACKOFF: OutboxPolicy's defaults are the table's, and so is each wait before jitter."""
    retry = TIMING["backoff"]["outbox_retry"]
    policy = OutboxPolicy()
    assert (policy.retry_base_ms, policy.retry_max_ms, policy.jitter) == (retry["base_ms"], retry["max_ms"],
                                                                           retry["jitter"])
    assert backoff_ms(attempts, policy) == min(retry["max_ms"],
                                               retry["base_ms"] * retry["multiplier"] ** (attempts - 1)) == wait
    assert backoff_ms(attempts, policy, 1.0) == round(wait * (1 + retry["jitter"]))
