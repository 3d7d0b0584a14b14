"""Mutants of the transport (§3.2, §3.4: auth, limits, HTTP bodies, the error envelope) and of the start (§1, §2,
E-15: identity, the state-directory lock, outbox integrity).

Transport mutants replace ``create_app``: the reference's app, wrapped in a WSGI layer that changes the request the
reference's guard sees (the request a looser guard would let through is rewritten into one the reference serves, so
what goes out is exactly what the looser daemon would answer) or the answer; or the reference's app built from a
changed context (its limits). Start mutants replace ``check_host``, ``lock_state_dir`` or ``outbox_store``.
"""

from __future__ import annotations

import io
import logging
import os
import re
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from . import mutant

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _around(change_environ=None, change_headers=None):
    """A ``create_app`` whose app sees ``change_environ(environ, ctx)`` and answers with ``change_headers(headers)``."""
    from reference.daemon.app import create_app

    def build(ctx, requeue):
        app = create_app(ctx, requeue)

        def wrapped(environ, start_response):
            if change_environ is not None:
                change_environ(environ, ctx)
            if change_headers is None:
                return app(environ, start_response)
            return app(environ, lambda status, headers, *exc: start_response(status, change_headers(headers), *exc))

        return wrapped

    return build


def _with_config(section: str, key: str, value):
    """A ``create_app`` that builds the reference's app with ``config[section][key] = value(configured)``."""
    from reference.daemon.app import create_app

    def build(ctx, requeue):
        config = {**ctx.config, section: {**ctx.config[section], key: value(ctx.config[section][key])}}
        return create_app(replace(ctx, config=config), requeue)

    return build


def _tcp(environ) -> bool:
    from reference.daemon.guard import TCP, transport_of

    return transport_of(environ) == TCP


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.partition(":")[0]


def _loosen_host(accepts):
    """Over TCP, a Host the reference refuses but ``accepts(name)`` allows is served as if it were localhost."""
    from reference.daemon.guard import host_is_loopback

    def change(environ, ctx):
        host = environ.get("HTTP_HOST")
        if _tcp(environ) and host and not host_is_loopback(host) and accepts(_host_name(host)):
            environ["HTTP_HOST"] = "localhost"

    return _around(change)


# --- Host (DNS rebinding) -----------------------------------------------------------------------------------------


@mutant("no-host-check", "any Host header is accepted over TCP (DNS rebinding)", kills=("AUTH-HOST",),
        select=("transport.auth",), seam="create_app")
def _no_host_check():
    return _loosen_host(lambda name: True)


@mutant("host-prefix-match", "a Host that starts with a loopback name is accepted (localhost.evil, 127.0.0.1.evil)",
        kills=("AUTH-HOST",), select=("transport.auth",), seam="create_app")
def _host_prefix_match():
    return _loosen_host(lambda name: name.startswith(LOOPBACK_NAMES))


@mutant("host-suffix-match", "a Host that ends with a loopback name is accepted (evil.localhost, evil-127.0.0.1)",
        kills=("AUTH-HOST",), select=("transport.auth",), seam="create_app")
def _host_suffix_match():
    return _loosen_host(lambda name: name.endswith(LOOPBACK_NAMES))


@mutant("ipv6-loopback-port-refused", "Host [::1] with a port ([::1]:PORT) is refused 403 forbidden_host",
        kills=("AUTH-HOST-TCP-ONLY",), select=("transport.auth",), seam="create_app")
def _ipv6_loopback_port_refused():
    bracketed_port = re.compile(r"\s*\[::1\]:\d+\s*")

    def change(environ, ctx):
        if _tcp(environ) and bracketed_port.fullmatch(environ.get("HTTP_HOST") or ""):
            environ["HTTP_HOST"] = "refused.invalid"  # the reference's guard then answers its own 403

    return _around(change)


# --- Origin, query tokens, bearer ---------------------------------------------------------------------------------


def _drop_origin(when):
    def change(environ, ctx):
        if "HTTP_ORIGIN" in environ and when(environ):
            del environ["HTTP_ORIGIN"]

    return _around(change)


@mutant("origin-allowed", "requests carrying a browser Origin header are served", kills=("AUTH-ORIGIN",),
        select=("transport.auth",), seam="create_app")
def _origin_allowed():
    return _drop_origin(lambda environ: True)


@mutant("origin-null-accepted", "Origin: null (a sandboxed page, a file: URL) is served", kills=("AUTH-ORIGIN",),
        select=("transport.auth",), seam="create_app")
def _origin_null_accepted():
    return _drop_origin(lambda environ: environ["HTTP_ORIGIN"].strip() == "null")


@mutant("origin-allowed-on-unix", "an Origin header is refused over TCP only; over the unix socket it is served",
        kills=("AUTH-ORIGIN-BOTH",), select=("transport.unix_refusals",), seam="create_app")
