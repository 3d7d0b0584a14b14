"""The client: discovery (§8), the /v1 calls, retries under one idempotency key, and a resuming event stream.

Rules of this file. Standard library only: it must import where nothing of meshspec's dependencies is installed
(http.client speaks HTTP/1.1 over any socket, which is all a unix socket needs; no library for that is in the
standard library). Every call opens its own connection, so a daemon restart between two calls costs nothing.
A send is retried only under the key it was first sent with, so a retry can never send twice (§4.5.1).
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import math
import os
import random
import re
import secrets
import socket
import threading
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
    """The daemon answered with a problem (RFC 9457), answered something that is not /v1, or could not be reached.

    ``problem`` is the problem body as sent; ``client_message_id`` is the key of the send it ended (a key the SDK
    minted included), so a caller can retry that send under it later: the daemon may have stored it.
    """

    def __init__(self, message: str, status: int | None = None, problem: dict[str, Any] | None = None,
                 client_message_id: str | None = None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}
        self.code: str | None = self.problem.get("error")
        self.client_message_id = client_message_id or self.problem.get("client_message_id")


class Conflict(MeshError):
    """409: the ``client_message_id`` is bound to another request or state (§4.5.1). ``conflict`` names the row."""

    @property
    def conflict(self) -> str | None:
        return self.problem.get("conflict")


class Unavailable(MeshError):
    """The daemon stayed busy, draining or unreachable past the call's deadline; ``retry_after`` is its last hint."""

    def __init__(self, message: str, status: int | None = None, problem: dict[str, Any] | None = None,
                 retry_after: float | None = None, client_message_id: str | None = None):
        super().__init__(message, status, problem, client_message_id)
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
        """The Authorization header's value. Raises MeshError (not retried) when the token file is unusable."""
        if self.socket_path is not None:
            return f"ClaudeMesh-Capability {self.capability_token}" if self.capability_token else None
        if self.token_file is None:
            return None
        try:
            token = self.token_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise MeshError(f"the token file {self.token_file} is unusable: {exc}") from exc
        if not token or not token.isprintable() or " " in token:
            raise MeshError(f"the token file {self.token_file} holds no token")
        return f"Bearer {token}"


