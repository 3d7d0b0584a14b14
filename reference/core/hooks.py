"""The hook-run lifecycle (spec/tables/hook_runs.yaml) and the id of a hook's reply, sans IO.

Theory of operation (claim -> process -> mark, §6 and E-48). An inbound message that gets a new inbox row gets, in the
same transaction, one run per hook that matches it (``enqueue``): so every inbound message is in inbox.db before any
hook runs, and a crash cannot lose a run. A worker claims a pending run, runs the hook's process, and on its exit
stores the result and marks the run in one transaction; a finished run stays as history. A claim whose worker is
gone (the daemon restarted, or the claim's lease ran out) goes back to pending, so the hook runs again, until the
run has been claimed ``max_claims`` times: then it fails (a hook that takes its daemon down must not do so forever).

A hook's reply is a send through the §4.5.1 lookup under ``reply_client_message_id(message, hook)``, submitted before
the exit that marks the run done: a re-run after a crash submits the same id, which the lookup answers from the row
the first run created -- a match is the same send (200, nothing new), a different reply is a 409 and changes nothing
(E-48). So a hook's reply reaches the outbox, and the broker, at most once.

This module decides; it performs nothing. Its callers perform the effects the table names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from spec import load_table
from spec.decision import DecisionTable, decision_table

__all__ = [
    "EFFECTS",
    "TERMINAL",
    "HookRun",
    "HookRunError",
    "HookStep",
    "apply",
    "enqueue",
    "reply_client_message_id",
    "table",
]

#: the effects the table may name: the caller performs each (``spawn`` and ``kill_group`` after the commit)
EFFECTS = frozenset({"insert_run", "set_claim", "increment_claims", "grant_capability", "spawn", "store_result",
                     "clear_claim", "revoke_capability", "kill_group"})
#: finished runs: kept as history, never claimed again
TERMINAL = frozenset(name for name, state in load_table("hook_runs")["states"].items() if state["terminal"])
#: a reply id: this prefix and 40 hex digits of sha256 (E-48), within the client_message_id grammar (E-02)
REPLY_ID_PREFIX = "hook."


def is_hook_reply_id(client_message_id: str | None) -> bool:
    """Whether ``client_message_id`` is in the space E-48 reserves for the daemon's own hook replies: a client's send
    or requeue under such an id is refused, so no one can take a reply's id before the hook's reply is sent."""
    return client_message_id is not None and client_message_id.startswith(REPLY_ID_PREFIX)


class HookRunError(Exception):
    """The table calls this (state, event) impossible; the message names both and the row."""

    def __init__(self, state: str, event: str, row: str, reason: str):
        super().__init__(f"hook run: event {event!r} is impossible in state {state!r} ({row}: {reason})")
        self.state, self.event, self.row = state, event, row


@dataclass(frozen=True)
class HookRun:
    """One run: the inbound message (its ``client_message_id``), the hook, the state and how often it was claimed."""

    message: str
    hook: str
    state: str = "none"
    claims: int = 0


@dataclass(frozen=True)
class HookStep:
    """What an event did: the table row, its outcome, the effects to perform and the run after it."""

    row: str
    outcome: str
    effects: tuple[str, ...]
    run: HookRun


def table() -> DecisionTable:
    """The hook-run table, loaded once from spec/tables/hook_runs.yaml."""
    return decision_table("hook_runs")


def enqueue(message: str, hook: str, decisions: DecisionTable | None = None) -> HookStep:
    """The run of ``hook`` for a message that just got its inbox row."""
    return apply(HookRun(message, hook), "enqueue", max_claims=1, decisions=decisions)


def apply(run: HookRun, event: str, max_claims: int, decisions: DecisionTable | None = None) -> HookStep:
    """Apply ``event`` to ``run``. ``claim_lost`` becomes ``claim_lost_final`` once the run has been claimed
    ``max_claims`` times. Raises ``HookRunError`` for a pair the table calls impossible, and the table's own errors
    for an event it does not know."""
    if max_claims < 1:
        raise ValueError(f"max_claims must be at least 1, not {max_claims}")
    if event == "claim_lost" and run.claims >= max_claims:
        event = "claim_lost_final"
    row = (decisions or table()).lookup(state=run.state, event=event)
    then = row.then
    outcome = then["outcome"]
    if outcome == "impossible":
        raise HookRunError(run.state, event, row.id, then.get("reason", ""))
    if outcome != "transition":
        return HookStep(row.id, outcome, (), run)
    effects = tuple(then["effects"])
    claims = run.claims + (1 if "increment_claims" in effects else 0)
    return HookStep(row.id, outcome, effects, replace(run, state=then["to"], claims=claims))


def reply_client_message_id(message: str, hook: str) -> str:
    """The ``client_message_id`` of ``hook``'s reply to the inbound ``message``: the same for every run of the pair,
    different for any other pair (sha256 over the two, joined by a 0x00 byte that neither may hold)."""
    if not message or not hook or "\x00" in message or "\x00" in hook:
        raise ValueError("a reply id needs a non-empty message id and hook name without NUL")
    # req: HOOK-REPLY-ID
    digest = hashlib.sha256(message.encode() + b"\x00" + hook.encode()).hexdigest()
    return REPLY_ID_PREFIX + digest[:40]
