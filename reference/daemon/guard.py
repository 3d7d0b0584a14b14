"""Transport security and limits for every IPC request (§3.2, §3.4).

Order of checks: Host over TCP (403 forbidden_host), Origin (403 forbidden_origin), token in the query string (400
token_in_query), a hook's capability token (E-50: 403 over TCP, 401 capability_invalid, 403 capability_denied for a
route it can never call) or, on the unix socket, a running hook's process that presents none (403
capability_required), bearer token over TCP (401, compared in constant time), then the in-flight cap (429
daemon_busy). The destination of a send made with a capability token is checked by the send route, once parsed.
Requests over the unix socket skip the Host and bearer checks (E-27): no browser can reach a unix socket, its 0600
mode is the gate, and unix-socket clients put arbitrary names in Host. The in-flight cap is counted per transport
(E-43): requests held up on TCP never make the unix socket answer 429.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time

import falcon
from gunicorn.http.errors import ParseException

from reference.core.limits import limit

from .capabilities import SCHEME as CAPABILITY_SCHEME
from .capabilities import Capabilities, peer_pid
from .deadlines import DeadlineSocket, ReadTimeout
from .problems import Problem

log = logging.getLogger("meshd.ipc")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
QUERY_TOKEN_NAMES = frozenset({"token", "access_token", "local_token"})
UNIX = "unix"
TCP = "tcp"
DRAIN_MAX_BYTES = int(limit("ipc_drain_bytes"))
DRAIN_MAX_S = float(limit("ipc_drain_s"))
DRAIN_IDLE_S = float(limit("ipc_drain_idle_s"))


def transport_of(env: dict) -> str:
    """`unix` for requests that arrived on the unix socket, `tcp` otherwise (set by the server, see server.py)."""
    return env.get("meshd.transport", TCP)


def host_is_loopback(host: str | None) -> bool:
    """True for an empty Host or one of the three names v3 §3.3 allows — ``localhost``, ``127.0.0.1``, ``[::1]`` —
    with or without a port (``[::1]:8080`` included). Other loopback addresses (``127.0.0.2``) are not on the list."""
    # req: AUTH-HOST -- empty, localhost, 127.0.0.1 or [::1], with any port
    if not host:
        return True
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return False
        name = host[1:end]
        rest = host[end + 1:]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return False
    else:
        name, _, port = host.partition(":")
        if port and not port.isdigit():
            return False
    return name in LOOPBACK_HOSTS


class Guard:
    """Falcon middleware enforcing §3.2 and the in-flight cap."""

    def __init__(self, token: str, max_inflight: int, public_paths: frozenset[str] = frozenset(),
                 capabilities: Capabilities | None = None):
        self._token = token.encode()
        self._capabilities = capabilities
        self._max_inflight = max_inflight
        self._inflight = {UNIX: 0, TCP: 0}
        self._lock = threading.Lock()
        self._public_paths = public_paths

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.counted = False
        tcp = transport_of(req.env) == TCP
        # req: AUTH-HOST, AUTH-HOST-TCP-ONLY
        if tcp and not host_is_loopback(req.get_header("Host")):
            raise Problem("forbidden_host", "the Host header must be localhost, 127.0.0.1 or [::1]")
        # req: AUTH-ORIGIN, AUTH-ORIGIN-BOTH -- a CORS preflight carries Origin too
        if req.get_header("Origin") is not None:
            raise Problem("forbidden_origin", "requests from browser origins are refused")
        # req: AUTH-TOKEN-QUERY, AUTH-TOKEN-QUERY-BOTH
        if QUERY_TOKEN_NAMES & set(req.params):
            log.warning("ipc_token_in_query_string_rejected path=%s", req.path)
            raise Problem("token_in_query", "send the token in the Authorization header, never in the URL")
        req.context.capability, req.context.capability_scope = None, None
        scheme, _, presented = (req.get_header("Authorization") or "").partition(" ")
        if scheme.lower() == CAPABILITY_SCHEME.lower():
            self._check_capability(req, tcp, presented.strip())
            return
        caps = self._capabilities
        if not tcp and caps is not None and caps.hooks_enabled:
            why = caps.hook_process(peer_pid(req.env.get("gunicorn.socket")))
            if why:
                # req: HOOK-CAP-REQUIRED -- a hook's process has its token's rights or none
                log.warning("ipc_hook_without_capability path=%s: %s", req.path, why)
                raise Problem("capability_required", f"{why}: a hook's process calls the daemon with its capability "
                              f"token (Authorization: {CAPABILITY_SCHEME} <CLAUDEMESH_CAPABILITY_TOKEN>), and only for "
                              "what its capability_token_scope grants")
        # req: AUTH-BEARER -- every route over TCP
        if tcp and req.path not in self._public_paths:
            self._check_bearer(req.get_header("Authorization"))
        if req.method == "OPTIONS":
            problem = Problem("method_not_allowed", "no CORS: OPTIONS is not served")
            problem.headers["Allow"] = "GET, POST"
            raise problem

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource, params) -> None:
        transport = transport_of(req.env)
        with self._lock:
            # req: LIMIT-INFLIGHT, IPC-TRANSPORT-CAPACITY -- counted per transport
            if self._inflight[transport] >= self._max_inflight:
                problem = Problem("daemon_busy", f"more than {self._max_inflight} requests in flight over {transport}")
                problem.headers["Retry-After"] = "1"
                raise problem
            self._inflight[transport] += 1
            req.context.counted = transport

    def _check_capability(self, req: falcon.Request, tcp: bool, presented: str) -> None:
        # req: HOOK-CAP-LOCAL -- local IPC only: the unix socket
        if tcp:
            raise Problem("capability_denied", f"{CAPABILITY_SCHEME} tokens are taken on the unix socket only")
        capability = self._capabilities.lookup(presented) if self._capabilities is not None and presented else None
        if capability is None:
            # req: HOOK-CAP-REVOKED -- unknown, revoked at the hook's exit, or past hook_capability_ttl_s
            problem = Problem("capability_invalid", "the capability token is unknown, expired or revoked: it lives "
                              "until its hook exits")
            problem.headers["WWW-Authenticate"] = f'{CAPABILITY_SCHEME} realm="meshd"'
            raise problem
        req.context.capability = capability  # counted as it leaves (process_response), whatever the answer
        # req: HOOK-CAP-SCOPE -- bound to its hook's process group: a token read from /proc by anyone else is refused
        if not self._capabilities.bound(capability, peer_pid(req.env.get("gunicorn.socket"))):
            raise Problem("capability_denied", f"the token of hook {capability.hook} is bound to its hook's process "
                          "group, and this connection is not from it")
        # req: HOOK-CAP-SCOPE -- no read scopes: a token can only ever send
        if (req.method, req.path) != ("POST", "/v1/send"):
            raise Problem("capability_denied", f"a capability token grants POST /v1/send only, not {req.method} "
                          f"{req.path[:200]}")

    def check_grant(self, req: falcon.Request, kind: str, ref: str, reply_to_id: str) -> None:
        """403 unless the request's capability grants a send to ``(kind, ref)`` answering ``reply_to_id``."""
        capability = req.context.capability
        grant = capability.grant_for(kind, ref, reply_to_id)
        if grant is not None:
            req.context.capability_scope = grant.scope
        else:
            # req: HOOK-CAP-SCOPE -- bound to the message that fired the hook
            scopes = ", ".join(sorted({g.scope for g in capability.grants})) or "none for this message"
            raise Problem("capability_denied", f"the token of hook {capability.hook} does not grant a send to "
                          f"{kind} {ref[:80]}" + (f" answering {reply_to_id[:80]}" if reply_to_id else "") +
                          f" (its scopes: {scopes})")

    def _check_bearer(self, header: str | None) -> None:
        scheme, _, presented = (header or "").partition(" ")
        if not header:
            problem = Problem("missing_bearer_token", "over TCP every route needs Authorization: Bearer <local_token>")
        elif scheme.lower() != "bearer" or not presented.strip():
            problem = Problem("missing_bearer_token", "the Authorization header must use the Bearer scheme")
        # req: AUTH-CONSTANT-TIME
        elif not hmac.compare_digest(presented.strip().encode(), self._token):
            log.warning("ipc_bearer_mismatch")
            problem = Problem("invalid_bearer_token", "the bearer token does not match local_token")
        else:
            return
        # req: AUTH-BEARER-401
        problem.headers["WWW-Authenticate"] = 'Bearer realm="meshd"'
        raise problem

    def release(self, req: falcon.Request) -> None:
        """Free the request's in-flight slot (idempotent)."""
        transport = getattr(req.context, "counted", False)
        if transport:
            req.context.counted = False
            with self._lock:
                self._inflight[transport] -= 1

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource, req_succeeded: bool) -> None:
        # An event stream has already released its slot (it counts against max_streams instead); release is idempotent.
        self.release(req)
        capability = getattr(req.context, "capability", None)
        if capability is not None:
            # E-50: every request made with a live token, by the scope that granted it or none (refused at any step)
            self._capabilities.called(capability, req.context.capability_scope)

    @property
    def inflight(self) -> int:
        return sum(self._inflight.values())


