"""Builders shared by the core tests (a plain module: conftest.py is not importable across test directories)."""

from __future__ import annotations

from reference.core import OutboxPolicy, OutboxRow, new_row, parse_send


def make_row(status: str = "pending", fingerprint: bytes = b"\x01" * 32, **changes) -> OutboxRow:
    request = parse_send(b'{"to":"#general","message":"hello"}')
    row = new_row("01ROW", "cmid-1", fingerprint, request.payload(), 1_000, OutboxPolicy(max_age_hours=72))
    return OutboxRow(**{**row.__dict__, "status": status, **changes})
