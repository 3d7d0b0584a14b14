"""The §4.5.1 IPC decision for POST /v1/send, driven by spec/tables/ipc_lookup.yaml.

``decide_send`` takes the row read under ``BEGIN IMMEDIATE`` (or ``None``) and the fingerprint of the validated
request, and returns the HTTP status and body members to answer with and whether to insert the new row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.decision import DecisionTable, decision_table

from .fingerprint import fingerprint_prefix
from .outbox import OutboxRow

IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"

def table() -> DecisionTable:
    """The lookup table, loaded once from spec/tables/ipc_lookup.yaml."""
    return decision_table("ipc_lookup")


@dataclass(frozen=True)
class IpcDecision:
    """The answer to one POST /v1/send.

    ``body`` holds the success members, or for a 409 the problem extension members (``error``, ``conflict``,
    ``client_message_id``, ``daemon_fingerprint_prefix`` and the row's extras); the adapter wraps it.
    """

    table_row: str
    http_status: int
    body: dict[str, Any]
    insert: bool
    row_state: str
    fingerprint_match: bool | None
    request_fingerprint: bytes = b""
    outbox_id: str | None = None  # the existing row's id (a new row's id is on its accept transition)

    @property
    def is_conflict(self) -> bool:
        return self.http_status == 409


def decide_send(
    existing: OutboxRow | None,
    fingerprint: bytes,
    client_message_id: str,
    decisions: DecisionTable | None = None,
) -> IpcDecision:
    """Apply the lookup table to the row found for ``client_message_id`` (or ``None``)."""
    decisions = decisions or table()
    state = "none" if existing is None else existing.status
    match = None if existing is None else existing.request_fingerprint == fingerprint
    # req: IPC-NEW-ROW, IPC-PENDING-MATCH, IPC-INFLIGHT-MATCH, IPC-DONE-MATCH -- the §4.5.1 table decides
    row = decisions.lookup(row_state=state, fingerprint="match" if match in (None, True) else "mismatch")
    then = row.then
    status = int(then["http_status"])
    extras = set(then.get("include", ()))
    # req: IPC-DONE-MISMATCH, IPC-DEAD-MATCH, REQUEUE-NEVER-FREES, IPC-CONFLICT-BODY
    if status == 409:
        body: dict[str, Any] = {
            "error": IDEMPOTENCY_KEY_REUSED,
            "conflict": then["conflict"],
            "client_message_id": client_message_id,
            # E-26: the prefix of the fingerprint the daemon computed for *this* request.
            # req: FP-PREFIX-409, FP-PREFIX-409-WHICH
            "daemon_fingerprint_prefix": fingerprint_prefix(fingerprint),
        }
    else:
        # req: IPC-STABLE-ID, IPC-NEW-ROW-BODY, IPC-PENDING-MATCH-BODY, IPC-INFLIGHT-MATCH-BODY, IPC-DONE-MATCH-BODY
        body = {
            "client_message_id": client_message_id,
            "status": then["status"],
            "duplicate": bool(then["duplicate"]),
            "request_fingerprint": fingerprint.hex(),
        }
    if existing is not None:
        # req: IPC-DONE-MATCH, IPC-DONE-MISMATCH -- the table row's include names the extras
        if "broker_message_id" in extras:
            body["broker_message_id"] = existing.broker_message_id
        if "history_id" in extras:
            body["history_id"] = existing.history_id
        # req: IPC-DEAD-MATCH
        if "reason" in extras:
            body["reason"] = existing.last_error or ""
    # req: IPC-CONFLICT-NO-MUTATION -- only the table's insert_pending writes
    return IpcDecision(row.id, status, body, then["mutation"] == "insert_pending", state, match, fingerprint,
                       None if existing is None else existing.id)
