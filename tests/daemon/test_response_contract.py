"""API-CONFORMS inside the daemon: with ``[daemon] check_responses`` every response is held to spec/openapi.yaml as
it leaves, and one that breaks it becomes 500 internal_error naming the deviation (every test daemon runs so)."""

from __future__ import annotations

import json
import tomllib
import types

import falcon
import falcon.testing
import pytest
from conftest import checking_responses

from reference.daemon import problems
from reference.daemon.app import DaemonContext, create_app
from reference.daemon.contract import ResponseContract, deviation, path_template


def problem(code: str, status: int, **extensions) -> bytes:
    return json.dumps({"type": f"urn:meshspec:error:{code}", "title": "t", "status": status, "detail": "d",
                       "error": code, **extensions}).encode()


@pytest.mark.parametrize(("template", "method", "status", "content_type", "body", "found"), [
    ("/v1/send", "POST", 400, "application/problem+json", problem("invalid_json", 400), None),
    (None, "GET", 404, "application/problem+json", problem("not_found", 404), None),
    ("/v1/send", "DELETE", 405, "application/problem+json", problem("method_not_allowed", 405), None),
    ("/v1/metrics", "GET", 200, "text/plain; version=0.0.4; charset=utf-8", b"up 1\n", None),
    ("/v1/events", "GET", 200, "text/event-stream", None, None),
    ("/v1/version", "GET", 200, "application/json", b'{"daemon_version": "0.9.0"}',
     "GET /v1/version 200: the body: 'ipc_api' is a required property"),
    ("/v1/send", "POST", 400, "application/problem+json", problem("invalid_json", 400, invalid_params="all"),
     "POST /v1/send 400: /invalid_params: 'all' is not of type 'array'"),
    ("/v1/send", "POST", 418, "application/problem+json", problem("invalid_json", 418),
     "POST /v1/send: status 418, which the operation does not list"),
    ("/v1/version", "GET", 200, "text/html", b"<p>", "GET /v1/version 200: media type 'text/html', not one of "
                                                      "['application/json']"),
    ("/v1/version", "GET", 200, "application/json", b"{", "GET /v1/version 200: the application/json body is not JSON"),
    (None, "GET", 200, "application/json", b"{}",
     "GET (no route): 200 for a path no route has (spec/openapi.yaml: 404 not_found)"),
    ("/v1/send", "DELETE", 200, "application/json", b"{}",
     "DELETE /v1/send: 200 for a method /v1/send does not define (spec/openapi.yaml: 405 method_not_allowed)"),
])
def test_deviation_names_how_a_response_breaks_the_contract(template, method, status, content_type, body, found):
    assert deviation(template, method, status, content_type, body) == found


class _Version:
    def __init__(self, body: dict):
        self.body = body

    def on_get(self, req, resp):
        resp.media = self.body


def test_a_response_that_breaks_the_contract_leaves_as_500_naming_it(caplog):
    app = falcon.App(middleware=[ResponseContract()])
    problems.install(app)
    app.add_route("/v1/version", _Version({"daemon_version": "0.9.0"}))
    client = falcon.testing.TestClient(app)
    answer = client.simulate_get("/v1/version")
    assert (answer.status_code, answer.headers["content-type"]) == (500, "application/problem+json")
    assert answer.json["detail"] == ("response_contract_violation: GET /v1/version 200: the body: 'ipc_api' is a "
                                     "required property")
    assert "response_contract_violation GET /v1/version 200" in caplog.text
    assert client.simulate_get("/v1/nowhere").json["error"] == "not_found"  # a conforming answer leaves as it was


def test_create_app_checks_responses_only_when_configured():
    """A link that negotiated a bit features.yaml does not have: /v1/version would name it."""
    link = types.SimpleNamespace(state=types.SimpleNamespace(negotiated={"no_such_bit": {"version": 1}}))

    def version(check: bool) -> falcon.testing.Result:
        config = {"ipc": {"max_inflight": 4}, "daemon": {"mesh": "m", "check_responses": check}}
        ctx = DaemonContext(config=config, token="t", outbox=None, inbox=None, link=link, events=None,
                            committer=None, metrics=None, member_pubkey="5b" * 32)
        return falcon.testing.TestClient(create_app(ctx, lambda *args: {})).simulate_get(
            "/v1/version", extras={"meshd.transport": "unix"})

    unchecked, checked = version(False), version(True)
    assert (unchecked.status_code, unchecked.json["broker_features_negotiated"]) == (200, ["no_such_bit"])
    assert checked.status_code == 500
    assert checked.json["detail"].startswith("response_contract_violation: GET /v1/version 200: "
                                             "/broker_feature_params: 'no_such_bit' is not one of [")


def test_an_answer_given_before_routing_is_judged_by_its_path():
    """The guard refuses a TCP request without the token before falcon routes it: still POST /v1/send's 401."""
    config = {"ipc": {"max_inflight": 4, "max_body_bytes": 1024}, "daemon": {"mesh": "m", "check_responses": True}}
    ctx = DaemonContext(config=config, token="t", outbox=None, inbox=None, link=None, events=None, committer=None,
                        metrics=None, member_pubkey="5b" * 32)
    answer = falcon.testing.TestClient(create_app(ctx, lambda *args: {})).simulate_post(
        "/v1/send", body=b"{}", headers={"Content-Type": "application/json", "Authorization": "Bearer wrong",
                                         "Host": "localhost"}, extras={"meshd.transport": "tcp"})
    assert (answer.status_code, answer.json["error"]) == (401, "invalid_bearer_token")
    assert (path_template("/v1/outbox/requeue"), path_template("/v1/send/"), path_template("/v1/nowhere")) == (
        "/v1/outbox/requeue", None, None)


@pytest.mark.parametrize(("config", "expected"), [
    ("[outbox]\nretry_base_ms = 100\n[daemon]\ndrain_timeout_s = 2.0\n",
     {"outbox": {"retry_base_ms": 100}, "daemon": {"check_responses": True, "drain_timeout_s": 2.0}}),
    ("[outbox]\nretry_base_ms = 100\n", {"outbox": {"retry_base_ms": 100}, "daemon": {"check_responses": True}}),
    ("[daemon]\ncheck_responses = false\n", {"daemon": {"check_responses": False}}),
])
def test_every_test_daemon_checks_its_responses_unless_told_not_to(config, expected):
    assert tomllib.loads(checking_responses(config)) == expected
