"""Retention (§17): old messages are pruned, flipping their dedupe rows' history_available, and expired dedupe rows
are deleted. ``retention_sweep`` is one sweep (``meshd broker retention-sweep`` runs it once); a running broker
runs it on a thread every ``sweep_interval_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .store import BrokerStore

log = logging.getLogger("meshbroker")


def retention_sweep(store: BrokerStore, now_ms: int, message_retention_ms: int,
                    emit: Callable[..., Any] | None = None) -> dict[str, int]:
    """Prune messages older than the retention (flipping their dedupe rows' history_available, §17 step 6), then
    delete expired dedupe rows (§17 step 5); ``emit`` gets one history_pruned event per flipped message.

    Returns:
        ``{"pruned": messages deleted, "history_flipped": dedupe rows flipped, "expired": dedupe rows deleted}``.
    """
    before = now_ms - message_retention_ms
    flipped = store.prunable(before)
    pruned = store.prune_messages(before)
    if emit is not None:
        for row in flipped:
            emit("history_pruned", mesh=row["mesh_id"], broker_message_id=row["broker_message_id"],
                 client_message_id=row["client_message_id"])
    expired = store.expire_dedupe(now_ms)
    log.info("retention_sweep pruned=%d history_flipped=%d expired=%d", pruned, len(flipped), expired)
    return {"pruned": pruned, "history_flipped": len(flipped), "expired": expired}


class Sweeper(threading.Thread):
    """Runs ``sweep`` every ``interval_s`` until ``stopping`` is set; a failed sweep runs again after the interval."""

    def __init__(self, sweep: Callable[[], Any], interval_s: float, stopping: threading.Event):
        super().__init__(name="meshbroker-retention", daemon=True)
        self.sweep = sweep
        self.interval_s = interval_s
        self.stopping = stopping

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.sweep()
            except Exception:
                log.exception("retention sweep failed; it runs again after the interval")