def body_stream(req: falcon.Request):
    """The request body: Content-Length bounded, or the server's own reader for a chunked body (E-34)."""
    # req: IPC-HTTP-BODY -- a chunked body is held to the route's limit like a Content-Length one
    if req.content_length is None and req.env.get("wsgi.input_terminated") and _chunked(req):
        return req.stream
    return req.bounded_stream


def _chunked(req: falcon.Request) -> bool:
    return "chunked" in (req.get_header("Transfer-Encoding") or "").lower()


class BodyDrain:
    """Falcon middleware: the part of a request body a handler did not read is read and dropped before the answer.

    An answer given before the body was read (413, 415, 401, 429, ...) would otherwise leave the body on the socket,
    the server would close on it, and the client, still writing, could lose the answer to a reset (RFC 9112 §9.6).
    The drain reads while the body keeps coming: it stops past ``DRAIN_MAX_BYTES``, after ``DRAIN_MAX_S`` in all, or
    when no byte has come for ``DRAIN_IDLE_S`` (E-34, E-43) -- these hold while a read blocks, through the
    connection's ``DeadlineSocket`` -- and the answer then says ``Connection: close`` (the server half-closes and
    lingers off the request thread, so the answer still reaches the client).
    """

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource, req_succeeded: bool) -> None:
        length = req.content_length
        if length is None and not _chunked(req):
            return
        if length is not None and length > DRAIN_MAX_BYTES:
            resp.set_header("Connection", "close")
            return
        stream = body_stream(req)
        if length is not None and stream.eof:
            return
        sock = req.env.get("gunicorn.socket")
        bounded = isinstance(sock, DeadlineSocket)
        end = time.monotonic() + DRAIN_MAX_S
        if bounded and sock.deadline is not None:
            end = min(end, sock.deadline)
        drained = 0
        try:
            # req: IPC-HTTP-BODY -- an early answer's unread body is read and dropped
            while drained <= DRAIN_MAX_BYTES and time.monotonic() < end:
                if bounded:
                    sock.until(min(end, time.monotonic() + DRAIN_IDLE_S))
                chunk = stream.read(64 * 1024)
                if not chunk:
                    return
                drained += len(chunk)
        except (OSError, ValueError, ReadTimeout, ParseException):  # gone, stalled, or a broken chunk
            pass
        resp.set_header("Connection", "close")
