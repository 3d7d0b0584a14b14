"""Miniatures: toy daemons that honour the launch contract and nothing else (bowtie's ``tests/miniatures.py``).

``python -m tests.conformance.mutants.miniatures KIND --state-dir DIR --broker-url URL --port PORT`` creates DIR, writes a
``local_token``, listens on ``DIR/daemon.sock`` and on ``127.0.0.1:PORT`` with the stdlib's HTTP/1.1 server (no
framework: a miniature must not inherit anything from the reference), and never connects to the broker:

* ``accept-everything`` — every GET is 200 and every POST 202, with a body that claims success;
* ``500-everything`` — every route but ``GET /v1/health`` answers 500 problem+json;
* ``hang`` — ``GET /v1/health`` answers, every other request is read and never answered;
* ``crash`` — exits 1 before listening.

The three that serve answer ``GET /v1/health`` with ``connected: true`` so the harness starts them and the cases, not
the launcher, have to find them out; the broker-dependent cases then skip (no hello reached the scripted broker),
which is never a pass. ``crash`` is a harness error (exit 2).
"""

from __future__ import annotations

import argparse
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


def template(kind: str) -> str:
    """The launch template that runs miniature ``kind``."""
    return (f"{shlex.quote(sys.executable)} -m tests.conformance.mutants.miniatures {kind} --state-dir {{state_dir}} "
            "--broker-url {broker_url} --port {port}")


MINIATURES: dict[str, Mutant] = {
    m.name: m for m in (
        Mutant("accept-everything", "200/202 with a success-shaped body to every request, broker never contacted",
               ("API-CONFORMS", "AUTH-BEARER", "IPC-VALIDATION-CONSUMES-NOTHING", "IPC-ID-GRAMMAR"),
               kind="miniature", launch=template("accept-everything")),
        Mutant("500-everything", "500 internal_error to every request but the health check",
               ("ERR-NO-5XX-ON-BAD-INPUT", "API-CONFORMS"), select=("fuzz.openapi",), kind="miniature",
               launch=template("500-everything")),
        Mutant("hang", "answers the health check, never answers anything else",
               ("IPC-ID-PRECEDENCE",), kind="miniature", launch=template("hang"), est_s=20),
        Mutant("crash", "exits 1 before listening", (HARNESS_ERROR,), select=("IPC-ID-PRECEDENCE",),
               kind="miniature", launch=template("crash")),
    )
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    kind = "accept-everything"

    def log_message(self, format: str, *args: object) -> None:  # unix-socket peers have no address to log
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self, status: int, document: dict, content_type: str = "application/json") -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self) -> None:
        self._body()
        if self.command == "GET" and self.path.split("?", 1)[0] == "/v1/health":
            self._answer(200, HEALTHY)
        elif self.kind == "hang":
            threading.Event().wait()
        elif self.kind == "500-everything":
            self._answer(500, {"type": "about:blank", "title": "Internal error", "status": 500,
                               "detail": "miniature", "error": "internal_error"}, "application/problem+json")
        elif self.command == "POST":
            self._answer(202, {"status": "queued", "duplicate": False})
        else:
            self._answer(200, {"items": [], "next_cursor": None, **HEALTHY})

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
    handler = type("Handler", (_Handler,), {"kind": args.kind})
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
