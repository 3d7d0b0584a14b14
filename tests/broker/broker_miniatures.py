"""Miniature brokers that are not brokers at all, for proving the broker suite ends in verdicts whatever it meets.

``garbage`` says hello_ack and a negotiation response without their required members, answers every send with an ack
that carries only the id (no status, no ids), pushes a message without a delivery_id, and closes 1011 on anything
else. ``silent`` accepts connections and never says anything. Each serves on 127.0.0.1 in a thread:

    with serving("garbage") as url: ...
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve


def _garbage(conn: ServerConnection) -> None:
    for raw in conn:
        try:
            frame: Any = json.loads(raw)
        except ValueError:
            frame = None
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "hello":
            conn.send(json.dumps({"type": "hello_ack"}))
        elif kind == "feature_negotiation_request":
            conn.send(json.dumps({"type": "feature_negotiation_response", "supported": "everything"}))
        elif kind == "send":
            conn.send(json.dumps({"type": "ack", "client_message_id": frame.get("client_message_id")}))
            conn.send(json.dumps({"type": "push", "client_message_id": frame.get("client_message_id"),
                                  "body": frame.get("body"), "messageId": None}))
            conn.send("]not json[")
        elif kind in ("client_ack", "list_peers"):
            conn.send(json.dumps([1, 2, 3]))
        else:
            conn.close(1011, "what")
            return


def _silent(conn: ServerConnection) -> None:
    for _ in conn:
        pass


HANDLERS = {"garbage": _garbage, "silent": _silent}


@contextlib.contextmanager
def serving(name: str) -> Iterator[str]:
    """The miniature ``name`` on a free 127.0.0.1 port; yields its ws:// URL."""
    handler = HANDLERS[name]

    def handle(conn: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            handler(conn)

    server = serve(handle, "127.0.0.1", 0, compression=None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
    finally:
        server.shutdown()
        thread.join(10)
