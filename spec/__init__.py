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

import jsonschema_rs
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
    "fast_validator",
    "load_json",
    "load_table",
    "load_yaml",
    "openapi",
    "openapi_parameter",
    "parameter_validator",
    "schema",
    "schema_ids",
    "schema_registry",
    "validator",
]


#: the safe loader, with libyaml when PyYAML has it (several times faster; the spec's files parse the same)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> Any:
    """Parse one YAML file."""
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=YAML_LOADER)


def load_json(path: Path) -> Any:
    """Parse one JSON file."""
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


@functools.cache
def load_table(name: str, spec_dir: Path = SPEC_DIR) -> dict[str, Any]:
    """Return the parsed table ``spec/tables/<name>.yaml``."""
    return load_yaml(spec_dir / "tables" / f"{name}.yaml")


@functools.cache
def openapi(spec_dir: Path = SPEC_DIR) -> dict[str, Any]:
    """The parsed ``spec/openapi.yaml``, read once."""
    return load_yaml(spec_dir / "openapi.yaml")


def _resolve_local(node: Any, document: dict[str, Any]) -> Any:
    """``node`` with every ``{"$ref": "#/..."}`` of ``document`` replaced by what it names, recursively."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = document
            for part in ref[2:].split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            return _resolve_local(target, document)
        return {key: _resolve_local(value, document) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolve_local(item, document) for item in node]
    return node


@functools.cache
def openapi_parameter(path: str, method: str, name: str, spec_dir: Path = SPEC_DIR) -> dict[str, Any]:
    """The schema of parameter ``name`` of the operation ``method path`` in spec/openapi.yaml, ``$ref``s resolved.

    Raises:
        KeyError: the operation has no parameter of that name.
    """
    document = openapi(spec_dir)
    for parameter in document["paths"][path][method.lower()].get("parameters", []):
        parameter = _resolve_local(parameter, document)
        if parameter["name"] == name:
            return parameter["schema"]
    raise KeyError(f"{method.upper()} {path} has no parameter {name!r} in spec/openapi.yaml")


def _schema_files(spec_dir: Path) -> list[Path]:
    return sorted((spec_dir / "schemas").rglob("*.json"))


@functools.cache
def schema_registry(spec_dir: Path = SPEC_DIR) -> Registry:
    """A registry holding every schema under ``spec/schemas`` by its ``$id``."""
    resources = []
    for path in _schema_files(spec_dir):
        document = load_json(path)
        if isinstance(document, dict) and "$id" in document:
            # Every file is 2020-12 (the gate checks its `$schema`). The registry holds it without `$schema`: when
            # a `$ref` enters a resource that names its dialect, jsonschema picks the stock validator class for it
            # and the ECMA-262 `pattern` of SpecValidator (E-30) would be lost below that reference.
            contents = {key: value for key, value in document.items() if key != "$schema"}
            resources.append((document["$id"], Resource(contents, specification=DRAFT202012)))
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


_ESCAPED_PUNCTUATION = frozenset(".+*?()[]{}|^$/\\-")


def portable_pattern(pattern: str) -> bool:
    """Whether ECMA-262 and Rust's regex crate read ``pattern`` alike (E-30).

    Allowed: printable ASCII literals, escaped punctuation, ``^``/``$``, groups and ``(?:``, alternation,
    quantifiers and classes of literal ASCII. Refused: ``.``, ``\\d``/``\\w``/``\\s`` and other escapes, look-arounds
    (where the two disagree on newlines and Unicode).
    """
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            if pattern[i + 1:i + 2] not in _ESCAPED_PUNCTUATION or i + 1 >= len(pattern):
                return False
            i += 2
        elif char == "[":
            end = pattern.find("]", i + 2)
            body = pattern[i + 1:end]
            if end < 0 or "\\" in body or "[" in body or not (body.isascii() and body.isprintable()):
                return False
            i = end + 1
        elif pattern.startswith("(?", i):
            if not pattern.startswith("(?:", i):
                return False
            i += 3
        elif char == "." or not (char.isascii() and char.isprintable()):
            return False
        else:
            i += 1
    return True


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)


def _format_function(check: Any, raises: Any) -> Any:
    def conforms(instance: str) -> bool:
        try:
            return bool(check(instance))
        except raises:
            return False
    return conforms


class FastValidator:
    """``validator(ref)``'s verdicts at compiled speed, for hot paths (the daemon checks every inbound frame).

    jsonschema-rs decides "valid"; an instance it refuses is handed to ``validator(ref)``, which alone reports the
    errors, so error messages are the reference validator's. jsonschema-rs is given the reference validator's own
    format functions, and it is used only when every ``pattern`` of every schema is portable (ECMA-262 and Rust
    read it alike, E-30); otherwise every instance goes to the reference validator.
    """

    def __init__(self, ref: str, spec_dir: Path = SPEC_DIR):
        self.reference = validator(ref, spec_dir)
        self._fast = None
        documents = [load_json(path) for path in _schema_files(spec_dir)]
        if all(portable_pattern(pattern) for document in documents for pattern in _patterns(document)):
            formats = {name: _format_function(check, raises)
                       for name, (check, raises) in FormatChecker().checkers.items()}
            registry = jsonschema_rs.Registry([(d["$id"], d) for d in documents if isinstance(d, dict) and "$id" in d])
            self._fast = jsonschema_rs.Draft202012Validator(schema(ref, spec_dir), registry=registry,
                                                            validate_formats=True, formats=formats)

    def iter_errors(self, instance: Any) -> Iterator[ValidationError]:
        """The reference validator's errors (none for a valid instance)."""
        if self._fast is not None and self._fast.is_valid(instance):
            return iter(())
        return self.reference.iter_errors(instance)

    def is_valid(self, instance: Any) -> bool:
        return next(self.iter_errors(instance), None) is None

    def verdict(self, instance: Any) -> bool:
        """jsonschema-rs's own verdict, no errors gathered (the reference validator's when every instance goes to
        it): what a caller asking only "valid?" of many invalid instances needs."""
        return self._fast.is_valid(instance) if self._fast is not None else self.reference.is_valid(instance)


@functools.cache
def parameter_validator(path: str, method: str, name: str, spec_dir: Path = SPEC_DIR) -> Draft202012Validator:
    """A validator for ``openapi_parameter(path, method, name)``, with formats checked and ECMA-262 ``pattern``."""
    return SpecValidator(openapi_parameter(path, method, name, spec_dir), format_checker=FormatChecker())


@functools.cache
def fast_validator(ref: str, spec_dir: Path = SPEC_DIR) -> FastValidator:
    """A ``FastValidator`` for the schema named ``group/name`` (same verdicts and errors as ``validator``)."""
    return FastValidator(ref, spec_dir)
