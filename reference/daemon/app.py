"""The IPC surface (spec/openapi.yaml) as a Falcon WSGI app.

Resources only translate HTTP to the stores, the link and the core, and back. ``create_app(ctx)`` wires everything;
tests pass their own context. Errors are raised as ``Problem`` and serialised in one place (problems.py).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import falcon
from jsonschema.exceptions import best_match
from ulid import ULID

from reference.clock import rfc3339_ms as format_rfc3339_ms
from reference.core import RequestError, SendRequest, is_hook_reply_id, parse_send
from reference.core.hooks import REPLY_ID_PREFIX
from reference.core.limits import limit
from spec import SPEC_VERSION, load_table, openapi, openapi_parameter, parameter_validator, schema

from . import ports, problems
from .capabilities import Capabilities
from .contract import ResponseContract
from .deadlines import peer_gone
from .guard import BodyDrain, Guard, body_stream, transport_of
from .link import BrokerTimeout, BrokerUnavailable
from .problems import Problem
from .store import AcceptItem, migrations

_VERSION = openapi()["components"]["schemas"]["Version"]["properties"]
#: GET /v1/version's ipc_api and ipc_features: the const and the features spec/openapi.yaml's Version requires
IPC_API: str = _VERSION["ipc_api"]["const"]
IPC_FEATURES = [required["contains"]["const"] for required in _VERSION["ipc_features"]["allOf"]]
# E-47: the local databases' schema version is the number of migrations applied to outbox.db and inbox.db together
# (each numbers its migrations 1, 2, ...), so it rises with every migration either file gets.
SCHEMA_VERSION = migrations("outbox")[-1].version + migrations("inbox")[-1].version
# req: LIMIT-BODY-ROUTES -- 16 KiB for profile, 4 KiB for requeue
PROFILE_LIMIT = int(limit("ipc_profile_body_bytes"))
REQUEUE_LIMIT = int(limit("ipc_requeue_body_bytes"))
#: POST /v1/profile's members by the frame that carries each to the broker (spec/schemas/broker/set_*.json)
PROFILE_FRAMES = {kind: tuple(member for member in schema(f"broker/{kind}")["properties"] if member != "type")
                  for kind in ("set_summary", "set_status", "set_visible", "set_profile")}


@dataclass
class DaemonContext:
    """Everything the IPC layer talks to. The real daemon builds it in runtime.py; tests build their own.

    ``clock`` (seconds since the epoch) is the only time the IPC layer reads; ``started_at`` defaults to its now.
    """

    config: dict[str, dict[str, Any]]
    token: str
    outbox: ports.Outbox
    inbox: ports.Inbox
    link: ports.Link
    events: ports.EventStreams
    committer: ports.Committer
    metrics: ports.Metrics
    member_pubkey: str
    clock: Callable[[], float] = time.time
    # req: IPC-ID-MINTED-FORM -- a bare 26-character ULID
    mint_id: Callable[[], str] = field(default=lambda: str(ULID()))
    parse_send: Callable[[bytes, str | None], SendRequest] = parse_send  # phase A of POST /v1/send
    started_at: float | None = None
    draining: threading.Event = field(default_factory=threading.Event)
    schema_version: int = SCHEMA_VERSION  # what the opened stores are at (runtime.py); the shipped migrations' count
    capabilities: Capabilities | None = None  # the running hooks' tokens and process groups (E-50)

    def __post_init__(self) -> None:
        if self.started_at is None:
            self.started_at = self.clock()


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return format_rfc3339_ms(ms)


def _read_body(req: falcon.Request, limit: int) -> bytes:
    length = req.content_length
    # req: LIMIT-BODY, LIMIT-BODY-ROUTES -- 413 payload_too_large
    if length is not None and length > limit:
        raise Problem("payload_too_large", f"the body is {length} bytes; the limit is {limit}")
    data = body_stream(req).read(limit + 1)
    if len(data) > limit:
        raise Problem("payload_too_large", f"the body exceeds {limit} bytes")
    return data


def _require_json(req: falcon.Request) -> None:
    # req: IPC-MEDIA-TYPE
    content_type = (req.content_type or "").split(";", 1)[0].strip().lower()
    if not content_type:
        raise Problem("unsupported_media_type", "the request has no Content-Type; send application/json (E-29)")
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise Problem("unsupported_media_type", f"content type {content_type!r} is not application/json")


def _json_object(raw: bytes) -> dict[str, Any]:
    from reference.core.request import parse_json_object

    try:
        return parse_json_object(raw)
    except RequestError as exc:
        raise Problem(exc.code, exc.detail) from exc


def _int_param(req: falcon.Request, route: str, name: str) -> int | None:
    """Query integer ``name`` of GET ``route``, bounded and defaulted by its schema in spec/openapi.yaml."""
    bounds = openapi_parameter(route, "get", name)
    low, high = bounds["minimum"], bounds["maximum"]
    raw = req.get_param(name)
    if raw is None:
        return bounds.get("default")
    if not re.fullmatch(r"[0-9]+", raw) or not low <= int(raw) <= high:
        raise Problem("invalid_parameter", f"{name} must be an integer from {low} to {high}",
                      invalid_params=[{"name": name, "reason": f"integer {low}-{high}"}])
    return int(raw)


def _str_param(route: str, name: str, value: str | None) -> str | None:
    """``value`` of parameter ``name`` of GET ``route`` (None: absent); 400 unless its schema in spec/openapi.yaml
    holds it."""
    if value is None:
        return None
    error = best_match(parameter_validator(route, "get", name).iter_errors(value))
    if error is not None:
        reason = f"fails {error.validator} {json.dumps(error.validator_value)}"
        raise Problem("invalid_parameter", f"{name}: {reason}", invalid_params=[{"name": name, "reason": reason}])
    return value


def _no_writes_while_draining(ctx: DaemonContext) -> None:
    # req: LIFE-DRAIN -- 503 daemon_draining
    if ctx.draining.is_set():
        problem = Problem("daemon_draining", "the daemon is shutting down; retry against the next one")
        problem.headers["Retry-After"] = "1"
        raise problem


def _send_json(resp: falcon.Response, status: int, body: dict[str, Any]) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps(body, ensure_ascii=False)


class Version:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx
        hooks = (ctx.config.get("hooks") or {}).get("enabled", False)
        # E-48: a daemon that runs hooks says so, and a harness skips its hook cases for one that does not
        self._features = [*IPC_FEATURES, "hooks"] if hooks else IPC_FEATURES

    def on_get(self, req, resp):
        negotiated = self.ctx.link.state.negotiated
        _send_json(resp, 200, {
            # req: API-VERSION
            "daemon_version": SPEC_VERSION, "ipc_api": IPC_API, "ipc_features": self._features,
            "schema_version": self.ctx.schema_version, "broker_features_negotiated": sorted(negotiated),
            "broker_feature_params": {bit: dict(params) for bit, params in sorted(negotiated.items())},
        })


class Health:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx

    def on_get(self, req, resp):
        counts, oldest = self.ctx.outbox.health()
        state = self.ctx.link.state
        connected = state.status == "open"
        lag_ms = None if oldest is None else max(0, int(self.ctx.clock() * 1000) - oldest)
        _send_json(resp, 200, {
            # req: API-HEALTH, LINK-RESTART, INB-QUARANTINE -- link_restarts, link_last_failure and quarantined too
            "ok": connected and not self.ctx.draining.is_set(), "connected": connected, "lag_ms": lag_ms,
            "queue_depth": counts.get("pending", 0), "inflight": counts.get("inflight", 0),
            "mesh": self.ctx.config["daemon"]["mesh"], "member_pubkey": self.ctx.member_pubkey,
            "uptime_s": round(self.ctx.clock() - self.ctx.started_at, 3), "schema_version": self.ctx.schema_version,
            "daemon_version": SPEC_VERSION, "broker_version": state.broker_version, "pid": os.getpid(),
            "link_restarts": getattr(state, "restarts", 0), "link_last_failure": getattr(state, "last_failure", None),
            "quarantined": getattr(state, "quarantined", 0),
        })


class Compat:
    def on_get(self, req, resp):
        # req: API-COMPAT
        features = load_table("features")["daemon_defaults"]["require"]
        _send_json(resp, 200, {
            "daemon": SPEC_VERSION, "compatible_brokers": ["0.9.x"], "required_broker_features": features,
            "compatible_clis": ["0.9.x"],
            "compatible_sdks": {"python": ">=0.9.0,<1.0.0", "go": ">=0.9.0,<1.0.0", "ts": ">=0.9.0,<1.0.0"},
        })


class Metrics:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx

    def on_get(self, req, resp):
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        # req: API-METRICS
        resp.text = self.ctx.metrics.render().decode("utf-8")


class Send:
    def __init__(self, ctx: DaemonContext, guard: Guard):
        self.ctx = ctx
        self.guard = guard

    def on_post(self, req, resp):
        _no_writes_while_draining(self.ctx)
        _require_json(req)
        limit = int(self.ctx.config["ipc"]["max_body_bytes"])
        length = req.content_length
        # The hot path: a declared length within the limit is read in one call (the body cannot run past it).
        # req: LIMIT-BODY-ROUTES -- 1 MiB for send (ipc.max_body_bytes)
        raw = req.bounded_stream.read(length) if length is not None and length <= limit else _read_body(req, limit)
        try:
            # req: IPC-VALIDATION-CONSUMES-NOTHING -- a phase-A refusal answers before the committer sees it
            request = self.ctx.parse_send(raw, req.get_header("Idempotency-Key"))
        except RequestError as exc:
            raise Problem(exc.code, exc.detail,
                          invalid_params=[{"name": n, "reason": r} for n, r in exc.invalid_params] or None) from exc
        if is_hook_reply_id(request.client_message_id):
            # req: HOOK-REPLY-ID-RESERVED -- the id of a hook's reply is the daemon's to take, first
            reason = f"ids beginning {REPLY_ID_PREFIX!r} are reserved for the daemon's hook replies (E-48)"
            raise Problem("invalid_client_message_id", reason,
                          invalid_params=[{"name": "client_message_id", "reason": reason}])
        if req.context.capability is not None:
            # req: HOOK-CAP-SCOPE -- the destination a hook's token may send to
            self.guard.check_grant(req, request.destination_kind, request.destination_ref, request.reply_to_id)
        _check_carriable(request, self.ctx.link)
        # req: IPC-ID-MINTED-ULID, IPC-STABLE-ID
        cmid = request.client_message_id or self.ctx.mint_id()
        # The fingerprint and payload are computed here, in parallel, not on the one committer thread.
        item = AcceptItem.of(request, cmid, self.ctx.mint_id(), int(self.ctx.clock() * 1000))
        decision, _ = self.ctx.committer.submit(item)
        if decision.is_conflict:
            extensions = {k: v for k, v in decision.body.items() if k != "error"}
            # req: IPC-CONFLICT-BODY
            raise Problem("idempotency_key_reused", f"{cmid} is bound to another request or state "
                          f"({decision.body['conflict']})", **extensions)
        if decision.insert:
            self.ctx.link.wake()
        _send_json(resp, decision.http_status, decision.body)


def _check_carriable(request: SendRequest, link: ports.Link) -> None:
    """413 at accept for a send the link could never carry (E-40): a stored payload past send_payload_max_bytes (it
    would not fit in one frame), or a message past the negotiated max_payload.inline_bytes (the broker would refuse
    it in B1). Unknown until the first negotiation: the broker's own B1 check then decides."""
    payload = len(request.payload())
    # req: LIMIT-CARRIABLE
    ceiling = int(limit("send_payload_max_bytes"))
    if payload > ceiling:
        raise Problem("payload_too_large", f"the send's stored payload is {payload} bytes; one link frame carries at "
                      f"most {ceiling} (send_payload_max_bytes)")
    negotiated = getattr(getattr(link, "state", None), "negotiated", None) or {}
    inline = (negotiated.get("max_payload") or {}).get("inline_bytes")
    if isinstance(inline, int) and len(request.message) > inline // 4:  # 4 bytes per character at most in UTF-8
        size = len(request.message.encode("utf-8"))
        # req: LIMIT-CARRIABLE
        if size > inline:
            raise Problem("payload_too_large", f"the message is {size} bytes; the broker carries at most {inline} "
                          "(max_payload.inline_bytes)")


