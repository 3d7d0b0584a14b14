"""The daemon's process wiring: preflight in the gunicorn master, the runtime in the worker.

``preflight`` runs before anything listens and exits with the E-15 codes: 6 when another daemon holds the state
directory, 4 on a host fingerprint mismatch, 5 when outbox.db fails its integrity check, 3 on bad configuration. It
also performs crash recovery (§4.11): inflight rows return to pending, a corrupt inbox.db is quarantined.
``Runtime`` is built in the worker: stores, event bus, metrics, group committer, broker link and the IPC app.

Both build the daemon's parts from a ``Components`` (the reference's own classes and functions by default): the one
seam for starting the real daemon with one part subclassed or wrapped, without replacing any module attribute
(tests/conformance/mutants starts its deliberately broken daemons through it).
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ulid import ULID

from reference.clock import WallClock
from reference.core import OutboxPolicy, SendRequest, parse_send
from reference.core.codes import exit_code
from reference.state_dir import StateDir
from reference.trace import TraceWriter
from spec import load_table

from . import identity
from .app import DaemonContext, create_app
from .capabilities import Capabilities
from .committer import GroupCommitter
from .config import Config
from .events import EventBus
from .hooks import Hook, HookRunner, HooksConfigError, load_hooks, matching, outbox_reply
from .link import BrokerLink
from .metrics import DaemonMetrics
from .problems import Problem
from .store import (
    InboxMessage,
    InboxRow,
    InboxStore,
    NewIdInUse,
    OutboxCorrupt,
    OutboxRowNotFound,
    OutboxStore,
    SchemaTooNew,
    StoreError,
)
from .store.hook_runs import HookRuns
from .store.hook_runs import enqueue as enqueue_runs

log = logging.getLogger("meshd")
WATCHDOG_S = 1.0
_LOCKS: list[Any] = []


class PreflightError(Exception):
    """The daemon cannot start; ``code`` is the exit code spec/tables/exit_codes.yaml names ``exit_name``."""

    def __init__(self, exit_name: str, message: str):
        super().__init__(message)
        self.code = exit_code(exit_name)


def policy_for(config: Config | dict) -> OutboxPolicy:
    """The outbox policy until the first negotiation: max age as in permanent mode (the link caps it then, §4.9)."""
    outbox = config["outbox"]
    cap = load_table("max_age")["permanent_cap_hours"]
    return OutboxPolicy(retry_base_ms=int(outbox["retry_base_ms"]), retry_max_ms=int(outbox["retry_max_ms"]),
                        jitter=float(outbox["retry_jitter"]),
                        max_age_hours=int(outbox["max_age_hours_override"] or min(outbox["max_age_hours"], cap)))


def daemon_node(keypair: Any) -> str:
    """The daemon's node name in traces."""
    return f"daemon-{keypair.public_hex[:16]}"


def lock_state_dir(state_dir: Path) -> None:
    """Hold an exclusive lock on the state directory for this process and its worker (one daemon per directory)."""
    files = StateDir(state_dir)
    handle = files.lock.open("a+")
    try:
        # req: LIFE-SINGLETON -- a second daemon on the directory exits 6
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.close()
        pid = files.pid.read_text().strip() if files.pid.exists() else "?"
        raise PreflightError("state_dir_locked", f"another daemon (pid {pid}) is running in {state_dir}") from exc
    _LOCKS.append(handle)
    files.pid.write_text(f"{os.getpid()}\n", encoding="ascii")


