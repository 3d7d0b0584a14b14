"""The Python SDK end to end (#14): the sandbox's broker and daemon, a second daemon joined to the same broker, a send
from one SDK client and an event stream on the other, whose connection is killed in the middle -- every message
arrives, once, and the stream resumes where it stopped."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from test_server import FAST_DAEMON

from conformance.launch import REFERENCE_TEMPLATE, Launched
from reference.client import Client, Endpoint, discover
from reference.sandbox import Sandbox


class Proxy:
    """A TCP relay on 127.0.0.1 to ``port`` whose connections the test can cut at once, both sides."""

    def __init__(self, port: int):
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[tuple[socket.socket, socket.socket]] = []
        self.requests: list[bytes] = []  # the first bytes each client sent: its request head
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.connections.append((client, server))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        first = True
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if record and first:
                    self.requests.append(data)
                    first = False
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> int:
        """Kill every open connection (both sides); how many there were."""
        cut = 0
        for pair in self.connections:
            for end in pair:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                    cut += 1
        return cut // 2

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.cut()


def test_the_sdk_sends_receives_and_resumes_a_killed_stream_in_the_sandbox(tmp_path):
    with Sandbox(tmp_path / "sb") as sandbox:
        second = tmp_path / "b"
        second.mkdir(mode=0o700)
        (second / "config.toml").write_text(FAST_DAEMON)
        receiver = Launched(REFERENCE_TEMPLATE, second, sandbox.broker_url)
        receiver.start()
        proxy = None
        try:
            receiver.wait_connected()
            sender = discover(sandbox.state_dir)
            direct = discover(second)
            pubkey = direct.health().member_pubkey
            # the receiver's stream goes over TCP through a relay the test can cut
            proxy = Proxy(direct_port(second))
            stream_client = Client(Endpoint(port=proxy.port, token_file=second / "local_token"))
            seen: list = []
            done = threading.Event()

            def consume() -> None:
                for event in stream_client.events(reconnect_s=60):
                    if event.event == "message":
                        seen.append(event)
                    if len(seen) >= 10:
                        break
                done.set()

            threading.Thread(target=consume, daemon=True).start()
            time.sleep(0.5)
            keys = [sender.send(f"dm:{pubkey}", f"m{n}").client_message_id for n in range(5)]
            wait(lambda: len(seen) >= 5, 30, "the first five messages on the stream")
            assert proxy.cut() >= 1  # the event stream's connection, killed mid-stream
            keys += [sender.send(f"dm:{pubkey}", f"m{n}").client_message_id for n in range(5, 10)]
            assert done.wait(60), f"{len(seen)} messages on the stream"
            bodies = [event.data["body"] for event in seen]
            ids = [event.id for event in seen]
            assert sorted(bodies, key=lambda b: int(b[1:])) == [f"m{n}" for n in range(10)]
            assert len(set(ids)) == 10 and ids == sorted(ids)  # each once, in id order
            streams = [r for r in proxy.requests if r.startswith(b"GET /v1/events")]
            assert len(streams) >= 2 and b"last-event-id: " in streams[1].lower()
            # and the inbox holds each message once, read to its end page by page
            items = [item for page in direct.inbox_pages(limit=3) for item in page.items]
            assert sorted(i.body for i in items) == sorted(bodies) and len({i.client_message_id for i in items}) == 10
            assert {i.client_message_id for i in items} == set(keys)
        finally:
            if proxy is not None:
                proxy.close()
            receiver.stop(timeout=10)


def direct_port(state_dir) -> int:
    return int((state_dir / "http.port").read_text().strip())


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)
