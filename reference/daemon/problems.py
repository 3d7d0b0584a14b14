"""The one place IPC errors become responses: RFC 9457 problem+json (E-11), codes from spec/tables/errors.yaml.

Resources raise ``Problem(code, detail, **extensions)``; falcon's own errors (unknown route, wrong method, unreadable
body), a body that stalls past its deadline (408) or breaks its framing (400 malformed_http), and any unexpected
exception are mapped here too, so no other code writes an error body. (Errors before the app -- a head that cannot
be parsed or does not arrive -- are answered by the server, server.py, with the same bodies.)
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

import falcon
from gunicorn.http.errors import NoMoreData, ParseException
from jsonschema.exceptions import ValidationError, best_match

from spec import load_table, validator

from .deadlines import ReadTimeout

log = logging.getLogger("meshd.ipc")
PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    """An IPC error with a stable code from spec/tables/errors.yaml."""

    def __init__(self, code: str, detail: str = "", **extensions: Any):
        codes = load_table("errors")["codes"]
        if code not in codes:
            raise ValueError(f"unknown error code {code!r} (add it to spec/tables/errors.yaml)")
        super().__init__(detail or codes[code]["title"])
        self.code = code
        self.status = int(codes[code]["status"])
        self.title = codes[code]["title"]
        self.detail = detail or self.title
        self.extensions = {k: v for k, v in extensions.items() if v is not None or k == "broker_message_id"}
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        prefix = load_table("errors")["type_prefix"]
        return {"type": f"{prefix}{self.code}", "title": self.title, "status": self.status, "detail": self.detail,
                "error": self.code, **self.extensions}


def check_body(document: Mapping[str, Any], ref: str, codes: Mapping[str, str] | None = None) -> None:
    """Raise the 400 for the first way an IPC body fails its schema ``spec/schemas/<ref>.json``.

    The code is ``invalid_request``, or the one ``codes`` names for the member the failure is about (the route's
    OpenAPI description documents it); ``invalid_params`` names that member when there is one.
    """
    error = best_match(validator(ref).iter_errors(document))
    if error is None:
        return
    member, reason = _failure(error, document)
    code = (codes or {}).get(member or "", "invalid_request")
    if member is None:
        raise Problem(code, f"body: {reason}")
    raise Problem(code, f"{member}: {reason}", invalid_params=[{"name": member, "reason": reason}])


def _failure(error: ValidationError, document: Mapping[str, Any]) -> tuple[str | None, str]:
    """The member a schema failure is about (None: the body as a whole) and a short reason (never the value)."""
    keyword, value = error.validator, error.validator_value
    if error.path:
        return str(error.path[0]), f"fails {keyword} {json.dumps(value)}" if keyword != "type" else f"must be {value}"
    if keyword == "required":
        return next(name for name in value if name not in document), "required"
    if keyword == "additionalProperties":
        return sorted(set(document) - set(error.schema.get("properties", {})))[0], "unknown member"
    if keyword == "minProperties":
        return None, "name at least one of " + ", ".join(error.schema.get("properties", {}))
    return None, f"fails {keyword} {json.dumps(value)}"


def write_problem(resp: falcon.Response, problem: Problem) -> None:
    resp.status = problem.status
    # req: ERR-PROBLEM-JSON -- every IPC error leaves through here
    resp.content_type = PROBLEM_JSON
    resp.text = json.dumps(problem.body(), ensure_ascii=False)
    for name, value in problem.headers.items():
        resp.set_header(name, value)


#: The codes answering falcon's own refusals (unknown route, wrong method, body too large, wrong media type).
FALCON_REFUSALS = ("not_found", "method_not_allowed", "payload_too_large", "unsupported_media_type")


@functools.cache
def falcon_codes() -> dict[int, str]:
    """Each of ``FALCON_REFUSALS`` keyed by the status errors.yaml gives it (the status falcon refused with)."""
    codes = load_table("errors")["codes"]
    return {int(codes[code]["status"]): code for code in FALCON_REFUSALS}


def install(app: falcon.App) -> None:
    """Route every error through ``write_problem``."""

    def on_problem(req, resp, exc: Problem, params):
        write_problem(resp, exc)

    def on_http_error(req, resp, exc: falcon.HTTPError, params):
        status = int(exc.status_code)
        code = falcon_codes().get(status)
        if code is None:
            # req: ERR-NO-5XX-ON-BAD-INPUT -- falcon's own refusals of client input stay 4xx
            code = "invalid_request" if 400 <= status < 500 else "internal_error"
        detail = exc.description or (f"no route {req.path}" if status == 404 else exc.title) or ""
        problem = Problem(code, detail)
        if status == 405 and exc.headers and "Allow" in exc.headers:
            problem.headers["Allow"] = exc.headers["Allow"]
        write_problem(resp, problem)

    def on_unexpected(req, resp, exc: Exception, params):
        log.exception("internal error on %s %s", req.method, req.path)
        write_problem(resp, Problem("internal_error", "internal daemon error; see the daemon log"))

    def on_read_timeout(req, resp, exc: ReadTimeout, params):
        # The body stalled past ipc_body_read_s (E-43): what arrived is dropped, the connection cannot be reused.
        # req: IPC-BODY-DEADLINE
        bound = "ipc_header_read_s" if exc.phase == "head" else "ipc_body_read_s"
        problem = Problem("request_timeout", f"{exc} ({bound})")
        problem.headers["Connection"] = "close"
        write_problem(resp, problem)

    def on_broken_body(req, resp, exc: Exception, params):
        # A chunked body that breaks its framing, or a body that ends before its Content-Length.
        # req: IPC-MALFORMED-HTTP
        problem = Problem("malformed_http", f"the request body is malformed: {type(exc).__name__}: {exc}"[:300])
        problem.headers["Connection"] = "close"
        write_problem(resp, problem)

    app.add_error_handler(Exception, on_unexpected)
    app.add_error_handler(falcon.HTTPError, on_http_error)
    app.add_error_handler(Problem, on_problem)
    app.add_error_handler(ReadTimeout, on_read_timeout)
    app.add_error_handler(ParseException, on_broken_body)
    app.add_error_handler(NoMoreData, on_broken_body)