def trace_store_item(trace: TraceWriter, mesh: str, item: Any) -> None:
    """Write the trace events for one committed ``IpcDecision`` or ``Transition`` of the outbox store."""
    if hasattr(item, "http_status"):
        trace.emit("ipc_decision", mesh=mesh, client_message_id=item.body["client_message_id"],
                   request_fingerprint=item.request_fingerprint.hex(),
                   row_state=item.row_state, fingerprint_match=item.fingerprint_match,
                   table_row=item.table_row, http_status=item.http_status, outbox_id=item.outbox_id)
        return
    if item.outcome != "transition":
        return
    # A requeue is traced as two events with the requeue row: old row -> aborted, successor none -> pending.
    for current, before in ((item.after, item.before), (item.successor, None)):
        if current is None:
            continue
        trace.emit("outbox_transition", mesh=mesh, outbox_id=current.id,
                   client_message_id=current.client_message_id,
                   request_fingerprint=current.request_fingerprint.hex(),
                   **{"from": "none" if before is None else before.status}, to=current.status,
                   event=item.event, table_row=item.table_row, attempts=current.attempts,
                   enqueued_at_ms=current.enqueued_at, max_age_at_ms=current.max_age_at,
                   broker_message_id=current.broker_message_id, superseded_by=current.superseded_by)


def trace_hook_run(trace: TraceWriter, mesh: str, run: Any) -> None:
    """Write the ``hook_run`` event of a run marked finished (a ``store.hook_runs.StoredRun``): its final state, its
    claims and, when its reply went through the §4.5.1 lookup, the reply's id and the answer's status."""
    reply = (run.result or {}).get("reply")
    submitted = isinstance(reply, dict) and reply.get("http_status") is not None
    trace.emit("hook_run", mesh=mesh, client_message_id=run.client_message_id, inbox_seq=run.inbox_seq, hook=run.hook,
               to=run.state, claims=run.claims,
               reply_client_message_id=reply["client_message_id"] if submitted else None,
               http_status=int(reply["http_status"]) if submitted else None)


@dataclass(frozen=True)
class Components:
    """What the daemon is built from; every field defaults to the reference's own and is called exactly like it.

    ``preflight`` uses ``lock_state_dir``, ``check_host``, ``outbox_store`` and ``inbox_store``; ``Runtime`` uses
    every store and class below and serves what ``create_app(ctx, requeue)`` returns. A replacement subclasses or
    wraps the default (``dataclasses.replace(Components(), broker_link=MyLink)``) and keeps its signature.
    """

    outbox_store: type[OutboxStore] = OutboxStore
    inbox_store: type[InboxStore] = InboxStore  # built with ``open_or_quarantine(path)``
    event_bus: type[EventBus] = EventBus
    broker_link: type[BrokerLink] = BrokerLink
    committer: type[GroupCommitter] = GroupCommitter
    create_app: Callable[[DaemonContext, Callable[..., dict[str, Any]]], Callable] = create_app  # the WSGI app
    parse_send: Callable[[bytes, str | None], SendRequest] = parse_send  # POST /v1/send phase A (DaemonContext)
    check_host: Callable[..., identity.HostCheck] = identity.check_host
    lock_state_dir: Callable[[Path], None] = lock_state_dir


