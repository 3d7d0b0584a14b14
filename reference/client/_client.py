"""The client: discovery (§8), the /v1 calls, retries under one idempotency key, and a resuming event stream.

Rules of this file. Standard library only: it must import where nothing of meshspec's dependencies is installed
(http.client speaks HTTP/1.1 over any socket, which is all a unix socket needs; no library for that is in the
standard library). Every call opens its own connection, so a daemon restart between two calls costs nothing.
A send is retried only under the key it was first sent with, so a retry can never send twice (§4.5.1).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import random
import secrets
import socket
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._types import Event, Health, InboxPage, OutboxPage, ProfileResult, RequeueResult, SendResult, Version

IPC_API = "v1"
#: the statuses a send is retried on, with the same key: the daemon is busy or draining, or the broker is away
RETRY_STATUSES = frozenset({429, 503})
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class MeshError(Exception):
    """The daemon answered with a problem (RFC 9457), or could not be reached. ``problem`` is the body as sent."""

    def __init__(self, message: str, status: int | None = None, problem: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}
        self.code: str | None = self.problem.get("error")


class Conflict(MeshError):
    """409: the ``client_message_id`` is bound to another request or state (§4.5.1). ``conflict`` names the row."""

    @property
    def conflict(self) -> str | None:
        return self.problem.get("conflict")

    @property
    def client_message_id(self) -> str | None:
        return self.problem.get("client_message_id")


class Unavailable(MeshError):
    """The daemon stayed busy, draining or unreachable past the call's deadline; ``retry_after`` is its last hint."""

    def __init__(self, message: str, status: int | None = None, problem: dict[str, Any] | None = None,
                 retry_after: float | None = None):
        super().__init__(message, status, problem)
        self.retry_after = retry_after


class DaemonNotFound(MeshError):
    """No daemon of this mesh answered on the socket or on TCP; the message lists what was tried."""