class Inbox:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx

    def on_get(self, req, resp):
        limit = _int_param(req, "/v1/inbox", "limit")
        since = req.get_param("since")
        since_ms = None if since is None else rfc3339_ms(since)
        sender = _str_param("/v1/inbox", "from", req.get_param("from"))
        topic = _str_param("/v1/inbox", "topic", req.get_param("topic"))
        # req: INBOX-CURSOR -- a cursor the store did not produce is 400 invalid_cursor
        cursor = _cursor_param(req)
        try:
            # req: INBOX-FILTERS
            rows, _ = self.ctx.inbox.page(cursor=cursor, since_ms=since_ms, topic=topic, sender=sender, limit=limit)
        except ValueError as exc:
            raise Problem("invalid_cursor", str(exc)) from exc
        # E-12: a consumer resumes from next_cursor even after reading everything there is so far.
        next_cursor = rows[-1].cursor if rows else cursor
        _send_json(resp, 200, {"items": [inbox_item(row) for row in rows], "next_cursor": next_cursor})


RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def rfc3339_ms(text: str) -> int:
    """Unix milliseconds of an RFC 3339 date-time; a leap second (:60) counts as the last instant of its minute."""
    match = RFC3339.fullmatch(text)
    if match is None:
        raise Problem("invalid_parameter", "since must be an RFC 3339 date-time with an offset")
    second = int(match[6])
    leap = second == 60
    iso = f"{match[1]}-{match[2]}-{match[3]}T{match[4]}:{match[5]}:{59 if leap else second:02d}"
    offset = "+00:00" if match[8] in ("Z", "z") else match[8]
    try:
        moment = datetime.fromisoformat(iso + offset)
    except ValueError as exc:
        raise Problem("invalid_parameter", f"since is not a valid date-time: {exc}") from exc
    fraction = float(match[7]) if match[7] else (0.999 if leap else 0.0)
    return int(moment.timestamp() * 1000) + int(fraction * 1000)