def _origin_allowed_on_unix():
    return _drop_origin(lambda environ: not _tcp(environ))


def _ignore_query_names(names):
    """Query parameters called one of ``names`` are ignored rather than refused with 400 token_in_query."""

    def change(environ, ctx):
        pairs = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        kept = [(k, v) for k, v in pairs if k not in names]
        if len(kept) != len(pairs):
            environ["QUERY_STRING"] = urlencode(kept)

    return _around(change)


@mutant("query-token-accepted", "a token in the query string is not refused (token, access_token, local_token)",
        kills=("AUTH-TOKEN-QUERY", "AUTH-TOKEN-QUERY-BOTH"), select=("transport.auth",), seam="create_app")
def _query_token_accepted():
    from reference.daemon.guard import QUERY_TOKEN_NAMES

    return _ignore_query_names(QUERY_TOKEN_NAMES)


@mutant("query-access-token-accepted", "only ?token= is refused; ?access_token= and ?local_token= are not",
        kills=("AUTH-TOKEN-QUERY-BOTH",), select=("transport.auth",), seam="create_app")
def _query_access_token_accepted():
    from reference.daemon.guard import QUERY_TOKEN_NAMES

    return _ignore_query_names(QUERY_TOKEN_NAMES - {"token"})


@mutant("token-prefix-accepted", "a bearer token that is a non-empty prefix of local_token is accepted",
        kills=("AUTH-BEARER",), select=("transport.auth",), seam="create_app")
def _token_prefix_accepted():
    def change(environ, ctx):
        scheme, _, presented = (environ.get("HTTP_AUTHORIZATION") or "").partition(" ")
        presented = presented.strip()
        if _tcp(environ) and scheme.lower() == "bearer" and presented and ctx.token.startswith(presented):
            environ["HTTP_AUTHORIZATION"] = f"Bearer {ctx.token}"

    return _around(change)


@mutant("token-compared-with-eq", "the bearer token is compared with == instead of hmac.compare_digest",
        kills=("AUTH-CONSTANT-TIME",), seam=None,
        undetectable="answers are identical; the timing difference of one bytes comparison is nanoseconds, far below "
        "the jitter of a loopback HTTP round trip, so no bounded black-box run can tell (tests/daemon checks it "
        "white-box). No seam either: the comparison is inside Guard, which create_app builds; a wrapper could only "
        "add a second comparison, not replace the guard's")
def _token_compared_with_eq():
    return None


# --- limits and HTTP bodies ---------------------------------------------------------------------------------------


@mutant("no-body-limit", "request bodies are read whole: no 413 above ipc.max_body_bytes", kills=("LIMIT-BODY",),
        select=("transport.limits",), seam="create_app")
def _no_body_limit():
    return _with_config("ipc", "max_body_bytes", lambda limit: 2**62)


@mutant("body-limit-exact-refused", "a send body of exactly ipc.max_body_bytes is refused 413 (>= instead of >)",
        kills=("LIMIT-BODY-ROUTES",), select=("transport.limits",), seam="create_app")
def _body_limit_exact_refused():
    return _with_config("ipc", "max_body_bytes", lambda limit: int(limit) - 1)


@mutant("body-limit-plus-one-accepted", "a send body one byte above ipc.max_body_bytes is accepted (off by one)",
        kills=("LIMIT-BODY",), select=("transport.limits",), seam="create_app")
def _body_limit_plus_one_accepted():
    return _with_config("ipc", "max_body_bytes", lambda limit: int(limit) + 1)


@mutant("no-inflight-cap", "requests beyond ipc.max_inflight are served: no 429 daemon_busy",
        kills=("LIMIT-INFLIGHT",), select=("limits.inflight",), seam="create_app", est_s=20)
def _no_inflight_cap():
    return _with_config("ipc", "max_inflight", lambda cap: 10**9)


@mutant("unread-body-left-on-the-socket", "a body the handler did not read is left unread when the answer goes out",
        kills=("IPC-HTTP-BODY",), select=("transport.early_answer",), seam="create_app")
def _unread_body_left():
    import falcon

    from reference.daemon import app as reference_app
    from reference.daemon import problems
    from reference.daemon.guard import Guard

    def build(ctx, requeue):
        # create_app re-stated without its BodyDrain middleware (create_app takes no middleware to leave out)
        guard = Guard(ctx.token, int(ctx.config["ipc"]["max_inflight"]))
        app = falcon.App(middleware=[reference_app.AccessLog(ctx.metrics), guard], cors_enable=False)
        app.req_options.auto_parse_qs_csv = False
        app.req_options.strip_url_path_trailing_slash = False
        problems.install(app)
        for path, resource in (("/v1/version", reference_app.Version(ctx)), ("/v1/health", reference_app.Health(ctx)),
                               ("/v1/compat", reference_app.Compat()), ("/v1/metrics", reference_app.Metrics(ctx)),
                               ("/v1/send", reference_app.Send(ctx, guard)), ("/v1/inbox", reference_app.Inbox(ctx)),
                               ("/v1/events", reference_app.Events(ctx, guard)),
                               ("/v1/peers", reference_app.Peers(ctx)), ("/v1/profile", reference_app.Profile(ctx)),
                               ("/v1/outbox", reference_app.Outbox(ctx)),
                               ("/v1/outbox/requeue", reference_app.Requeue(ctx, requeue))):
            app.add_route(path, resource)
        return app

    return build


