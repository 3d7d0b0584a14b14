"""The daemons' outboxes as the generator follows them: each row's transitions and the IPC posts that look it up.

Rules of this file. A ``TracedRow`` holds the columns of the core's ``OutboxRow`` that an ``outbox_transition``
event carries, under the same names. Every transition is the one the core's outbox table takes for the row's
status and the event (``Core.transition``), and the row changes only where the core changed its own row: the status,
the attempts, the broker_message_id an ack carries, the successor a requeue names. A pair the table ignores changes
nothing and writes nothing. Each transition is written as an ``outbox_transition`` event at its time, and a row
keeps its status timeline so a later post is answered with the status the row had then. An ``emit_outbox_dead``
effect writes the daemon's ``outbox_dead`` SSE event. When things happen is the stories' business, not this file's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ._sim_calendar import Calendar
from ._sim_core import Core, Step
from ._sim_mesh import Daemon, Mesh
from ._sim_trace import IPC, OT, SSE, Codes


@dataclass(slots=True)
class TracedRow:
    """One outbox row: the core's ``OutboxRow`` columns a trace shows, the bucket its events go to, its timeline."""

    id: str
    client_message_id: str
    request_fingerprint: bytes
    enqueued_at: int
    max_age_at: int
    bucket: int
    status: str = "pending"
    attempts: int = 0
    broker_message_id: str | None = None
    superseded_by: str | None = None
    times: list[int] = field(default_factory=list)  # when the status changed ...
    statuses: list[str] = field(default_factory=list)  # ... and to what

    def status_at(self, t: int) -> str:
        return self.statuses[bisect.bisect_right(self.times, t) - 1]


class Outbox:
    """The outbox rows of one mesh's daemons, written as ``outbox_transition`` and ``ipc_decision`` events."""

    def __init__(self, mesh: Mesh, calendar: Calendar, core: Core, codes: Codes):
        self.mesh = mesh
        self.mesh_i = mesh.mesh_i
        self.push = calendar.push
        self.core = core
        self.codes = codes
        self.outbox_dead = mesh.sse["outbox_dead"]
        self._steps: dict[tuple[str, str], tuple[Step, int] | None] = {}  # with the code of each step
        self._ipc: dict[tuple[str, bool | None], int] = {}

    def ipc_code(self, status: str, match: bool | None) -> int:
        key = (status, match)
        code = self._ipc.get(key)
        if code is None:
            table_row, http_status = self.core.ipc(status, match)
            code = self._ipc[key] = self.codes.code(IPC, (status, match, table_row, http_status))
        return code

    def step(self, status: str, event: str) -> tuple[Step, int] | None:
        """The core's ``Step`` for ``event`` on a row in ``status``, and its code; None when the table ignores it."""
        key = (status, event)
        if key in self._steps:
            return self._steps[key]
        step = self.core.transition(status, event)
        found = None if step is None else (step, self.ot_code(status, step.to, event, step.table_row))
        self._steps[key] = found
        return found

    def ot_code(self, from_state: str, to_state: str, event: str, table_row: str) -> int:
        return self.codes.code(OT, (from_state, to_state, event, table_row))

    def post(self, daemon: Daemon, t: int, client_message_id: str, request_fingerprint: bytes, bucket: int,
             status: str, match: bool | None, outbox_id: str | None) -> None:
        """One POST /v1/send reaching the §4.5.1 lookup, with the row (if any) in ``status``."""
        self.push(t, IPC, daemon.node, bucket,
                  (self.mesh_i, client_message_id, request_fingerprint, self.ipc_code(status, match), outbox_id))

    def accept(self, daemon: Daemon, t: int, client_message_id: str, request_fingerprint: bytes,
               max_age_at: int | None = None, bucket: int | None = None) -> TracedRow:
        """The accept transition (OB-NONE-ACCEPT) of a new row."""
        max_age_at = self.core.max_age_at(t) if max_age_at is None else max_age_at
        row = TracedRow(self.mesh.new_id(t), client_message_id, request_fingerprint, t, max_age_at,
                        self.mesh.bucket(client_message_id) if bucket is None else bucket, times=[t],
                        statuses=["pending"])
        code = self.step("none", "accept")[1]  # type: ignore[index]
        self.push(t, OT, daemon.node, row.bucket,
                  (self.mesh_i, row.id, client_message_id, request_fingerprint, code, 0, t, max_age_at, None, None))
        return row

    def transition(self, daemon: Daemon, row: TracedRow, t: int, event: str, broker_message_id: str | None = None,
                   successor_id: str | None = None) -> str:
        """``event`` on ``row`` at ``t`` (an ack's ``broker_message_id``, a requeue's ``successor_id``); the status."""
        decided = self.step(row.status, event)
        if decided is None:
            return row.status
        step, code = decided
        row.status = to = step.to
        row.attempts += step.attempts_delta
        if step.sets_broker_message_id:
            row.broker_message_id = broker_message_id
        if step.sets_superseded_by:
            row.superseded_by = successor_id
        row.times.append(t)
        row.statuses.append(to)
        self.push(t, OT, daemon.node, row.bucket,
                  (self.mesh_i, row.id, row.client_message_id, row.request_fingerprint, code, row.attempts,
                   row.enqueued_at, row.max_age_at, row.broker_message_id, row.superseded_by))
        if "emit_outbox_dead" in step.effects:
            self.push(t, SSE, daemon.node, self.mesh.node_bucket[daemon.index], self.outbox_dead)
        return to

    def requeue(self, daemon: Daemon, row: TracedRow, t: int, client_message_id: str | None = None) -> TracedRow:
        """Operator requeue (§4.5.3): the row goes aborted, a successor with a fresh id starts pending.

        The successor takes ``client_message_id`` when given (an injected fault: requeue never frees an id), else a
        fresh one derived from the row's.
        """
        daemon.requeues += 1
        successor_cmid = client_message_id or f"{row.client_message_id}.r{daemon.requeues:x}"
        successor_id = self.mesh.new_id(t)
        table_row = self.step(row.status, "requeue")[0].table_row  # type: ignore[index]
        self.transition(daemon, row, t, "requeue", successor_id=successor_id)
        successor = TracedRow(successor_id, successor_cmid, row.request_fingerprint, t, self.core.max_age_at(t),
                              self.mesh.bucket(successor_cmid), times=[t], statuses=["pending"])
        self.push(t, OT, daemon.node, successor.bucket,
                  (self.mesh_i, successor_id, successor_cmid, row.request_fingerprint,
                   self.ot_code("none", "pending", "requeue", table_row), 0, t, successor.max_age_at, None, None))
        return successor
