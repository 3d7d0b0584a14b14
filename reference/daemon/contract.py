"""Testing only (``[daemon] check_responses``): every response the IPC app writes is held to spec/openapi.yaml.

Theory of operation. ``ResponseContract`` is the outermost middleware, so its ``process_response`` sees each
response last, as it leaves. The operation is the path template of spec/openapi.yaml the request path matches (the
guard answers some requests before falcon routes them) and the method; a path no template matches answers by
components/responses ``NotFound`` and a method its path does not define by ``MethodNotAllowed``. The
status must be one the operation lists (or its ``default``), the media type one that response declares, and a JSON
body (``application/json``, ``application/problem+json``) must validate against that media type's schema: JSON
Schema 2020-12 inside the OpenAPI 3.1 document, read in place (its ``#/components/schemas`` references resolve
against the document), with spec's ECMA-262 ``pattern`` and formats checked. A body that is not JSON is not read
(``text/event-stream`` frames are checked against spec/schemas/sse by the tests, the metrics text by its own).

A response that breaks the contract is logged (``response_contract_violation``) and replaced by 500 internal_error
whose detail names the deviation, so a test that meets it fails where it happened. The daemon never checks by
default: it costs a schema validation per response.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any

import falcon
from jsonschema import FormatChecker
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import spec

from .problems import Problem, write_problem

log = logging.getLogger("meshd.ipc")
OPENAPI_URI = "urn:meshspec:openapi"
JSON_MEDIA = ("application/json", "application/problem+json")


@functools.cache
def _document() -> dict[str, Any]:
    return spec.openapi()


@functools.cache
def _validator(pointer: str) -> Any:
    """A validator for the schema at JSON pointer ``pointer`` of spec/openapi.yaml."""
    registry = Registry().with_resource(OPENAPI_URI, Resource(_document(), specification=DRAFT202012))
    return spec.SpecValidator({"$ref": f"{OPENAPI_URI}#{pointer}"}, registry=registry,
                              format_checker=FormatChecker())


@functools.cache
def _templates() -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + r"\Z"), template)
                 for template in _document()["paths"])


def path_template(path: str) -> str | None:
    """The path template of spec/openapi.yaml that ``path`` matches, or None."""
    return next((template for pattern, template in _templates() if pattern.match(path)), None)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _at(pointer: str) -> Any:
    node: Any = _document()
    for part in pointer.lstrip("/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


#: the answers spec/openapi.yaml's order of checks gives before routing (steps 1-4), so on any path and method too
BEFORE_ROUTING = {400: "/components/responses/TokenInQuery", 401: "/components/responses/Unauthorized",
                  403: "/components/responses/Forbidden"}


def _response(template: str | None, method: str, status: int) -> tuple[str | None, str]:
    """The JSON pointer of the response spec/openapi.yaml documents for this answer, or None and why not."""
    operation = None if template is None else _document()["paths"].get(template, {}).get(method)
    if operation is None and status in BEFORE_ROUTING:
        return BEFORE_ROUTING[status], ""
    if template is None:
        return ("/components/responses/NotFound", "") if status == 404 else (
            None, f"{status} for a path no route has (spec/openapi.yaml: 404 not_found)")
    if operation is None:
        return ("/components/responses/MethodNotAllowed", "") if status == 405 else (
            None, f"{status} for a method {template} does not define (spec/openapi.yaml: 405 method_not_allowed)")
    key = str(status) if str(status) in operation["responses"] else "default"
    if key not in operation["responses"]:
        return None, f"status {status}, which the operation does not list"
    pointer = f"/paths/{_escape(template)}/{method}/responses/{key}"
    ref = _at(pointer).get("$ref")
    return (ref[1:] if isinstance(ref, str) and ref.startswith("#/") else pointer), ""


def deviation(template: str | None, method: str, status: int, content_type: str | None,
              body: bytes | None) -> str | None:
    """How one response differs from spec/openapi.yaml (None: it conforms).

    Args:
        template: the path template of spec/openapi.yaml the request path matches (None: none does).
        method: the request method, any case.
        status: the response status code.
        content_type: the Content-Type header, parameters included.
        body: the response body (None or empty: none).
    """
    method = method.lower()
    operation = f"{method.upper()} {template or '(no route)'}"
    pointer, why = _response(template, method, status)
    if pointer is None:
        return f"{operation}: {why}"
    content: dict[str, Any] = _at(pointer).get("content") or {}
    if not content:
        return f"{operation} {status}: has a body, but the response declares none" if body else None
    declared = {key.split(";", 1)[0].strip().lower(): key for key in content}
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in declared:
        return f"{operation} {status}: media type {content_type!r}, not one of {sorted(content)}"
    if media not in JSON_MEDIA or "schema" not in content[declared[media]]:
        return None
    try:
        document = json.loads(body or b"")
    except ValueError:
        return f"{operation} {status}: the {media} body is not JSON"
    error = best_match(_validator(f"{pointer}/content/{_escape(declared[media])}/schema").iter_errors(document))
    if error is None:
        return None
    where = "".join(f"/{part}" for part in error.absolute_path) or "the body"
    return f"{operation} {status}: {where}: {error.message}"[:600]


class ResponseContract:
    """Middleware: a response that ``deviation`` finds fault with becomes 500 internal_error naming the fault."""

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool):
        body = None if resp.stream is not None else resp.render_body()  # an event stream: status and media type
        # req: API-CONFORMS -- testing only (check_responses): the contract is checked as each response leaves
        found = deviation(path_template(req.path), req.method, resp.status_code, resp.content_type, body)
        if found is not None:
            log.error("response_contract_violation %s", found)
            resp.stream = None
            write_problem(resp, Problem("internal_error", f"response_contract_violation: {found}"))