def preflight(state_dir: Path, config: Config, components: Components | None = None) -> list[str]:
    """Checks and recovery before serving; returns log lines describing what was done."""
    parts = components or Components()
    files = StateDir(state_dir)
    clock = WallClock(config["daemon"]["clock_file"])
    notes: list[str] = []
    # req: AUTH-STATE-DIR-MODE
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    bind = config["ipc"]["http_bind"]
    try:
        loopback = ipaddress.ip_address(bind).is_loopback
    except ValueError:
        loopback = bind == "localhost"
    # req: AUTH-LOOPBACK
    if config["ipc"]["tcp_enabled"] and not loopback and not config["ipc"]["allow_non_loopback"]:
        raise PreflightError("invalid_config", f"ipc.http_bind {bind!r} is not loopback; set "
                             "ipc.allow_non_loopback = true to expose the daemon beyond this machine")
    parts.lock_state_dir(state_dir)
    try:
        check = parts.check_host(state_dir, config["identity"]["host_id_override"],
                                 config["identity"]["stable_mac_override"], clock=clock)
    # req: ID-MISMATCH-REFUSE -- exit 4
    except identity.HostMismatch as exc:
        raise PreflightError("host_fingerprint_mismatch", str(exc)) from exc
    notes.append(f"host_fingerprint {check.result} {check.fingerprint[:16]}")
    try:
        _, minted = identity.load_or_mint_keypair(state_dir)
        identity.load_or_mint_token(state_dir)
    except identity.IdentityUnreadable as exc:
        # req: LIFE-STATE-REFUSED -- an unreadable keypair.json is exit 3, never replaced
        raise PreflightError("invalid_config", str(exc)) from exc
    if minted:
        notes.append("member keypair minted (keypair.json)")
    try:
        outbox = parts.outbox_store(files.outbox_db, policy_for(config), config["outbox"]["synchronous"],
                                    clock=clock.ms)
    except (OutboxCorrupt, SchemaTooNew) as exc:
        raise PreflightError("outbox_integrity_failed", f"{exc}; the outbox is never discarded automatically: "
                             "restore it from a backup or move it aside by hand") from exc
    except (sqlite3.Error, OSError, StoreError) as exc:  # not a database file at all: a directory, no permission
        # req: LIFE-STATE-REFUSED -- an unopenable outbox.db is exit 5
        raise PreflightError("outbox_integrity_failed", f"{files.outbox_db} cannot be opened "
                             f"({type(exc).__name__}: {exc}); the outbox is never discarded automatically: fix or "
                             "move it aside by hand") from exc
    try:
        # req: REC-OUTBOX-INTEGRITY -- exit 5; the outbox is never discarded
        outbox.integrity_check()
        # req: REC-INFLIGHT-TO-PENDING, REC-ATTEMPTS-UNCHANGED
        recovered = outbox.recover(clock.ms())
    except OutboxCorrupt as exc:
        raise PreflightError("outbox_integrity_failed", f"{exc}; refusing to start") from exc
    finally:
        outbox.close()
    if recovered:
        notes.append(f"crash recovery: {len(recovered)} inflight row(s) returned to pending")
        if config["trace"]["dir"]:  # the recovery transitions belong in the trace like every other transition
            keypair, _ = identity.load_or_mint_keypair(state_dir)
            trace = TraceWriter(Path(config["trace"]["dir"]), "daemon", daemon_node(keypair), clock=clock)
            try:
                for transition in recovered:
                    trace_store_item(trace, config["daemon"]["mesh"], transition)
            finally:
                trace.close()
    if config["hooks"]["enabled"]:
        try:
            hooks = load_hooks(hooks_folder(state_dir, config), float(config["hooks"]["default_timeout_s"]))
        except HooksConfigError as exc:
            raise PreflightError("invalid_config", str(exc)) from exc
        notes.append(f"hooks: {', '.join(hook.name for hook in hooks) or 'none enabled'}")
    try:
        open_inbox(parts, files.inbox_db, clock).close()
    except (sqlite3.Error, OSError, StoreError) as exc:
        raise PreflightError("error", f"{files.inbox_db} cannot be opened ({type(exc).__name__}: {exc}); "
                             "move it aside and start again (a fresh inbox is created)") from exc
    return notes


def hooks_folder(state_dir: Path, config: Config | dict) -> Path:
    """The folder of hooks.toml and the hook scripts: ``[hooks] dir``, relative to the state directory."""
    return state_dir / config["hooks"]["dir"]


def open_inbox(parts: Components, path: Path, clock: WallClock) -> InboxStore:
    """``inbox.db``, quarantined and recreated when it is corrupt (§4.11, E-16), whoever opens it: preflight, or a
    worker gunicorn starts in place of a killed one (which runs no preflight)."""
    inbox, quarantined = parts.inbox_store.open_or_quarantine(path, clock=clock.ms)
    if quarantined is not None:
        # req: REC-INBOX-QUARANTINE
        log.warning("inbox_corruption_recovered moved to %s", quarantined)
    return inbox