class Client:
    """A client of one daemon. ``discover()`` finds it the way §8 says; or give the endpoint yourself."""

    def __init__(self, endpoint: Endpoint, timeout: float = 10.0):
        self.endpoint = endpoint
        self.timeout = timeout

    # --- transport ------------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout: float | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh connection: the status, the headers (lower-case names) and the body, all within
        ``timeout`` seconds (the client's by default) however slowly the daemon answers. Over TCP a 401 re-reads the
        token file once (the token may have been rotated) and tries again.

        Raises:
            OSError, http.client.HTTPException: the connection failed or timed out (the caller may retry).
            MeshError: the token file is unusable (retrying would not help).
        """
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        for attempt in (1, 2):
            sent = dict(headers or {})
            authorization = self.endpoint.authorization()
            if authorization:
                sent["Authorization"] = authorization
            payload = None
            if body is not None:
                payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
                sent["Content-Type"] = "application/json"
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{method} {path}: no answer within the call's time")
            conn = self.endpoint.connection(left)
            # the socket timeout bounds each read; this bounds them all (a daemon trickling bytes)
            watchdog = threading.Timer(left, _abort, args=(conn,))
            watchdog.start()
            try:
                conn.request(method, path, body=payload, headers=sent)
                answer = conn.getresponse()
                status, data = answer.status, answer.read()
                answer_headers = {k.lower(): v for k, v in answer.getheaders()}
            finally:
                watchdog.cancel()
                conn.close()
            if status == 401 and attempt == 1 and self.endpoint.token_file is not None:
                # req: SDK-TOKEN-REREAD -- a rotated token: authorization() reads the file again
                continue
            return status, answer_headers, data
        raise AssertionError("unreachable")

    def _typed(self, result: type, method: str, path: str, body: Any = None) -> Any:
        """The answer of one call as ``result`` (a class of _types), or MeshError naming the members it lacks."""
        return _typed(result, self._json(method, path, body), f"{method} {path}")

    def _json(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,),
              timeout: float | None = None) -> Any:
        try:
            status, headers, data = self.request(method, path, body, timeout=timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if status not in ok:
            raise _problem(method, path, status, headers, data)
        return _decoded(data, f"{method} {path}")

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
        """Send once, whatever happens on the way (§4.5.1): the key (given, or minted here) goes with every retry,
        and every error raised carries it (``client_message_id``), so the caller can try again under it.

        Retries 429 and 503 no sooner than their Retry-After (with a growing floor: a Retry-After of 0 is no busy
        loop), and a connection lost or timed out before the answer; the whole call ends by ``deadline_s``.

        Raises:
            Conflict: 409: the key is bound to another request or state.
            Unavailable: still busy or unreachable at the deadline.
            MeshError: any other refusal (400, 413, ...), or an answer that is not /v1: retrying would not help.
            ValueError: ``deadline_s`` is not a positive number.
        """
        if not (isinstance(deadline_s, int | float) and math.isfinite(deadline_s) and deadline_s > 0):
            raise ValueError(f"deadline_s must be a positive number of seconds, not {deadline_s!r}")
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
                status, headers, data = self.request("POST", "/v1/send", body,
                                                     timeout=min(self.timeout, max(0.001, end - time.monotonic())))
            except (OSError, http.client.HTTPException) as exc:  # lost before the answer: maybe stored, so same key
                failure = f"{type(exc).__name__}: {exc}"
            except MeshError as exc:
                exc.client_message_id = key
                raise
            else:
                if status in (200, 202):
                    return _typed(SendResult, _decoded(data, "POST /v1/send", key), "POST /v1/send", key)
                error = _problem("POST", "/v1/send", status, headers, data, key)
                if status not in RETRY_STATUSES:
                    # req: SDK-NO-RETRY-REFUSED, SDK-TYPED-CONFLICT -- a 409 is a Conflict, raised at once
                    raise error
                hint, failure, problem = retry_after(headers.get("retry-after")), str(error), error.problem
            left = end - time.monotonic()
            # req: SDK-RETRY-AFTER -- Retry-After is honoured, never cut short; a growing floor under it, with jitter
            floor = min(5.0, 0.05 * 2 ** min(attempt, 10)) * (0.5 + random.random() / 2)
            wait = max(hint, floor) if hint is not None else min(left, floor)
            if left <= 0 or wait > left:
                raise Unavailable(f"send {key}: {failure}; gave up at the {deadline_s} s deadline", status, problem,
                                  hint, key)
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
        from there, at least once) and skips what it already yielded; ``replay_gap`` (no id) is yielded as it comes.
        Reconnections back off (and honour a 429 or 503's Retry-After); it gives up (Unavailable) once ``reconnect_s``
        pass without an event or a connection that held. ``read_timeout_s`` must exceed the daemon's keepalive.

        Raises:
            Unavailable: no stream for ``reconnect_s``.
            MeshError: the daemon refused the stream (401, 400, ...) or sent an event that is not JSON.
        """
        last = last_event_id
        trouble_since: float | None = None  # since when no event came and no connection held
        attempt = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                # req: SDK-EVENTS-RESUME -- the last event yielded; the replay's repeats are skipped below
                headers["Last-Event-ID"] = str(last)
            conn = self.endpoint.connection(read_timeout_s)
            opened, hint = time.monotonic(), None
            try:
                authorization = self.endpoint.authorization()
                if authorization:
                    headers["Authorization"] = authorization
                conn.request("GET", "/v1/events", headers=headers)
                answer = conn.getresponse()
                if answer.status != 200:
                    error = _problem("GET", "/v1/events", answer.status,
                                     {k.lower(): v for k, v in answer.getheaders()}, answer.read())
                    if answer.status not in RETRY_STATUSES:
                        raise error
                    hint = error.retry_after
                    raise ConnectionError(str(error))
                for event in _sse(answer):
                    if event.id is not None:
                        if last is not None and event.id <= last:
                            continue  # replayed after a resume: yielded already
                        last = event.id
                    trouble_since, attempt = None, 0
                    yield event
                raise ConnectionError("the daemon closed the stream")
            except (OSError, http.client.HTTPException) as exc:
                now = time.monotonic()
                if now - opened >= min(5.0, reconnect_s / 2):  # the connection held a while: a new drop
                    trouble_since, attempt = None, 0
                trouble_since = now if trouble_since is None else trouble_since
                if now - trouble_since > reconnect_s:
                    raise Unavailable(f"GET /v1/events: {type(exc).__name__}: {exc}; no stream that held for "
                                      f"{reconnect_s} s") from exc
                floor = min(5.0, 0.05 * 2 ** min(attempt, 10)) * (0.5 + random.random() / 2)
                time.sleep(max(hint, floor) if hint is not None else floor)
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
        try:
            text = line.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise MeshError(f"GET /v1/events: a line that is not UTF-8: {exc}") from exc
        if not text:
            if data:
                yield Event(event_id, name, _decoded("\n".join(data).encode(), f"GET /v1/events: event {event_id}"))
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
    if re.fullmatch(r"[0-9]{1,12}", value):  # ASCII digits only: str.isdigit() takes superscripts too
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - time.time())


