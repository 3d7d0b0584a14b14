"""Hook capability tokens (§6.2, E-50) in a real daemon: the route-by-route matrix of a live token, the destinations
each scope is bound to, the token's death with its hook, the refusal of a hook's process that presents no token, the
environment, the audit count and the metric; and the registry and hooks.toml rules on their own."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
from daemon_testkit import FAST

from reference.daemon.capabilities import Capabilities, Grant, bind_scopes
from reference.daemon.hooks import HooksConfigError, hook_environment, load_hooks
from spec import openapi

HOOKS_ON = FAST + "[hooks]\nenabled = true\n"
SENDER = "cd" * 32
OTHER = "ef" * 32
BROKER_ID = "01J9ZZZZZZZZZZZZZZZZZZZZZZ"

#: a hook that records what it sees and what its own token-less calls get, then waits to be released
PROBE = textwrap.dedent("""\
    #!{python}
    import http.client, json, os, socket, sys, time

    class Unix(http.client.HTTPConnection):
        def __init__(self, path):
            super().__init__("localhost", timeout=10)
            self.unix_path = path

        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(self.unix_path)

    def call(method, path):
        conn = Unix(os.environ["CLAUDEMESH_DAEMON_SOCK"])
        conn.request(method, path)
        answer = conn.getresponse()
        return [answer.status, json.loads(answer.read() or b"{{}}").get("error")]

    folder = {folder!r}
    name = os.environ["CLAUDEMESH_HOOK_NAME"]
    record = {{"env": dict(os.environ), "event": json.load(sys.stdin), "no_token": call("GET", "/v1/version")}}
    child = os.fork()
    if child == 0:  # a child in the hook's process group is the hook too
        with open(os.path.join(folder, name + ".child"), "w") as out:
            json.dump(call("GET", "/v1/inbox"), out)
        os._exit(0)
    os.waitpid(child, 0)
    with open(os.path.join(folder, name + ".json.tmp"), "w") as out:
        json.dump(record, out)
    os.rename(os.path.join(folder, name + ".json.tmp"), os.path.join(folder, name + ".json"))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
        time.sleep(0.05)
    """)

HOOKS_TOML = """\
[on-topic-alerts]
command = "probe"
capability_token_scope = ["reply:event", "dm:send:<sender_pubkey>", "topic:alerts:post"]
[on-message]
command = "probe"
capability_token_scope = ["reply:event"]
[on-dm]
command = "probe"
"""


def wait_file(path: Path, timeout: float = 30.0) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path


def audit_lines(daemon, count: int, timeout: float = 30.0) -> list[dict]:
    """The daemon's first ``count`` hook_audit records, once it has logged them."""
    deadline = time.monotonic() + timeout
    while True:
        lines = daemon.log_path.read_text().splitlines()
        records = [json.loads(line)["msg"] for line in lines if "hook_audit " in line]
        audit = [json.loads(record.split("hook_audit ", 1)[1]) for record in records]
        if len(audit) >= count:
            return audit
        assert time.monotonic() < deadline, f"{len(audit)} hook_audit lines, waited for {count}"
        time.sleep(0.05)


def routes() -> list[tuple[str, str]]:
    """Every (method, path) spec/openapi.yaml defines, and a path it does not."""
    found = [(method.upper(), path) for path, item in openapi()["paths"].items()
             for method in item if method in ("get", "post", "put", "delete", "patch")]
    return [*found, ("GET", "/v1/no-such-route"), ("DELETE", "/v1/inbox")]


@pytest.fixture
def hooked(broker, make_daemon):
    daemon = make_daemon(broker.url, HOOKS_ON, start=False)
    folder = daemon.state_dir / "hooks"
    folder.mkdir()
    probe = folder / "probe"
    probe.write_text(PROBE.format(python=sys.executable, folder=str(folder)))
    probe.chmod(0o755)
    (folder / "hooks.toml").write_text(HOOKS_TOML)
    daemon.start()
    daemon.wait_connected()
    return daemon, folder


def send(client, token: str, to: str, reply_to_id: str | None = None):
    body = {"to": to, "message": "from a hook"}
    if reply_to_id is not None:
        body["reply_to_id"] = reply_to_id
    return client.post("/v1/send", json=body, headers={"Authorization": f"ClaudeMesh-Capability {token}"})