def new_client_message_id() -> str:
    """A fresh idempotency key: a ULID (48 bits of milliseconds, 80 random bits, Crockford base32)."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def default_state_dir(mesh: str | None = None) -> Path:
    """``$MESHD_STATE_DIR``, else ``~/.claudemesh/daemon/<mesh>`` (``default`` when no mesh is given)."""
    env = os.environ.get("MESHD_STATE_DIR")
    return Path(env) if env else Path.home() / ".claudemesh" / "daemon" / (mesh or "default")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass
class Endpoint:
    """Where a daemon listens: its unix socket, or its TCP port with the file holding the bearer token."""

    socket_path: str | None = None
    port: int | None = None
    token_file: Path | None = None
    capability_token: str | None = None  # a hook's (CLAUDEMESH_CAPABILITY_TOKEN), sent on the socket

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixConnection(self.socket_path, timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def authorization(self) -> str | None:
        if self.socket_path is not None:
            return f"ClaudeMesh-Capability {self.capability_token}" if self.capability_token else None
        return f"Bearer {self.token_file.read_text(encoding='ascii').strip()}" if self.token_file else None


class Client:
    """A client of one daemon. ``discover()`` finds it the way §8 says; or give the endpoint yourself."""

    def __init__(self, endpoint: Endpoint, timeout: float = 10.0):
        self.endpoint = endpoint
        self.timeout = timeout

    # --- transport ------------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout: float | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh connection: the status, the headers (lower-case names) and the body.
        Over TCP a 401 re-reads the token file once (the token may have been rotated) and tries again."""
        for attempt in (1, 2):
            sent = dict(headers or {})
            authorization = self.endpoint.authorization()
            if authorization:
                sent["Authorization"] = authorization
            payload = None
            if body is not None:
                payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
                sent["Content-Type"] = "application/json"
            conn = self.endpoint.connection(self.timeout if timeout is None else timeout)
            try:
                conn.request(method, path, body=payload, headers=sent)
                answer = conn.getresponse()
                status, data = answer.status, answer.read()
                answer_headers = {k.lower(): v for k, v in answer.getheaders()}
            finally:
                conn.close()
            if status == 401 and attempt == 1 and self.endpoint.token_file is not None:
                # req: SDK-TOKEN-REREAD -- a rotated token: authorization() reads the file again
                continue
            return status, answer_headers, data
        raise AssertionError("unreachable")

    def _typed(self, result: type, method: str, path: str, body: Any = None) -> Any:
        """The answer of one call as ``result`` (a class of _types), or MeshError naming the members it lacks."""
        document = self._json(method, path, body)
        try:
            return result.from_json(document)
        except (TypeError, KeyError, AttributeError) as exc:
            raise MeshError(f"{method} {path}: the answer is not a {result.__name__} of /v1: {exc}") from exc

    def _json(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)) -> Any:
        try:
            status, headers, data = self.request(method, path, body)
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if status not in ok:
            raise _problem(method, path, status, headers, data)
        return json.loads(data)

    # --- the core surface -----------------------------------------------------------------------------------------
    def version(self) -> Version:
        return self._typed(Version, "GET", "/v1/version")

    def health(self) -> Health:
        return self._typed(Health, "GET", "/v1/health")

    def peers(self) -> list[dict[str, Any]]:
        """The broker's peer list, as it came (``GET /v1/peers``)."""
        return self._json("GET", "/v1/peers")["peers"]

    def profile(self, **members: Any) -> ProfileResult:
        """Set summary, status, visible, avatar, title, bio or capabilities (``POST /v1/profile``)."""
        return self._typed(ProfileResult, "POST", "/v1/profile", members)

    def outbox(self, status: str | None = None, limit: int | None = None, cursor: str | None = None) -> OutboxPage:
        return self._typed(OutboxPage, "GET", "/v1/outbox" + _query(status=status, limit=limit, cursor=cursor))

    def requeue(self, outbox_id: str, new_client_message_id: str | None = None) -> RequeueResult:
        body = {"id": outbox_id, **({"new_client_message_id": new_client_message_id} if new_client_message_id else {})}
        return self._typed(RequeueResult, "POST", "/v1/outbox/requeue", body)

    def send(self, to: str, message: str, *, client_message_id: str | None = None, priority: str | None = None,
             meta: Any = None, reply_to_id: str | None = None, deadline_s: float = 60.0) -> SendResult:
        """Send once, whatever happens on the way (§4.5.1): the key (given, or minted here) goes with every retry.

        Retries 429 and 503 after their Retry-After, and a connection lost before the answer, until ``deadline_s``.

        Raises:
            Conflict: 409: the key is bound to another request or state.
            Unavailable: still busy or unreachable at the deadline.
            MeshError: any other refusal (400, 413, ...): retrying it would not help.
        """
        # req: SDK-SAME-KEY -- given or minted once, then the key of every attempt
        key = client_message_id or new_client_message_id()
        body: dict[str, Any] = {"to": to, "message": message, "client_message_id": key}
        for name, value in (("priority", priority), ("meta", meta), ("reply_to_id", reply_to_id)):
            if value is not None:
                body[name] = value
        end = time.monotonic() + deadline_s
        for attempt in range(1_000_000):
            hint, failure, status, problem = None, "", None, None
            try:
                status, headers, data = self.request("POST", "/v1/send", body)
            except (OSError, http.client.HTTPException) as exc:  # lost before the answer: maybe stored, so same key
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if status in (200, 202):
                    return SendResult.from_json(json.loads(data))
                error = _problem("POST", "/v1/send", status, headers, data)
                if status not in RETRY_STATUSES:
                    # req: SDK-NO-RETRY-REFUSED, SDK-TYPED-CONFLICT -- a 409 is a Conflict, raised at once
                    raise error
                hint, failure, problem = retry_after(headers.get("retry-after")), str(error), error.problem
            left = end - time.monotonic()
            # req: SDK-RETRY-AFTER
            # Retry-After is honoured, never cut short; without one, backoff with jitter, and a last try at the end
            wait = hint if hint is not None else min(left, min(5.0, 0.05 * 2 ** attempt) * (0.5 + random.random() / 2))
            if left <= 0 or wait > left:
                raise Unavailable(f"send {key}: {failure}; gave up at the {deadline_s} s deadline", status, problem,
                                  hint)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def inbox(self, *, cursor: str | None = None, since: str | None = None, topic: str | None = None,
              sender: str | None = None, limit: int | None = None) -> InboxPage:
        """One page of received messages, oldest first, after ``cursor``."""
        return self._typed(InboxPage, "GET", "/v1/inbox" + _query(
            cursor=cursor, since=since, topic=topic, limit=limit, **{"from": sender}))

    def inbox_pages(self, *, cursor: str | None = None, **filters: Any) -> Iterator[InboxPage]:
        """Every page after ``cursor`` up to the first empty one; resume later from the last ``next_cursor``."""
        while True:
            # req: SDK-INBOX-CURSOR -- to the first empty page, each page after the last one's next_cursor
            page = self.inbox(cursor=cursor, **filters)
            if not page.items:
                return
            yield page
            cursor = page.next_cursor

    def events(self, last_event_id: int | None = None, *, reconnect_s: float = 30.0,
               read_timeout_s: float = 60.0) -> Iterator[Event]:
        """The event stream, each event once: after a drop it reconnects with ``Last-Event-ID`` (the daemon replays
        from there, at least once) and skips what it already yielded. Gives up after ``reconnect_s`` without a
        connection (Unavailable). ``read_timeout_s`` must exceed the daemon's keepalive interval."""
        last = last_event_id
        down_since: float | None = None
        attempt = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                # req: SDK-EVENTS-RESUME -- the last event yielded; the replay's repeats are skipped below
                headers["Last-Event-ID"] = str(last)
            conn = self.endpoint.connection(read_timeout_s)
            try:
                authorization = self.endpoint.authorization()
                if authorization:
                    headers["Authorization"] = authorization
                conn.request("GET", "/v1/events", headers=headers)
                answer = conn.getresponse()
                if answer.status != 200:
                    error = _problem("GET", "/v1/events", answer.status, dict(answer.getheaders()), answer.read())
                    if answer.status not in RETRY_STATUSES:
                        raise error
                    raise ConnectionError(str(error))
                down_since, attempt = None, 0
                for event in _sse(answer):
                    if event.id is not None:
                        if last is not None and event.id <= last:
                            continue  # replayed after a resume: yielded already
                        last = event.id
                    yield event
                raise ConnectionError("the daemon closed the stream")
            except (OSError, http.client.HTTPException) as exc:
                now = time.monotonic()
                down_since = now if down_since is None else down_since
                if now - down_since > reconnect_s:
                    raise Unavailable(f"GET /v1/events: {type(exc).__name__}: {exc}; no connection for "
                                      f"{reconnect_s} s") from exc
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
                attempt += 1
            finally:
                conn.close()