class Runtime:
    """The daemon inside the gunicorn worker."""

    def __init__(self, state_dir: Path, config: Config, trace_dir: Path | None = None,
                 on_fatal: Callable[[int, str], None] | None = None, components: Components | None = None):
        parts = self.components = components or Components()
        self.state_dir = state_dir
        files = StateDir(state_dir)
        self.config = config
        self._on_fatal = on_fatal
        self._stop_master: Callable[[], None] | None = None
        self.clock = WallClock(config["daemon"]["clock_file"])
        self.keypair, _ = identity.load_or_mint_keypair(state_dir)
        self.token = identity.load_or_mint_token(state_dir)
        self.trace = (TraceWriter(trace_dir, "daemon", daemon_node(self.keypair), clock=self.clock) if trace_dir
                      else None)
        self.outbox = parts.outbox_store(files.outbox_db, policy_for(config), config["outbox"]["synchronous"],
                                         trace=self._trace_store if self.trace else None, clock=self.clock.ms)
        # §4.11 at every worker start, not only the master's: gunicorn starts a new worker after one is SIGKILLed,
        # and the rows the dead worker had in flight must go back to pending (a no-op after preflight's own pass).
        # req: REC-WORKER-RESTART, REC-NO-LOSS -- a replacement worker recovers what its predecessor had in flight
        recovered = self.outbox.recover(self.clock.ms())
        if recovered:
            log.warning("crash recovery: %d inflight row(s) of a previous worker returned to pending", len(recovered))
        self.inbox = open_inbox(parts, files.inbox_db, self.clock)
        self.bus = parts.event_bus(self.inbox, int(config["ipc"]["max_streams"]), float(config["ipc"]["keepalive_s"]),
                                   trace=self.trace, clock=self.clock)
        self.metrics = DaemonMetrics(self.outbox)
        self.hooks = (load_hooks(hooks_folder(state_dir, config), float(config["hooks"]["default_timeout_s"]))
                      if config["hooks"]["enabled"] else None)
        self.receiver = InboxReceiver(self.inbox, self.bus, self.hooks, self.clock.ms, trace=self.trace)
        self.link = parts.broker_link(config=config.values, keypair=self.keypair, outbox=self.outbox,
                                      inbox=self.receiver, publish=self.bus.publish,
                                      on_fatal=self._fatal, metrics=self.metrics, trace=self.trace, clock=self.clock)
        self.metrics.link = self.link
        self.link.state.quarantined = self.inbox.quarantine_count()
        self.committer = parts.committer(self.outbox.accept_batch, float(config["outbox"]["group_commit_ms"]) / 1000)
        # E-50: the running hooks' capability tokens and process groups, shared by the runner and the IPC guard
        self.capabilities = Capabilities(on_call=self.metrics.capability_call,
                                         hooks_enabled=bool(config["hooks"]["enabled"]))
        self.ctx = DaemonContext(config=config.values, token=self.token, outbox=self.outbox, inbox=self.inbox,
                                 link=self.link, events=self.bus, committer=self.committer, metrics=self.metrics,
                                 member_pubkey=self.keypair.public_hex, clock=self.clock,
                                 started_at=self.clock(), parse_send=parts.parse_send,
                                 # req: API-SCHEMA-VERSION -- E-47: migrations applied to both files
                                 schema_version=self.outbox.schema_version + self.inbox.schema_version,
                                 capabilities=self.capabilities)
        self.app = parts.create_app(self.ctx, self.requeue)
        self._closed = threading.Event()
        self.hook_runner: HookRunner | None = None
        if self.hooks is not None:
            submit = outbox_reply(self.ctx.parse_send, self.committer.submit, self.ctx.mint_id, self.clock.ms,
                                  self.link.wake)
            self.hook_runner = HookRunner(
                HookRuns(self.inbox, int(config["hooks"]["max_claims"])), self.hooks, hooks_folder(state_dir, config),
                inbox_row=self.inbox.by_seq, submit_reply=submit, mesh=config["daemon"]["mesh"],
                socket_path=str(files.socket), clock_ms=self.clock.ms, concurrency=int(config["hooks"]["concurrency"]),
                on_finish=self._hook_finished, on_unenforceable=self.metrics.unenforceable, publish=self.bus.publish,
                capabilities=self.capabilities)
            self.receiver.runner = self.hook_runner

    def _hook_finished(self, run: Any) -> None:
        duration = (run.result or {}).get("duration_ms")
        self.metrics.hook(run.hook, run.state, None if duration is None else duration / 1000)
        if self.trace is not None:  # after the mark's commit, as every trace event follows its commit (E-32)
            trace_hook_run(self.trace, self.config["daemon"]["mesh"], run)

    def _trace_store(self, item: Any) -> None:
        trace_store_item(self.trace, self.config["daemon"]["mesh"], item)

    def start(self, stop_master: Callable[[], None] | None = None) -> None:
        self._stop_master = stop_master
        if self.hook_runner is not None:
            self.hook_runner.start()
        self.link.start()
        threading.Thread(target=self._watch_link, name="meshd-link-watchdog", daemon=True).start()

    def _watch_link(self) -> None:
        """Restart the broker-link thread should it ever end while the daemon runs (E-41; health says so)."""
        while not self._closed.wait(WATCHDOG_S) and not self.ctx.draining.is_set():
            try:
                self.link.watch()
            except Exception:
                log.exception("the link watchdog failed; it looks again in %s s", WATCHDOG_S)

    def _fatal(self, code: int, reason: str) -> None:
        log.error("fatal: %s", reason)
        if self._on_fatal is not None:
            self._on_fatal(code, reason)
        if self._stop_master is not None:
            self._stop_master()

    def requeue(self, outbox_id: str, new_client_message_id: str | None, actor: str) -> dict[str, Any]:
        """§4.5.3 for the IPC route and the CLI: returns {aborted_row_id, new_row_id, new_client_message_id}."""
        return requeue(self.outbox, outbox_id, new_client_message_id, actor, self.link.wake, self.clock)

    def shutdown(self) -> None:
        """SIGTERM: refuse writes, end the streams, wait for outstanding acks, close the link (E-15)."""
        if self.ctx.draining.is_set():
            return
        self.ctx.draining.set()
        if self.hook_runner is not None:
            self.hook_runner.stop()
        self.bus.close()
        # req: LIFE-DRAIN
        self.link.drain_and_stop(float(self.config["daemon"]["drain_timeout_s"]))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self.shutdown()
        self.committer.close()
        self.outbox.close()
        self.inbox.close()
        if self.trace is not None:
            self.trace.close()


