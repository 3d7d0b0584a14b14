"""The Python SDK on its own: it imports with the standard library alone, its result types are the OpenAPI schemas,
and against a scripted daemon that misbehaves it retries under one key, honours Retry-After, gives up at its
deadline, and reads event streams the way the daemon frames them."""

from __future__ import annotations

import http.server
import json
import socketserver
import subprocess
import sys
import threading
import time
from dataclasses import fields
from email.utils import formatdate
from pathlib import Path

import pytest

import reference.client as sdk
from spec import openapi

REPO = Path(__file__).resolve().parents[2]


def test_the_sdk_imports_with_the_standard_library_alone(tmp_path):
    """A fresh venv with nothing installed: the package imports, and every module it loaded is the standard
    library's or its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules); import reference.client; "
             "new = sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names "
             "and m.split('.')[0] != 'reference'); print(new); assert not new, new")
    python = tmp_path / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-I", "-c", probe, str(REPO)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "No module named" not in done.stderr
    outside = subprocess.run([str(python), "-I", "-c", "import httpx"], capture_output=True, text=True)
    assert outside.returncode != 0  # the venv really has none of meshspec's dependencies


@pytest.mark.parametrize(("result", "schemas"), [
    (sdk.SendResult, ("SendAccepted", "SendDuplicate")), (sdk.InboxItem, ("InboxItem",)),
    (sdk.InboxPage, ("InboxPage",)), (sdk.OutboxItem, ("OutboxItem",)), (sdk.OutboxPage, ("OutboxPage",)),
    (sdk.Version, ("Version",)), (sdk.Health, ("Health",)), (sdk.RequeueResult, ("RequeueResult",)),
    (sdk.ProfileResult, ("ProfileResult",)),
])
def test_each_result_type_has_exactly_its_schemas_members(result, schemas):
    documented = {}
    required = set()
    for name in schemas:
        schema = openapi()["components"]["schemas"][name]
        documented.update(dict.fromkeys(schema["properties"]))
        required |= set(schema.get("required", []))
    assert [f.name for f in fields(result)] == list(documented)
    # a member every schema requires is a field without a default; an optional one defaults to None
    for f in fields(result):
        must = all(f.name in openapi()["components"]["schemas"][n].get("required", []) for n in schemas)
        assert (f.default is None) != must or f.name in ("items", "next_cursor"), f.name


# --- a scripted daemon on a unix socket ---------------------------------------------------------------------------
class Scripted(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, script: list):
        self.script, self.requests = list(script), []
        super().__init__(path, Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((time.monotonic(), self.path, body))
        action = self.server.script.pop(0) if self.server.script else ("answer", 202, {})
        if action[0] == "reset":  # the request was read (and, for a real daemon, committed), then the line dropped
            self.connection.shutdown(2)
            self.close_connection = True
            return
        _, status, headers = action
        document = ({"client_message_id": body["client_message_id"], "status": "queued", "duplicate": False,
                     "request_fingerprint": "ab" * 32} if status in (200, 202) else
                    {"type": "urn:meshspec:error:x", "title": "t", "status": status, "detail": "d",
                     "error": {409: "idempotency_key_reused", 429: "daemon_busy", 503: "daemon_draining",
                               400: "invalid_request"}[status],
                     **({"conflict": "outbox_pending_fingerprint_mismatch",
                         "client_message_id": body["client_message_id"]} if status == 409 else {})})
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if status < 300 else "application/problem+json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def scripted(tmp_path):
    servers = []

    def start(script: list) -> tuple[Scripted, sdk.Client]:
        server = Scripted(str(tmp_path / f"s{len(servers)}.sock"), script)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, sdk.Client(sdk.Endpoint(socket_path=server.server_address), timeout=5)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_busy_draining_and_a_reset_after_commit_are_retried_under_the_one_key(scripted):
    server, client = scripted([("answer", 429, {"Retry-After": "1"}), ("reset",),
                               ("answer", 503, {"Retry-After": formatdate(time.time() + 4, usegmt=True)}),
                               ("answer", 202, {})])
    result = client.send("#t", "m")
    keys = {body["client_message_id"] for _, _, body in server.requests}
    assert len(server.requests) == 4 and keys == {result.client_message_id}
    times = [t for t, _, _ in server.requests]
    assert times[1] - times[0] >= 0.95  # Retry-After: 1
    assert times[3] - times[2] >= 1.0  # an HTTP-date 4 s after the script was written, about 1.1 s before it served
    assert {json.dumps(body, sort_keys=True) for _, _, body in server.requests}.__len__() == 1  # the same body


def test_a_retry_after_past_the_deadline_gives_up_with_the_hint(scripted):
    server, client = scripted([("answer", 429, {"Retry-After": "30"})])
    started = time.monotonic()
    with pytest.raises(sdk.Unavailable) as gave_up:
        client.send("#t", "m", deadline_s=5)
    assert time.monotonic() - started < 2 and gave_up.value.retry_after == 30.0 and gave_up.value.status == 429
    assert len(server.requests) == 1


def test_a_conflict_and_a_bad_request_are_not_retried(scripted):
    server, client = scripted([("answer", 409, {}), ("answer", 400, {})])
    with pytest.raises(sdk.Conflict) as conflict:
        client.send("#t", "m", client_message_id="k-1")
    assert (conflict.value.conflict, conflict.value.client_message_id) == ("outbox_pending_fingerprint_mismatch", "k-1")
    with pytest.raises(sdk.MeshError) as bad:
        client.send("#t", "m")
    assert type(bad.value) is sdk.MeshError and bad.value.code == "invalid_request"
    assert len(server.requests) == 2


def test_an_unreachable_daemon_is_retried_until_the_deadline(tmp_path):
    client = sdk.Client(sdk.Endpoint(socket_path=str(tmp_path / "none.sock")))
    started = time.monotonic()
    with pytest.raises(sdk.Unavailable, match="deadline"):
        client.send("#t", "m", deadline_s=1.0)
    assert 0.95 < time.monotonic() - started < 3  # tried until the deadline, not given up before it


@pytest.mark.parametrize(("value", "wanted"), [("3", 3.0), (" 0 ", 0.0), ("-1", None), ("soon", None), (None, None),
                                                ("1.5", None)])
def test_retry_after_reads_delta_seconds(value, wanted):
    assert sdk.retry_after(value) == wanted


def test_retry_after_reads_an_http_date():
    assert 9 <= sdk.retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10.5
    assert sdk.retry_after(formatdate(time.time() - 10, usegmt=True)) == 0.0


def test_minted_keys_are_ulids_in_the_id_grammar_and_sort_by_time():
    import re

    keys = [sdk.new_client_message_id() for _ in range(200)]
    grammar = re.compile(openapi()["components"]["schemas"]["Ulid"]["pattern"])
    assert all(grammar.fullmatch(k) for k in keys) and len(set(keys)) == 200
    earlier = sdk.new_client_message_id()
    time.sleep(0.002)
    assert sdk.new_client_message_id()[:10] > earlier[:10]


class _Lines:
    def __init__(self, data: bytes):
        self.lines = data.splitlines(keepends=True)

    def readline(self):
        return self.lines.pop(0) if self.lines else b""


def test_the_event_parser_reads_the_daemons_framing_and_drops_a_cut_event():
    from reference.client._client import _sse

    stream = (b": keepalive\n\nid: 7\nevent: message\ndata: {\"body\": \"x\"}\n\n"
              b"event: replay_gap\ndata: {\"requested_after\": 1}\n\nid: 8\nevent: message\ndata: {\"bo")
    events = list(_sse(_Lines(stream)))
    assert events == [sdk.Event(7, "message", {"body": "x"}), sdk.Event(None, "replay_gap", {"requested_after": 1})]
