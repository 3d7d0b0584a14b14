"""A mesh's broker as the generator plays it: the accept decision for each send frame, the commit, and deliveries.

Theory of operation. Each send frame is decided by the core's accept table (``Core.broker``) on the inputs the
frame meets: B1 (faults may reject it), drift, whether the dedupe row is already claimed and with which fingerprint,
B2 (the destination) and the commit (faults may fail it). A send's ``Dedupe`` is the broker's dedupe row for its
(mesh, client_message_id) as every story sharing the id sees it; messages to topic ``t3`` have their history
pruned after ``HISTORY_RETENTION_MS``, so a later duplicate is answered ``ack_duplicate_pruned``.

A committed message is delivered to each recipient until the recipient acks: every attempt is a ``delivery`` with a
lease, a push lost or a recipient down means the next attempt at the lease's end (leases double up to
``LEASE_MAX_MS``), and a client ack lost or cut by an outage means the recipient is pushed again, its inbox row not
inserted twice.

A new inbox row on a daemon with hooks (every even-numbered daemon runs ``on-message``) gets its ``hook_enqueue``
after its ``inbox_insert`` and a ``hook_run`` when the run is marked (``hook_run``): done, failed or timed out, some
done runs replying under the derived id (the reply's send is not played). A run's outcome and duration come from a
hash of (node, client_message_id), never from the mesh's random source, so adding hooks moved no other event. A
crash of the daemon while the hook runs has it run again after the restart, claimed twice.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from ._sim_calendar import Calendar
from ._sim_core import Core
from ._sim_faults import CRASH, FaultRates
from ._sim_mesh import Daemon, Mesh
from ._sim_outbox import TracedRow
from ._sim_trace import AC, AD, DA, DL, HE, HP, HR, INBOX, SSE, Codes
from .catalogue import hook_reply_id

LEASE_MS = 30_000
LEASE_MAX_MS = 600_000
FORCED_LEASE_MS = 1_000  # the lease of an injected delivery fault
HISTORY_RETENTION_MS = 600_000  # topic t3 keeps message rows for 10 minutes (history_pruned after)
HOOK = "on-message"  # the hook of the daemons that run one
#: injected hook faults, played on the recipient's first inbox row of the send (``Injector``)
HOOK_FAULTS = ("hook_run_twice", "hook_run_unenqueued", "hook_run_unfinished", "hook_reply_id_wrong")


@dataclass
class Dedupe:
    """The broker's dedupe row for one (mesh, client_message_id), as the stories sharing it see it."""

    broker_message_id: str | None = None
    request_fingerprint: bytes | None = None
    pruned_at: int | None = None


@dataclass(frozen=True)
class Destination:
    """Where a send goes (``kind`` and ``ref`` as the core's ``Destination``) and what the broker finds there."""

    kind: str
    ref: str
    recipients: tuple[int, ...]  # daemon indexes
    ok: bool  # whether B2 passes
    b2_check: str = ""  # the B2 check that fails when not ``ok``