def requeue(outbox: OutboxStore, outbox_id: str, new_client_message_id: str | None, actor: str,
            wake: Callable[[], None] = lambda: None, clock: WallClock | None = None) -> dict[str, Any]:
    """Shared by POST /v1/outbox/requeue and `meshd outbox requeue`; raises Problem on refusal."""
    from reference.core import is_client_message_id, is_hook_reply_id

    if new_client_message_id is not None and not is_client_message_id(new_client_message_id):
        raise Problem("invalid_client_message_id", "new_client_message_id does not match the id grammar")
    # req: HOOK-REPLY-ID-RESERVED -- nor may a requeue take a hook reply's id
    if is_hook_reply_id(new_client_message_id):
        raise Problem("invalid_client_message_id", "new_client_message_id: ids beginning 'hook.' are reserved for the "
                      "daemon's hook replies (E-48)")
    # req: REQUEUE-FRESH-ID
    cmid = new_client_message_id or str(ULID())
    successor_id = str(ULID())
    try:
        now_ms = clock.ms() if clock is not None else int(outbox.clock())
        result = outbox.requeue(outbox_id, cmid, successor_id, now_ms, actor=actor)
    except OutboxRowNotFound as exc:
        raise Problem("outbox_row_not_found", f"no outbox row {outbox_id}") from exc
    # req: REQUEUE-NEW-ID-IN-USE -- 409 with the row's frozen fingerprint's prefix (E-29)
    except NewIdInUse as exc:
        row = outbox.get(outbox_id)
        prefix = row.request_fingerprint[:8].hex() if row is not None else None
        raise Problem("idempotency_key_reused", f"{cmid} is already bound to an outbox row",
                      conflict="requeue_new_id_in_use", client_message_id=cmid,
                      daemon_fingerprint_prefix=prefix) from exc
    # req: REQUEUE-STATES-REFUSED -- 409 outbox_requeue_state_invalid
    if result.outcome != "transition":
        raise Problem("outbox_requeue_state_invalid",
                      f"row {outbox_id} is {result.before.status}; only dead and pending rows can be requeued")
    wake()
    return {"aborted_row_id": result.after.id, "new_row_id": result.successor.id,
            "new_client_message_id": result.successor.client_message_id}


