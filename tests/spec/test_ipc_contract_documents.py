"""The IPC contract documents: spec/openapi.yaml, spec/schemas/ipc/*.json and spec/schemas/sse/*.json.

Checks that the OpenAPI document is valid and loads in openapi-core, that every schema file is a valid 2020-12 schema
whose references resolve, that the OpenAPI components mirror the schema files exactly, that every example validates
(with jsonschema and through openapi-core), and that every route lists the statuses and error codes the contract
promises, each error as application/problem+json with the Problem schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

import spec as spec_pkg
from reference.core.destination import DestinationError, parse_destination
from reference.core.request import RequestError, parse_send

SPEC_DIR = spec_pkg.SPEC_DIR
OPENAPI_PATH = SPEC_DIR / "openapi.yaml"
OPENAPI_URI = "https://meshspec.dev/openapi.yaml"
BASE = spec_pkg.SCHEMA_BASE
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PROBLEM_JSON = "application/problem+json"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
IPC_FILES = sorted((SPEC_DIR / "schemas" / "ipc").glob("*.json"))
SSE_FILES = sorted((SPEC_DIR / "schemas" / "sse").glob("*.json"))
SSE_EVENTS = sorted(p.stem for p in SSE_FILES if p.stem != "index")

EXPECTED_IPC = {
    "send_request", "send_accepted", "send_duplicate", "problem", "inbox_page", "inbox_item", "outbox_page",
    "outbox_item", "requeue_request", "requeue_result", "profile_request", "profile_result", "peers_list", "peer",
    "version", "health", "compat",
}
EXPECTED_SSE = {
    "message", "peer_join", "peer_leave", "file_shared", "daemon_disconnect", "daemon_reconnect", "hook_executed",
    "feature_negotiation_failed", "outbox_dead", "replay_gap",
}
ERROR_CODES = {
    "invalid_json", "invalid_request", "invalid_client_message_id", "destination_unresolvable",
    "meta_not_canonicalizable", "token_in_query", "invalid_parameter", "invalid_cursor", "missing_bearer_token",
    "invalid_bearer_token", "forbidden_host", "forbidden_origin", "not_found", "method_not_allowed",
    "outbox_row_not_found", "idempotency_key_reused", "outbox_requeue_state_invalid", "payload_too_large",
    "unsupported_media_type", "daemon_busy", "too_many_streams", "broker_unavailable", "broker_timeout",
    "daemon_draining", "internal_error", "limit_exceeded", "malformed_http", "request_timeout", "uri_too_long",
    "header_fields_too_large", "capability_invalid", "capability_denied", "capability_required",
}
CONFLICTS = [
    "outbox_pending_fingerprint_mismatch", "outbox_inflight_fingerprint_mismatch", "outbox_done_fingerprint_mismatch",
    "outbox_dead_fingerprint_match", "outbox_dead_fingerprint_mismatch", "outbox_aborted_fingerprint_match",
    "outbox_aborted_fingerprint_mismatch", "requeue_new_id_in_use",
]

# The contract, route by route: every status a route may answer, and for each error status the codes it may carry.
_COMMON = {
    "400": {"token_in_query"},
    "401": {"missing_bearer_token", "invalid_bearer_token", "capability_invalid"},  # E-50: a hook's token too
    "403": {"forbidden_host", "forbidden_origin", "capability_denied", "capability_required"},
    "429": {"daemon_busy"},
    "500": {"internal_error"},
}
_POST = {
    **_COMMON,
    "400": {"token_in_query", "invalid_json", "invalid_request", "limit_exceeded"},
    "408": {"request_timeout"},
    "413": {"payload_too_large"},
    "415": {"unsupported_media_type"},
    "503": {"daemon_draining"},
}
EXPECTED_ROUTES: dict[tuple[str, str], tuple[set[str], dict[str, set[str]]]] = {
    ("get", "/v1/version"): ({"200"}, _COMMON),
    ("get", "/v1/health"): ({"200"}, _COMMON),
    ("get", "/v1/compat"): ({"200"}, _COMMON),
    ("get", "/v1/metrics"): ({"200"}, _COMMON),
    ("post", "/v1/send"): ({"200", "202"}, {
        **_POST,
        "400": _POST["400"] | {"invalid_client_message_id", "destination_unresolvable", "meta_not_canonicalizable"},
        "409": {"idempotency_key_reused"},
    }),
    ("get", "/v1/inbox"): ({"200"}, {**_COMMON, "400": {"token_in_query", "invalid_parameter", "invalid_cursor"}}),
    ("get", "/v1/events"): ({"200"}, {
        **_COMMON, "400": {"token_in_query", "invalid_parameter"}, "429": {"daemon_busy", "too_many_streams"},
    }),
    ("get", "/v1/peers"): ({"200"}, {**_COMMON, "503": {"broker_unavailable"}, "504": {"broker_timeout"}}),
    ("post", "/v1/profile"): ({"200"}, {**_POST, "503": {"daemon_draining", "broker_unavailable"}}),
    ("get", "/v1/outbox"): ({"200"}, {**_COMMON, "400": {"token_in_query", "invalid_parameter", "invalid_cursor"}}),
    ("post", "/v1/outbox/requeue"): ({"200"}, {
        **_POST,
        "400": _POST["400"] | {"invalid_client_message_id"},
        "404": {"outbox_row_not_found"},
        "409": {"outbox_requeue_state_invalid", "idempotency_key_reused"},
    }),
}


# ------------------------------------------------------------------------------------------------------ loading
@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return yaml.safe_load(OPENAPI_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def registry(openapi) -> Registry:
    """Every spec/schemas/**/*.json by its $id, plus the OpenAPI document itself (for its component refs)."""
    resources = []
    for path in sorted((SPEC_DIR / "schemas").rglob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(document, dict) and "$id" in document:
            resources.append((document["$id"], Resource.from_contents(document, default_specification=DRAFT202012)))
    resources.append((OPENAPI_URI, Resource.from_contents(openapi, default_specification=DRAFT202012)))
    return Registry().with_resources(resources)


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _validator(registry: Registry, uri: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": uri}, registry=registry, format_checker=FormatChecker())


def _resolve(openapi: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = openapi
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _operations(openapi: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in openapi["paths"].items():
        for method in METHODS:
            if method in item:
                yield method, path, item[method]


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------------ documents
def test_openapi_document_is_valid():
    from openapi_spec_validator import validate
    from openapi_spec_validator.readers import read_from_filename

    document, base_uri = read_from_filename(str(OPENAPI_PATH))
    validate(document, base_uri=base_uri)
    assert document["openapi"] == "3.1.0"


def test_openapi_core_loads_the_document():
    openapi_core = pytest.importorskip("openapi_core")
    api = openapi_core.OpenAPI.from_file_path(str(OPENAPI_PATH))
    assert str(api.version) == "OpenAPIV3.1"


def test_the_expected_schema_files_exist():
    assert {p.stem for p in IPC_FILES} == EXPECTED_IPC
    assert set(SSE_EVENTS) == EXPECTED_SSE
    assert (SPEC_DIR / "schemas" / "sse" / "index.json").is_file()


@pytest.mark.parametrize("path", IPC_FILES + SSE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_schema_file_is_valid_2020_12(path, registry):
    document = _load(path)
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"] == f"{BASE}{path.parent.name}/{path.name}"
    assert document.get("title") and document.get("description")
    resolver = registry.resolver(base_uri=document["$id"])
    for ref in _refs(document):
        resolver.lookup(ref)  # raises when a reference does not resolve
    for example in document.get("examples", []):
        errors = list(_validator(registry, document["$id"]).iter_errors(example))
        assert not errors, [e.message for e in errors]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


# ------------------------------------------------------------------------------------------------------ mirrors
def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _component_uris(openapi: dict[str, Any]) -> dict[str, str]:
    """Each component schema's twin: an ipc file, a $defs entry of an ipc file, or a common/defs.json entry."""
    defs = _load(SPEC_DIR / "schemas" / "common" / "defs.json")["$defs"]
    ipc_defs = {name: path.stem for path in IPC_FILES for name in _load(path).get("$defs", {})}
    uris = {}
    for component in openapi["components"]["schemas"]:
        snake = _snake(component)
        if (SPEC_DIR / "schemas" / "ipc" / f"{snake}.json").is_file():
            uris[component] = f"{BASE}ipc/{snake}.json"
        elif snake in ipc_defs:
            uris[component] = f"{BASE}ipc/{ipc_defs[snake]}.json#/$defs/{snake}"
        elif snake in defs:
            uris[component] = f"{BASE}common/defs.json#/$defs/{snake}"
    return uris


