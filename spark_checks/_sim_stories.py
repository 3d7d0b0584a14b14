"""The generator's stories: everything that follows from one client send, played out the moment it is posted.

Theory of operation. A story is the IPC decision, the outbox row's whole lifecycle and the broker's side of it:
dispatch over the daemon's link, the broker's answer, retries after failures and timeouts, late acks, link losses,
crash recovery, max age, operator requeue (the successor gets a story of its own), and the deliveries to every
recipient. Every time a story needs is drawn as it plays and its events are pushed into the calendar at their
timestamps; each daemon's outage schedule is the same for every story, so all rows inflight at a crash are
recovered at the restart. Some stories add to the load: duplicate posts of the same id (mostly the same body, some
a different one), another daemon of the mesh reusing an id the broker already holds, and hot keys -- a client
re-posting one id in a tight loop.
"""

from __future__ import annotations

from ._sim_broker import Broker, Dedupe, Destination
from ._sim_calendar import Calendar
from ._sim_core import Core
from ._sim_faults import CRASH, FaultRates
from ._sim_inject import Injector
from ._sim_mesh import Daemon, Mesh
from ._sim_outbox import Outbox, TracedRow

ACK_TIMEOUT_MS = 10_000
MAX_REQUEUES = 2  # requeues in a row of successors; a collision's story starts at this depth (none)


