"""schemathesis over spec/openapi.yaml: no 5xx on any generated input, and every response conforms.

Generated requests include schema-violating ones. The checks: no server error, every status code listed for the
operation, the content type, the response headers and the response body schema. `/v1/events` is excluded (a stream
that never ends); "valid data must be accepted" is not a check here, because legitimate 409s (ids collide), 404s
(random requeue ids) and 503s (peers with the link down) are part of the contract.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from conformance.registry import case
from spec import SPEC_DIR

schema = schemathesis.openapi.from_path(str(SPEC_DIR / "openapi.yaml")).exclude(path="/v1/events")
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_headers_conformance, checks.response_schema_conformance]


@case("fuzz.openapi", "ERR-NO-5XX-ON-BAD-INPUT", "API-CONFORMS", "ERR-PROBLEM-JSON")
@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
def test_openapi_fuzz(case, tcp_api):
    """Generated requests against the target's TCP listener, with its bearer token."""
    base = str(tcp_api.client.base_url)
    response = case.call(base_url=base, headers=dict(tcp_api.client.headers))
    case.validate_response(response, checks=CHECKS)
