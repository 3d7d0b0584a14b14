"""The daemon's IPC stack with no work behind it: the ceiling rows of bench/send_throughput.py.

    python bench/_bare_ipc.py SOCKET WORKERS

Serves a Falcon app whose routes answer ``GET /v1/health`` and ``POST /v1/send`` with a constant body (the POST body
is read, as the daemon reads it), with the daemon's own gunicorn settings (``serving_settings`` at the default
configuration) but ``WORKERS`` worker processes, on a unix socket, until SIGTERM. Its rate is what the daemon would
reach if validation, the outbox transaction, the fsync and the broker link cost nothing: no daemon built on this
stack with ``WORKERS`` processes answers faster.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import falcon
from gunicorn.app.base import BaseApplication

from reference.daemon.config import defaults
from reference.daemon.server import serving_settings

BODY = (b'{"client_message_id":"bench-00000000-0000000000","status":"queued","duplicate":false,'
        b'"request_fingerprint":"' + b"0" * 64 + b'"}')


class _Answer:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = BODY

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.bounded_stream.read()
        resp.status = falcon.HTTP_202
        resp.content_type = falcon.MEDIA_JSON
        resp.data = BODY


class StackServer(BaseApplication):
    """The daemon's gunicorn settings (default configuration) with ``workers`` processes on a unix socket, serving
    ``resource`` at ``/v1/health`` and ``/v1/send`` (each worker process builds its own)."""

    def __init__(self, socket_path: str, workers: int, resource: Callable[[], object]):
        config = defaults()
        config["daemon"]["log_level"] = "WARNING"
        self.settings = {**serving_settings(config), "bind": [f"unix:{socket_path}"], "workers": workers}
        self.resource = resource
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.settings.items():
            self.cfg.set(key, value)

    def load(self) -> falcon.App:
        app = falcon.App()
        resource = self.resource()
        app.add_route("/v1/health", resource)
        app.add_route("/v1/send", resource)
        return app


if __name__ == "__main__":
    StackServer(sys.argv[1], int(sys.argv[2]), _Answer).run()