def test_a_live_token_is_held_to_its_scope_route_by_route_and_dies_with_its_hook(broker, hooked):
    daemon, folder = hooked
    broker.push(body="disk full", topic="alerts", sender=SENDER, broker_message_id=BROKER_ID)
    alerts = json.loads(wait_file(folder / "on-topic-alerts.json").read_text())
    message = json.loads(wait_file(folder / "on-message.json").read_text())
    token, reply_only = alerts["env"]["CLAUDEMESH_CAPABILITY_TOKEN"], message["env"]["CLAUDEMESH_CAPABILITY_TOKEN"]
    assert token != reply_only
    header = {"Authorization": f"ClaudeMesh-Capability {token}"}
    with daemon.unix() as client:
        # req: HOOK-CAP-SCOPE -- every route but POST /v1/send is refused, known or not
        for method, path in routes():
            if (method, path) == ("POST", "/v1/send"):
                continue
            answer = client.request(method, path, headers=header)
            assert (answer.status_code, answer.json()["error"]) == (403, "capability_denied"), (method, path)
            assert answer.headers["content-type"].startswith("application/problem+json")
        # the destinations the scopes bind: the topic that fired, the sender, the message answered
        assert send(client, token, "#alerts").status_code == 202  # topic:alerts:post
        assert send(client, token, f"dm:{SENDER}").status_code == 202  # dm:send:<sender_pubkey>
        assert send(client, token, SENDER.upper()).status_code == 202  # the same key, another spelling
        assert send(client, reply_only, "#alerts", BROKER_ID).status_code == 202  # reply:event
        refused = [send(client, token, "#incidents"), send(client, token, f"dm:{OTHER}"),
                   send(client, token, "queue:jobs"), send(client, reply_only, "#alerts"),
                   send(client, reply_only, "#alerts", "01J9YYYYYYYYYYYYYYYYYYYYYY"),
                   send(client, reply_only, f"dm:{SENDER}")]
        assert [(a.status_code, a.json()["error"]) for a in refused] == [(403, "capability_denied")] * 6
        # a refused send consumes nothing: the same id is still free for the daemon's own client
        assert client.post("/v1/send", json={"to": "#incidents", "message": "m", "client_message_id": "cap-free"}
                           ).status_code == 202
        # req: HOOK-CAP-REVOKED -- a token this daemon never minted
        forged = send(client, "x" * 43, "#alerts")
        assert (forged.status_code, forged.json()["error"]) == (401, "capability_invalid")
        assert forged.headers["www-authenticate"].startswith("ClaudeMesh-Capability")
        # the unix socket is unchanged for a process that is not a hook
        assert client.get("/v1/version").status_code == 200
    # req: HOOK-CAP-LOCAL -- never over TCP, whatever the token
    with daemon.tcp() as tcp:
        answer = tcp.get("/v1/version", headers=header)
        assert (answer.status_code, answer.json()["error"]) == (403, "capability_denied")
    (folder / "release").write_text("")
    audit = audit_lines(daemon, 2)
    with daemon.unix() as client:
        for dead in (send(client, token, "#alerts"), send(client, reply_only, "#alerts", BROKER_ID)):
            assert (dead.status_code, dead.json()["error"]) == (401, "capability_invalid")
        metrics = client.get("/v1/metrics").text
    assert 'cm_daemon_hook_capability_calls_total{hook="on-topic-alerts",scope="topic:alerts:post"} 1.0' in metrics
    assert 'cm_daemon_hook_capability_calls_total{hook="on-topic-alerts",scope="dm:send:<sender_pubkey>"} 2.0' \
        in metrics
    assert 'cm_daemon_hook_capability_calls_total{hook="on-message",scope="reply:event"} 1.0' in metrics
    calls = {record["hook"]: record["capability_calls"] for record in audit}
    routes_refused = len(routes()) - 1
    assert calls == {"on-topic-alerts": 3 + routes_refused + 3, "on-message": 1 + 3}