class Stories:
    """Plays each send of one mesh: its row on the sending daemon, its frames at the broker, its deliveries."""

    def __init__(self, mesh: Mesh, calendar: Calendar, core: Core, rates: FaultRates, outbox: Outbox, broker: Broker,
                 injector: Injector, hot_posts: int, budget: int):
        self.mesh = mesh
        self.daemons = mesh.daemons
        self.rng = mesh.rng
        self.rnd = mesh.rnd
        self.later = calendar.later
        self.core = core
        self.rates = rates
        self.outbox = outbox
        self.broker = broker
        self.injector = injector
        self.started = 0
        self.hot_posts = hot_posts
        self.hot_started = 0
        rate = len(mesh.daemons) / mesh.params.send_interval_ms * 14.0  # events per ms, roughly
        self.hot_interval = max(1, int(budget / rate / max(1, hot_posts))) if hot_posts else 0

    def start_send(self, daemon: Daemon, t0: int) -> None:
        """A client posts a new send to ``daemon`` at ``t0``."""
        self.started += 1
        daemon.sends += 1
        if self.injector.pending and self.started > 10 and self.injector.try_inject(daemon, t0):
            return
        if self.hot_started < (2 if self.hot_posts else 0) and self.started > 4 and self._try_hot(daemon, t0):
            return
        cmid = f"{daemon.short}-{daemon.sends:x}"
        dest = self.destination(daemon.index)
        self.play(daemon, t0, cmid, dest, Dedupe(), f"{cmid}:0", dups=True)

    def destination(self, sender: int) -> Destination:
        """Where daemon ``sender``'s client sends: a topic, a DM, the queue, or (a fault) a destination B2 refuses."""
        rnd = self.rnd
        roll = rnd()
        n = len(self.daemons)
        mesh = self.mesh
        if rnd() < self.rates.bad_destination:
            if roll < 0.5:
                return Destination("topic", "t-missing", (), False, "topic_exists")
            return Destination("dm", f"{self.rng.getrandbits(256):064x}", (), False, "recipient_is_member")
        if roll < 0.6:
            j = int(rnd() * 4)
            return Destination("topic", mesh.topics[j], tuple(i for i in mesh.subscribers[j] if i != sender), True)
        if roll < 0.9 and n > 1:
            other = int(rnd() * (n - 1))
            other += other >= sender
            return Destination("dm", self.daemons[other].pubkey, (other,), True)
        consumer = 0 if sender != 0 or n == 1 else 1
        return Destination("queue", "q0", (consumer,), True)

    def play(self, daemon: Daemon, t0: int, client_message_id: str, dest: Destination, dedupe: Dedupe, body: str,
             dups: bool, depth: int = 0) -> TracedRow:
        """POST, accept and the row's whole lifecycle; returns the row (its timeline filled)."""
        request_fingerprint = self.core.fingerprint(dest.kind, dest.ref, body)
        bucket = self.mesh.bucket(client_message_id)
        self.outbox.post(daemon, t0, client_message_id, request_fingerprint, bucket, "none", None, None)
        row = self.outbox.accept(daemon, t0, client_message_id, request_fingerprint, bucket=bucket)
        self.run_row(daemon, row, t0 + 1 + int(self.rnd() * 20), dest, dedupe, depth)
        if dups and self.rnd() < self.rates.dup_post:
            self.duplicate_posts(daemon, row, dest, t0)
        return row

    def run_row(self, daemon: Daemon, row: TracedRow, t: int, dest: Destination, dedupe: Dedupe, depth: int) -> None:
        """The row's life on the daemon's link, from its first dispatch at (or after) ``t`` to a terminal status."""
        rnd = self.rnd
        core = self.core
        rates = self.rates
        outages = daemon.outages
        transition = self.outbox.transition
        while True:
            t = outages.online(t)
            if core.expired(row, t):
                transition(daemon, row, t, "max_age_exceeded")
                self.after_dead(daemon, row, t, dest, depth)
                return
            transition(daemon, row, t, "dispatch")
            t_broker = t + 1 + int(rnd() * 8)
            t_ack = t_broker + 1 + int(rnd() * 8)
            cut = outages.first_between(t, t_ack)
            decided = (cut < 0 or outages.starts[cut] > t_broker) and rnd() >= rates.frame_lost
            event, broker_message_id = "", None
            if decided:
                event, broker_message_id = self.broker.receive(daemon, row, t_broker, dest, dedupe, True)
            lost = not decided or rnd() < rates.ack_lost
            if cut < 0 and lost:
                t_timeout = t + ACK_TIMEOUT_MS
                cut = outages.first_between(t_ack, t_timeout)
                if cut < 0:
                    transition(daemon, row, t_timeout, "ack_timeout")
                    if decided and rnd() < rates.late_ack:
                        t_late = t_timeout + 1 + int(rnd() * 400)
                        if outages.covering(t_late) < 0 and transition(
                                daemon, row, t_late, event, broker_message_id) in ("done", "dead"):
                            self._settled(daemon, row, t_late, dedupe, dest, depth)
                            return
                    t = t_timeout + core.backoff(row.attempts, rnd() * 2 - 1)
                    continue
            if cut >= 0:
                start, end = outages.starts[cut], outages.ends[cut]
                if outages.kinds[cut] == CRASH:
                    transition(daemon, row, end, "crash_recovery")
                    t = end + core.policy.retry_base_ms
                else:
                    transition(daemon, row, start, "link_lost")
                    t = max(end + 1, start + core.backoff(row.attempts, rnd() * 2 - 1))
                continue
            to = transition(daemon, row, t_ack, event, broker_message_id)
            if to == "pending":
                t = t_ack + core.backoff(row.attempts, rnd() * 2 - 1)
                if depth < MAX_REQUEUES and rnd() < rates.requeue_pending:
                    t_req = outages.up(t_ack + (t - t_ack) // 2)
                    if t_req < t and row.status == "pending":
                        self.requeue(daemon, row, t_req, dest, depth)
                        return
                continue
            self._settled(daemon, row, t_ack, dedupe, dest, depth)
            return

    def _settled(self, daemon: Daemon, row: TracedRow, t: int, dedupe: Dedupe, dest: Destination, depth: int
                 ) -> None:
        if row.status == "done":
            if depth == 0 and dedupe.broker_message_id is not None and self.rnd() < self.rates.collision and \
                    len(self.daemons) > 1:
                self.later(t + 30_000 + int(self.rnd() * 60_000),
                           lambda ts: self.collide(ts, daemon.index, row.client_message_id, dedupe, dest))
        elif row.status == "dead":
            self.after_dead(daemon, row, t, dest, depth)

    def after_dead(self, daemon: Daemon, row: TracedRow, t: int, dest: Destination, depth: int) -> None:
        if depth < MAX_REQUEUES and self.rnd() < self.rates.requeue_dead:
            self.requeue(daemon, row, daemon.outages.up(t + 5_000 + int(self.rnd() * 55_000)), dest, depth)

    def requeue(self, daemon: Daemon, row: TracedRow, t: int, dest: Destination, depth: int) -> None:
        """Operator requeue (§4.5.3); the successor's story starts at once."""
        successor = self.outbox.requeue(daemon, row, t)
        self.run_row(daemon, successor, t + 1 + int(self.rnd() * 20), dest, Dedupe(), depth + 1)

    def collide(self, t: int, original: int, client_message_id: str, dedupe: Dedupe, dest: Destination) -> None:
        """Another daemon of the mesh sends with an id the broker already holds (same or different body)."""
        others = [d for d in self.daemons if d.index != original and d.outages.up(t) == t]
        if not others:
            return
        daemon = others[int(self.rnd() * len(others))]
        same = self.rnd() < 0.3
        body = f"{client_message_id}:0" if same else f"{client_message_id}:collision"
        self.play(daemon, t, client_message_id, dest, dedupe, body, dups=False, depth=MAX_REQUEUES)

    def duplicate_posts(self, daemon: Daemon, row: TracedRow, dest: Destination, t0: int) -> None:
        """The client posts the same id again, a few times (mostly the same body; a different body is answered 409)."""
        rnd = self.rnd
        other_fingerprint: bytes | None = None
        count = 1
        while rnd() < 0.5 and count < 8:
            count += 1
        horizon = max(row.times[-1] + 5_000, t0 + 3_000)
        for _ in range(count):
            t = t0 + 1 + (int(rnd() * 3_000) if rnd() < 0.7 else int(rnd() * (horizon - t0)))
            if daemon.outages.up(t) != t:
                continue
            match = rnd() < 0.85
            if not match and other_fingerprint is None:
                other_fingerprint = self.core.fingerprint(dest.kind, dest.ref, f"{row.client_message_id}:other")
            self.outbox.post(daemon, t, row.client_message_id,
                             row.request_fingerprint if match else other_fingerprint,  # type: ignore[arg-type]
                             row.bucket, row.status_at(t), match, row.id)

    def _try_hot(self, daemon: Daemon, t0: int) -> bool:
        """A client re-posting one id in a tight loop (a hot key), from a send that went the happy path."""
        dest = Destination("queue", "q0", (), True)
        if not daemon.outages.online_through(t0, t0 + 100):
            return False
        self.hot_started += 1
        cmid = f"{daemon.short}-hot{self.hot_started}"
        row = self.injector.happy(daemon, t0, cmid, dest)
        other = self.core.fingerprint(dest.kind, dest.ref, f"{cmid}:other")
        remaining = [self.hot_posts]
        post = self.outbox.post

        def hammer(ts: int) -> None:
            t = ts
            for _ in range(min(256, remaining[0])):
                t += self.hot_interval
                if daemon.outages.up(t) != t:
                    continue
                match = self.rnd() < 0.9
                post(daemon, t, cmid, row.request_fingerprint if match else other, row.bucket, row.status_at(t), match,
                     row.id)
            remaining[0] -= 256
            if remaining[0] > 0:
                self.later(t + 1, hammer)

        self.later(row.times[-1] + 1, hammer)
        return True