def _problem(method: str, path: str, status: int, headers: dict[str, str], data: bytes,
             key: str | None = None) -> MeshError:
    try:
        problem = json.loads(data) if data else {}
    except (ValueError, RecursionError):
        problem = {}
    problem = problem if isinstance(problem, dict) else {}
    message = f"{method} {path}: {status} {problem.get('error', '')}: {problem.get('detail', '')}".rstrip(": ")
    if status == 409:
        return Conflict(message, status, problem, key)
    if status in RETRY_STATUSES:
        return Unavailable(message, status, problem, retry_after(headers.get("retry-after")), key)
    return MeshError(message, status, problem, key)


def _decoded(data: bytes, call: str, key: str | None = None) -> Any:
    """The JSON of an answer, or MeshError: a daemon that answers something else does not speak /v1."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise MeshError(f"{call}: the answer is not JSON: {exc}", client_message_id=key) from exc


def _typed(result: type, document: Any, call: str, key: str | None = None) -> Any:
    try:
        if not isinstance(document, dict):
            raise TypeError(f"a {type(document).__name__}, not an object")
        return result.from_json(document)
    except (TypeError, KeyError, AttributeError) as exc:
        raise MeshError(f"{call}: the answer is not a {result.__name__} of /v1: {exc}", client_message_id=key) from exc


def _abort(conn: http.client.HTTPConnection) -> None:
    """Past the call's time: cut the connection, which ends whatever read or write is waiting on it."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _query(**params: Any) -> str:
    present = {k: v for k, v in params.items() if v is not None}
    return "?" + urllib.parse.urlencode(present) if present else ""


def _answers(endpoint: Endpoint, mesh: str | None, connect_timeout_s: float, probe_timeout_s: float) -> str | None:
    """Why ``endpoint`` is not a usable daemon of ``mesh`` (None: it is): a connection must open within
    ``connect_timeout_s``, then the version (and the mesh) must be this client's, each answered within
    ``probe_timeout_s``."""
    client = Client(endpoint, probe_timeout_s)
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
             connect_timeout_s: float = 0.1, probe_timeout_s: float = 2.0, timeout: float = 10.0) -> Client:
    """The daemon of ``mesh``, found as §8 says: by a real connection, never by a pid file.

    In a hook, ``CLAUDEMESH_DAEMON_SOCK`` (and its ``CLAUDEMESH_CAPABILITY_TOKEN``) come first. Then the state
    directory (``state_dir``, else ``default_state_dir(mesh)``): its unix socket (``daemon.sock``, then ``sock``),
    when a connection opens within ``connect_timeout_s`` and ``GET /v1/version`` (and, for a mesh,
    ``GET /v1/health``) says within ``probe_timeout_s`` it is the one; then TCP on 127.0.0.1 at the port in
    ``http.port`` with the bearer token of ``local_token``. The client returned calls with ``timeout``.

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
        why = _answers(endpoint, mesh, connect_timeout_s, probe_timeout_s)
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
        why = _answers(endpoint, mesh, max(connect_timeout_s, 1.0), probe_timeout_s)
        if why is None:
            return Client(endpoint, timeout)
        tried.append(f"127.0.0.1:{port}: {why}")
    raise DaemonNotFound("no daemon found: " + "; ".join(tried))
