"""`meshd spec diff OLD NEW`: every change between two spec trees, classified breaking or additive.

Theory of operation. Both trees are read whole (``openapi.yaml``, ``schemas/**/*.json``, ``tables/*.yaml``,
``requirements.yaml``) and compared part by part; each finding is a ``Change`` with a location a reader can open.

Rules of this file:

* Breaking means an implementation or client written against OLD can be wrong against NEW: something it relied on
  is gone (a route, method, status code, parameter, property, enum value, type, schema file, table, error code,
  feature bit, requirement), something it could omit is now demanded (a required parameter or property, a new
  required feature parameter), a constraint got tighter (a type or bound narrowed, a pattern added), or a decision
  changed (a table combination OLD covered now has another ``then``, no row, or two rows; a catalogue value changed;
  a requirement's level went up MAY -> SHOULD -> MUST).
* Additive is everything else that changed meaning: new routes, codes, optional properties, enum values, schema
  files, input values with their rows, requirements; loosened constraints; a row renamed with the same ``then``.
  Prose (titles, descriptions, requirement text) is not compared; a catalogue string that reads as a sentence is
  reported as a wording change, never as breaking.
* Schemas are compared structurally by JSON pointer. A ``$ref`` that points at the same place on both sides is not
  followed when that place is compared on its own (a component schema or a schema file), so a change is reported
  once, where it is defined; a ``$ref`` whose target changed is followed on both sides.
* Decision tables are compared by behaviour, not text: every combination of the OLD input domains is looked up in
  both tables, so moving a value between rows with the same outcome is no change at all.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

import yaml

import spec as spec_pkg
from spec.decision import DecisionTable

__all__ = ["Change", "SpecTreeError", "cli", "diff_trees"]

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
LEVELS = {"MAY": 0, "SHOULD": 1, "MUST": 2}
PROSE_KEYS = frozenset({"title", "description", "summary", "section", "$comment", "examples", "example", "default",
                        "deprecated", "readOnly", "writeOnly"})
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")
SUBSCHEMA_KEYWORDS = ("items", "contains", "not", "if", "then", "else", "propertyNames", "unevaluatedItems",
                      "contentSchema")
SCHEMA_MAP_KEYWORDS = ("$defs", "definitions", "patternProperties", "dependentSchemas")
LIST_KEYS = ("id", "phase", "check", "effect", "name", "code")


@dataclass(frozen=True)
class Change:
    """One difference between the OLD and the NEW tree."""

    kind: str
    breaking: bool
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.detail}"


class SpecTreeError(Exception):
    """A spec tree is missing or one of its files cannot be read."""


# --- reading a tree ---------------------------------------------------------------------------------------------


@dataclass
class _Doc:
    key: str  # the `$id` of a schema file, else its path inside the tree
    rel: str  # path inside the tree, for messages
    content: Any


class _Tree:
    """One spec tree, parsed, with a `$ref` resolver over all of its documents."""

    def __init__(self, root: Path):
        root = root.resolve()
        if not root.is_dir():
            raise SpecTreeError(f"{root}: not a directory")
        if not any((root / part).exists() for part in ("openapi.yaml", "requirements.yaml", "tables", "schemas")):
            raise SpecTreeError(f"{root}: not a spec tree (no openapi.yaml, requirements.yaml, tables/ or schemas/)")
        self.root = root
        self.openapi = self._read(root / "openapi.yaml")
        self.requirements = self._read(root / "requirements.yaml")
        self.schemas: dict[str, _Doc] = {}
        self.tables: dict[str, Any] = {}
        self._by_uri: dict[str, _Doc] = {}
        if self.openapi is not None:
            self._by_uri[(root / "openapi.yaml").as_uri()] = _Doc("openapi.yaml", "openapi.yaml", self.openapi)
        for path in sorted((root / "schemas").rglob("*.json")):
            rel = path.relative_to(root).as_posix()
            content = self._read(path)
            schema_id = content.get("$id") if isinstance(content, dict) else None
            doc = _Doc(schema_id if isinstance(schema_id, str) else rel, rel, content)
            self.schemas[doc.key] = doc
            self._by_uri[path.as_uri()] = doc
            if isinstance(schema_id, str):
                self._by_uri[urldefrag(schema_id).url] = doc
        for path in sorted((root / "tables").glob("*.yaml")):
            self.tables[f"tables/{path.name}"] = self._read(path)

    @staticmethod
    def _read(path: Path) -> Any:
        if not path.exists():
            return None
        try:
            if path.suffix == ".json":
                return spec_pkg.load_json(path)
            with path.open(encoding="utf-8") as handle:
                return yaml.load(handle, Loader=spec_pkg.YAML_LOADER)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
            raise SpecTreeError(f"{path}: {exc}") from exc

    def base_of(self, doc: _Doc) -> str:
        """The URI that relative `$ref`s inside ``doc`` resolve against."""
        if doc.key.startswith(("http://", "https://", "urn:")):
            return doc.key
        return (self.root / doc.rel).as_uri()

    def resolve(self, base: str, ref: str) -> tuple[str, str, str, Any] | None:
        """``(base of the target document, its key, pointer, node)`` for ``ref``, or ``None`` when unresolvable."""
        uri, fragment = urldefrag(urljoin(base, ref))
        doc = self._by_uri.get(uri)
        if doc is None:
            return None
        node = doc.content
        pointer = fragment if fragment.startswith("/") else ""
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return self.base_of(doc), doc.key, pointer, node


# --- output helpers ---------------------------------------------------------------------------------------------


class _Out:
    def __init__(self) -> None:
        self.changes: list[Change] = []

    def breaking(self, kind: str, where: str, detail: str) -> None:
        self.changes.append(Change(kind, True, where, detail))

    def additive(self, kind: str, where: str, detail: str) -> None:
        self.changes.append(Change(kind, False, where, detail))


def _flow(value: Any) -> str:
    """A compact YAML-flow rendering of a value, for messages."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value and not re.search(r"[,:{}\[\]#\"']|^\s|\s$", value) else json.dumps(value)
    return json.dumps(value)


def _escape(token: str) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def _at(pointer: str) -> str:
    return f"#{pointer}"


# --- JSON Schema ------------------------------------------------------------------------------------------------


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    value = schema.get("type")
    if value is None:
        return None
    types = {value} if isinstance(value, str) else set(value)
    if schema.get("nullable") is True:  # OpenAPI 3.0 spelling, tolerated
        types.add("null")
    return types


def _enum(schema: Mapping[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    value = schema.get("enum")
    return list(value) if isinstance(value, list) else None


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


class _SchemaDiff:
    """Structural comparison of one pair of schemas, reporting under ``where``."""

    def __init__(self, old: _Tree, new: _Tree, out: _Out, where: str):
        self.old, self.new, self.out, self.where = old, new, out, where
        self.seen: set[tuple[str, str]] = set()

    def run(self, old: Any, new: Any, old_base: str, new_base: str, pointer: str = "") -> None:
        if isinstance(old, bool) or isinstance(new, bool):
            self._booleans(old, new, pointer)
            return
        if not isinstance(old, dict) or not isinstance(new, dict):
            if old != new:
                self.out.breaking("schema_changed", self.where, f"{_at(pointer)}: schema changed")
            return
        if "$ref" in old or "$ref" in new:
            self._refs(old, new, old_base, new_base, pointer)
            return
        self._type(old, new, pointer)
        self._enum(old, new, pointer)
        self._properties(old, new, old_base, new_base, pointer)
        self._closed(old, new, old_base, new_base, pointer, "additionalProperties")
        self._closed(old, new, old_base, new_base, pointer, "unevaluatedProperties")
        self._bounds(old, new, pointer)
        self._default(old, new, pointer)
        for keyword in SUBSCHEMA_KEYWORDS:
            self._subschema(old, new, old_base, new_base, pointer, keyword)
        for keyword in SCHEMA_MAP_KEYWORDS:
            self._schema_map(old, new, old_base, new_base, pointer, keyword)
        for keyword in ("prefixItems", "allOf", "anyOf", "oneOf"):
            self._schema_list(old, new, old_base, new_base, pointer, keyword)

    def _booleans(self, old: Any, new: Any, pointer: str) -> None:
        """At least one side is a boolean schema (``true`` admits anything, ``false`` nothing)."""
        if old == new:
            return
        if new is False or (old is True and _constrains(new)):
            self.out.breaking("schema_narrowed", self.where, f"{_at(pointer)}: schema narrowed {_flow(old)} -> "
                              f"{_flow(new)}")
        elif old is False or (new is True and _constrains(old)):
            self.out.additive("schema_widened", self.where, f"{_at(pointer)}: schema widened {_flow(old)} -> "
                              f"{_flow(new)}")

    def _refs(self, old: dict, new: dict, old_base: str, new_base: str, pointer: str) -> None:
        """Compare two nodes of which at least one has a ``$ref``, then their sibling keywords."""
        old_ref, new_ref = old.get("$ref"), new.get("$ref")
        old_target = self.old.resolve(old_base, old_ref) if old_ref else None
        new_target = self.new.resolve(new_base, new_ref) if new_ref else None
        if (old_ref and old_target is None) or (new_ref and new_target is None):
            if old_ref != new_ref:
                self.out.breaking("ref_changed", self.where, f"{_at(pointer)}: $ref {old_ref or '-'} -> "
                                  f"{new_ref or '-'} (a target cannot be resolved; compare by hand)")
        elif old_target and new_target and old_target[1:3] == new_target[1:3] and _compared_on_its_own(
            *old_target[1:3]
        ):
            pass  # the same definition on both sides: it is compared where it is defined
        else:
            marker = (_key(old_target[1:3]) if old_target else pointer,
                      _key(new_target[1:3]) if new_target else pointer)
            if marker not in self.seen:  # recursive schemas: compare each pair of definitions once
                self.seen.add(marker)
                old_node, old_next = (old_target[3], old_target[0]) if old_target else (old, old_base)
                new_node, new_next = (new_target[3], new_target[0]) if new_target else (new, new_base)
                self.run(old_node, new_node, old_next, new_next, pointer)
        if old_ref and new_ref:
            rest_old, rest_new = _without_ref(old), _without_ref(new)
            if rest_old or rest_new:
                self.run(rest_old, rest_new, old_base, new_base, pointer)

    def _type(self, old: dict, new: dict, pointer: str) -> None:
        old_types, new_types = _types(old), _types(new)
        if old_types is None and new_types is None:
            return
        where = _at(pointer)
        if old_types is None:
            shown = "|".join(sorted(new_types))
            self.out.breaking("type_narrowed", self.where, f"{where}: type narrowed any -> {shown}")
            return
        if new_types is None:
            self.out.additive("type_widened", self.where, f"{where}: type widened {'|'.join(sorted(old_types))} -> any")
            return
        covered = new_types | ({"integer"} if "number" in new_types else set())
        lost = old_types - covered
        gained = new_types - old_types - ({"integer"} if "number" in old_types else set())
        shown = f"{'|'.join(sorted(old_types))} -> {'|'.join(sorted(new_types))}"
        if lost:
            self.out.breaking("type_narrowed", self.where, f"{where}: type narrowed {shown}")
        elif gained:
            self.out.additive("type_widened", self.where, f"{where}: type widened {shown}")

    def _enum(self, old: dict, new: dict, pointer: str) -> None:
        old_values, new_values = _enum(old), _enum(new)
        where = _at(pointer)
        if old_values is None and new_values is None:
            return
        if old_values is None:
            self.out.breaking("enum_added", self.where, f"{where}: now restricted to {_flow(new_values)}")
            return
        if new_values is None:
            self.out.additive("enum_removed", self.where, f"{where}: no longer restricted to {_flow(old_values)}")
            return
        new_keys, old_keys = {_key(v) for v in new_values}, {_key(v) for v in old_values}
        for value in old_values:
            if _key(value) not in new_keys:
                self.out.breaking("enum_value_removed", self.where, f"{where}: enum value {_flow(value)} removed")
        for value in new_values:
            if _key(value) not in old_keys:
                self.out.additive("enum_value_added", self.where, f"{where}: enum value {_flow(value)} added")

    def _properties(self, old: dict, new: dict, old_base: str, new_base: str, pointer: str) -> None:
        old_props, new_props = old.get("properties") or {}, new.get("properties") or {}
        old_required, new_required = set(old.get("required") or ()), set(new.get("required") or ())
        for name, schema in old_props.items():
            here = f"{pointer}/properties/{_escape(name)}"
            if name not in new_props:
                self.out.breaking("property_removed", self.where, f"{_at(here)}: property removed")
            else:
                self.run(schema, new_props[name], old_base, new_base, here)
        for name in new_props:
            if name not in old_props and name not in new_required:
                here = f"{pointer}/properties/{_escape(name)}"
                self.out.additive("property_added", self.where, f"{_at(here)}: optional property added")
        for name in sorted(new_required - old_required):
            state = "required property added" if name not in old_props else "property is now required"
            here = f"{pointer}/properties/{_escape(name)}"
            self.out.breaking("property_required", self.where, f"{_at(here)}: {state}")
        for name in sorted(old_required - new_required):
            if name in new_props:
                here = f"{pointer}/properties/{_escape(name)}"
                self.out.additive("property_optional", self.where, f"{_at(here)}: property no longer required")

    def _closed(self, old: dict, new: dict, old_base: str, new_base: str, pointer: str, keyword: str) -> None:
        old_value, new_value = old.get(keyword, True), new.get(keyword, True)
        here = f"{pointer}/{keyword}"
        if isinstance(old_value, dict) and isinstance(new_value, dict):
            self.run(old_value, new_value, old_base, new_base, here)
        else:
            self._booleans(old_value, new_value, here)

    def _default(self, old: dict, new: dict, pointer: str) -> None:
        if "default" in old and "default" in new and old["default"] != new["default"]:
            detail = f"{_at(pointer)}: default {_flow(old['default'])} -> {_flow(new['default'])}"
            self.out.breaking("default_changed", self.where, detail)
        elif ("default" in old) != ("default" in new):
            detail = f"{_at(pointer)}: default {_flow(old.get('default', '-'))} -> {_flow(new.get('default', '-'))}"
            self.out.additive("default_changed", self.where, detail)

    def _bounds(self, old: dict, new: dict, pointer: str) -> None:
        for keyword, tighter in [*((k, lambda a, b: b > a) for k in LOWER_BOUNDS),
                                 *((k, lambda a, b: b < a) for k in UPPER_BOUNDS)]:
            self._bound(old, new, pointer, keyword, tighter)
        for keyword in ("pattern", "format", "contentMediaType", "multipleOf"):
            self._bound(old, new, pointer, keyword, None)
        if not old.get("uniqueItems") and new.get("uniqueItems"):
            self.out.breaking("constraint_tightened", self.where, f"{_at(pointer)}: uniqueItems now true")
        elif old.get("uniqueItems") and not new.get("uniqueItems"):
            self.out.additive("constraint_loosened", self.where, f"{_at(pointer)}: uniqueItems no longer true")

    def _bound(self, old: dict, new: dict, pointer: str, keyword: str, tighter: Any) -> None:
        if old.get(keyword) == new.get(keyword):
            return
        where = f"{_at(pointer)}: {keyword} {_flow(old.get(keyword, '-'))} -> {_flow(new.get(keyword, '-'))}"
        if keyword not in new:
            self.out.additive("constraint_loosened", self.where, where)
        elif keyword not in old or tighter is None or tighter(old[keyword], new[keyword]):
            self.out.breaking("constraint_tightened", self.where, where)
        else:
            self.out.additive("constraint_loosened", self.where, where)

    def _subschema(self, old: dict, new: dict, old_base: str, new_base: str, pointer: str, keyword: str) -> None:
        here = f"{pointer}/{keyword}"
        if keyword in old and keyword in new:
            self.run(old[keyword], new[keyword], old_base, new_base, here)
        elif keyword in new:
            self.out.breaking("constraint_tightened", self.where, f"{_at(here)}: {keyword} added")
        elif keyword in old:
            self.out.additive("constraint_loosened", self.where, f"{_at(here)}: {keyword} removed")

    def _schema_map(self, old: dict, new: dict, old_base: str, new_base: str, pointer: str, keyword: str) -> None:
        old_map, new_map = old.get(keyword) or {}, new.get(keyword) or {}
        for name, schema in old_map.items():
            here = f"{pointer}/{keyword}/{_escape(name)}"
            if name not in new_map:
                kind = "definition_removed" if keyword in ("$defs", "definitions") else "schema_narrowed"
                self.out.breaking(kind, self.where, f"{_at(here)}: removed")
            else:
                self.run(schema, new_map[name], old_base, new_base, here)
        for name in new_map:
            if name not in old_map:
                here = f"{pointer}/{keyword}/{_escape(name)}"
                if keyword in ("$defs", "definitions"):
                    self.out.additive("definition_added", self.where, f"{_at(here)}: added")
                else:
                    self.out.breaking("constraint_tightened", self.where, f"{_at(here)}: added")

    def _schema_list(self, old: dict, new: dict, old_base: str, new_base: str, pointer: str, keyword: str) -> None:
        """``prefixItems`` by position; ``allOf``/``anyOf``/``oneOf`` branches by equality, then the rest in order."""
        old_list, new_list = old.get(keyword) or [], new.get(keyword) or []
        if keyword == "prefixItems":
            pairs = list(zip(range(len(old_list)), range(len(new_list)), strict=False))
            gone, added = list(range(len(new_list), len(old_list))), list(range(len(old_list), len(new_list)))
        else:
            unmatched_new = list(range(len(new_list)))
            gone = []
            for index, branch in enumerate(old_list):
                twin = next((j for j in unmatched_new if _key(new_list[j]) == _key(branch)), None)
                if twin is None:
                    gone.append(index)
                else:
                    unmatched_new.remove(twin)
            pairs = list(zip(gone, unmatched_new, strict=False))
            gone, added = gone[len(pairs):], unmatched_new[len(pairs):]
        for old_index, new_index in pairs:
            here = f"{pointer}/{keyword}/{old_index}"
            self.run(old_list[old_index], new_list[new_index], old_base, new_base, here)
        for index in gone:
            here = f"{pointer}/{keyword}/{index}"
            if keyword == "allOf":
                self.out.additive("constraint_loosened", self.where, f"{_at(here)}: removed")
            else:
                self.out.breaking("schema_narrowed", self.where, f"{_at(here)}: removed")
        for index in added:
            here = f"{pointer}/{keyword}/{index}"
            if keyword in ("allOf", "prefixItems"):
                self.out.breaking("constraint_tightened", self.where, f"{_at(here)}: added")
            else:
                self.out.additive("schema_widened", self.where, f"{_at(here)}: added")


def _constrains(schema: Any) -> bool:
    return schema is False or (isinstance(schema, dict) and any(k not in PROSE_KEYS for k in schema))


def _without_ref(schema: dict) -> dict:
    return {k: v for k, v in schema.items() if k != "$ref"}


def _compared_on_its_own(doc_key: str, pointer: str) -> bool:
    """Whether the node at ``pointer`` in ``doc_key`` is compared by its own entry (a component or a schema file)."""
    if doc_key == "openapi.yaml":
        return re.fullmatch(r"/components/schemas/[^/]+(/.*)?", pointer) is not None
    return True


# --- OpenAPI ----------------------------------------------------------------------------------------------------


def _route_key(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


class _OpenAPIDiff:
    def __init__(self, old: _Tree, new: _Tree, out: _Out):
        self.old, self.new, self.out = old, new, out
        self.old_base = (old.root / "openapi.yaml").as_uri()
        self.new_base = (new.root / "openapi.yaml").as_uri()

    def _deref(self, tree: _Tree, base: str, node: Any) -> Any:
        for _ in range(16):  # a chain of `$ref`s to a response, parameter or request body
            if not (isinstance(node, dict) and "$ref" in node):
                return node
            target = tree.resolve(base, node["$ref"])
            if target is None:
                return {}
            node = target[3]
        return node

    def run(self) -> None:
        old_doc, new_doc = self.old.openapi, self.new.openapi
        if not isinstance(old_doc, dict) or not isinstance(new_doc, dict):
            return
        old_paths = old_doc.get("paths") or {}
        new_paths = {_route_key(p): (p, item) for p, item in (new_doc.get("paths") or {}).items()}
        old_keys = {_route_key(p) for p in old_paths}
        for path, old_item in old_paths.items():
            if _route_key(path) not in new_paths:
                methods = ", ".join(m.upper() for m in METHODS if m in (old_item or {}))
                self.out.breaking("route_removed", f"openapi.yaml: {path}", f"route removed ({methods})")
                continue
            self._path_item(path, old_item or {}, new_paths[_route_key(path)][1] or {})
        for key, (path, item) in new_paths.items():
            if key not in old_keys:
                methods = ", ".join(m.upper() for m in METHODS if m in (item or {}))
                self.out.additive("route_added", f"openapi.yaml: {path}", f"route added ({methods})")
        self._components(old_doc, new_doc)

    def _path_item(self, path: str, old_item: dict, new_item: dict) -> None:
        for method in METHODS:
            where = f"openapi.yaml: {method.upper()} {path}"
            if method in old_item and method not in new_item:
                self.out.breaking("method_removed", where, "method removed")
            elif method in new_item and method not in old_item:
                self.out.additive("method_added", where, "method added")
            elif method in old_item:
                self._operation(where, old_item, new_item, method)

    def _parameters(self, tree: _Tree, base: str, item: dict, method: str) -> dict[tuple[str, str], dict]:
        found: dict[tuple[str, str], dict] = {}
        for raw in [*(item.get("parameters") or []), *((item[method] or {}).get("parameters") or [])]:
            parameter = self._deref(tree, base, raw)
            if not isinstance(parameter, dict) or "name" not in parameter:
                continue
            where_in = parameter.get("in", "query")
            name = parameter["name"].lower() if where_in == "header" else parameter["name"]
            found[(where_in, name)] = parameter
        return found

    def _operation(self, where: str, old_item: dict, new_item: dict, method: str) -> None:
        old_op, new_op = old_item[method] or {}, new_item[method] or {}
        old_params = self._parameters(self.old, self.old_base, old_item, method)
        new_params = self._parameters(self.new, self.new_base, new_item, method)
        for (place, name), parameter in old_params.items():
            label = f"parameter {name} ({place})"
            if (place, name) not in new_params:
                self.out.breaking("parameter_removed", where, f"{label} removed")
                continue
            other = new_params[(place, name)]
            if not parameter.get("required") and other.get("required"):
                self.out.breaking("parameter_required", where, f"{label} is now required")
            elif parameter.get("required") and not other.get("required"):
                self.out.additive("parameter_optional", where, f"{label} no longer required")
            if "schema" in parameter and "schema" in other:
                self._schema(f"{where}: {label}", parameter["schema"], other["schema"])
        for (place, name), parameter in new_params.items():
            if (place, name) not in old_params:
                label = f"parameter {name} ({place})"
                if parameter.get("required"):
                    self.out.breaking("parameter_required", where, f"required {label} added")
                else:
                    self.out.additive("parameter_added", where, f"optional {label} added")
        self._request_body(where, old_op, new_op)
        self._responses(where, old_op, new_op)

    def _request_body(self, where: str, old_op: dict, new_op: dict) -> None:
        old_body = self._deref(self.old, self.old_base, old_op.get("requestBody"))
        new_body = self._deref(self.new, self.new_base, new_op.get("requestBody"))
        if old_body is None and new_body is None:
            return
        if old_body is None:
            if new_body.get("required"):
                self.out.breaking("request_body_required", where, "required request body added")
            else:
                self.out.additive("request_body_added", where, "optional request body added")
            return
        if new_body is None:
            self.out.breaking("request_body_removed", where, "request body removed")
            return
        if not old_body.get("required") and new_body.get("required"):
            self.out.breaking("request_body_required", where, "request body is now required")
        self._content(f"{where}: request", old_body.get("content") or {}, new_body.get("content") or {})

    def _responses(self, where: str, old_op: dict, new_op: dict) -> None:
        old_responses = {str(k): v for k, v in (old_op.get("responses") or {}).items()}
        new_responses = {str(k): v for k, v in (new_op.get("responses") or {}).items()}
        for code, old_response in old_responses.items():
            if code not in new_responses:
                self.out.breaking("response_removed", where, f"response {code} removed")
                continue
            old_response = self._deref(self.old, self.old_base, old_response) or {}
            new_response = self._deref(self.new, self.new_base, new_responses[code]) or {}
            old_headers = {k.lower() for k in old_response.get("headers") or {}}
            new_headers = {k.lower() for k in new_response.get("headers") or {}}
            for header in sorted(old_headers - new_headers):
                self.out.breaking("response_header_removed", where, f"response {code}: header {header} removed")
            for header in sorted(new_headers - old_headers):
                self.out.additive("response_header_added", where, f"response {code}: header {header} added")
            self._content(f"{where}: response {code}", old_response.get("content") or {},
                          new_response.get("content") or {})
        for code in new_responses:
            if code not in old_responses:
                self.out.additive("response_added", where, f"response {code} added")

    def _content(self, where: str, old: dict, new: dict) -> None:
        for media_type, old_media in old.items():
            if media_type not in new:
                self.out.breaking("media_type_removed", where, f"{media_type} removed")
            elif isinstance(old_media, dict) and "schema" in old_media and "schema" in (new[media_type] or {}):
                self._schema(f"{where} {media_type}", old_media["schema"], new[media_type]["schema"])
        for media_type in new:
            if media_type not in old:
                self.out.additive("media_type_added", where, f"{media_type} added")

    def _schema(self, where: str, old: Any, new: Any) -> None:
        _SchemaDiff(self.old, self.new, self.out, where).run(old, new, self.old_base, self.new_base)

    def _components(self, old_doc: dict, new_doc: dict) -> None:
        old_schemas = (old_doc.get("components") or {}).get("schemas") or {}
        new_schemas = (new_doc.get("components") or {}).get("schemas") or {}
        for name, schema in old_schemas.items():
            where = f"openapi.yaml: components/schemas/{name}"
            if name not in new_schemas:
                self.out.breaking("component_removed", where, "schema removed")
            else:
                self._schema(where, schema, new_schemas[name])
        for name in new_schemas:
            if name not in old_schemas:
                self.out.additive("component_added", f"openapi.yaml: components/schemas/{name}", "schema added")


# --- schema files -----------------------------------------------------------------------------------------------


def _schema_files(old: _Tree, new: _Tree, out: _Out) -> None:
    for key, doc in old.schemas.items():
        if key not in new.schemas:
            out.breaking("schema_file_removed", doc.rel, f"schema {key} removed")
            continue
        other = new.schemas[key]
        _SchemaDiff(old, new, out, doc.rel).run(doc.content, other.content, old.base_of(doc), new.base_of(other))
    for key, doc in new.schemas.items():
        if key not in old.schemas:
            out.additive("schema_file_added", doc.rel, f"schema {key} added")


# --- tables -----------------------------------------------------------------------------------------------------


def _tables(old: _Tree, new: _Tree, out: _Out) -> None:
    for where, old_doc in old.tables.items():
        new_doc = new.tables.get(where)
        if new_doc is None:
            out.breaking("table_removed", where, "table removed")
            continue
        if not isinstance(old_doc, dict) or not isinstance(new_doc, dict):
            if old_doc != new_doc:
                out.breaking("table_changed", where, "table is not a mapping; changed")
            continue
        old_kind, new_kind = old_doc.get("kind"), new_doc.get("kind")
        if (old_kind == "decision") != (new_kind == "decision"):
            out.breaking("table_changed", where, f"kind {old_kind} -> {new_kind}")
        elif old_kind == "decision":
            _decision_table(where, old_doc, new_doc, out)
        elif old_doc.get("id") == "features":
            _features(where, old_doc, new_doc, out)
        elif old_doc.get("id") == "errors":
            _errors(where, old_doc, new_doc, out)
        else:
            _catalogue(where, old_doc, new_doc, out, skip=("id", "kind"))
    for where in new.tables:
        if where not in old.tables:
            out.additive("table_added", where, "table added")


def _show_combos(combos: list[dict[str, str]], domains: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Describe a set of input combinations: as one cube (``a=x, b=[y, z]``) when it is one, else one per line."""
    names = list(domains)
    values = {n: [v for v in domains[n] if any(c[n] == v for c in combos)] for n in names}
    unique = {tuple(c[n] for n in names) for c in combos}
    if len(unique) == math.prod(len(v) for v in values.values()):
        parts = [f"{n}={vs[0]}" if len(vs) == 1 else f"{n}=[{', '.join(vs)}]"
                 for n, vs in values.items() if len(vs) != len(domains[n])]
        return [", ".join(parts) or "every combination"]
    return [", ".join(f"{n}={c[n]}" for n in names) for c in combos]


def _then_delta(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = [k for k in old if old.get(k) != new.get(k) or k not in new] + [k for k in new if k not in old]
    return f"{_flow({k: old[k] for k in keys if k in old})} -> {_flow({k: new[k] for k in keys if k in new})}"


def _decision_table(where: str, old_doc: dict, new_doc: dict, out: _Out) -> None:
    try:
        old, new = DecisionTable(old_doc), DecisionTable(new_doc)
    except (KeyError, TypeError, AttributeError) as exc:
        raise SpecTreeError(f"{where}: not a readable decision table ({exc!r})") from exc
    gone: dict[str, set[str]] = {}
    for name, domain in old.inputs.items():
        if name not in new.inputs:
            out.breaking("input_removed", where, f"input {name} removed")
            gone[name] = set(domain)
            continue
        gone[name] = set(domain) - set(new.inputs[name])
        for value in domain:
            if value not in new.inputs[name]:
                out.breaking("input_value_removed", where, f"input value {name}={value} removed")
        for value in new.inputs[name]:
            if value not in domain:
                rows = sorted({r.id for r in new.rows if r.when.get(name) is None or value in r.when[name]})
                covered = f"rows {', '.join(rows)}" if rows else "no row covers it yet"
                out.additive("input_value_added", where, f"input value {name}={value} added ({covered})")
    extra = {n: d for n, d in new.inputs.items() if n not in old.inputs}
    for name, domain in extra.items():
        out.additive("input_added", where, f"input {name} added with values [{', '.join(domain)}]")

    groups: dict[tuple[str, str, str, str, str], list[dict[str, str]]] = {}
    for combo in old.combinations():
        if any(combo[n] in gone[n] for n in combo):
            continue
        old_rows = old.matching(combo)
        if len(old_rows) != 1:
            continue  # OLD itself is not total or not deterministic here: `meshd spec check` names that
        old_row = old_rows[0]
        for values in itertools.product(*extra.values()):
            full = {**combo, **dict(zip(extra, values, strict=True))}
            new_rows = new.matching(full)
            if not new_rows:
                key = ("uncovered", old_row.id, "", "", "")
            elif len(new_rows) > 1:
                key = ("ambiguous", old_row.id, ", ".join(r.id for r in new_rows), "", "")
            elif dict(new_rows[0].then) != dict(old_row.then):
                key = ("then_changed", old_row.id, new_rows[0].id, _key(old_row.then), _key(new_rows[0].then))
            elif new_rows[0].id != old_row.id:
                key = ("row_renamed", old_row.id, new_rows[0].id, "", "")
            else:
                continue
            groups.setdefault(key, []).append(full)
    domains = {**{n: d for n, d in old.inputs.items() if n in new.inputs}, **extra}
    for (kind, old_id, new_id, old_then, new_then), combos in groups.items():
        for shown in _show_combos(combos, domains):
            if kind == "uncovered":
                out.breaking("table_outcome_uncovered", where, f"{shown}: no longer covered by any row (was {old_id})")
            elif kind == "ambiguous":
                out.breaking("table_outcome_ambiguous", where, f"{shown}: now covered by several rows ({new_id}; "
                             f"was {old_id})")
            elif kind == "then_changed":
                delta = _then_delta(json.loads(old_then), json.loads(new_then))
                rows = old_id if old_id == new_id else f"{old_id} -> {new_id}"
                out.breaking("table_outcome_changed", where, f"{shown}: then changed {delta} (row {rows})")
            else:
                out.additive("table_row_renamed", where, f"{shown}: row {old_id} renamed {new_id}, same then")
    rest = ("id", "kind", "inputs", "rows", "events")
    _catalogue(where, old_doc, new_doc, out, skip=rest)


def _list_key(items: list[Any]) -> str | None:
    for field in LIST_KEYS:
        if items and all(isinstance(i, dict) and field in i for i in items):
            return field
    return None


def _catalogue(where: str, old: Any, new: Any, out: _Out, skip: Iterable[str] = (), path: str = "") -> None:
    """A generic comparison: removed or changed entries are breaking, new entries additive, prose ignored."""
    label = path or "<root>"
    if isinstance(old, dict) and isinstance(new, dict):
        for key, value in old.items():
            if key in skip or key in PROSE_KEYS:
                continue
            here = f"{path}.{key}" if path else str(key)
            if key not in new:
                out.breaking("catalogue_entry_removed", where, f"{here}: removed (was {_flow(value)})")
            else:
                _catalogue(where, value, new[key], out, (), here)
        for key, value in new.items():
            if key not in old and key not in skip and key not in PROSE_KEYS:
                here = f"{path}.{key}" if path else str(key)
                out.additive("catalogue_entry_added", where, f"{here}: added {_flow(value)}")
    elif isinstance(old, list) and isinstance(new, list):
        field = _list_key(old) if _list_key(old) == _list_key(new) else None
        if field is not None:
            _catalogue(where, {i[field]: i for i in old}, {i[field]: i for i in new}, out, (), path)
        elif all(not isinstance(i, dict | list) for i in [*old, *new]):
            for value in old:
                if value not in new:
                    out.breaking("catalogue_entry_removed", where, f"{label}: {_flow(value)} removed")
            for value in new:
                if value not in old:
                    out.additive("catalogue_entry_added", where, f"{label}: {_flow(value)} added")
        else:
            for index, value in enumerate(old):
                if index >= len(new):
                    out.breaking("catalogue_entry_removed", where, f"{path}[{index}]: removed")
                else:
                    _catalogue(where, value, new[index], out, (), f"{path}[{index}]")
            for index in range(len(old), len(new)):
                out.additive("catalogue_entry_added", where, f"{path}[{index}]: added {_flow(new[index])}")
    elif old != new:
        if isinstance(old, str) and isinstance(new, str) and re.search(r"\s", old) and re.search(r"\s", new):
            out.additive("catalogue_wording_changed", where, f"{label}: wording changed")
        else:
            out.breaking("catalogue_entry_changed", where, f"{label}: {_flow(old)} -> {_flow(new)}")


def _feature_params(bit: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    params: dict[str, tuple[str, Any]] = {}
    for group in ("required", "optional"):
        for name, rule in (bit.get(group) or {}).items():
            params[name] = (group, rule)
    return params


def _features(where: str, old: dict, new: dict, out: _Out) -> None:
    old_bits, new_bits = old.get("bits") or {}, new.get("bits") or {}
    for bit, old_bit in old_bits.items():
        if bit not in new_bits:
            out.breaking("feature_removed", where, f"bits.{bit}: feature bit removed")
            continue
        new_bit = new_bits[bit]
        if old_bit.get("version") != new_bit.get("version"):
            out.breaking("feature_changed", where, f"bits.{bit}.version: {old_bit.get('version')} -> "
                         f"{new_bit.get('version')}")
        old_params, new_params = _feature_params(old_bit), _feature_params(new_bit)
        for name, (group, rule) in old_params.items():
            here = f"bits.{bit}.{group}.{name}"
            if name not in new_params:
                out.breaking("feature_param_removed", where, f"{here}: parameter removed")
                continue
            new_group, new_rule = new_params[name]
            if group != new_group:
                if new_group == "required":
                    out.breaking("feature_param_required", where, f"{here}: parameter is now required")
                else:
                    out.additive("feature_param_optional", where, f"{here}: parameter is now optional")
            if rule != new_rule:
                out.breaking("feature_param_changed", where, f"{here}: rule changed {_flow(rule)} -> {_flow(new_rule)}")
        for name, (group, rule) in new_params.items():
            if name not in old_params:
                here = f"bits.{bit}.{group}.{name}"
                if group == "required":
                    out.breaking("feature_param_required", where, f"{here}: required parameter added {_flow(rule)}")
                else:
                    out.additive("feature_param_added", where, f"{here}: optional parameter added {_flow(rule)}")
    for bit in new_bits:
        if bit not in old_bits:
            out.additive("feature_added", where, f"bits.{bit}: feature bit added")
    old_required = (old.get("daemon_defaults") or {}).get("require") or []
    new_required = (new.get("daemon_defaults") or {}).get("require") or []
    for bit in new_required:
        if bit not in old_required:
            out.breaking("feature_required", where, f"daemon_defaults.require: {bit} is now required of brokers")
    for bit in old_required:
        if bit not in new_required:
            out.additive("feature_optional", where, f"daemon_defaults.require: {bit} no longer required")
    old_rest = {k: v for k, v in old.items() if k != "bits"}
    new_rest = {k: v for k, v in new.items() if k != "bits"}
    for document in (old_rest, new_rest):
        document["daemon_defaults"] = {k: v for k, v in (document.get("daemon_defaults") or {}).items()
                                       if k != "require"}
    _catalogue(where, old_rest, new_rest, out, skip=("id", "kind"))


def _errors(where: str, old: dict, new: dict, out: _Out) -> None:
    old_codes, new_codes = old.get("codes") or {}, new.get("codes") or {}
    for code, entry in old_codes.items():
        if code not in new_codes:
            out.breaking("error_code_removed", where, f"codes.{code}: error code removed (was {entry.get('status')})")
        elif entry.get("status") != new_codes[code].get("status"):
            out.breaking("error_status_changed", where, f"codes.{code}: status {entry.get('status')} -> "
                         f"{new_codes[code].get('status')}")
    for code, entry in new_codes.items():
        if code not in old_codes:
            out.additive("error_code_added", where, f"codes.{code}: error code added ({entry.get('status')})")
    _catalogue(where, old, new, out, skip=("id", "kind", "codes"))


# --- requirements -----------------------------------------------------------------------------------------------


def _requirements(old: _Tree, new: _Tree, out: _Out) -> None:
    def by_id(document: Any) -> dict[str, dict]:
        items = document.get("requirements") if isinstance(document, dict) else None
        return {r["id"]: r for r in items or () if isinstance(r, dict) and "id" in r}

    old_reqs, new_reqs = by_id(old.requirements), by_id(new.requirements)
    for req_id, req in old_reqs.items():
        where = f"requirements.yaml: {req_id}"
        if req_id not in new_reqs:
            out.breaking("requirement_removed", where, f"requirement removed (was {req.get('level')}, "
                         f"§{req.get('section')})")
            continue
        old_level, new_level = req.get("level"), new_reqs[req_id].get("level")
        if LEVELS.get(new_level, 0) > LEVELS.get(old_level, 0):
            out.breaking("requirement_level_raised", where, f"level raised {old_level} -> {new_level}")
        elif LEVELS.get(new_level, 0) < LEVELS.get(old_level, 0):
            out.additive("requirement_level_lowered", where, f"level lowered {old_level} -> {new_level}")
    for req_id, req in new_reqs.items():
        if req_id not in old_reqs:
            out.additive("requirement_added", f"requirements.yaml: {req_id}",
                         f"requirement added ({req.get('level')}, §{req.get('section')})")


# --- entry points -----------------------------------------------------------------------------------------------


def _documents(old: _Tree, new: _Tree, out: _Out) -> None:
    for name, old_doc, new_doc in (("openapi.yaml", old.openapi, new.openapi),
                                   ("requirements.yaml", old.requirements, new.requirements)):
        if old_doc is not None and new_doc is None:
            out.breaking("document_removed", name, "document removed")
        elif old_doc is None and new_doc is not None:
            out.additive("document_added", name, "document added")


def diff_trees(old: Path, new: Path) -> list[Change]:
    """Every change from the spec tree ``old`` to ``new``, in a stable order.

    Raises:
        SpecTreeError: a tree is not a directory or one of its files cannot be parsed.
    """
    old_tree, new_tree = _Tree(Path(old)), _Tree(Path(new))
    out = _Out()
    _documents(old_tree, new_tree, out)
    _OpenAPIDiff(old_tree, new_tree, out).run()
    _schema_files(old_tree, new_tree, out)
    _tables(old_tree, new_tree, out)
    _requirements(old_tree, new_tree, out)
    return list(_unique(out.changes))


def _unique(changes: list[Change]) -> Iterator[Change]:
    seen: set[Change] = set()
    for change in changes:
        if change not in seen:
            seen.add(change)
            yield change


def _report(changes: list[Change]) -> str:
    breaking = [c for c in changes if c.breaking]
    additive = [c for c in changes if not c.breaking]
    lines = []
    if breaking:
        lines += [f"Breaking changes ({len(breaking)}):", *(f"  {c}" for c in breaking), ""]
    if additive:
        lines += [f"Additive changes ({len(additive)}):", *(f"  {c}" for c in additive), ""]
    summary = f"spec diff: {len(breaking)} breaking, {len(additive)} additive"
    lines.append(summary if changes else "spec diff: no changes")
    return "\n".join(lines)


def cli(argv: list[str]) -> int:
    """`meshd spec diff OLD NEW [--json]`: exit 1 on a breaking change, 0 otherwise, 2 on a usage error."""
    parser = argparse.ArgumentParser(
        prog="meshd spec diff",
        description="List every change between two spec trees (directories laid out like spec/), breaking first.",
    )
    parser.add_argument("old", type=Path, help="the older spec tree")
    parser.add_argument("new", type=Path, help="the newer spec tree")
    parser.add_argument("--json", action="store_true", help="print a JSON list of {kind, breaking, where, detail}")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        changes = diff_trees(args.old, args.new)
    except SpecTreeError as exc:
        print(f"meshd spec diff: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(c) for c in changes], indent=2, ensure_ascii=False))
    else:
        print(_report(changes))
    return 1 if any(c.breaking for c in changes) else 0
