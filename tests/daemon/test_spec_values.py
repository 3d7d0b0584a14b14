"""The daemon's values are the spec's: every status, bound and set it uses equals the one spec/ decides (issue 15).

Each test reads the value from its source in spec/ (a table, spec/openapi.yaml, a schema) and compares the code's
own, so an edit of the spec that the code does not follow fails here rather than drifting silently.
"""

from __future__ import annotations

from http import HTTPStatus

import pytest
from gunicorn.http import errors as http_errors

from reference.daemon.deadlines import ReadTimeout
from reference.daemon.problems import FALCON_REFUSALS, Problem, falcon_codes
from reference.daemon.server import problem_for, problem_response
from spec import load_table

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