def _normalise(node: Any, ref: Any) -> Any:
    if isinstance(node, dict):
        return {k: (ref(v) if k == "$ref" else _normalise(v, ref)) for k, v in node.items()}
    if isinstance(node, list):
        return [_normalise(v, ref) for v in node]
    return node


def test_every_component_schema_has_a_twin_file(openapi):
    uris = _component_uris(openapi)
    assert set(openapi["components"]["schemas"]) == set(uris), "components without a twin schema file"
    twins = {uri for uri in uris.values() if "#" not in uri}
    assert twins == {f"{BASE}ipc/{p.name}" for p in IPC_FILES}, "ipc files without a component"


def test_components_equal_their_schema_files(openapi):
    uris = _component_uris(openapi)

    def component_ref(ref: str) -> str:
        assert ref.startswith("#/components/schemas/"), ref
        return uris[ref.rsplit("/", 1)[1]]

    for component, uri in uris.items():
        file_uri, _, fragment = uri.partition("#")
        document = _load(SPEC_DIR / "schemas" / file_uri.removeprefix(BASE))
        if fragment:
            twin = document["$defs"][fragment.rsplit("/", 1)[1]]
        else:
            twin = {k: v for k, v in document.items() if k not in ("$schema", "$id", "$defs")}
        expected = _normalise(twin, lambda ref, base=file_uri: urljoin(base, ref))
        actual = _normalise(openapi["components"]["schemas"][component], component_ref)
        assert actual == expected, f"components/schemas/{component} differs from {uri}"


