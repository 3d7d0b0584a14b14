"""Shared settings for the daemon integration tests (a plain module: conftest.py is not importable)."""

from __future__ import annotations

from conformance.peer import PeerConfig

FAST = """
[outbox]
retry_base_ms = 100
retry_max_ms = 400
ack_timeout_s = 2.0
[daemon]
drain_timeout_s = 2.0
"""


def peer_config(**changes) -> PeerConfig:
    config = PeerConfig()
    for key, value in changes.items():
        setattr(config, key, value)
    return config
