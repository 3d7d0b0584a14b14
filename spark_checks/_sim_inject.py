"""Injected violations: one eligible story of a mesh replaced by a hand-played happy path that breaks one invariant.

Theory of operation. ``happy`` plays one send without faults -- post, accept, dispatch, the broker's accept and
commit, the deliveries, the ack -- and plays the injected kind into it (see ``catalogue.INJECTIONS``). An injection
waits for a send whose sender (and recipients) stay online through the story, so nothing else gets in its way. Each
one is recorded with the key a checker must report, and is realised only when the trace reaches the events it
needs (a mesh cut by its event budget may drop it); the seq, event-id and inbox-seq faults are armed in the
calendar and realised when it plays them. The manifest lists realised and dropped injections apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._sim_broker import FORCED_LEASE_MS, HOOK, HOOK_FAULTS, LEASE_MS, Broker, Dedupe, Destination
from ._sim_calendar import Calendar
from ._sim_core import Core
from ._sim_mesh import Daemon, Mesh
from ._sim_outbox import Outbox, TracedRow
from ._sim_trace import DA, DL, OT
from .catalogue import (
    DEFAULT_ACK_GRACE_MS,
    DEFAULT_ACK_TIMEOUT_MS,
    DEFAULT_HOOK_GRACE_MS,
    DEFAULT_HOOK_TIMEOUT_MS,
    INJECTIONS,
)

#: injections played on one recipient's deliveries (the mesh's first recipient of the send)
DELIVERY_KINDS = ("unacked_delivery", "duplicate_inbox_row", "delivery_attempt_repeated", "inbox_seq_misnamed",
                  "duplicate_message_event", *HOOK_FAULTS)
#: faults the calendar plays on a node's next eligible event (see ``Calendar``)
NODE_FAULTS = ("non_monotonic_seq", "non_monotonic_event_id", "inbox_seq_reused")


@dataclass
class Injection:
    kind: str
    invariant: str
    key: dict[str, str]
    needs_ts: int = 0  # realised when the mesh emitted past this ts (of ``needs_node`` when set)
    needs_node: int | None = None
    realised: bool = False


class Injector:
    """The injections planned for one mesh, played into the first eligible sends, and what became of each."""

    def __init__(self, mesh: Mesh, calendar: Calendar, core: Core, outbox: Outbox, broker: Broker,
                 kinds: list[str]):
        self.mesh = mesh
        self.calendar = calendar
        self.push = calendar.push
        self.core = core
        self.outbox = outbox
        self.broker = broker
        self.pending = list(kinds)
        self.injections: list[Injection] = []

    def happy(self, daemon: Daemon, t0: int, cmid: str, dest: Destination, inject: str = "") -> TracedRow:
        """The fault-free path of one send with client_message_id ``cmid``, with ``inject`` played into it."""
        core, mesh, outbox, broker = self.core, self.mesh, self.outbox, self.broker
        fingerprint = core.fingerprint(dest.kind, dest.ref, f"{cmid}:0")
        bucket = mesh.bucket(cmid)
        outbox.post(daemon, t0, cmid, fingerprint, bucket, "none", None, None)
        if inject == "new_row_untraced":  # answered 202 with no row; the daemon's next send goes out as usual
            daemon.sends += 1
            return self.happy(daemon, t0 + 1, f"{daemon.short}-{daemon.sends:x}", dest)
        row = outbox.accept(daemon, t0, cmid, fingerprint, t0 + 1 if inject == "max_age_violated" else None, bucket)
        t = t0 + 5
        outbox.transition(daemon, row, t, "dispatch")
        if inject == "inflight_unresolved":  # the frame is lost and the row never times out
            return row
        t_broker = t + 3
        dedupe = Dedupe()
        if inject == "id_freed":
            event, broker_message_id = broker.receive(daemon, row, t_broker, dest, dedupe, False)
            outbox.transition(daemon, row, t_broker + 3, event, broker_message_id)
            outbox.requeue(daemon, row, t_broker + 1_000, client_message_id=cmid)
            return row
        table_row, phase, http_status = core.broker("ok", "same", "ours", "match", "ok", "ok")
        broker_message_id = dedupe.broker_message_id = mesh.new_id(t_broker)
        dedupe.request_fingerprint = fingerprint
        broker.commit(cmid, bucket, fingerprint, broker_message_id, t_broker, dest,
                      0 if inject == "missing_side_effect" else 1, deliver=False)
        broker.decision(t_broker, cmid, bucket, fingerprint, table_row, phase, int(http_status), broker_message_id,
                        daemon.node)
        for k, recipient in enumerate(dest.recipients):
            mode = inject if k == 0 and inject in DELIVERY_KINDS else ""
            delivery_id = broker.deliver(recipient, broker_message_id, cmid, bucket, t_broker, mode)
            if mode == "unacked_delivery":
                self._record("unacked_delivery", {"mesh": mesh.name, "delivery_id": delivery_id},
                             needs_ts=t_broker + 20 + FORCED_LEASE_MS + mesh.params.redelivery_grace_ms,
                             needs_node=mesh.broker_node)
            elif mode == "delivery_attempt_repeated":
                self._record(mode, {"mesh": mesh.name, "delivery_id": delivery_id},
                             needs_ts=t_broker + FORCED_LEASE_MS + 100, needs_node=mesh.broker_node)
            elif mode in ("duplicate_inbox_row", "inbox_seq_misnamed"):
                self._record(mode, {"recipient": mesh.daemons[recipient].pubkey, "client_message_id": cmid},
                             needs_ts=t_broker + FORCED_LEASE_MS + 100)
            elif mode == "duplicate_message_event":  # the redelivery publishes a message event
                self._record(mode, {"node": mesh.daemons[recipient].name}, needs_ts=t_broker + FORCED_LEASE_MS + 100)
            elif mode in HOOK_FAULTS:  # played on the recipient's hook run for its new row (``Broker.hook_run``)
                wait = DEFAULT_HOOK_TIMEOUT_MS + DEFAULT_HOOK_GRACE_MS if mode == "hook_run_unfinished" else 1_000
                self._record(mode, {"node": mesh.daemons[recipient].name, "client_message_id": cmid, "hook": HOOK},
                             needs_ts=broker.inserted_at + wait, needs_node=mesh.daemons[recipient].node)
        t_ack = t_broker + 3
        acked_id = mesh.new_id(t_ack) if inject == "done_without_message" else broker_message_id
        if inject == "fingerprint_changed":
            row.request_fingerprint = core.fingerprint(dest.kind, dest.ref, f"{cmid}:changed")
        outbox.transition(daemon, row, t_ack, core.ack(int(http_status)), acked_id)
        if inject == "illegal_transition":
            failed = outbox.step("inflight", "ack_failed")[0].table_row  # type: ignore[index]
            code = outbox.ot_code("inflight", "pending", "ack_failed", failed)
            self.push(t_ack + 1_000, OT, daemon.node, bucket,
                      (mesh.mesh_i, row.id, cmid, fingerprint, code, row.attempts, row.enqueued_at, row.max_age_at,
                       row.broker_message_id, None))
        elif inject == "ipc_decision_inconsistent":
            outbox.post(daemon, t_ack + 500, cmid, fingerprint, bucket, "pending", True, row.id)
        elif inject == "mismatch_answered_duplicate":
            duplicate = core.broker("ok", "same", "theirs", "match", "ok", "ok")
            other = core.fingerprint(dest.kind, dest.ref, f"{cmid}:other")
            broker.decision(t_ack + 2_000, cmid, bucket, other, duplicate[0], duplicate[1], int(duplicate[2]),
                            broker_message_id, daemon.node)
        elif inject == "duplicate_broker_message":
            t_dup = t_ack + 2_000
            other = mesh.new_id(t_dup)
            broker.commit(cmid, bucket, fingerprint, other, t_dup, dest, deliver=False)
            broker.decision(t_dup, cmid, bucket, fingerprint, table_row, phase, int(http_status), other, daemon.node)
        elif inject == "delivery_uncommitted":
            t_dl = t_ack + 1_000
            phantom = mesh.new_id(t_dl)
            recipient = mesh.daemons[dest.recipients[0]]
            delivery_id = f"{phantom}.{recipient.index}"
            self.push(t_dl, DL, mesh.broker_node, bucket,
                      (mesh.mesh_i, phantom, cmid, recipient.node, delivery_id, 1, t_dl + LEASE_MS))
            self.push(t_dl + 3, DA, mesh.broker_node, bucket,
                      (mesh.mesh_i, phantom, cmid, recipient.node, delivery_id))
        return row

    def _record(self, kind: str, key: dict[str, str], needs_ts: int = 0, needs_node: int | None = None) -> None:
        self.injections.append(Injection(kind, INJECTIONS[kind], key, needs_ts, needs_node))

    def try_inject(self, daemon: Daemon, t0: int) -> bool:
        """Play the next pending injection as ``daemon``'s send at ``t0`` if it is eligible; True when played."""
        mesh = self.mesh
        kind = self.pending[0]
        if kind in NODE_FAULTS:
            self.pending.pop(0)
            self.calendar.node_faults.append((kind, daemon.node))
            self.injections.append(Injection(kind, INJECTIONS[kind], {"node": daemon.name}, needs_ts=-1))
            return False
        if kind == "id_freed":
            dest = Destination("topic", "t-missing", (), False, "topic_exists")
        else:
            subscribers = mesh.subscribers
            j = max(range(4), key=lambda j: sum(i != daemon.index for i in subscribers[j]))
            dest = Destination("topic", mesh.topics[j], tuple(i for i in subscribers[j] if i != daemon.index), True)
            if not dest.recipients and kind in (*DELIVERY_KINDS, "delivery_uncommitted"):
                return False
        window = t0 + 8_000
        if not daemon.outages.online_through(t0, window) or not all(
                mesh.daemons[r].outages.online_through(t0, window) for r in dest.recipients):
            return False
        self.pending.pop(0)
        cmid = f"{daemon.short}-{daemon.sends:x}"
        row = self.happy(daemon, t0, cmid, dest, kind)
        end = t0 + 5_000
        if kind in ("illegal_transition", "fingerprint_changed", "max_age_violated"):
            self._record(kind, {"node": daemon.name, "outbox_id": row.id}, end)
        elif kind in ("ipc_decision_inconsistent", "id_freed", "new_row_untraced"):
            self._record(kind, {"node": daemon.name, "client_message_id": cmid}, end)
        elif kind == "inflight_unresolved":
            self._record(kind, {"node": daemon.name, "outbox_id": row.id},
                         needs_ts=row.times[-1] + DEFAULT_ACK_TIMEOUT_MS + DEFAULT_ACK_GRACE_MS, needs_node=daemon.node)
        elif kind in ("duplicate_broker_message", "mismatch_answered_duplicate", "missing_side_effect",
                      "done_without_message", "delivery_uncommitted"):
            self._record(kind, {"mesh": mesh.name, "client_message_id": cmid}, end)
        return True

    def finish(self) -> None:
        """Once the mesh has run: which injections the trace realised, and the ones never played (dropped)."""
        calendar = self.calendar
        for fault, node in calendar.played_faults:
            for injection in self.injections:
                if injection.kind == fault and injection.needs_ts < 0 and \
                        injection.key["node"] == self.mesh.node_names[node]:
                    injection.realised = True
        for kind in self.pending:
            self.injections.append(Injection(kind, INJECTIONS[kind], {}, needs_ts=-1))
        for injection in self.injections:
            if injection.needs_ts >= 0:
                last = max(calendar.last_ts) if injection.needs_node is None else \
                    calendar.last_ts[injection.needs_node - self.mesh.base_node]
                injection.realised = last > injection.needs_ts