def test_a_hooks_own_process_without_its_token_is_refused_everywhere(broker, hooked):
    daemon, folder = hooked
    broker.push(body="hello", sender=SENDER)  # a direct message: on-dm (no scope) and on-message (reply:event)
    for name in ("on-dm", "on-message"):
        record = json.loads(wait_file(folder / f"{name}.json").read_text())
        # req: HOOK-CAP-REQUIRED -- the hook and the child it forked, token or not
        assert record["no_token"] == [403, "capability_required"], name
        assert json.loads(wait_file(folder / f"{name}.child").read_text()) == [403, "capability_required"], name
        # req: HOOK-CAP-ENV -- a token only where a scope is configured
        assert ("CLAUDEMESH_CAPABILITY_TOKEN" in record["env"]) == (name == "on-message")
    (folder / "release").write_text("")
    with daemon.unix() as client:  # once the hooks are gone, the socket serves as before
        assert client.get("/v1/inbox").status_code == 200


def test_scopes_are_bound_to_the_message_that_fired_the_hook():
    scopes = ("reply:event", "dm:send:<sender_pubkey>", "topic:alerts:post")
    assert bind_scopes(scopes, "alerts", SENDER.upper(), BROKER_ID) == (
        Grant("reply:event", "topic", "alerts", BROKER_ID), Grant("dm:send:<sender_pubkey>", "dm", SENDER),
        Grant("topic:alerts:post", "topic", "alerts"))
    # a direct message: reply:event answers the sender, and no topic scope grants anything
    assert bind_scopes(scopes, None, SENDER, None) == (
        Grant("reply:event", "dm", SENDER, ""), Grant("dm:send:<sender_pubkey>", "dm", SENDER))
    assert bind_scopes(("topic:alerts:post",), "incidents", SENDER, BROKER_ID) == ()


def test_a_token_lives_at_most_its_ttl_and_is_compared_whole():
    now = [100.0]
    registry = Capabilities(ttl_s=300.0, clock=lambda: now[0])
    capability = registry.mint("on-dm", 1, ())
    assert registry.lookup(capability.token) is capability
    assert registry.lookup(capability.token[:-1]) is None and registry.lookup(capability.token + "x") is None
    now[0] += 299.9
    assert registry.lookup(capability.token) is capability
    now[0] += 0.1
    # req: HOOK-CAP-REVOKED -- hook_capability_ttl_s, even while the hook still runs
    assert registry.lookup(capability.token) is None and not capability.live
    other = registry.mint("on-dm", 2, ())
    registry.enter(4242, other)
    registry.leave(4242, other)
    assert registry.lookup(other.token) is None and not registry.running


def test_the_environment_carries_a_token_only_when_given():
    assert "CLAUDEMESH_CAPABILITY_TOKEN" not in hook_environment("m", "on-dm", "e", "/s")
    assert hook_environment("m", "on-dm", "e", "/s", "tok")["CLAUDEMESH_CAPABILITY_TOKEN"] == "tok"


@pytest.mark.parametrize(("hook", "scope", "message"), [
    ("on-topic-a", "topic:b:post", "can never be granted"),
    ("on-dm", "topic:a:post", "can never be granted"),
    ("on-dm", f"dm:send:{SENDER}", "does not match"),  # no fixed recipients (v4 §6.2)
    ("on-dm", "topic:*:post", "does not match"),
    ("on-dm", "inbox:read", "does not match"),
])
def test_hooks_toml_refuses_a_scope_that_could_grant_nothing_or_too_much(tmp_path, hook, scope, message):
    (tmp_path / hook).write_text("#!/bin/sh\n")
    (tmp_path / hook).chmod(0o755)
    (tmp_path / "hooks.toml").write_text(f'[{hook}]\ncapability_token_scope = ["{scope}"]\n')
    with pytest.raises(HooksConfigError, match=message):
        load_hooks(tmp_path, 30.0)


def test_hooks_toml_takes_the_three_scopes(tmp_path):
    (tmp_path / "on-topic-a").write_text("#!/bin/sh\n")
    (tmp_path / "on-topic-a").chmod(0o755)
    (tmp_path / "hooks.toml").write_text(
        '[on-topic-a]\ncapability_token_scope = ["reply:event", "dm:send:<sender_pubkey>", "topic:a:post"]\n')
    assert load_hooks(tmp_path, 30.0)[0].scopes == ("reply:event", "dm:send:<sender_pubkey>", "topic:a:post")