# ------------------------------------------------------------------------------------------------------ examples
def _examples(openapi: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(label, JSON pointer of the schema in the OpenAPI document, example value) for every example."""
    for method, path, operation in _operations(openapi):
        where = ("paths", path, method)
        for index, parameter in enumerate(operation.get("parameters", [])):
            resolved = _resolve(openapi, parameter)
            if "example" in resolved:
                pointer = _pointer(*where, "parameters", str(index), "schema")
                if "$ref" in parameter:
                    pointer = parameter["$ref"][2:] + "/schema"
                yield f"{method} {path} parameter {resolved['name']}", pointer, resolved["example"]
        body = operation.get("requestBody", {}).get("content", {})
        for media, content in body.items():
            for name, example in content.get("examples", {}).items():
                pointer = _pointer(*where, "requestBody", "content", media, "schema")
                yield f"{method} {path} request {name}", pointer, example["value"]
        for status, response in operation["responses"].items():
            base = (*where, "responses", status)
            if "$ref" in response:
                base = tuple(response["$ref"][2:].split("/"))
            for media, content in _resolve(openapi, response).get("content", {}).items():
                if "schema" not in content:  # text/event-stream: its frames are checked by the SSE tests
                    continue
                for name, example in content.get("examples", {}).items():
                    pointer = _pointer(*base, "content", media, "schema")
                    yield f"{method} {path} {status} {media} {name}", pointer, example["value"]


def test_every_operation_has_request_and_response_examples(openapi):
    for method, path, operation in _operations(openapi):
        for media, content in operation.get("requestBody", {}).get("content", {}).items():
            assert content.get("examples"), f"{method} {path} request {media} has no examples"
        for status, response in operation["responses"].items():
            for media, content in _resolve(openapi, response).get("content", {}).items():
                assert content.get("examples"), f"{method} {path} {status} {media} has no examples"


def test_every_example_validates_against_its_schema(openapi, registry):
    checked = 0
    for label, pointer, value in _examples(openapi):
        errors = list(_validator(registry, f"{OPENAPI_URI}#/{pointer}").iter_errors(value))
        assert not errors, f"{label}: {[e.message for e in errors]}"
        twin = _twin_uri(openapi, _walk(openapi, pointer))
        if twin:  # the same example against the standalone schema file, through the cross-file registry
            errors = list(_validator(registry, twin).iter_errors(value))
            assert not errors, f"{label} against {twin}: {[e.message for e in errors]}"
        checked += 1
    assert checked > 100


def _walk(document: dict[str, Any], pointer: str) -> Any:
    node: Any = document
    for part in pointer.split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def _twin_uri(openapi: dict[str, Any], schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        return _component_uris(openapi).get(ref.rsplit("/", 1)[1])
    return None


def test_examples_pass_openapi_core(openapi):
    """Every example, sent through openapi-core as the conformance harness will: responses and request bodies."""
    openapi_core = pytest.importorskip("openapi_core")
    from openapi_core.deserializing.media_types.util import json_loads
    from openapi_core.testing import MockRequest, MockResponse

    # openapi-core decodes only application/json as JSON by default; problem+json needs this one line of config.
    config = openapi_core.Config(extra_media_type_deserializers={PROBLEM_JSON: json_loads})
    api = openapi_core.OpenAPI.from_file_path(str(OPENAPI_PATH), config=config)
    host = "http://127.0.0.1:47823"
    for method, path, operation in _operations(openapi):
        headers = {}
        for parameter in operation.get("parameters", []):
            parameter = _resolve(openapi, parameter)
            if parameter["in"] == "header":
                headers[parameter["name"]] = parameter["example"]
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            for name, example in body["examples"].items():
                request = MockRequest(host, method, path, headers=headers,
                                      data=json.dumps(example["value"]).encode())
                api.validate_request(request)  # raises on any mismatch
                assert name
        request = MockRequest(host, method, path, headers=headers)
        for status, response in operation["responses"].items():
            response = _resolve(openapi, response)
            response_headers = {n: h["example"] for n, h in response.get("headers", {}).items() if h.get("required")}
            for media, content in response["content"].items():
                for example in content["examples"].values():
                    value = example["value"]
                    data = value.encode() if isinstance(value, str) else json.dumps(value).encode()
                    api.validate_response(request, MockResponse(data, int(status), response_headers, media))


# ------------------------------------------------------------------------------------------------------ errors
def _problem_codes(openapi: dict[str, Any], response: dict[str, Any]) -> set[str]:
    """The error codes an error response may carry, read from its narrowed Problem schema."""
    schema = response["content"][PROBLEM_JSON]["schema"]
    if schema == {"$ref": "#/components/schemas/Problem"}:
        return set(openapi["components"]["schemas"]["ErrorCode"]["enum"])
    refs = [part for part in schema["allOf"] if part.get("$ref") == "#/components/schemas/Problem"]
    assert refs, "error schema does not use Problem"
    narrowed = next(part for part in schema["allOf"] if "$ref" not in part)["properties"]["error"]
    return {narrowed["const"]} if "const" in narrowed else set(narrowed["enum"])


def _error_responses(openapi: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for method, path, operation in _operations(openapi):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                yield f"{method} {path} {status}", _resolve(openapi, response)
    for name, response in openapi["components"]["responses"].items():
        yield f"components/responses/{name}", response


def test_every_error_response_is_problem_json(openapi):
    codes = spec_pkg.load_yaml(SPEC_DIR / "tables" / "errors.yaml")["codes"]
    for label, response in _error_responses(openapi):
        assert set(response["content"]) == {PROBLEM_JSON}, label
        allowed = _problem_codes(openapi, response)
        examples = response["content"][PROBLEM_JSON]["examples"]
        shown = {example["value"]["error"] for example in examples.values()}
        assert shown == allowed, f"{label}: every code needs an example, and only those codes"
        statuses = {codes[code]["status"] for code in allowed}
        assert len(statuses) == 1, label
        schema = response["content"][PROBLEM_JSON]["schema"]
        narrowed = next(part for part in schema["allOf"] if "$ref" not in part)
        assert narrowed["properties"]["status"] == {"const": statuses.pop()}, label


def test_every_route_lists_its_contracted_statuses_and_codes(openapi):
    routes = {(method, path): operation for method, path, operation in _operations(openapi)}
    assert set(routes) == set(EXPECTED_ROUTES)
    for key, (successes, errors) in EXPECTED_ROUTES.items():
        responses = routes[key]["responses"]
        assert set(responses) == successes | set(errors), key
        for status in ("400", "401", "403", "429", "500"):
            assert status in responses, (key, status)
        for status, expected in errors.items():
            assert _problem_codes(openapi, _resolve(openapi, responses[status])) == expected, (key, status)
        if key[0] == "post":
            assert "daemon_draining" in _problem_codes(openapi, _resolve(openapi, responses["503"])), key


def test_error_code_enum_and_conflicts(openapi):
    schemas = openapi["components"]["schemas"]
    table = spec_pkg.load_yaml(SPEC_DIR / "tables" / "errors.yaml")
    assert set(schemas["ErrorCode"]["enum"]) >= ERROR_CODES
    assert set(schemas["ErrorCode"]["enum"]) == set(table["codes"])
    assert schemas["Conflict"]["enum"] == CONFLICTS == table["conflicts"]
    bound = {}
    for rule in schemas["Problem"]["allOf"]:
        code = rule["if"].get("properties", {}).get("error", {}).get("const")
        status = rule["then"].get("properties", {}).get("status", {}).get("const")
        if code and status:
            bound[code] = status
            assert rule["then"]["properties"]["type"] == {"const": f"urn:meshspec:error:{code}"}
    assert bound == {code: entry["status"] for code, entry in table["codes"].items()}


def test_problem_schema_rules(registry):
    validator = _validator(registry, f"{BASE}ipc/problem.json")

    def problem(code: str, **extra: Any) -> dict[str, Any]:
        entry = spec_pkg.load_yaml(SPEC_DIR / "tables" / "errors.yaml")["codes"][code]
        return {"type": f"urn:meshspec:error:{code}", "title": entry["title"], "status": entry["status"],
                "detail": "d", "error": code, **extra}

    conflict = {"client_message_id": "cmid-1", "daemon_fingerprint_prefix": "0123456789abcdef"}
    assert validator.is_valid(problem("invalid_json"))
    assert not validator.is_valid({**problem("invalid_json"), "status": 500})
    assert not validator.is_valid({**problem("invalid_json"), "type": "urn:meshspec:error:internal_error"})
    assert not validator.is_valid({**problem("invalid_json"), "extra": 1})
    assert not validator.is_valid(problem("idempotency_key_reused"))
    assert validator.is_valid(problem("idempotency_key_reused", conflict="outbox_pending_fingerprint_mismatch",
                                      **conflict))
    assert not validator.is_valid(problem("idempotency_key_reused", conflict="outbox_done_fingerprint_mismatch",
                                          **conflict))
    assert validator.is_valid(problem("idempotency_key_reused", conflict="outbox_done_fingerprint_mismatch",
                                      broker_message_id="01HQX8Z6Y3K4N5P6Q7R8S9T0VW", **conflict))
    assert not validator.is_valid(problem("idempotency_key_reused", conflict="outbox_dead_fingerprint_match",
                                          **conflict))
    assert validator.is_valid(problem("idempotency_key_reused", conflict="outbox_dead_fingerprint_match",
                                      reason="", **conflict))
    assert not validator.is_valid(problem("invalid_request", conflict="requeue_new_id_in_use"))
    assert not validator.is_valid(problem("idempotency_key_reused", conflict="other", **conflict))


# ------------------------------------------------------------------------------------------------------ route facts
def test_security_is_bearer_over_tcp_and_none_over_the_socket(openapi):
    assert openapi["security"] == [{"bearerAuth": []}, {}]
    scheme = openapi["components"]["securitySchemes"]["bearerAuth"]
    assert scheme["type"] == "http"
    assert scheme["scheme"] == "bearer"
    for text in (scheme["description"], openapi["info"]["description"]):
        assert re.search(r"unix (domain )?socket", text, re.I), text
        assert "no authentication" in text
    for _, _, operation in _operations(openapi):
        assert "security" not in operation  # every route inherits the top-level requirement


def test_metrics_content_type_is_exact(openapi):
    content = openapi["paths"]["/v1/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == [METRICS_TYPE]


def test_events_stream_and_event_map(openapi):
    operation = openapi["paths"]["/v1/events"]["get"]
    assert list(operation["responses"]["200"]["content"]) == ["text/event-stream"]
    assert operation["x-meshspec-sse-events"] == {name: f"{BASE}sse/{name}.json" for name in SSE_EVENTS}
    names = {p["name"] for p in operation["parameters"]}
    assert names == {"Last-Event-ID", "last_event_id"}


def test_send_idempotency_key_header(openapi):
    operation = openapi["paths"]["/v1/send"]["post"]
    (header,) = [p for p in operation["parameters"] if p["in"] == "header"]
    assert header["name"] == "Idempotency-Key"
    assert header["schema"] == {"$ref": "#/components/schemas/ClientMessageId"}
    assert header["required"] is False


def test_send_example_fingerprints_match_the_reference(openapi):
    """The request_fingerprint in a send example is the fingerprint of one of the send request examples."""
    operation = openapi["paths"]["/v1/send"]["post"]
    requests = operation["requestBody"]["content"]["application/json"]["examples"].values()
    fingerprints = {parse_send(json.dumps(example["value"]).encode()).fingerprint().hex() for example in requests}
    for status in ("200", "202"):
        for example in operation["responses"][status]["content"]["application/json"]["examples"].values():
            assert example["value"]["request_fingerprint"] in fingerprints


def _ecma(pattern: str) -> re.Pattern[str]:
    """An ECMA-262 anchored pattern as Python: `$` must not match before a trailing newline."""
    assert pattern.startswith("^") and pattern.endswith("$")
    return re.compile(pattern[:-1] + r"\Z")


def _destination_ok(to: str) -> bool:
    try:
        parse_destination(to)
    except DestinationError:
        return False
    return True


@pytest.fixture(scope="module")
def destination_pattern() -> re.Pattern[str]:
    return _ecma(_load(SPEC_DIR / "schemas" / "ipc" / "send_request.json")["properties"]["to"]["pattern"])


def test_destination_pattern_agrees_with_the_vectors(destination_pattern):
    path = SPEC_DIR / "vectors" / "destination.json"
    if not path.is_file():
        pytest.skip("spec/vectors/destination.json not present")
    vectors = [v for v in _load(path)["vectors"] if isinstance(v["input"].get("to"), str)]
    assert vectors
    for vector in vectors:
        to = vector["input"]["to"]
        assert bool(destination_pattern.match(to)) == vector["expected"]["valid"], vector["id"]


_DEST_PIECES = st.sampled_from(["#", "topic:", "dm:", "queue:", "@", "*", "", "a", "Z", "0", "f", "F", ".", "_",
                                "-", ":", " ", "\n", "/", "é", "a" * 63, "0" * 64, "ab" * 32, "A" * 64])


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(_DEST_PIECES, max_size=4).map("".join), st.text(max_size=80)))
def test_destination_pattern_agrees_with_the_reference(to):
    pattern = _ecma(_load(SPEC_DIR / "schemas" / "ipc" / "send_request.json")["properties"]["to"]["pattern"])
    assert bool(pattern.match(to)) == _destination_ok(to)


_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.text(max_size=8),
                        st.integers(min_value=-(2**60), max_value=2**60),
                        st.sampled_from([2**53 - 1, 2**53, -(2**53 - 1), -(2**53)]))
_JSON_VALUES = st.recursive(_JSON_LEAVES, lambda children: st.one_of(
    st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=3)), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _JSON_VALUES, max_size=3))
def test_meta_schema_agrees_with_the_reference(meta):
    """An integer-valued meta is schema-valid exactly when the reference can canonicalise it (E-04)."""
    validator = _validator(spec_pkg.schema_registry(), f"{BASE}ipc/send_request.json#/properties/meta")
    body = json.dumps({"to": "#general", "message": "m", "meta": meta}).encode()
    try:
        parse_send(body)
        accepted = True
    except RequestError as exc:
        assert exc.code == "meta_not_canonicalizable", exc
        accepted = False
    assert validator.is_valid(meta) == accepted


# ------------------------------------------------------------------------------------------------------ SSE
def test_sse_index_covers_every_event(registry):
    index = _load(SPEC_DIR / "schemas" / "sse" / "index.json")
    events = [branch["properties"]["event"]["const"] for branch in index["oneOf"]]
    assert sorted(events) == SSE_EVENTS
    validator = _validator(registry, f"{BASE}sse/index.json")
    for name in SSE_EVENTS:
        schema = _load(SPEC_DIR / "schemas" / "sse" / f"{name}.json")
        assert schema["examples"], name
        for example in schema["examples"]:
            assert validator.is_valid({"event": name, "data": example}), name
            assert validator.is_valid({"id": 7, "event": name, "data": example}), name
    message = _load(SPEC_DIR / "schemas" / "sse" / "message.json")["examples"][0]
    assert not validator.is_valid({"event": "peer_join", "data": message})
    assert not validator.is_valid({"event": "message", "data": {**message, "seq": "41"}})
    assert not validator.is_valid({"event": "broker_status", "data": {}})


def _sse_frames(text: str) -> Iterator[dict[str, Any]]:
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            yield fields


def test_sse_stream_examples_are_well_framed(openapi, registry):
    validator = _validator(registry, f"{BASE}sse/index.json")
    content = openapi["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    for name, example in content["examples"].items():
        frames = list(_sse_frames(example["value"]))
        assert frames, name
        last_id = 0
        for frame in frames:
            envelope = {"event": frame["event"], "data": json.loads(frame["data"])}
            if frame["event"] == "replay_gap":  # not persisted: no id line (E-13)
                assert set(frame) == {"event", "data"}, frame
            else:
                assert set(frame) == {"id", "event", "data"}, frame
                envelope["id"] = int(frame["id"])
                assert envelope["id"] > last_id, (name, frame)
                last_id = envelope["id"]
            errors = list(validator.iter_errors(envelope))
            assert not errors, (name, frame["event"], [e.message for e in errors])

