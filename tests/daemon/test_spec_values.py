"""The daemon's values are the spec's: every status, bound and set it uses equals the one spec/ decides (issue 15).

Each test reads the value from its source in spec/ (a table, spec/openapi.yaml, a schema) and compares the code's
own, so an edit of the spec that the code does not follow fails here rather than drifting silently.
"""

from __future__ import annotations

import argparse
from http import HTTPStatus

import falcon.testing
import pytest
from gunicorn.http import errors as http_errors

from reference.daemon.app import IPC_API, IPC_FEATURES, DaemonContext, create_app
from reference.daemon.cli import OUTBOX_FILTERS, add_commands
from reference.daemon.config import KEYS
from reference.daemon.deadlines import ReadTimeout
from reference.daemon.events import EventBus
from reference.daemon.metrics import DaemonMetrics
from reference.daemon.problems import FALCON_REFUSALS, Problem, falcon_codes
from reference.daemon.server import problem_for, problem_response
from reference.daemon.store.outbox import STATES
from spec import load_table, openapi, openapi_parameter, schema

ERRORS = load_table("errors")["codes"]


@pytest.mark.parametrize(("exc", "code"), [
    (ReadTimeout("head", 3), "request_timeout"),
    (ReadTimeout("body", 3), "request_timeout"),
    (http_errors.LimitRequestLine(5000, 4094), "uri_too_long"),
    (http_errors.LimitRequestHeaders("too many headers"), "header_fields_too_large"),
    (http_errors.InvalidRequestLine("GARBAGE"), "malformed_http"),
    (http_errors.NoMoreData(b""), "malformed_http"),
])
def test_an_error_before_the_app_is_answered_with_its_codes_status_and_reason(exc, code):
    """ERR-PROBLEM-JSON: the status line and the body's ``status`` are both errors.yaml's for the code."""
    problem = problem_for(exc)
    status = ERRORS[code]["status"]
    assert (problem.code, problem.status) == (code, status)
    head, _, body = problem_response(problem).partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()
    assert f'"status": {status}'.encode() in body


def test_a_fault_is_the_internal_error_of_the_table():
    assert problem_for(RuntimeError("boom")) is None
    problem = Problem("internal_error")
    assert problem_response(problem).startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert problem.status == ERRORS["internal_error"]["status"] == 500


def test_falcon_refusals_are_keyed_by_their_table_status():
    assert falcon_codes() == {ERRORS[code]["status"]: code for code in FALCON_REFUSALS}
    assert falcon_codes() == {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
                              415: "unsupported_media_type"}


# --- query parameters: bounds, defaults and grammars are spec/openapi.yaml's --------------------------------------

class _Pages:
    """The inbox, outbox and event streams of the IPC app: each records what the app asked it for."""

    def __init__(self):
        self.asked: list[tuple[str, dict]] = []

    def page(self, **kwargs):
        self.asked.append(("inbox", kwargs))
        return [], None

    def list(self, **kwargs):
        self.asked.append(("outbox", kwargs))
        return [], None

    def open_stream(self, last, **kwargs):
        self.asked.append(("events", {"last": last}))
        raise Problem("too_many_streams")


@pytest.fixture
def query():
    """GET a route of the IPC app; returns its status, its error code (None on success) and what the app asked."""
    pages = _Pages()
    ctx = DaemonContext(config={"ipc": {"max_inflight": 64}, "daemon": {"mesh": "m"}, "broker": {}}, token="t",
                        outbox=pages, inbox=pages, link=None, events=pages, committer=None, metrics=None,
                        member_pubkey="5b" * 32)
    client = falcon.testing.TestClient(create_app(ctx, None))

    def get(path: str, params: dict, headers: dict | None = None) -> tuple[int, str | None, dict | None]:
        pages.asked.clear()
        result = client.simulate_get(path, params=params, extras={"meshd.transport": "unix"},
                                     headers={"Host": "localhost", **(headers or {})})
        error = result.json.get("error") if result.status_code >= 400 else None
        return result.status_code, error, pages.asked[0][1] if pages.asked else None

    return get


@pytest.mark.parametrize("route", ["/v1/inbox", "/v1/outbox"])
def test_limit_is_bounded_and_defaulted_by_the_openapi_parameter(query, route):
    bounds = openapi()["paths"][route]["get"]["parameters"]
    bounds = next(p["schema"] for p in bounds if p.get("name") == "limit")
    assert openapi_parameter(route, "get", "limit") == bounds
    low, high, default = bounds["minimum"], bounds["maximum"], bounds["default"]
    assert query(route, {})[2]["limit"] == default
    assert query(route, {"limit": str(low)})[2]["limit"] == low
    assert query(route, {"limit": str(high)})[2]["limit"] == high
    for refused in (str(low - 1), str(high + 1), "ten", "-1"):
        assert query(route, {"limit": refused})[:2] == (400, "invalid_parameter")


