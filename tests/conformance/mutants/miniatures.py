"""Miniatures: toy daemons that honour the launch contract and nothing else (bowtie's ``tests/miniatures.py``).

``python -m tests.conformance.mutants.miniatures KIND --state-dir DIR --broker-url URL --port PORT`` creates DIR,
writes a ``local_token``, listens on ``DIR/daemon.sock`` and on ``127.0.0.1:PORT`` with the standard library's HTTP
server (no framework: a miniature inherits nothing from the reference), and never connects to the broker:

* ``accept-everything`` — every GET is 200 and every POST 202, with a body that claims success;
* ``500-everything`` — every route but ``GET /v1/health`` answers 500 problem+json;
* ``hang`` — ``GET /v1/health`` answers, every other request is read and never answered;
* ``hang-everything`` — the first ``GET /v1/health`` answers (so the harness starts it); every later request, the
  health check included, is read and never answered;
* ``endless-pages`` — every list route (``/v1/outbox``, ``/v1/inbox``) answers a full page and a fresh
  ``next_cursor``, forever; everything else as ``accept-everything``;
* ``garbage`` — ``GET /v1/health`` answers; every other request gets, in turn, JSON that is not JSON, the wrong
  content type, a body cut short of its Content-Length, broken chunked framing, two Content-Lengths, a status line
  that is not HTTP, and well-framed JSON of the wrong shape;
* ``crash`` — exits 1 before listening.

The ones that serve answer ``GET /v1/health`` with ``connected: true``, so the harness starts them and the cases,
not the launcher, have to find them out; the broker-dependent cases then skip (no hello reached the scripted broker),
which is never a pass. Each must end in verdicts — exit 1 with failed requirements — within the run's deadline.
``crash`` is the one subject that ends in a harness error, exit 2: the harness could not start a target, so it
checked nothing, and a failed verdict would claim requirements were tested that never were (CONFORMANCE.md: exit 2
is "the target could not be started or reached").
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from . import HARNESS_ERROR, Mutant

HEALTHY = {"ok": True, "connected": True, "lag_ms": None, "queue_depth": 0, "inflight": 0}
NEVER = threading.Event()


def template(kind: str) -> str:
    """The launch template that runs miniature ``kind`` (run from the repository root)."""
    return (f"{shlex.quote(sys.executable)} -m tests.conformance.mutants.miniatures {kind} --state-dir {{state_dir}} "
            "--broker-url {broker_url} --port {port}")


def _miniature(name: str, description: str, kills: tuple[str, ...], select: tuple[str, ...] = (),
               deadline_s: float = 120.0, est_s: float = 30.0) -> Mutant:
    return Mutant(name, description, kills, select=select, kind="miniature", launch=template(name),
                  deadline_s=deadline_s, case_timeout_s=30.0, est_s=est_s)


# Selections: cases that need no broker (a miniature never links), so each verdict is the miniature's own doing.
BASIC = ("transport.auth", "ipc.id.precedence", "ipc.id.grammar", "ipc.id.minted")

MINIATURES: dict[str, Mutant] = {
    m.name: m for m in (
        _miniature("accept-everything", "200/202 with a success-shaped body to every request, broker never contacted",
                   ("AUTH-BEARER", "AUTH-HOST", "AUTH-ORIGIN", "AUTH-TOKEN-QUERY", "IPC-ID-GRAMMAR",
                    "IPC-VALIDATION-CONSUMES-NOTHING"), select=(*BASIC, "ipc.validation.consumes_nothing")),
        _miniature("500-everything", "500 internal_error to every request but the health check",
                   ("ERR-NO-5XX-ON-BAD-INPUT", "IPC-ID-GRAMMAR", "IPC-ID-PRECEDENCE"),
                   select=("transport.malformed_json", "ipc.id.grammar", "ipc.id.precedence")),
        _miniature("hang", "answers the health check, never answers anything else",
                   ("IPC-ID-PRECEDENCE", "IPC-ID-GRAMMAR", "AUTH-BEARER"),
                   select=("ipc.id.precedence", "ipc.id.grammar", "transport.auth"), est_s=90),
        _miniature("hang-everything", "answers the first health check, then never answers anything, health included",
                   ("IPC-ID-PRECEDENCE", "IPC-ID-GRAMMAR", "AUTH-BEARER"),
                   select=("ipc.id.precedence", "ipc.id.grammar", "transport.auth"), est_s=90),
        _miniature("endless-pages", "every list route answers a full page and a fresh next_cursor, forever",
                   ("IPC-ID-PRECEDENCE", "IPC-ID-MINTED-ULID", "IPC-ID-GRAMMAR"),
                   select=("ipc.id.precedence", "ipc.id.minted", "ipc.id.grammar"), est_s=60),
        _miniature("garbage", "non-JSON, wrong content types, truncated bodies and broken HTTP framing",
                   ("IPC-ID-PRECEDENCE", "IPC-ID-GRAMMAR", "AUTH-BEARER", "AUTH-HOST"), select=BASIC, est_s=60),
        _miniature("crash", "exits 1 before listening", (HARNESS_ERROR,), select=("ipc.id.precedence",),
                   deadline_s=60, est_s=5),
    )
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    kind = "accept-everything"
    served = itertools.count()  # every request of the process, health included
    garbage = itertools.count()

    def log_message(self, format: str, *args: object) -> None:  # unix-socket peers have no address to log
        pass

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        return self.rfile.read(length) if length > 0 else b""

    def _answer(self, status: int, document: object, content_type: str = "application/json") -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _raw(self, data: bytes) -> None:
        """Write ``data`` as the whole answer and close the connection (the framing is the point)."""
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True

    def _serve(self) -> None:
        first = next(self.served) == 0
        self._body()
        health = self.command == "GET" and self.path.split("?", 1)[0] == "/v1/health"
        if self.kind == "hang-everything" and not first:
            NEVER.wait()
        if health:
            self._answer(200, HEALTHY)
        elif self.kind in ("hang", "hang-everything"):
            NEVER.wait()
        elif self.kind == "500-everything":
            self._answer(500, {"type": "about:blank", "title": "Internal error", "status": 500,
                               "detail": "miniature", "error": "internal_error"}, "application/problem+json")
        elif self.kind == "garbage":
            self._garbage(next(self.garbage))
        elif self.command == "POST":
            self._answer(202, {"status": "queued", "duplicate": False})
        elif self.kind == "endless-pages" and self.path.split("?", 1)[0] in ("/v1/outbox", "/v1/inbox"):
            self._endless_page()
        else:
            self._answer(200, {"items": [], "next_cursor": None, **HEALTHY})

    def _endless_page(self) -> None:
        page = next(self.garbage)
        items = [{"id": f"01J{page:010d}{n:013d}"[:26], "client_message_id": f"endless-{page}-{n}", "status": "pending",
                  "seq": page * 100 + n, "attempts": 0} for n in range(100)]
        self._answer(200, {"items": items, "next_cursor": f"page-{page + 1}"})

    def _garbage(self, turn: int) -> None:
        variant = turn % 7
        if variant == 0:
            data = b"<html>this is not json"
            self._raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(data), data))
        elif variant == 1:
            self._raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok")
        elif variant == 2:
            self._raw(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{"status": "qu')
        elif variant == 3:
            self._raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"zz\r\nnot a chunk\r\n")
        elif variant == 4:
            self._raw(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n{}")
        elif variant == 5:
            self._raw(b"HTTX/9.9 two hundred\r\n\r\n")
        else:
            self._answer(200, {"items": "none", "next_cursor": 7, "status": 12, "client_message_id": [],
                               "duplicate": "maybe"})

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _serve


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.mutants.miniatures")
    parser.add_argument("kind", choices=sorted(MINIATURES))
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.kind == "crash":
        print("miniature crash: exiting before listening", file=sys.stderr)
        return 1
    args.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = args.state_dir / "local_token"
    token.write_text("miniature-" + os.urandom(24).hex() + "\n")
    os.chmod(token, 0o600)
    handler = type("Handler", (_Handler,), {"kind": args.kind, "served": itertools.count(),
                                            "garbage": itertools.count()})
    sock_path = args.state_dir / "daemon.sock"
    sock_path.unlink(missing_ok=True)
    old_umask = os.umask(0o077)
    unix = _UnixServer(str(sock_path), handler)
    os.umask(old_umask)
    tcp = _TcpServer(("127.0.0.1", args.port), handler)
    threading.Thread(target=tcp.serve_forever, daemon=True).start()
    unix.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
