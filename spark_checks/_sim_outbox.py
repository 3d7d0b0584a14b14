"""The daemons' outboxes as the generator follows them: each row's transitions and the IPC posts that look it up.

Rules of this file. Every transition is the one the core's outbox table decides for the row's state and the event
(``Core.transition``); a pair the table ignores changes nothing and writes nothing. Each transition is written as
an ``outbox_transition`` event at its time, and a row keeps its state timeline so a later post can be answered
with the state the row had at that time. An ``emit_outbox_dead`` effect writes the daemon's ``outbox_dead`` SSE
event. Only the timing of a row's events (the link, the broker, outages) is the stories' business.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ._sim_calendar import Calendar
from ._sim_core import Core
from ._sim_mesh import Daemon, Mesh
from ._sim_trace import IPC, OT, SSE, Codes


@dataclass
class Row:
    oid: str
    cmid: str
    fp: bytes
    enq: int
    max_age_at: int
    bucket: int
    state: str = "pending"
    attempts: int = 0
    bmid: str | None = None
    times: list[int] = field(default_factory=list)
    states: list[str] = field(default_factory=list)


class Outbox:
    """The outbox rows of one mesh's daemons, written as ``outbox_transition`` and ``ipc_decision`` events."""

    def __init__(self, mesh: Mesh, calendar: Calendar, core: Core, codes: Codes):
        self.mesh = mesh
        self.mesh_i = mesh.mesh_i
        self.push = calendar.push
        self.core = core
        self.codes = codes
        self.outbox_dead = mesh.sse["outbox_dead"]
        # memoised decisions with their codes
        self._transitions: dict[tuple[str, str], tuple[str, int, tuple[str, ...], int, str] | None] = {}
        self._ipc: dict[tuple[str, bool | None], int] = {}

    def ipc_code(self, state: str, match: bool | None) -> int:
        key = (state, match)
        code = self._ipc.get(key)
        if code is None:
            table_row, status = self.core.ipc(state, match)
            code = self._ipc[key] = self.codes.code(IPC, (state, match, table_row, status))
        return code

    def decide(self, state: str, event: str) -> tuple[str, int, tuple[str, ...], int, str] | None:
        """(to, attempts delta, io effects, code, table_row) of ``event`` on a row in ``state``; None if ignored."""
        key = (state, event)
        if key in self._transitions:
            return self._transitions[key]
        decided = self.core.transition(state, event)
        found = None
        if decided is not None:
            table_row, to, delta, effects = decided
            found = (to, delta, effects, self.codes.code(OT, (state, to, event, table_row)), table_row)
        self._transitions[key] = found
        return found

    def ot_code(self, from_state: str, to_state: str, event: str, table_row: str) -> int:
        return self.codes.code(OT, (from_state, to_state, event, table_row))

    def post(self, daemon: Daemon, t: int, cmid: str, fp: bytes, bucket: int, state: str, match: bool | None,
             oid: str | None) -> None:
        """One POST /v1/send reaching the §4.5.1 lookup."""
        self.push(t, IPC, daemon.node, bucket, (self.mesh_i, cmid, fp, self.ipc_code(state, match), oid))

    def new_row(self, daemon: Daemon, t: int, cmid: str, fp: bytes, max_age_at: int | None = None,
                bucket: int | None = None) -> Row:
        """The accept transition (OB-NONE-ACCEPT) of a new row."""
        max_age_at = t + self.core.max_age_ms if max_age_at is None else max_age_at
        row = Row(self.mesh.new_id(t), cmid, fp, t, max_age_at, self.mesh.bucket(cmid) if bucket is None else bucket,
                  times=[t], states=["pending"])
        code = self.decide("none", "accept")[3]  # type: ignore[index]
        self.push(t, OT, daemon.node, row.bucket, (self.mesh_i, row.oid, cmid, fp, code, 0, t, max_age_at, None,
                                                   None))
        return row

    def transition(self, daemon: Daemon, row: Row, t: int, event: str, superseded_by: str | None = None) -> str:
        decided = self.decide(row.state, event)
        if decided is None:
            return row.state
        to, delta, effects, code, _ = decided
        row.state = to
        row.attempts += delta
        row.times.append(t)
        row.states.append(to)
        self.push(t, OT, daemon.node, row.bucket,
                  (self.mesh_i, row.oid, row.cmid, row.fp, code, row.attempts, row.enq, row.max_age_at, row.bmid,
                   superseded_by))
        if "emit_outbox_dead" in effects:
            self.push(t, SSE, daemon.node, self.mesh.node_bucket[daemon.index], self.outbox_dead)
        return to

    def requeue(self, daemon: Daemon, row: Row, t: int, new_cmid: str | None = None) -> Row:
        """Operator requeue (§4.5.3): the row goes aborted, a successor with a fresh id starts pending."""
        daemon.requeues += 1
        cmid = new_cmid or f"{row.cmid}.r{daemon.requeues:x}"
        successor_oid = self.mesh.new_id(t)
        table_row = self.decide(row.state, "requeue")[4]  # type: ignore[index]
        self.transition(daemon, row, t, "requeue", superseded_by=successor_oid)
        successor = Row(successor_oid, cmid, row.fp, t, t + self.core.max_age_ms, self.mesh.bucket(cmid), times=[t],
                        states=["pending"])
        self.push(t, OT, daemon.node, successor.bucket,
                  (self.mesh_i, successor_oid, cmid, row.fp, self.ot_code("none", "pending", "requeue", table_row),
                   0, t, successor.max_age_at, None, None))
        return successor

    @staticmethod
    def state_at(row: Row, t: int) -> str:
        return row.states[bisect.bisect_right(row.times, t) - 1]