def _cursor_param(req: falcon.Request) -> str | None:
    cursor = req.get_param("cursor")
    if cursor is not None and not cursor:
        raise Problem("invalid_cursor", "cursor must not be empty")
    return cursor


def inbox_item(row: Any) -> dict[str, Any]:
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    meta = get("meta")
    if isinstance(meta, str):
        meta = json.loads(meta)
    return {
        "id": get("id"), "seq": get("seq"), "client_message_id": get("client_message_id"),
        "broker_message_id": get("broker_message_id"), "mesh": get("mesh"), "topic": get("topic"),
        "sender_pubkey": get("sender_pubkey"), "sender_name": get("sender_name"), "body": get("body"),
        "meta": meta, "received_at": _iso(get("received_at")), "reply_to_id": get("reply_to_id"),
    }


class Events:
    def __init__(self, ctx: DaemonContext, guard: Guard):
        self.ctx = ctx
        self.guard = guard

    def on_get(self, req, resp):
        # req: SSE-REPLAY
        header = req.get_header("Last-Event-ID")
        if header:
            last = int(_str_param("/v1/events", "Last-Event-ID", header.strip()))
        else:
            last = _int_param(req, "/v1/events", "last_event_id")
        sock = req.env.get("gunicorn.socket")
        stream = self.ctx.events.open_stream(last, transport=transport_of(req.env),
                                             gone=lambda: peer_gone(sock))  # raises Problem too_many_streams
        self.guard.release(req)
        resp.status = 200
        resp.content_type = "text/event-stream; charset=utf-8"
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = stream