class InboxReceiver:
    """Turns a broker ``push`` into an inbox row and its ``message`` event, in one transaction (with the row's hook
    runs, traced as ``hook_enqueue`` events after its ``inbox_insert``)."""

    def __init__(self, inbox: InboxStore, bus: EventBus, hooks: list[Hook] | None = None,
                 clock_ms: Callable[[], int] = lambda: 0, trace: TraceWriter | None = None):
        self.inbox = inbox
        self.bus = bus
        self.hooks = hooks or []
        self.clock_ms = clock_ms
        self.trace = trace
        self.runner: HookRunner | None = None  # woken when a stored message has runs

    def receive(self, frame: dict[str, Any], mesh: str, now_ms: int,
                traced: Callable[[dict[str, Any] | None], None] | None = None) -> dict[str, Any] | None:
        """Store the pushed message (``None`` for a duplicate) and announce its event; ``traced`` is called with the
        result after the commit and before the event is announced, so the row's ``inbox_insert`` precedes its
        ``hook_enqueue`` events and its ``message`` ``sse_event`` in the trace (E-32), and the runs are traced
        before a worker is woken to claim them."""
        message = InboxMessage(
            id=str(ULID()), client_message_id=frame["client_message_id"], mesh=mesh,
            sender_pubkey=frame["senderPubkey"], sender_name=frame.get("senderName") or "", received_at=now_ms,
            broker_message_id=frame["messageId"], topic=frame.get("topic"), body=frame.get("body"),
            meta=frame.get("meta") or None, reply_to_id=frame.get("replyToId") or None,
            delivery_id=frame.get("delivery_id"),
        )
        runs: list[str] = []
        hooks: list[str] = []

        def with_row(conn: sqlite3.Connection, row: InboxRow, event_id: int) -> None:
            names = matching(self.hooks, row)
            runs.extend(enqueue_runs(conn, row, names, self.clock_ms(), event_id))
            hooks[:] = names

        # req: HOOK-INBOX-FIRST -- a message's hook runs are written in the transaction that stores it (§5)
        stored = self.inbox.insert_with_event(message, message_payload, with_row=with_row if self.hooks else None)
        inserted = None if stored is None else {"seq": stored[0].seq, "id": stored[0].id}
        if traced is not None:
            traced(inserted)
        if stored is not None and self.trace is not None:
            for hook in hooks:
                self.trace.emit("hook_enqueue", mesh=mesh, client_message_id=stored[0].client_message_id,
                                broker_message_id=frame["messageId"], inbox_seq=stored[0].seq, hook=hook)
        if runs and self.runner is not None:
            self.runner.notify()
        # req: INB-DEDUPE-EVENT -- a duplicate publishes no event
        if stored is None:
            return None
        self.bus.notify(stored[1], "message")
        return inserted

    def quarantine(self, **record: Any) -> tuple[int, bool]:
        """Keep an inbound frame the daemon could not take (E-41); see ``InboxStore.quarantine``."""
        return self.inbox.quarantine(**record)

    def mark_quarantine_acked(self, quarantine_id: int) -> None:
        self.inbox.mark_quarantine_acked(quarantine_id)


def message_payload(row: InboxRow) -> dict[str, Any]:
    """The `message` SSE payload (spec/schemas/sse/message.json)."""
    from .app import inbox_item

    # req: SSE-PAYLOADS -- spec/schemas/sse/message.json
    item = inbox_item(row.as_dict())
    return {"inbox_id": item.pop("id"), **item}