def test_the_two_limits_are_the_documented_ones():
    assert {route: openapi_parameter(route, "get", "limit") for route in ("/v1/inbox", "/v1/outbox")} == {
        "/v1/inbox": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
        "/v1/outbox": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}}


@pytest.mark.parametrize(("route", "name", "held", "refused"), [
    ("/v1/inbox", "from", "ab" * 32, ["AB" * 32, "ab" * 31, "ab" * 32 + "\n"]),
    ("/v1/inbox", "topic", "deploys.arm64", ["Deploys", "-x", "a" * 65]),
    ("/v1/outbox", "status", "dead", ["DEAD", "gone"]),
])
def test_string_parameters_hold_their_openapi_schema(query, route, name, held, refused):
    """The grammar is the parameter's schema: an ECMA-262 ``$`` refuses a trailing newline."""
    key = {"from": "sender"}.get(name, name)
    assert query(route, {name: held})[2][key] == held
    for value in refused:
        assert query(route, {name: value})[:2] == (400, "invalid_parameter"), value


def test_the_openapi_statuses_are_the_outbox_states():
    assert openapi_parameter("/v1/outbox", "get", "status")["enum"] == list(STATES)


def test_last_event_id_is_held_to_its_header_and_query_schemas(query):
    most = openapi_parameter("/v1/events", "get", "last_event_id")["maximum"]
    assert openapi_parameter("/v1/events", "get", "Last-Event-ID")["pattern"] == "^[0-9]{1,18}$"
    assert most == 10 ** 18 - 1
    assert query("/v1/events", {}, {"Last-Event-ID": " 40 "})[2] == {"last": 40}
    assert query("/v1/events", {"last_event_id": str(most)})[2] == {"last": most}
    assert query("/v1/events", {})[2] == {"last": None}
    assert query("/v1/events", {}, {"Last-Event-ID": "1" * 19})[:2] == (400, "invalid_parameter")
    assert query("/v1/events", {"last_event_id": str(most + 1)})[:2] == (400, "invalid_parameter")


# --- outbox states: common/defs outbox_status -------------------------------------------------------------------

def test_the_outbox_depth_gauge_has_one_sample_per_outbox_state():
    class Counts:
        def counts(self):
            return {"dead": 2}

    metrics = DaemonMetrics(outbox=Counts())
    samples = {sample.labels["status"]: sample.value
               for family in metrics.registry.collect() if family.name == "cm_daemon_outbox_depth"
               for sample in family.samples}
    assert tuple(schema("common/defs")["$defs"]["outbox_status"]["enum"]) == STATES
    assert samples == {state: (2.0 if state == "dead" else 0.0) for state in STATES}


def test_meshd_outbox_list_filters_each_outbox_state_once():
    assert sorted(OUTBOX_FILTERS.values()) == sorted(STATES)
    assert OUTBOX_FILTERS["failed"] == "dead" and "dead" not in OUTBOX_FILTERS
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    listing = parser.parse_args(["outbox", "list"])
    assert listing.limit == openapi_parameter("/v1/outbox", "get", "limit")["default"]


# --- timing defaults: spec/tables/timing.yaml and limits.yaml ------------------------------------------------------

def test_the_configs_timing_defaults_are_the_timing_tables():
    """WS-RECONNECT-SCHEDULE, OBX-BACKOFF, SSE-KEEPALIVE: each default of a key the table names is the table's."""
    timing = load_table("timing")
    named = [(schedule["config"][member], schedule[member]) for schedule in timing["backoff"].values()
             for member in schedule["config"]] + [(timing["sse_keepalive_s"]["config"],
                                                   timing["sse_keepalive_s"]["value"])]
    assert sorted(key for key, _ in named) == ["ipc.keepalive_s", "outbox.retry_base_ms", "outbox.retry_jitter",
                                               "outbox.retry_max_ms", "reconnect.initial_ms", "reconnect.jitter",
                                               "reconnect.max_ms", "reconnect.multiplier"]
    for key, value in named:
        section, name = key.split(".")
        assert KEYS[section][name][0] == value, key


def test_the_event_bus_defaults_are_the_configs():
    bus = EventBus(inbox=None)
    assert (bus.max_streams, bus.keepalive_s) == (KEYS["ipc"]["max_streams"][0], KEYS["ipc"]["keepalive_s"][0])


# --- GET /v1/version: spec/openapi.yaml's Version ------------------------------------------------------------------

def test_the_version_body_names_what_the_openapi_version_schema_requires():
    version = openapi()["components"]["schemas"]["Version"]["properties"]
    assert IPC_API == version["ipc_api"]["const"] == "v1"
    assert [entry["contains"]["const"] for entry in version["ipc_features"]["allOf"]] == IPC_FEATURES
    assert IPC_FEATURES == ["version", "health", "send", "inbox", "events", "peers", "profile", "outbox",
                            "outbox_requeue", "metrics", "compat"]
