"""Every response the harness sees is checked against spec/openapi.yaml with openapi-core.

``ContractClient`` wraps an httpx client: each exchange is validated (status code listed for the operation, headers,
body schema; ``application/problem+json`` decoded as JSON) and failures are collected, not raised, so one test run
reports every deviation. Event streams are checked frame by frame elsewhere (their 200 has no body schema).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from openapi_core import OpenAPI
from openapi_core.templating.paths.exceptions import OperationNotFound, PathNotFound
from openapi_core.testing import MockRequest, MockResponse

import spec as spec_pkg

HOST_URL = "http://127.0.0.1:47823"


@cache
def openapi() -> OpenAPI:
    from openapi_core import Config

    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads})
    return OpenAPI.from_file_path(str(spec_pkg.SPEC_DIR / "openapi.yaml"), config=config)


@dataclass
class Deviation:
    """One response that does not match the OpenAPI document."""

    method: str
    path: str
    status: int
    error: str
    body: str


def validate_exchange(method: str, url: str, request_body: bytes | None, request_headers: dict[str, str],
                      status: int, response_headers: dict[str, str], response_body: bytes) -> str | None:
    """Validate one exchange; returns the first problem, or None."""
    parts = urlsplit(url)
    args = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    request = MockRequest(HOST_URL, method.lower(), parts.path, args=args, headers=request_headers,
                          data=request_body or None,
                          content_type=request_headers.get("content-type", "application/json"))
    content_type = response_headers.get("content-type", "").strip()
    if content_type.split(";", 1)[0].strip() in ("application/json", "application/problem+json"):
        content_type = content_type.split(";", 1)[0].strip()
    response = MockResponse(response_body, status_code=status, headers=response_headers,
                            content_type=content_type or "application/json")
    try:
        openapi().validate_response(request, response)
    except (PathNotFound, OperationNotFound) as exc:
        # OpenAPI cannot attach 404/405 to an operation: they are components/responses NotFound and MethodNotAllowed.
        return _unrouted(exc, status, response_headers, response_body)
    except Exception as exc:  # openapi-core raises a family of errors; each is a finding
        detail = str(exc)
        cause = exc.__cause__
        while cause is not None:
            detail += f": {cause}"
            cause = getattr(cause, "__cause__", None)
        return f"{type(exc).__name__}: {detail}"[:600]
    return None


def _unrouted(exc: Exception, status: int, headers: dict[str, str], body: bytes) -> str | None:
    expected = (404, "not_found") if isinstance(exc, PathNotFound) else (405, "method_not_allowed")
    if status != expected[0]:
        return f"{type(exc).__name__}: expected {expected[0]} {expected[1]}, got {status}"
    if not headers.get("content-type", "").startswith("application/problem+json"):
        return f"{status} without application/problem+json"
    try:
        problem = json.loads(body)
    except ValueError:
        return f"{status} body is not JSON"
    errors = list(spec_pkg.validator("ipc/problem").iter_errors(problem))
    if errors:
        return f"{status} problem body: {errors[0].message}"
    if problem.get("error") != expected[1]:
        return f"{status} with error {problem.get('error')!r}, expected {expected[1]!r}"
    if status == 405 and "allow" not in headers:
        return "405 without an Allow header"
    return None


@dataclass
class ContractClient:
    """An httpx client whose every response is validated against the OpenAPI document."""

    client: httpx.Client
    deviations: list[Deviation] = field(default_factory=list)
    exchanges: int = 0

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.client.request(method, path, **kwargs)
        self.check(response)
        return response

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def check(self, response: httpx.Response) -> None:
        request = response.request
        self.exchanges += 1
        headers = {k.lower(): v for k, v in request.headers.items()}
        problem = validate_exchange(request.method, str(request.url), request.content, headers,
                                    response.status_code, {k.lower(): v for k, v in response.headers.items()},
                                    response.content)
        if problem is not None:
            self.deviations.append(Deviation(request.method, request.url.path, response.status_code, problem,
                                             response.text[:300]))

    def __enter__(self) -> ContractClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()
