"""Hook runs in ``inbox.db`` (§6, E-48): enqueue with the inbox row, claim, mark, and reset a dead worker's claims.

Rules of this file: every change of a run's state is decided by the core (``reference.core.hooks`` over
spec/tables/hook_runs.yaml) inside the write transaction that makes it, so what the table calls impossible never
reaches the file. A claim is an update that succeeds only while the run is pending; a run's result is stored and the
run marked in one transaction; a finished run is never written again. The process effects (``spawn``,
``kill_group``) are the caller's, after the commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reference.core import hooks as core

from .inbox import InboxRow, InboxStore

_COLUMNS = ("id", "inbox_seq", "message_event", "client_message_id", "hook", "state", "claims", "enqueued_at",
            "claimed_at", "lease_until", "claim_owner", "pgid", "pgid_started", "finished_at", "result")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM hook_runs"


@dataclass(frozen=True)
class StoredRun:
    """One row of ``hook_runs``; ``result`` is the stored outcome of a finished run (a JSON object)."""

    id: int
    inbox_seq: int
    message_event: int | None
    client_message_id: str
    hook: str
    state: str
    claims: int
    enqueued_at: int
    claimed_at: int | None
    lease_until: int | None
    claim_owner: str | None
    pgid: int | None
    pgid_started: int | None
    finished_at: int | None
    result: dict[str, Any] | None

    @property
    def core(self) -> core.HookRun:
        return core.HookRun(self.client_message_id, self.hook, self.state, self.claims)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _COLUMNS}


def _run(values: Iterable[Any]) -> StoredRun:
    record = dict(zip(_COLUMNS, values, strict=True))
    if record["result"] is not None:
        record["result"] = json.loads(record["result"])
    return StoredRun(**record)


def enqueue(conn: sqlite3.Connection, row: InboxRow, hooks: Iterable[str], now_ms: int,
            message_event: int | None = None) -> list[str]:
    """Insert one pending run per hook for the new inbox ``row`` (whose ``message`` SSE event has the id
    ``message_event``), on the caller's transaction; the table rows."""
    decided = []
    for hook in hooks:
        step = core.enqueue(row.client_message_id, hook)
        # req: HOOK-INBOX-FIRST -- the runs commit with their inbox row, never before it
        conn.execute("INSERT INTO hook_runs (inbox_seq, message_event, client_message_id, hook, state, enqueued_at)"
                     " VALUES (?, ?, ?, ?, ?, ?)",
                     (row.seq, message_event, row.client_message_id, hook, step.run.state, now_ms))
        decided.append(step.row)
    return decided


