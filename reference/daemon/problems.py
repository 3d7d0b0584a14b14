"""The one place IPC errors become responses: RFC 9457 problem+json (E-11), codes from spec/tables/errors.yaml.

Resources raise ``Problem(code, detail, **extensions)``; falcon's own errors (unknown route, wrong method, unreadable
body) and any unexpected exception are mapped here too, so no other code writes an error body.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import falcon

from spec import load_table

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


def write_problem(resp: falcon.Response, problem: Problem) -> None:
    resp.status = problem.status
    resp.content_type = PROBLEM_JSON
    resp.text = json.dumps(problem.body(), ensure_ascii=False)
    for name, value in problem.headers.items():
        resp.set_header(name, value)


_FALCON_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 415: "unsupported_media_type"}


def install(app: falcon.App) -> None:
    """Route every error through ``write_problem``."""

    def on_problem(req, resp, exc: Problem, params):
        write_problem(resp, exc)

    def on_http_error(req, resp, exc: falcon.HTTPError, params):
        status = int(exc.status_code)
        code = _FALCON_CODES.get(status)
        if code is None:
            code = "invalid_request" if 400 <= status < 500 else "internal_error"
        detail = exc.description or (f"no route {req.path}" if status == 404 else exc.title) or ""
        problem = Problem(code, detail)
        if status == 405 and exc.headers and "Allow" in exc.headers:
            problem.headers["Allow"] = exc.headers["Allow"]
        write_problem(resp, problem)

    def on_unexpected(req, resp, exc: Exception, params):
        log.exception("internal error on %s %s", req.method, req.path)
        write_problem(resp, Problem("internal_error", "internal daemon error; see the daemon log"))

    app.add_error_handler(Exception, on_unexpected)
    app.add_error_handler(falcon.HTTPError, on_http_error)
    app.add_error_handler(Problem, on_problem)
