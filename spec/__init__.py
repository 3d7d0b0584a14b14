"""The meshspec v0.9.0 specification as data, and the loaders every other package uses.

Nothing here interprets the spec: it finds files, parses them once, and builds JSON Schema validators whose
cross-file ``$ref``s resolve through one registry keyed by each schema's ``$id``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, FormatChecker
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
def validator(ref: str, spec_dir: Path = SPEC_DIR) -> Draft202012Validator:
    """A validator for the schema named ``group/name``, with formats checked."""
    return Draft202012Validator(
        schema(ref, spec_dir), registry=schema_registry(spec_dir), format_checker=FormatChecker()
    )
