"""The meshspec v0.9.0 specification as data, and the loaders every other package uses.

Nothing here interprets the spec: it finds files, parses them once, and builds JSON Schema validators whose
cross-file ``$ref``s resolve through one registry keyed by each schema's ``$id``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_DIR = Path(__file__).resolve().parent
SPEC_VERSION = "0.9.0"
SCHEMA_BASE = "https://meshspec.dev/schemas/"

__all__ = [
    "SCHEMA_BASE",
    "SPEC_DIR",
    "SPEC_VERSION",
    "load_json",
    "load_table",
    "load_yaml",
    "schema",
    "schema_ids",
    "schema_registry",
    "validator",
]


def load_yaml(path: Path) -> Any:
    """Parse one YAML file."""
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_json(path: Path) -> Any:
    """Parse one JSON file."""
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


@functools.cache
def load_table(name: str, spec_dir: Path = SPEC_DIR) -> dict[str, Any]:
    """Return the parsed table ``spec/tables/<name>.yaml``."""
    return load_yaml(spec_dir / "tables" / f"{name}.yaml")


def _schema_files(spec_dir: Path) -> list[Path]:
    return sorted((spec_dir / "schemas").rglob("*.json"))


@functools.cache
def schema_registry(spec_dir: Path = SPEC_DIR) -> Registry:
    """A registry holding every schema under ``spec/schemas`` by its ``$id``."""
    resources = []
    for path in _schema_files(spec_dir):
        document = load_json(path)
        if isinstance(document, dict) and "$id" in document:
            resources.append((document["$id"], Resource.from_contents(document, default_specification=DRAFT202012)))
    return Registry().with_resources(resources)


def schema_ids(spec_dir: Path = SPEC_DIR) -> list[str]:
    """Every schema ``$id`` under ``spec/schemas``."""
    return sorted(str(uri) for uri in schema_registry(spec_dir))


def _uri(ref: str) -> str:
    name, sep, fragment = ref.partition("#")
    uri = name if name.startswith("https://") else f"{SCHEMA_BASE}{name}.json"
    return f"{uri}{sep}{fragment}"


def schema(ref: str, spec_dir: Path = SPEC_DIR) -> dict[str, Any]:
    """Return a schema by ``group/name`` (e.g. ``broker/ack``), by full ``$id``, or a ``#/$defs/...`` part of one."""
    uri = _uri(ref)
    if "#" in uri:
        return {"$ref": uri}
    return schema_registry(spec_dir).contents(uri)


@functools.cache
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a JSON Schema (ECMA-262) pattern for Python: an unescaped ``$`` outside a class becomes ``\\Z``.

    In ECMA-262 ``$`` (without the multiline flag) matches only at the end of the input; Python's ``$`` also matches
    before a final newline, so ``^[a-z]+$`` would accept ``"abc\\n"``.
    """
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        out.append(r"\Z" if char == "$" and not in_class else char)
        i += 1
    return re.compile("".join(out))


def _ecma_pattern_keyword(checker: Any, pattern: str, instance: Any, _schema: Any) -> Iterator[ValidationError]:
    if checker.is_type(instance, "string") and not ecma_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


SpecValidator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern_keyword})


@functools.cache
def validator(ref: str, spec_dir: Path = SPEC_DIR) -> Draft202012Validator:
    """A validator for the schema named ``group/name``, with formats checked and ECMA-262 ``pattern`` semantics."""
    return SpecValidator(schema(ref, spec_dir), registry=schema_registry(spec_dir), format_checker=FormatChecker())
