"""`meshd spec diff`: each kind of breaking change fails (exit 1) and is named; additive changes pass (exit 0).

Every test copies the real spec tree twice (OLD and NEW), changes one thing, and diffs the two.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import spec as spec_pkg
from reference.cli import main as meshd
from spec.tools import diff

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
NOT_COMPARED = shutil.ignore_patterns("__pycache__", "tools", "vectors", "model", "*.md", "*.py")


@pytest.fixture
def trees(tmp_path) -> tuple[Path, Path]:
    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        shutil.copytree(spec_pkg.SPEC_DIR, root, ignore=NOT_COMPARED)
    assert (old / "openapi.yaml").exists(), "the real spec tree has an OpenAPI document"
    return old, new


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=LOADER)


def edit_yaml(path: Path, change: Callable[[Any], Any]) -> None:
    document = load_yaml(path)
    change(document)
    path.write_text(yaml.dump(document, Dumper=DUMPER, sort_keys=False, allow_unicode=True), encoding="utf-8")


def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    document = json.loads(path.read_text(encoding="utf-8"))
    change(document)
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")


def run(old: Path, new: Path, capsys) -> tuple[int, str]:
    code = meshd(["spec", "diff", str(old), str(new)])
    return code, capsys.readouterr().out


def assert_breaking(old: Path, new: Path, capsys, *expected: str) -> str:
    code, out = run(old, new, capsys)
    assert code == 1, out
    breaking = out.split("Additive changes")[0]
    for text in expected:
        assert text in breaking, f"{text!r} not named as breaking in:\n{out}"
    return out


def assert_additive(old: Path, new: Path, capsys, *expected: str) -> str:
    code, out = run(old, new, capsys)
    assert code == 0, out
    assert "Breaking changes" not in out
    for text in expected:
        assert text in out, f"{text!r} not in:\n{out}"
    return out


# --- helpers over the real OpenAPI document ------------------------------------------------------------------------


def component(document: dict, schema: dict) -> tuple[str, dict]:
    """The component name and schema a ``{"$ref": "#/components/schemas/X"}`` points at."""
    ref = schema["$ref"]
    assert ref.startswith("#/components/schemas/"), ref
    name = ref.rsplit("/", 1)[1]
    return name, document["components"]["schemas"][name]


def send_request(document: dict) -> tuple[str, dict]:
    body = document["paths"]["/v1/send"]["post"]["requestBody"]
    return component(document, body["content"]["application/json"]["schema"])


def send_accepted(document: dict) -> tuple[str, dict]:
    response = document["paths"]["/v1/send"]["post"]["responses"]["202"]
    return component(document, response["content"]["application/json"]["schema"])


def optional_query_parameter(document: dict) -> tuple[str, str, dict]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if "$ref" not in parameter and parameter.get("in") == "query" and not parameter.get("required"):
                    return f"{method.upper()} {path}", parameter["name"], parameter
    raise AssertionError("no optional query parameter in openapi.yaml")


def first_requirement(new: Path, level: str) -> str:
    registry = load_yaml(new / "requirements.yaml")
    return next(r["id"] for r in registry["requirements"] if r["level"] == level)


# --- nothing changed ---------------------------------------------------------------------------------------------


def test_identical_trees_have_no_changes(trees, capsys):
    old, new = trees
    assert diff.diff_trees(old, new) == []
    code, out = run(old, new, capsys)
    assert code == 0
    assert "no changes" in out


# --- breaking: OpenAPI ---------------------------------------------------------------------------------------------


def test_removed_route(trees, capsys):
    old, new = trees
    edit_yaml(new / "openapi.yaml", lambda d: d["paths"].pop("/v1/outbox/requeue"))
    assert_breaking(old, new, capsys, "openapi.yaml: /v1/outbox/requeue: route removed (POST)")


def test_removed_method(trees, capsys):
    old, new = trees
    edit_yaml(new / "openapi.yaml", lambda d: d["paths"]["/v1/send"].pop("post"))
    assert_breaking(old, new, capsys, "openapi.yaml: POST /v1/send: method removed")


def test_removed_status_code(trees, capsys):
    old, new = trees
    edit_yaml(new / "openapi.yaml", lambda d: d["paths"]["/v1/send"]["post"]["responses"].pop("409"))
    assert_breaking(old, new, capsys, "openapi.yaml: POST /v1/send: response 409 removed")


def test_removed_parameter(trees, capsys):
    old, new = trees

    def drop(document):
        operation = document["paths"]["/v1/send"]["post"]
        operation["parameters"] = [p for p in operation["parameters"] if p.get("name") != "Idempotency-Key"]

    edit_yaml(new / "openapi.yaml", drop)
    assert_breaking(old, new, capsys, "openapi.yaml: POST /v1/send: parameter idempotency-key (header) removed")


def test_parameter_became_required(trees, capsys):
    old, new = trees
    document = load_yaml(new / "openapi.yaml")
    operation, name, _ = optional_query_parameter(document)

    def require(document):
        optional_query_parameter(document)[2]["required"] = True

    edit_yaml(new / "openapi.yaml", require)
    assert_breaking(old, new, capsys, f"openapi.yaml: {operation}: parameter {name} (query) is now required")


def test_removed_response_field(trees, capsys):
    old, new = trees
    document = load_yaml(new / "openapi.yaml")
    name, schema = send_accepted(document)
    field = "request_fingerprint" if "request_fingerprint" in schema["properties"] else next(iter(schema["properties"]))

    def drop(document):
        target = send_accepted(document)[1]
        del target["properties"][field]
        target["required"] = [r for r in target.get("required", []) if r != field]

    edit_yaml(new / "openapi.yaml", drop)
    assert_breaking(old, new, capsys,
                    f"openapi.yaml: components/schemas/{name}: #/properties/{field}: property removed")


def test_newly_required_request_field(trees, capsys):
    old, new = trees
    document = load_yaml(new / "openapi.yaml")
    name, schema = send_request(document)
    field = next(p for p in schema["properties"] if p not in schema.get("required", []))
    edit_yaml(new / "openapi.yaml", lambda d: send_request(d)[1].setdefault("required", []).append(field))
    assert_breaking(old, new, capsys,
                    f"openapi.yaml: components/schemas/{name}: #/properties/{field}: property is now required")


def test_removed_enum_value(trees, capsys):
    old, new = trees
    document = load_yaml(new / "openapi.yaml")
    name, schema = component(document, send_request(document)[1]["properties"]["priority"])
    value = schema["enum"][-1]
    edit_yaml(new / "openapi.yaml", lambda d: d["components"]["schemas"][name]["enum"].remove(value))
    assert_breaking(old, new, capsys, f"openapi.yaml: components/schemas/{name}: #: enum value {value} removed")


def test_changed_type_is_narrowed(trees, capsys):
    old, new = trees
    edit_yaml(new / "openapi.yaml", lambda d: send_request(d)[1]["properties"]["message"].update(type="integer"))
    name = send_request(load_yaml(new / "openapi.yaml"))[0]
    assert_breaking(old, new, capsys,
                    f"openapi.yaml: components/schemas/{name}: #/properties/message: type narrowed string -> integer")


def test_type_removed_from_type_list(trees, capsys):
    old, new = trees
    edit_json(old / "schemas" / "ipc" / "send_request.json",
              lambda d: d["properties"]["message"].update(type=["string", "null"]))
    assert_breaking(old, new, capsys,
                    "schemas/ipc/send_request.json: #/properties/message: type narrowed null|string -> string")


def test_changed_ref_target_is_followed(trees, capsys):
    old, new = trees

    def swap(document):
        schemas = document["components"]["schemas"]
        schemas["SendRequestNarrow"] = {k: v for k, v in schemas["SendRequest"].items()}
        schemas["SendRequestNarrow"]["properties"] = {
            k: v for k, v in schemas["SendRequest"]["properties"].items() if k != "reply_to_id"
        }
        content = document["paths"]["/v1/send"]["post"]["requestBody"]["content"]["application/json"]
        content["schema"] = {"$ref": "#/components/schemas/SendRequestNarrow"}

    edit_yaml(new / "openapi.yaml", swap)
    assert_breaking(old, new, capsys,
                    "openapi.yaml: POST /v1/send: request application/json: #/properties/reply_to_id: property removed")


# --- breaking: JSON Schema files -----------------------------------------------------------------------------------


def test_removed_schema_file(trees, capsys):
    old, new = trees
    (new / "schemas" / "ipc" / "send_request.json").unlink()
    assert_breaking(old, new, capsys,
                    "schemas/ipc/send_request.json: schema https://meshspec.dev/schemas/ipc/send_request.json removed")


def test_removed_property_in_schema_file(trees, capsys):
    old, new = trees
    path = new / "schemas" / "ipc" / "send_request.json"
    edit_json(path, lambda d: d["properties"].pop("reply_to_id"))
    assert_breaking(old, new, capsys, "schemas/ipc/send_request.json: #/properties/reply_to_id: property removed")


def test_removed_enum_value_in_shared_definition(trees, capsys):
    old, new = trees
    edit_json(new / "schemas" / "common" / "defs.json", lambda d: d["$defs"]["priority"]["enum"].remove("low"))
    out = assert_breaking(old, new, capsys, "schemas/common/defs.json: #/$defs/priority: enum value low removed")
    # send_request.json refers to the same definition: the change is reported once, where it is defined
    assert "send_request.json: #/properties/priority" not in out


# --- breaking: decision tables -------------------------------------------------------------------------------------


def outbox_rows(change: Callable[[list[dict]], list[dict] | None]) -> Callable[[dict], None]:
    def apply(document: dict) -> None:
        rows = change(document["rows"])
        if rows is not None:
            document["rows"] = rows

    return apply


def test_changed_table_outcome(trees, capsys):
    old, new = trees

    def to_pending(rows):
        next(r for r in rows if r["id"] == "OB-INFLIGHT-CONFLICT")["then"]["to"] = "pending"

    edit_yaml(new / "tables" / "outbox.yaml", outbox_rows(to_pending))
    assert_breaking(old, new, capsys, "tables/outbox.yaml: state=inflight, event=ack_conflict: then changed "
                                      "{to: dead} -> {to: pending} (row OB-INFLIGHT-CONFLICT)")


def test_removed_row_leaves_combination_uncovered(trees, capsys):
    old, new = trees
    edit_yaml(new / "tables" / "outbox.yaml",
              outbox_rows(lambda rows: [r for r in rows if r["id"] != "OB-INFLIGHT-CONFLICT"]))
    assert_breaking(old, new, capsys, "tables/outbox.yaml: state=inflight, event=ack_conflict: no longer covered "
                                      "by any row (was OB-INFLIGHT-CONFLICT)")


def test_wildcard_row_change_is_shown_as_one_cube(trees, capsys):
    old, new = trees

    def change(document):
        document["rows"][0]["then"]["http_status"] = 400

    edit_yaml(new / "tables" / "broker_accept.yaml", change)
    assert_breaking(old, new, capsys, "tables/broker_accept.yaml: b1=rejected: then changed {http_status: 4xx} -> "
                                      "{http_status: 400} (row BRK-B1-REJECT)")


def test_removed_input_value(trees, capsys):
    old, new = trees

    def drop(document):
        document["inputs"]["event"].remove("link_lost")
        for row in document["rows"]:
            cell = row["when"]["event"]
            if isinstance(cell, list) and "link_lost" in cell:
                cell.remove("link_lost")

    edit_yaml(new / "tables" / "outbox.yaml", drop)
    assert_breaking(old, new, capsys, "tables/outbox.yaml: input value event=link_lost removed")


def test_removed_table(trees, capsys):
    old, new = trees
    (new / "tables" / "broker_accept.yaml").unlink()
    assert_breaking(old, new, capsys, "tables/broker_accept.yaml: table removed")


# --- breaking: catalogues ------------------------------------------------------------------------------------------


def test_removed_error_code(trees, capsys):
    old, new = trees
    edit_yaml(new / "tables" / "errors.yaml", lambda d: d["codes"].pop("daemon_busy"))
    assert_breaking(old, new, capsys, "tables/errors.yaml: codes.daemon_busy: error code removed")


def test_changed_error_status(trees, capsys):
    old, new = trees
    edit_yaml(new / "tables" / "errors.yaml", lambda d: d["codes"]["not_found"].update(status=410))
    assert_breaking(old, new, capsys, "tables/errors.yaml: codes.not_found: status 404 -> 410")


def test_changed_feature_param_rule(trees, capsys):
    old, new = trees

    def raise_floor(document):
        document["bits"]["client_message_id_dedupe"]["required"]["dedupe_retention_days"]["floor"] = 7

    edit_yaml(new / "tables" / "features.yaml", raise_floor)
    out = assert_breaking(old, new, capsys,
                          "tables/features.yaml: bits.client_message_id_dedupe.required.dedupe_retention_days: "
                          "rule changed")
    assert "floor: 3" in out and "floor: 7" in out


def test_removed_feature_bit(trees, capsys):
    old, new = trees
    edit_yaml(new / "tables" / "features.yaml", lambda d: d["bits"].pop("key_epoch"))
    assert_breaking(old, new, capsys, "tables/features.yaml: bits.key_epoch: feature bit removed")


def test_changed_max_age_parameter(trees, capsys):
    old, new = trees
    edit_yaml(new / "tables" / "max_age.yaml", lambda d: d.update(floor_hours=48))
    assert_breaking(old, new, capsys, "tables/max_age.yaml: floor_hours: 72 -> 48")


# --- breaking: requirements ----------------------------------------------------------------------------------------


def test_removed_requirement(trees, capsys):
    old, new = trees
    removed = first_requirement(new, "MUST")
    edit_yaml(new / "requirements.yaml",
              lambda d: d.update(requirements=[r for r in d["requirements"] if r["id"] != removed]))
    assert_breaking(old, new, capsys, f"requirements.yaml: {removed}: requirement removed")


def test_raised_requirement_level(trees, capsys):
    old, new = trees
    raised = first_requirement(new, "SHOULD")

    def must(document):
        next(r for r in document["requirements"] if r["id"] == raised)["level"] = "MUST"

    edit_yaml(new / "requirements.yaml", must)
    assert_breaking(old, new, capsys, f"requirements.yaml: {raised}: level raised SHOULD -> MUST")


# --- additive ------------------------------------------------------------------------------------------------------


def test_new_route(trees, capsys):
    old, new = trees
    route = {"get": {"responses": {"200": {"description": "ok"}}}}
    edit_yaml(new / "openapi.yaml", lambda d: d["paths"].__setitem__("/v1/fixture", route))
    assert_additive(old, new, capsys, "openapi.yaml: /v1/fixture: route added (GET)")


def test_new_optional_field(trees, capsys):
    old, new = trees
    edit_yaml(new / "openapi.yaml",
              lambda d: send_request(d)[1]["properties"].__setitem__("note", {"type": "string"}))
    assert_additive(old, new, capsys, "#/properties/note: optional property added")


def test_new_enum_value(trees, capsys):
    old, new = trees
    edit_json(new / "schemas" / "common" / "defs.json", lambda d: d["$defs"]["priority"]["enum"].append("urgent"))
    assert_additive(old, new, capsys, "schemas/common/defs.json: #/$defs/priority: enum value urgent added")


def test_new_status_code(trees, capsys):
    old, new = trees
    edit_yaml(new / "openapi.yaml",
              lambda d: d["paths"]["/v1/send"]["post"]["responses"].__setitem__("418", {"description": "teapot"}))
    assert_additive(old, new, capsys, "openapi.yaml: POST /v1/send: response 418 added")


def test_new_requirement(trees, capsys):
    old, new = trees
    requirement = {"id": "FIXTURE-NEW", "level": "MUST", "section": "4.4", "source": "spec",
                   "text": "A requirement added by the test.", "tests": []}
    edit_yaml(new / "requirements.yaml", lambda d: d["requirements"].append(requirement))
    assert_additive(old, new, capsys, "requirements.yaml: FIXTURE-NEW: requirement added (MUST, §4.4)")


def test_new_table_input_value_with_its_row(trees, capsys):
    old, new = trees

    def add_event(document):
        document["inputs"]["event"].append("heartbeat")
        document["rows"].append({"id": "OB-ANY-HEARTBEAT", "when": {"state": "*", "event": "heartbeat"},
                                 "then": {"outcome": "ignore", "reason": "a link heartbeat changes no row"}})

    edit_yaml(new / "tables" / "outbox.yaml", add_event)
    assert_additive(old, new, capsys, "tables/outbox.yaml: input value event=heartbeat added (rows OB-ANY-HEARTBEAT)")


def test_new_schema_file(trees, capsys):
    old, new = trees
    fixture = {"$schema": "https://json-schema.org/draft/2020-12/schema",
               "$id": "https://meshspec.dev/schemas/ipc/fixture.json", "type": "object"}
    (new / "schemas" / "ipc" / "fixture.json").write_text(json.dumps(fixture), encoding="utf-8")
    assert_additive(old, new, capsys,
                    "schemas/ipc/fixture.json: schema https://meshspec.dev/schemas/ipc/fixture.json added")


def test_row_rename_with_same_then_is_not_breaking(trees, capsys):
    old, new = trees

    def rename(rows):
        next(r for r in rows if r["id"] == "OB-INFLIGHT-CONFLICT")["id"] = "OB-INFLIGHT-409"

    edit_yaml(new / "tables" / "outbox.yaml", outbox_rows(rename))
    assert_additive(old, new, capsys, "row OB-INFLIGHT-CONFLICT renamed OB-INFLIGHT-409, same then")


def test_splitting_a_row_with_the_same_outcome_is_no_change(trees):
    old, new = trees

    def split(rows):
        index = next(i for i, r in enumerate(rows) if r["id"] == "OB-INFLIGHT-FAILED")
        row = rows[index]
        head = {**row, "when": {"state": "inflight", "event": ["ack_failed", "ack_timeout"]}}
        tail = {**row, "id": "OB-INFLIGHT-FAILED", "when": {"state": "inflight", "event": "link_lost"}}
        head["id"] = "OB-INFLIGHT-FAILED-ACK"
        return [*rows[:index], head, tail, *rows[index + 1:]]

    edit_yaml(new / "tables" / "outbox.yaml", outbox_rows(split))
    changes = diff.diff_trees(old, new)
    assert not any(c.breaking for c in changes), changes
    assert [c.kind for c in changes] == ["table_row_renamed"]


# --- small synthetic trees: $ref handling ----------------------------------------------------------------------------


def openapi_tree(root: Path, schemas: dict, request_ref: str) -> Path:
    root.mkdir()
    document = {
        "openapi": "3.1.0",
        "info": {"title": "fixture", "version": "1"},
        "paths": {"/x": {"post": {
            "requestBody": {"content": {"application/json": {"schema": {"$ref": request_ref}}}},
            "responses": {"200": {"description": "ok"}},
        }}},
        "components": {"schemas": schemas},
    }
    (root / "openapi.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    return root


def test_shared_component_change_is_reported_once(tmp_path):
    a = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    old = openapi_tree(tmp_path / "old", {"A": a}, "#/components/schemas/A")
    new = openapi_tree(tmp_path / "new", {"A": {**a, "properties": {"a": {"type": "string"}}}},
                       "#/components/schemas/A")
    assert [str(c) for c in diff.diff_trees(old, new)] == [
        "openapi.yaml: components/schemas/A: #/properties/b: property removed"
    ]


def test_recursive_schemas_behind_a_changed_ref_terminate(tmp_path):
    node_a = {"type": "object", "properties": {"child": {"$ref": "#/components/schemas/A"}, "x": {"type": "string"}}}
    node_b = {"type": "object", "properties": {"child": {"$ref": "#/components/schemas/B"}}}
    old = openapi_tree(tmp_path / "old", {"A": node_a}, "#/components/schemas/A")
    new = openapi_tree(tmp_path / "new", {"A": node_a, "B": node_b}, "#/components/schemas/B")
    shown = [str(c) for c in diff.diff_trees(old, new)]
    assert "openapi.yaml: POST /x: request application/json: #/properties/x: property removed" in shown


# --- the command line ----------------------------------------------------------------------------------------------


def test_json_output(trees, capsys):
    old, new = trees
    edit_yaml(new / "tables" / "errors.yaml", lambda d: d["codes"].pop("daemon_busy"))
    assert meshd(["spec", "diff", str(old), str(new), "--json"]) == 1
    changes = json.loads(capsys.readouterr().out)
    assert {"kind": "error_code_removed", "breaking": True, "where": "tables/errors.yaml",
            "detail": "codes.daemon_busy: error code removed (was 429)"} in changes
    assert all(set(c) == {"kind", "breaking", "where", "detail"} for c in changes)


def test_relative_paths(trees, monkeypatch, capsys):
    old, new = trees
    monkeypatch.chdir(old.parent)
    assert diff.cli([old.name, new.name]) == 0


def test_usage_error_is_exit_2(capsys):
    assert diff.cli([]) == 2
    assert diff.cli(["only-one"]) == 2


def test_unreadable_tree_is_exit_2(trees, tmp_path, capsys):
    old, new = trees
    assert diff.cli([str(old), str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert diff.cli([str(tmp_path / "empty"), str(new)]) == 2
    (new / "tables" / "outbox.yaml").write_text("rows: [unclosed\n", encoding="utf-8")
    assert diff.cli([str(old), str(new)]) == 2
    assert "outbox.yaml" in capsys.readouterr().err
