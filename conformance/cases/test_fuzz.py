"""schemathesis over spec/openapi.yaml: no 5xx on any generated input, and every response conforms.

Generated requests include schema-violating ones. A server error is evidence against ERR-NO-5XX-ON-BAD-INPUT; a
status code, content type, header or body outside the document is evidence against API-CONFORMS (the OpenAPI shape),
each recorded separately. `/v1/events` is excluded (a stream that never ends); "valid data must be accepted" is not a
check here, because legitimate 409s (ids collide), 404s (random requeue ids) and 503s (peers with the link down) are
part of the contract. The answers spec/openapi.yaml gives before routing -- 400 `malformed_http`, 408
`request_timeout`, 414 `uri_too_long`, 431 `header_fields_too_large` (a generated query string can pass the request-line
limit) -- are listed by no route; such an answer conforms when it is that code's problem+json (spec/tables/errors.yaml,
spec/schemas/ipc/problem.json).
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from conformance.registry import case
from conformance.verdict import Attributed
from spec import SPEC_DIR, load_table, validator

schema = schemathesis.openapi.from_path(str(SPEC_DIR / "openapi.yaml")).exclude(path="/v1/events")
CHECKS = [(checks.not_a_server_error, "ERR-NO-5XX-ON-BAD-INPUT"),
          (checks.status_code_conformance, "API-CONFORMS"), (checks.content_type_conformance, "API-CONFORMS"),
          (checks.response_headers_conformance, "API-CONFORMS"), (checks.response_schema_conformance, "API-CONFORMS")]
_ERRORS = load_table("errors")
#: the answers given before routing (spec/openapi.yaml, "Order of checks"): code -> its status
BEFORE_ROUTING = {code: _ERRORS["codes"][code]["status"] for code in ("malformed_http", "request_timeout",
                                                                        "uri_too_long", "header_fields_too_large")}


def before_routing_problem(response) -> str | None:
    """Why ``response`` is a conforming answer given before routing, or None when it is not one."""
    if response.status_code not in BEFORE_ROUTING.values():
        return None
    if not response.headers.get("Content-Type", "").startswith("application/problem+json"):
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("error") if isinstance(body, dict) else None
    if BEFORE_ROUTING.get(code) != response.status_code or body.get("type") != _ERRORS["type_prefix"] + code:
        return None
    if list(validator("ipc/problem").iter_errors(body)):
        return None
    return f"{response.status_code} {code}, answered before routing"


@case("fuzz.openapi", "ERR-NO-5XX-ON-BAD-INPUT", "API-CONFORMS")
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False,
          report_multiple_bugs=False)
def test_openapi_fuzz(case, tcp_api, verdict):
    """Generated requests against the target's TCP listener, with its bearer token."""
    base = str(tcp_api.client.base_url)
    response = case.call(base_url=base, headers=dict(tcp_api.client.headers), timeout=10)
    checks_here = CHECKS
    if before_routing_problem(response) is not None:  # no route lists it: only "no 5xx" applies
        checks_here = [(check, requirement) for check, requirement in CHECKS if requirement != "API-CONFORMS"]
    for check, requirement in checks_here:
        try:
            case.validate_response(response, checks=[check])
        except (AssertionError, BaseExceptionGroup) as exc:
            detail = f"{case.method} {case.formatted_path} -> {response.status_code}: {str(exc).strip()[:400]}"
            verdict.expect(requirement, False, detail)
            raise Attributed(detail) from None