class Peers:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx

    def on_get(self, req, resp):
        try:
            # req: API-PEERS, API-PEERS-PASSTHROUGH -- the broker's peers_list as it came
            peers = self.ctx.link.request_peers(float(self.ctx.config["broker"]["request_timeout_s"]))
        except BrokerUnavailable as exc:
            raise Problem("broker_unavailable", str(exc)) from exc
        except BrokerTimeout as exc:
            raise Problem("broker_timeout", str(exc)) from exc
        _send_json(resp, 200, {"peers": peers})


class Profile:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx

    def on_post(self, req, resp):
        _no_writes_while_draining(self.ctx)
        _require_json(req)
        body = _json_object(_read_body(req, PROFILE_LIMIT))
        # req: API-PROFILE-FIELDS -- E-29's limits, as spec/schemas/ipc/profile_request.json states them
        problems.check_body(body, "ipc/profile_request")
        frames = profile_frames(body)
        try:
            # req: API-PROFILE, API-PROFILE-FIELDS
            self.ctx.link.send_frames(frames)
        except BrokerUnavailable as exc:
            raise Problem("broker_unavailable", str(exc)) from exc
        # req: API-PROFILE-FIELDS -- what it applied, in request order
        _send_json(resp, 200, {"ok": True, "applied": list(body)})


