"""Fixtures for the core tests."""

from __future__ import annotations

import pytest

from reference.core import OutboxPolicy


@pytest.fixture
def policy() -> OutboxPolicy:
    return OutboxPolicy(retry_base_ms=500, retry_max_ms=30_000, jitter=0.25, max_age_hours=72)