class Broker:
    """One mesh's broker node: ``accept_decision``, ``accept_commit``, ``delivery`` and ``delivery_ack`` events."""

    def __init__(self, mesh: Mesh, calendar: Calendar, core: Core, codes: Codes, rates: FaultRates):
        self.mesh = mesh
        self.mesh_i = mesh.mesh_i
        self.node = mesh.broker_node
        self.rnd = mesh.rnd
        self.push = calendar.push
        self.core = core
        self.codes = codes
        self.rates = rates
        self.message = mesh.sse["message"]
        self.later = calendar.later
        self.inserted_at = 0  # the ts of the last new inbox row ``deliver`` played (for the injector)

    def receive(self, daemon: Daemon, row: TracedRow, t: int, dest: Destination, dedupe: Dedupe, faults: bool
                ) -> tuple[str, str | None]:
        """The broker decides one send frame at ``t``; returns the daemon's ack event and its broker_message_id."""
        rnd = self.rnd
        rates = self.rates
        cmid, request_fingerprint, bucket = row.client_message_id, row.request_fingerprint, row.bucket
        b1 = "rejected" if faults and rnd() < rates.b1_reject else "ok"
        drift = "differs" if faults and rnd() < rates.drift else "same"
        claim = "theirs" if dedupe.broker_message_id is not None else "ours"
        fingerprint = "match" if dedupe.request_fingerprint in (None, request_fingerprint) else "mismatch"
        b2 = "ok" if dest.ok else "rejected"
        commit = "failed" if faults and rnd() < rates.broker_5xx else "ok"
        table_row, phase, http_status = self.core.broker(b1, drift, claim, fingerprint, b2, commit)
        broker_message_id, history_available, failed = None, True, None
        if table_row == "BRK-ACCEPT":
            broker_message_id = self.mesh.new_id(t)
            dedupe.broker_message_id, dedupe.request_fingerprint = broker_message_id, request_fingerprint
            self.commit(cmid, bucket, request_fingerprint, broker_message_id, t, dest)
        elif table_row == "BRK-DUP-MATCH":
            broker_message_id = dedupe.broker_message_id
            history_available = dedupe.pruned_at is None or dedupe.pruned_at > t
        elif table_row == "BRK-B1-REJECT":
            failed = ("rate_limit", "payload_size", "membership")[int(rnd() * 3)]
        elif table_row == "BRK-B2-REJECT":
            failed = dest.b2_check or "topic_exists"
        # the row's status made concrete: a 4xx is the failed check's, the simulated broker's 5xx is a 503
        status = self.core.check_status(phase, failed) if failed else 503 if http_status == "5xx" else int(http_status)
        event = self.core.ack(status, history_available)  # a rate limit's 429 is transient (E-42)
        self.decision(t, cmid, bucket, request_fingerprint, table_row, phase, status, broker_message_id, daemon.node)
        if table_row == "BRK-ACCEPT" and dest.ref == "t3":
            dedupe.pruned_at = t + HISTORY_RETENTION_MS
            self.push(dedupe.pruned_at, HP, self.node, bucket, (self.mesh_i, broker_message_id, cmid))
        return event, broker_message_id

    def decision(self, t: int, client_message_id: str, bucket: int, request_fingerprint: bytes, table_row: str,
                 phase: str, status: int, broker_message_id: str | None, member: int) -> None:
        """An accept_decision; ``member`` is the sending daemon's node id (its key is written)."""
        code = self.codes.code(AD, (table_row, phase, status))
        self.push(t, AD, self.node, bucket,
                  (self.mesh_i, client_message_id, request_fingerprint, code, broker_message_id, member))

    def commit(self, client_message_id: str, bucket: int, request_fingerprint: bytes, broker_message_id: str, t: int,
               dest: Destination, history: int = 1, deliver: bool = True) -> None:
        """An accept_commit (``history``: history rows written), then the deliveries unless ``deliver`` is False."""
        n = len(dest.recipients) if deliver else 0
        code = self.codes.code(AC, (dest.kind, 1, 1, history, n, n))
        self.push(t, AC, self.node, bucket,
                  (self.mesh_i, client_message_id, broker_message_id, request_fingerprint, code, dest.ref))
        if deliver:
            for recipient in dest.recipients:
                self.deliver(recipient, broker_message_id, client_message_id, bucket, t)

    def deliver(self, r: int, broker_message_id: str, client_message_id: str, bucket: int, t: int, mode: str = ""
                ) -> str:
        """Deliver one message to daemon ``r`` until it acks; ``mode`` plays an injected fault instead.

        Returns the delivery_id.
        """
        recipient = self.mesh.daemons[r]
        outages = recipient.outages
        rnd = self.rnd
        push = self.push
        mesh, node = self.mesh_i, recipient.node
        delivery_id = f"{broker_message_id}.{r}"
        attempt = 1
        t += 1 + int(rnd() * 4)
        cell: list[Any] | None = None  # the inbox_seq of the row inserted first, filled in when the calendar emits it
        broker = self.node
        faults = not mode
        p_push_lost, p_ack_lost = self.rates.push_lost, self.rates.client_ack_lost
        while True:
            lease = t + (FORCED_LEASE_MS if mode else min(LEASE_MS << min(attempt - 1, 10), LEASE_MAX_MS))
            push(t, DL, broker, bucket, (mesh, broker_message_id, client_message_id, node, delivery_id, attempt, lease))
            t_insert = t + 1 + int(rnd() * 4)
            if mode == "delivery_attempt_repeated" and cell is None and attempt == 1:
                mode = "repeat"  # the push is lost, and the next lease repeats attempt 1
                t = lease
                continue
            if (faults and rnd() < p_push_lost) or outages.covering(t_insert) >= 0:
                t, attempt = lease, attempt + 1
                continue
            inserted = cell is None or (mode == "duplicate_inbox_row" and attempt == 2)
            if inserted:
                cell = [None]
            payload = (node, mesh, client_message_id, broker_message_id, delivery_id, inserted, cell)
            if mode == "inbox_seq_misnamed" and attempt == 2:  # names the seq after the row's, once that is known
                self.later(t_insert, lambda ts, held=cell, p=payload: push(ts, INBOX, node, bucket,
                                                                           (*p[:-1], [held[0] + 1])))
            else:
                push(t_insert, INBOX, node, bucket, payload)
            if inserted:
                self.inserted_at = t_insert
                # (the injected second row of duplicate_inbox_row runs no hook: one violation per injection)
                if ((recipient.index % 2 == 0 and not (mode == "duplicate_inbox_row" and attempt == 2))
                        or mode in HOOK_FAULTS):
                    self.hook_run(recipient, client_message_id, broker_message_id, bucket, t_insert, cell, mode)
            # a new row's message event follows its insert (E-32); an injected one follows a redelivery too
            if inserted or (mode == "duplicate_message_event" and attempt == 2):
                push(t_insert, SSE, node, self.mesh.node_bucket[r], self.message)
            if mode == "unacked_delivery":
                return delivery_id
            t_ack = t_insert + 1 + int(rnd() * 4)
            lost = (faults and rnd() < p_ack_lost) or (mode in ("duplicate_inbox_row", "inbox_seq_misnamed",
                                                                "duplicate_message_event") and attempt == 1)
            if lost or outages.first_between(t_insert, t_ack) >= 0:
                t, attempt = lease, attempt + 1
                continue
            push(t_ack, DA, broker, bucket, (mesh, broker_message_id, client_message_id, node, delivery_id))
            return delivery_id

    def hook_run(self, recipient: Daemon, client_message_id: str, broker_message_id: str, bucket: int, t: int,
                 cell: list[Any], mode: str) -> None:
        """The recipient's ``on-message`` run for its new inbox row (``cell`` holds the row's inbox_seq once the
        calendar emits the insert); ``mode`` plays an injected hook fault instead."""
        mesh, node, push = self.mesh_i, recipient.node, self.push
        h = zlib.crc32(f"{recipient.name}\x00{client_message_id}".encode())
        if mode != "hook_run_unenqueued":
            push(t, HE, node, bucket, (mesh, client_message_id, broker_message_id, cell, self.codes.code(HE, (HOOK,))))
        if mode == "hook_run_unfinished":
            return
        draw = (h >> 12) % 100
        to, duration = ("timed_out", 30_000 + h % 5_000) if draw < 2 and not mode else (
            ("failed" if draw < 7 and not mode else "done"), 20 + h % 400)
        reply = hook_reply_id(client_message_id, HOOK) if to == "done" and (h >> 20) % 3 == 0 else None
        if mode == "hook_reply_id_wrong":
            reply = hook_reply_id(client_message_id, "on-dm")
        claims, end = 1, t + duration
        outages = recipient.outages
        crash = outages.first_between(t, end)
        while 0 <= crash < len(outages.starts) and outages.starts[crash] <= end:
            if outages.kinds[crash] == CRASH:  # killed mid-hook: the run is claimed again after the restart
                claims, to, end = 2, "done", outages.up(outages.starts[crash]) + 20 + h % 400
                break
            crash += 1
        code = self.codes.code(HR, (HOOK, to, claims, 202 if reply is not None else None))
        for k in range(2 if mode == "hook_run_twice" else 1):
            push(end + 10 * k, HR, node, bucket, (mesh, client_message_id, cell, code, reply))
