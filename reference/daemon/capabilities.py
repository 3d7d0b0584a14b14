"""Hook capability tokens (§6.2, E-50): what a running hook may ask of the daemon, and who is a running hook.

A hook whose ``hooks.toml`` entry lists ``capability_token_scope`` gets a token for one run: 32 random bytes,
valid until its process exits or ``hook_capability_ttl_s`` passes, whichever is first. The scopes are bound to the
message that fired the hook when the token is minted (v4 §6.2): ``reply:event`` grants a send to the message's topic
or, for a direct message, to its sender, answering that message (``reply_to_id``); ``dm:send:<sender_pubkey>`` a
direct message to the message's sender; ``topic:<name>:post`` a send to that topic when it is the message's topic.
Only ``POST /v1/send`` is ever granted: there are no read scopes.

The registry also knows the process group of every running hook, token or not, so the guard can refuse a request
that comes over the unix socket from a hook's process without presenting its token (``capability_required``): the
socket itself takes no credential (E-27), and a hook runs as the daemon's user. A token is bound to its hook's process
group: presented from any other process (another hook that read it from /proc, any local program) it is refused. A
connection whose opening process is gone cannot be told from a hook's (a hook can connect from a child that exits
and talk on the socket itself), so while hooks are on it is refused too.
"""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reference.core.limits import limit

SCHEME = "ClaudeMesh-Capability"
SENDER_SCOPE = "dm:send:<sender_pubkey>"  # v4 §6.2's spelling: bound to the sender of the message that fired
TTL_S = float(limit("hook_capability_ttl_s"))
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Grant:
    """One destination a token may send to: ``(kind, ref)`` as parse_destination resolves it, and the scope that
    grants it; ``reply_to_id`` is the id the send must answer (``reply:event``), or None for any."""

    scope: str
    kind: str
    ref: str
    reply_to_id: str | None = None


def bind_scopes(scopes: tuple[str, ...], topic: str | None, sender_pubkey: str,
                broker_message_id: str | None) -> tuple[Grant, ...]:
    """What ``scopes`` grant for the message that fired the hook (v4 §6.2: every scope is bound to that message)."""
    grants = []
    for scope in scopes:
        if scope == "reply:event":
            kind, ref = ("topic", topic) if topic is not None else ("dm", sender_pubkey.lower())
            grants.append(Grant(scope, kind, ref, broker_message_id or ""))
        elif scope == SENDER_SCOPE:
            grants.append(Grant(scope, "dm", sender_pubkey.lower()))
        elif scope.startswith("topic:") and scope.endswith(":post"):
            name = scope[len("topic:"):-len(":post")]
            # req: HOOK-CAP-SCOPE -- a topic scope grants the topic that fired, never another one
            if name == topic:
                grants.append(Grant(scope, "topic", name))
    return tuple(grants)


@dataclass
class Capability:
    """The token of one hook run."""

    token: str
    hook: str
    run_id: int
    grants: tuple[Grant, ...]
    expires: float  # monotonic
    calls: int = 0
    refused: int = 0
    pgid: int | None = None
    live: bool = True

    def grant_for(self, kind: str, ref: str, reply_to_id: str) -> Grant | None:
        """The grant that allows a send to ``(kind, ref)`` answering ``reply_to_id``, or None."""
        for grant in self.grants:
            if (grant.kind, grant.ref) == (kind, ref) and grant.reply_to_id in (None, reply_to_id):
                return grant
        return None


@dataclass
class Capabilities:
    """The live tokens and running hook process groups of one daemon process (thread-safe)."""

    ttl_s: float = TTL_S
    clock: Callable[[], float] = time.monotonic
    hooks_enabled: bool = False  # whether this daemon runs hooks: only then can a unix-socket peer be a hook
    on_call: Callable[[str, str], None] | None = None  # (hook, granting scope or "none") per call with a token
    _tokens: dict[str, Capability] = field(default_factory=dict)
    _groups: dict[int, int] = field(default_factory=dict)  # pgid -> running hooks in it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mint(self, hook: str, run_id: int, grants: tuple[Grant, ...]) -> Capability:
        """A fresh token for one run of ``hook``."""
        capability = Capability(secrets.token_urlsafe(32), hook, run_id, grants, self.clock() + self.ttl_s)
        with self._lock:
            self._tokens[capability.token] = capability
        return capability

    def enter(self, pgid: int, capability: Capability | None = None) -> None:
        """A hook's process group started (``capability`` is its token, if it has one)."""
        with self._lock:
            self._groups[pgid] = self._groups.get(pgid, 0) + 1
            if capability is not None:
                capability.pgid = pgid

    def revoke(self, capability: Capability | None) -> None:
        """The hook's process exited: its token dies with it (what it left running is killed next)."""
        if capability is None:
            return
        with self._lock:
            # req: HOOK-CAP-REVOKED -- the token dies with the hook's process
            capability.live = False
            self._tokens.pop(capability.token, None)

    def leave(self, pgid: int | None, capability: Capability | None = None) -> None:
        """The hook's group was killed: it is no longer a hook's (and its token, if still live, is revoked)."""
        self.revoke(capability)
        with self._lock:
            if pgid is not None and pgid in self._groups:
                self._groups[pgid] -= 1
                if not self._groups[pgid]:
                    del self._groups[pgid]

    def lookup(self, presented: str) -> Capability | None:
        """The live capability ``presented`` names, or None (unknown, revoked or past its lifetime)."""
        now = self.clock()
        with self._lock:
            for token, capability in list(self._tokens.items()):
                if capability.expires <= now:
                    # req: HOOK-CAP-REVOKED -- at most hook_capability_ttl_s
                    capability.live = False
                    del self._tokens[token]
            found = None
            for token, capability in self._tokens.items():  # every live token compared, in constant time each
                if hmac.compare_digest(token.encode(), presented.encode()):
                    found = capability
            return found

    def called(self, capability: Capability, scope: str | None) -> None:
        """Count one request made with ``capability``: granted by ``scope``, or refused (None)."""
        with self._lock:
            if scope is None:
                capability.refused += 1
            capability.calls += 1
        if self.on_call is not None:
            self.on_call(capability.hook, scope or "none")

    def hook_process(self, pid: int | None) -> str | None:
        """Why the process at the other end of a connection (``pid``, from SO_PEERCRED) may be a hook's, or None:
        it is in the process group of a running hook, or it is gone (its connection handed to another process)."""
        if pid is None:  # the platform does not say who connected
            return None
        try:
            pgid = os.getpgid(pid)
        except OSError:
            # req: HOOK-CAP-REQUIRED -- a connection whose opener is gone may be a hook's, handed on
            return "the process that opened this connection is gone, so it cannot be told from a hook's"
        with self._lock:
            return "it is in the process group of a running hook" if pgid in self._groups else None

    def bound(self, capability: Capability, pid: int | None) -> bool:
        """Whether ``pid`` (SO_PEERCRED; None where the platform does not say) is in ``capability``'s hook group."""
        if pid is None:
            return True
        try:
            return capability.pgid is not None and os.getpgid(pid) == capability.pgid
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return bool(self._groups)


def peer_pid(sock: object) -> int | None:
    """The pid of the process at the other end of unix socket ``sock`` (Linux SO_PEERCRED), None where unknown."""
    raw = getattr(sock, "raw", sock)  # DeadlineSocket wraps the real one
    if not hasattr(socket, "SO_PEERCRED") or not isinstance(raw, socket.socket) or raw.family != socket.AF_UNIX:
        return None
    try:
        pid, _, _ = _PEERCRED.unpack(raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return None
    return pid or None