@mutant("chunked-body-read-as-empty", "a chunked request body is read as an empty body", kills=("IPC-HTTP-BODY",),
        select=("transport.chunked_body",), seam="create_app")
def _chunked_body_empty():
    def change(environ, ctx):
        if "chunked" in (environ.get("HTTP_TRANSFER_ENCODING") or "").lower() and not environ.get("CONTENT_LENGTH"):
            environ["wsgi.input"] = io.BytesIO(b"")

    return _around(change)


@mutant("problem-as-plain-json", "error bodies are sent as application/json instead of application/problem+json",
        kills=("ERR-PROBLEM-JSON",), select=("transport.malformed_json", "transport.limits"), seam="create_app")
def _problem_as_plain_json():
    def change(headers):
        return [(k, "application/json" if k.lower() == "content-type" and v.startswith("application/problem+json")
                 else v) for k, v in headers]

    return _around(change_headers=change)


@mutant("unix-socket-0644", "daemon.sock is left group/world readable (0644)", kills=("AUTH-UDS-MODE",),
        select=("transport.socket_mode",), seam="create_app")
def _unix_socket_0644():
    from reference.daemon.app import create_app

    def build(ctx, requeue):
        # the worker builds the app after the master bound the socket (0600): loosen it, as a daemon that forgot to
        # set its umask would have left it
        socket_path = Path(ctx.outbox.path).parent / "daemon.sock"
        if socket_path.exists():
            os.chmod(socket_path, 0o644)
        return create_app(ctx, requeue)

    return build


# --- the start: identity, the lock, outbox integrity --------------------------------------------------------------


@mutant("host-mismatch-accepted", "a host fingerprint that no longer matches this machine is logged and accepted",
        kills=("ID-MISMATCH-REFUSE",), select=("identity.host_fingerprint",), seam="check_host", est_s=20)
def _host_mismatch_accepted():
    from reference.daemon import identity

    def check_host(state_dir, host_id_override="", mac_override="", **options):
        try:
            return identity.check_host(state_dir, host_id_override, mac_override, **options)
        except identity.HostMismatch as exc:
            logging.getLogger("meshd").warning("%s (continuing anyway)", exc)
            current = identity.host_fingerprint(identity.read_host_id(host_id_override),
                                                identity.read_stable_mac(mac_override))
            return identity.HostCheck("match", current)

    return check_host


@mutant("singleton-not-enforced", "a second daemon on one state directory starts: the pid is written, nothing locked",
        kills=("LIFE-SINGLETON",), select=("lifecycle.singleton",), seam="lock_state_dir", est_s=20)
def _singleton_not_enforced():
    def lock_state_dir(state_dir):
        (Path(state_dir) / "daemon.pid").write_text(f"{os.getpid()}\n", encoding="ascii")

    return lock_state_dir


@mutant("corrupt-outbox-accepted",
        "a corrupt outbox.db is moved aside and a fresh one created (as inbox.db is) instead of refusing to start",
        kills=("REC-OUTBOX-INTEGRITY",), select=("recovery.corrupt_outbox",), seam="outbox_store", est_s=25)
def _corrupt_outbox_accepted():
    from reference.daemon.store import OutboxCorrupt, OutboxStore

    class Store(OutboxStore):
        def __init__(self, path, *args, **kwargs):
            try:
                super().__init__(path, *args, **kwargs)
                self.integrity_check()
            except OutboxCorrupt:
                if getattr(self, "_writer", None) is not None:
                    self.close()
                for suffix in ("", "-wal", "-shm"):
                    moved = Path(f"{path}{suffix}")
                    if moved.exists():
                        moved.rename(f"{moved}.corrupt")
                super().__init__(path, *args, **kwargs)

    return Store


@mutant("no-fsync", "outbox.db runs with synchronous=OFF (no fsync before the 202)", kills=("REC-NO-LOSS",),
        seam="outbox_store",
        undetectable="SIGKILL never loses the OS page cache; only a power cut or kernel crash would show it")
def _no_fsync():
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def __init__(self, path, policy, synchronous="FULL", **kwargs):
            super().__init__(path, policy, "OFF", **kwargs)

    return Store