def profile_frames(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Map a valid POST /v1/profile body (spec/schemas/ipc/profile_request.json) to its set_* frames."""
    frames = []
    for kind, members in PROFILE_FRAMES.items():
        carried = {member: body[member] for member in members if member in body}
        if carried:
            frames.append({"type": kind, **carried})
    return frames


def outbox_item(row: Any) -> dict[str, Any]:
    return {
        "id": row.id, "client_message_id": row.client_message_id, "status": row.status, "attempts": row.attempts,
        "enqueued_at": _iso(row.enqueued_at), "next_attempt_at": _iso(row.next_attempt_at),
        "delivered_at": _iso(row.delivered_at), "broker_message_id": row.broker_message_id,
        "history_id": row.history_id, "last_error": row.last_error, "aborted_at": _iso(row.aborted_at),
        "aborted_by": row.aborted_by, "superseded_by": row.superseded_by,
        "request_fingerprint": row.request_fingerprint.hex(), "payload_bytes": len(row.payload),
    }


class Outbox:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx

    def on_get(self, req, resp):
        status = _str_param("/v1/outbox", "status", req.get_param("status"))
        limit = _int_param(req, "/v1/outbox", "limit")
        try:
            # req: API-OUTBOX
            rows, next_cursor = self.ctx.outbox.list(status=status, limit=limit, cursor=_cursor_param(req))
        except ValueError as exc:
            raise Problem("invalid_cursor", str(exc)) from exc
        _send_json(resp, 200, {"items": [outbox_item(r) for r in rows], "next_cursor": next_cursor})


class Requeue:
    def __init__(self, ctx: DaemonContext, requeue: Callable[..., dict[str, Any]]):
        self.ctx = ctx
        self.requeue = requeue

    def on_post(self, req, resp):
        _no_writes_while_draining(self.ctx)
        _require_json(req)
        body = _json_object(_read_body(req, REQUEUE_LIMIT))
        # req: API-OUTBOX -- spec/schemas/ipc/requeue_request.json
        problems.check_body(body, "ipc/requeue_request",
                            {"new_client_message_id": "invalid_client_message_id"})  # E-02 grammar
        # req: API-OUTBOX -- §4.5.3 (runtime.requeue)
        _send_json(resp, 200, self.requeue(body["id"], body.get("new_client_message_id"), "operator"))


class AccessLog:
    """Counts every request by route template, status and transport (cm_daemon_ipc_request_total)."""

    def __init__(self, metrics: ports.Metrics | None):
        self.metrics = metrics

    def process_request(self, req, resp):
        req.context.started = time.perf_counter()

    def process_response(self, req, resp, resource, req_succeeded):
        if self.metrics is None:
            return
        endpoint = req.uri_template or "unmatched"
        status = str(resp.status_code if hasattr(resp, "status_code") else resp.status)[:3]
        elapsed = time.perf_counter() - getattr(req.context, "started", time.perf_counter())
        self.metrics.ipc(endpoint, status, transport_of(req.env), elapsed)


def create_app(ctx: DaemonContext, requeue: Callable[..., dict[str, Any]]) -> falcon.App:
    """The IPC app: routes, the guard, the access counter and the single error serialiser."""
    guard = Guard(ctx.token, int(ctx.config["ipc"]["max_inflight"]), capabilities=ctx.capabilities)
    middleware = [AccessLog(ctx.metrics), guard, BodyDrain()]
    if ctx.config["daemon"].get("check_responses"):
        middleware.insert(0, ResponseContract())  # first in the list: its process_response runs last
    # req: AUTH-ORIGIN -- Access-Control-Allow-Origin is never sent
    app = falcon.App(middleware=middleware, cors_enable=False)
    app.req_options.auto_parse_qs_csv = False
    app.req_options.strip_url_path_trailing_slash = False
    problems.install(app)
    app.add_route("/v1/version", Version(ctx))
    app.add_route("/v1/health", Health(ctx))
    app.add_route("/v1/compat", Compat())
    app.add_route("/v1/metrics", Metrics(ctx))
    app.add_route("/v1/send", Send(ctx, guard))
    app.add_route("/v1/inbox", Inbox(ctx))
    app.add_route("/v1/events", Events(ctx, guard))
    app.add_route("/v1/peers", Peers(ctx))
    app.add_route("/v1/profile", Profile(ctx))
    app.add_route("/v1/outbox", Outbox(ctx))
    app.add_route("/v1/outbox/requeue", Requeue(ctx, requeue))
    return app