class HookRuns:
    """The hook runs of one ``InboxStore`` (the same file and writer lock)."""

    def __init__(self, inbox: InboxStore, max_claims: int):
        if max_claims < 1:
            raise ValueError(f"max_claims must be at least 1, not {max_claims}")
        self.inbox = inbox
        self.max_claims = max_claims

    def get(self, run_id: int) -> StoredRun | None:
        with self.inbox._reading() as conn:
            found = conn.execute(f"{_SELECT} WHERE id = ?", (run_id,)).fetchone()
        return None if found is None else _run(found)

    def list(self, state: str | None = None, limit: int = 100) -> list[StoredRun]:
        """Runs, newest first (of one state when given)."""
        where, params = ("WHERE state = ?", (state,)) if state else ("", ())
        with self.inbox._reading() as conn:
            found = conn.execute(f"{_SELECT} {where} ORDER BY id DESC LIMIT ?", (*params, limit)).fetchall()
        return [_run(r) for r in found]

    def counts(self) -> dict[str, int]:
        with self.inbox._reading() as conn:
            return {state: int(n) for state, n in conn.execute("SELECT state, count(*) FROM hook_runs GROUP BY state")}

    def counts_by_hook(self) -> dict[str, dict[str, int]]:
        """Per hook, its runs by state."""
        found: dict[str, dict[str, int]] = {}
        with self.inbox._reading() as conn:
            for hook, state, n in conn.execute("SELECT hook, state, count(*) FROM hook_runs GROUP BY hook, state"):
                found.setdefault(hook, {})[state] = int(n)
        return found

    def claim(self, owner: str, now_ms: int, lease_ms: int, hooks: Iterable[str] | None = None
              ) -> tuple[StoredRun, core.HookStep] | None:
        """Claim the oldest pending run (of ``hooks`` when given) for ``owner``; None when there is none."""
        names = None if hooks is None else sorted(set(hooks))
        where = "" if names is None else f" AND hook IN ({', '.join('?' * len(names))})"
        with self.inbox._transaction() as conn:
            found = conn.execute(f"{_SELECT} WHERE state = 'pending'{where} ORDER BY id LIMIT 1",
                                 tuple(names or ())).fetchone()
            if found is None:
                return None
            run = _run(found)
            step = core.apply(run.core, "claim", self.max_claims)
            # req: HOOK-CLAIM-PROCESS-MARK -- a claim succeeds only while the run is pending
            updated = conn.execute(
                "UPDATE hook_runs SET state = ?, claims = ?, claimed_at = ?, lease_until = ?, claim_owner = ?,"
                " pgid = NULL, pgid_started = NULL WHERE id = ? AND state = 'pending' RETURNING "
                + ", ".join(_COLUMNS), (step.run.state, step.run.claims, now_ms, now_ms + lease_ms, owner, run.id),
            ).fetchone()
        return (_run(updated), step) if updated is not None else None

    def record_process(self, run_id: int, owner: str, pgid: int, started: int | None) -> None:
        """Remember the claimed run's process group, so a later reset can kill what the worker left behind."""
        with self.inbox._transaction() as conn:
            conn.execute("UPDATE hook_runs SET pgid = ?, pgid_started = ? WHERE id = ? AND state = 'claimed'"
                         " AND claim_owner = ?", (pgid, started, run_id, owner))

    def finish(self, run_id: int, owner: str, event: str, result: dict[str, Any], now_ms: int
               ) -> tuple[StoredRun, core.HookStep] | None:
        """Apply ``event`` (exit_ok, exit_error, timeout) to the run ``owner`` holds, storing ``result`` with the
        mark in one transaction. None when the run is no longer this owner's claim (it was reset)."""
        with self.inbox._transaction() as conn:
            found = conn.execute(f"{_SELECT} WHERE id = ?", (run_id,)).fetchone()
            if found is None:
                return None
            run = _run(found)
            if run.state == "claimed" and run.claim_owner != owner:
                return None
            step = core.apply(run.core, event, self.max_claims)
            if step.outcome != "transition":
                return run, step
            stored = json.dumps(result, separators=(",", ":")) if "store_result" in step.effects else None
            # req: HOOK-CLAIM-PROCESS-MARK -- the result and the mark commit together
            conn.execute("UPDATE hook_runs SET state = ?, result = ?, finished_at = ?, claim_owner = NULL,"
                         " lease_until = NULL WHERE id = ?", (step.run.state, stored, now_ms, run.id))
            after = _run(conn.execute(f"{_SELECT} WHERE id = ?", (run.id,)).fetchone())
        return after, step

    def reset_lost(self, now_ms: int, keep_owner: str | None = None, held: Iterable[int] = ()
                   ) -> list[tuple[StoredRun, core.HookStep]]:
        """Reset the claims whose worker is gone (``claim_lost``): every claim not of ``keep_owner`` (the previous
        process's, at start), and this owner's claims whose lease ran out and that no live worker ``held``.
        Returns each reset run as it was before (its process group for the caller to kill) and its step."""
        keep = set(held)
        reset = []
        with self.inbox._transaction() as conn:
            found = [_run(r) for r in conn.execute(f"{_SELECT} WHERE state = 'claimed' ORDER BY id").fetchall()]
            for run in found:
                lost = run.claim_owner != keep_owner or (
                    run.id not in keep and run.lease_until is not None and run.lease_until < now_ms)
                if not lost:
                    continue
                step = core.apply(run.core, "claim_lost", self.max_claims)
                result = json.dumps({"outcome": "claims_exhausted", "claims": run.claims}, separators=(",", ":")) \
                    if "store_result" in step.effects else None
                # req: HOOK-CLAIM-RESET -- back to pending (the hook runs again), or failed after max_claims
                conn.execute("UPDATE hook_runs SET state = ?, claim_owner = NULL, lease_until = NULL, result = ?,"
                             " finished_at = ? WHERE id = ?",
                             (step.run.state, result, now_ms if result is not None else None, run.id))
                reset.append((run, step))
        return reset