def _sse(answer: http.client.HTTPResponse) -> Iterator[Event]:
    """The events of a text/event-stream body (WHATWG HTML §9.2), as the daemon frames them: ``id``, ``event``,
    one ``data`` line of JSON; comment lines (keepalives) are skipped; an event cut by a drop is never yielded."""
    event_id, name, data = None, "message", []
    while True:
        line = answer.readline()
        if not line:
            return
        if not line.endswith(b"\n"):
            return  # cut mid-line: the stream dropped
        text = line.decode("utf-8").rstrip("\r\n")
        if not text:
            if data:
                yield Event(event_id, name, json.loads("\n".join(data)))
            event_id, name, data = None, "message", []
            continue
        key, _, value = text.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "id" and value.isdigit():
            event_id = int(value)
        elif key == "event":
            name = value
        elif key == "data":
            data.append(value)


def retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` asks for (delta-seconds or an HTTP-date, RFC 9110 §10.2.3), None if absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _problem(method: str, path: str, status: int, headers: dict[str, str], data: bytes) -> MeshError:
    try:
        problem = json.loads(data) if data else {}
    except ValueError:
        problem = {}
    problem = problem if isinstance(problem, dict) else {}
    message = f"{method} {path}: {status} {problem.get('error', '')}: {problem.get('detail', '')}".rstrip(": ")
    if status == 409:
        return Conflict(message, status, problem)
    if status in RETRY_STATUSES:
        return Unavailable(message, status, problem, retry_after(headers.get("retry-after")))
    return MeshError(message, status, problem)


def _query(**params: Any) -> str:
    present = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(present) if present else ""


def _answers(endpoint: Endpoint, mesh: str | None, connect_timeout_s: float, timeout: float) -> str | None:
    """Why ``endpoint`` is not a usable daemon of ``mesh`` (None: it is): a connection must open within
    ``connect_timeout_s``, then the version (and the mesh) must be this client's."""
    client = Client(endpoint, timeout)
    try:
        probe = endpoint.connection(connect_timeout_s)
        try:
            probe.connect()  # req: SDK-DISCOVER-CONNECT -- a real connection, within the connect timeout
        finally:
            probe.close()
        # §8.2: well-formed, the mesh, a compatible version -- judged by ipc_api, the surface this client is
        # versioned with (daemon_version is each implementation's own number), E-51
        # req: SDK-DISCOVER-CHECK
        version = client._json("GET", "/v1/version")
        api = version.get("ipc_api") if isinstance(version, dict) else None
        if api != IPC_API:
            return f"speaks ipc_api {api!r}, this client {IPC_API!r}"
        if mesh is not None:
            health = client._json("GET", "/v1/health")
            if not isinstance(health, dict) or health.get("mesh") != mesh:
                return f"serves another mesh than {mesh!r}"
    except (MeshError, OSError, http.client.HTTPException, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def discover(state_dir: str | os.PathLike[str] | None = None, *, mesh: str | None = None,
             connect_timeout_s: float = 0.1, timeout: float = 10.0) -> Client:
    """The daemon of ``mesh``, found as §8 says: by a real connection, never by a pid file.

    In a hook, ``CLAUDEMESH_DAEMON_SOCK`` (and its ``CLAUDEMESH_CAPABILITY_TOKEN``) come first. Then the state
    directory (``state_dir``, else ``default_state_dir(mesh)``): its unix socket, when a connection opens within
    ``connect_timeout_s`` and ``GET /v1/version`` (and, for a mesh, ``GET /v1/health``) says it is the one; then
    TCP on 127.0.0.1 at the port in ``http.port`` with the bearer token of ``local_token``.

    Raises:
        DaemonNotFound: neither answered; the message says what each attempt found.
    """
    tried = []
    candidates = []
    if state_dir is None and os.environ.get("CLAUDEMESH_DAEMON_SOCK"):
        candidates.append(Endpoint(socket_path=os.environ["CLAUDEMESH_DAEMON_SOCK"],
                                   capability_token=os.environ.get("CLAUDEMESH_CAPABILITY_TOKEN")))
    root = Path(state_dir) if state_dir is not None else default_state_dir(mesh)
    # daemon.sock as implementations name it (the reference, upstream), then `sock` as §1 of the spec does
    candidates += [Endpoint(socket_path=str(root / name)) for name in ("daemon.sock", "sock")]
    for endpoint in candidates:
        if not os.path.exists(endpoint.socket_path):
            tried.append(f"{endpoint.socket_path}: no socket")
            continue
        why = _answers(endpoint, mesh, connect_timeout_s, timeout)
        if why is None:
            return Client(endpoint, timeout)
        tried.append(f"{endpoint.socket_path}: {why}")
    try:
        # req: SDK-DISCOVER-TCP -- http.port and local_token
        port = int((root / "http.port").read_text(encoding="ascii").strip())
    except (OSError, ValueError) as exc:
        tried.append(f"{root / 'http.port'}: {exc}")
    else:
        endpoint = Endpoint(port=port, token_file=root / "local_token")
        why = _answers(endpoint, mesh, max(connect_timeout_s, 1.0), timeout)
        if why is None:
            return Client(endpoint, timeout)
        tried.append(f"127.0.0.1:{port}: {why}")
    raise DaemonNotFound("no daemon found: " + "; ".join(tried))
