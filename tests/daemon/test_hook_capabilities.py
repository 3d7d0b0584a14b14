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

#: a hook that records what it sees and what its own token-less calls get, then makes the calls of the plan the test
#: writes for it (with its token, none, or another's; one over a connection a child opened and left), records the
#: answers, and waits to be released
PROBE = textwrap.dedent("""\
    #!{python}
    import http.client, json, os, socket, sys, time

    class Unix(http.client.HTTPConnection):
        def __init__(self, path, sock=None):
            super().__init__("localhost", timeout=10)
            self.unix_path, self.handed = path, sock

        def connect(self):
            if self.handed is not None:
                self.sock = self.handed
                return
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(self.unix_path)

    def handed_over():
        # a child opens the connection and exits; this process talks on it
        sock = socket.socket(socket.AF_UNIX)
        child = os.fork()
        if child == 0:
            sock.connect(os.environ["CLAUDEMESH_DAEMON_SOCK"])
            os._exit(0)
        os.waitpid(child, 0)
        return sock

    def call(method, path, body=None, token=None, handoff=False):
        conn = Unix(os.environ["CLAUDEMESH_DAEMON_SOCK"], handed_over() if handoff else None)
        headers = {{"Content-Type": "application/json"}} if body is not None else {{}}
        if token:
            headers["Authorization"] = "ClaudeMesh-Capability " + token
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        answer = conn.getresponse()
        return [answer.status, json.loads(answer.read() or b"{{}}").get("error")]

    def wait(path):
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return os.path.exists(path)

    def write(path, document):
        with open(path + ".tmp", "w") as out:
            json.dump(document, out)
        os.rename(path + ".tmp", path)

    folder = {folder!r}
    name = os.environ["CLAUDEMESH_HOOK_NAME"]
    own = os.environ.get("CLAUDEMESH_CAPABILITY_TOKEN")
    record = {{"env": dict(os.environ), "event": json.load(sys.stdin), "no_token": call("GET", "/v1/version")}}
    child = os.fork()
    if child == 0:  # a child in the hook's process group is the hook too
        write(os.path.join(folder, name + ".child"), call("GET", "/v1/inbox"))
        os._exit(0)
    os.waitpid(child, 0)
    write(os.path.join(folder, name + ".json"), record)
    plan = os.path.join(folder, name + ".plan.json")
    if wait(plan):
        results = []
        for step in json.load(open(plan)):
            token = own if step.get("auth", "own") == "own" else step.get("token")
            results.append(call(step["method"], step["path"], step.get("body"), token, step.get("handoff", False)))
        write(os.path.join(folder, name + ".results.json"), results)
    wait(os.path.join(folder, "release"))
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


def send(to: str, reply_to_id: str | None = None, **step) -> dict:
    """A plan step: POST /v1/send to ``to`` (answering ``reply_to_id``)."""
    body = {"to": to, "message": "from a hook"}
    if reply_to_id is not None:
        body["reply_to_id"] = reply_to_id
    return {"method": "POST", "path": "/v1/send", "body": body, **step}


def plan(folder: Path, hook: str, steps: list[dict]) -> list[list]:
    """Have ``hook`` make ``steps`` itself; its answers, [status, error] each."""
    (folder / f"{hook}.plan.json").write_text(json.dumps(steps))
    return json.loads(wait_file(folder / f"{hook}.results.json").read_text())


DENIED, INVALID = [403, "capability_denied"], [401, "capability_invalid"]


def test_a_live_token_is_held_to_its_scope_route_by_route_and_dies_with_its_hook(broker, hooked):
    daemon, folder = hooked
    broker.push(body="disk full", topic="alerts", sender=SENDER, broker_message_id=BROKER_ID)
    alerts = json.loads(wait_file(folder / "on-topic-alerts.json").read_text())
    message = json.loads(wait_file(folder / "on-message.json").read_text())
    token, reply_only = alerts["env"]["CLAUDEMESH_CAPABILITY_TOKEN"], message["env"]["CLAUDEMESH_CAPABILITY_TOKEN"]
    assert token != reply_only
    others = [(method, path) for method, path in routes() if (method, path) != ("POST", "/v1/send")]
    answers = plan(folder, "on-topic-alerts", [
        *[{"method": method, "path": path} for method, path in others],
        # the destinations the scopes bind: the topic that fired, the sender (two spellings)
        send("#alerts"), send(f"dm:{SENDER}"), send(SENDER.upper()),
        send("#incidents"), send(f"dm:{OTHER}"), send("queue:jobs"),
        send("@group"),  # refused by validation (400): still a call made with the token
        # req: HOOK-CAP-SCOPE -- bound to its group: the other hook's token is refused here, even within its scope
        send("#alerts", BROKER_ID, auth="other", token=reply_only),
        # req: HOOK-CAP-REVOKED -- a token this daemon never minted
        send("#alerts", auth="other", token="x" * 43),
    ])
    # req: HOOK-CAP-SCOPE -- every route but POST /v1/send is refused, known or not
    assert answers[:len(others)] == [DENIED] * len(others), list(zip(others, answers, strict=False))
    sends = answers[len(others):]
    assert sends == [[202, None], [202, None], [202, None], DENIED, DENIED, DENIED,
                     [400, "destination_unresolvable"], DENIED, INVALID]
    answers = plan(folder, "on-message", [
        send("#alerts", BROKER_ID),  # reply:event
        send("#alerts"), send("#alerts", "01J9YYYYYYYYYYYYYYYYYYYYYY"), send(f"dm:{SENDER}"),
        # a connection a child opened and left: its opener is gone, so the daemon cannot tell who talks on it
        {"method": "GET", "path": "/v1/inbox", "auth": "none", "handoff": True},
        send("#alerts", BROKER_ID, handoff=True),
    ])
    assert answers == [[202, None], DENIED, DENIED, DENIED, [403, "capability_required"], DENIED]
    with daemon.unix() as client:
        # a token presented by a process outside its hook's group (this test) is refused, in scope or not
        bound = client.post("/v1/send", json={"to": "#alerts", "message": "m"},
                            headers={"Authorization": f"ClaudeMesh-Capability {token}"})
        assert (bound.status_code, bound.json()["error"]) == (403, "capability_denied")
        assert "process group" in bound.json()["detail"]
        # a refused send consumes nothing: the id is still free
        assert client.post("/v1/send", json={"to": "#incidents", "message": "m", "client_message_id": "cap-free"}
                           ).status_code == 202
        forged = client.post("/v1/send", json={"to": "#alerts", "message": "m"},
                             headers={"Authorization": "ClaudeMesh-Capability " + "y" * 43})
        assert (forged.status_code, forged.json()["error"]) == (401, "capability_invalid")
        assert forged.headers["www-authenticate"].startswith("ClaudeMesh-Capability")
        # the unix socket is unchanged for a process that is not a hook
        assert client.get("/v1/version").status_code == 200
    # req: HOOK-CAP-LOCAL -- never over TCP, whatever the token
    with daemon.tcp() as tcp:
        answer = tcp.get("/v1/version", headers={"Authorization": f"ClaudeMesh-Capability {token}"})
        assert (answer.status_code, answer.json()["error"]) == (403, "capability_denied")
    (folder / "release").write_text("")
    audit = audit_lines(daemon, 2)
    with daemon.unix() as client:
        for dead in (token, reply_only):
            answer = client.post("/v1/send", json={"to": "#alerts", "message": "m"},
                                 headers={"Authorization": f"ClaudeMesh-Capability {dead}"})
            assert (answer.status_code, answer.json()["error"]) == (401, "capability_invalid")
        metrics = client.get("/v1/metrics").text
    assert 'cm_daemon_hook_capability_calls_total{hook="on-topic-alerts",scope="topic:alerts:post"} 1.0' in metrics
    assert 'cm_daemon_hook_capability_calls_total{hook="on-topic-alerts",scope="dm:send:<sender_pubkey>"} 2.0' \
        in metrics
    assert 'cm_daemon_hook_capability_calls_total{hook="on-message",scope="reply:event"} 1.0' in metrics
    # every request made with a live token is counted, the 400 and the ones refused anywhere included: on-topic-alerts'
    # own 12 routes and 7 sends, the outside and TCP ones aside (TCP never looks a token up); on-message's token was
    # presented by on-topic-alerts once and by this test once
    calls = {record["hook"]: record["capability_calls"] for record in audit}
    assert calls == {"on-topic-alerts": len(others) + 7 + 1, "on-message": 1 + 3 + 1 + 1}


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


def test_hook_reply_ids_are_reserved_to_the_daemon(broker, daemon):
    """E-50: no client takes a hook reply's id first -- not in the body, not in the header, not as a requeue's."""
    from reference.core import reply_client_message_id

    reserved = reply_client_message_id("in-1", "on-message")
    with daemon.unix() as client:
        for answer in (client.post("/v1/send", json={"to": "#t", "message": "m", "client_message_id": reserved}),
                       client.post("/v1/send", json={"to": "#t", "message": "m"},
                                   headers={"Idempotency-Key": reserved})):
            assert (answer.status_code, answer.json()["error"]) == (400, "invalid_client_message_id")
        sent = client.post("/v1/send", json={"to": "#t", "message": "m"}).json()
        row = client.get("/v1/outbox").json()["items"][0]
        requeued = client.post("/v1/outbox/requeue", json={"id": row["id"], "new_client_message_id": reserved})
        assert (requeued.status_code, requeued.json()["error"]) == (400, "invalid_client_message_id")
        assert [i["client_message_id"] for i in client.get("/v1/outbox").json()["items"]] == \
            [sent["client_message_id"]]
