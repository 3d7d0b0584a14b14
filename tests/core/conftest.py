"""Shared builders for the core tests."""

from __future__ import annotations

import pytest

from reference.core import OutboxPolicy, OutboxRow, new_row, parse_send


@pytest.fixture
def policy() -> OutboxPolicy:
    return OutboxPolicy(retry_base_ms=500, retry_max_ms=30_000, jitter=0.25, max_age_hours=72)


def make_row(status: str = "pending", fingerprint: bytes = b"\x01" * 32, **changes) -> OutboxRow:
    request = parse_send(b'{"to":"#general","message":"hello"}')
    row = new_row("01ROW", "cmid-1", fingerprint, request.payload(), 1_000, OutboxPolicy(max_age_hours=72))
    return OutboxRow(**{**row.__dict__, "status": status, **changes})
