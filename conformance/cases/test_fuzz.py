"""schemathesis over spec/openapi.yaml: no 5xx on any generated input, and every response conforms.

Generated requests include schema-violating ones. A server error is evidence against ERR-NO-5XX-ON-BAD-INPUT; a
status code, content type, header or body outside the document is evidence against API-CONFORMS (the OpenAPI shape),
each recorded separately. `/v1/events` is excluded (a stream that never ends); "valid data must be accepted" is not a
check here, because legitimate 409s (ids collide), 404s (random requeue ids) and 503s (peers with the link down) are
part of the contract.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from conformance.registry import case
from conformance.verdict import Attributed
from spec import SPEC_DIR

schema = schemathesis.openapi.from_path(str(SPEC_DIR / "openapi.yaml")).exclude(path="/v1/events")
CHECKS = [(checks.not_a_server_error, "ERR-NO-5XX-ON-BAD-INPUT"),
          (checks.status_code_conformance, "API-CONFORMS"), (checks.content_type_conformance, "API-CONFORMS"),
          (checks.response_headers_conformance, "API-CONFORMS"), (checks.response_schema_conformance, "API-CONFORMS")]


@case("fuzz.openapi", "ERR-NO-5XX-ON-BAD-INPUT", "API-CONFORMS")
@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False,
          report_multiple_bugs=False)
def test_openapi_fuzz(case, tcp_api, verdict):
    """Generated requests against the target's TCP listener, with its bearer token."""
    base = str(tcp_api.client.base_url)
    response = case.call(base_url=base, headers=dict(tcp_api.client.headers), timeout=10)
    for check, requirement in CHECKS:
        try:
            case.validate_response(response, checks=[check])
        except (AssertionError, BaseExceptionGroup) as exc:
            detail = f"{case.method} {case.formatted_path} -> {response.status_code}: {str(exc).strip()[:400]}"
            verdict.expect(requirement, False, detail)
            raise Attributed(detail) from None
