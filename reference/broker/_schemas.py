"""Validation of the frames a daemon sends, against spec/schemas/broker, fast enough to run on every frame.

Rules of this file: the schemas are the published ones, copied once with every ``$ref`` replaced by its target (a
reference with sibling keywords becomes ``allOf``), so nothing is resolved per frame. They are checked with
``jsonschema_rs`` when it is installed (a Rust implementation of the same draft, about a hundred times faster, and
ECMA-262-exact for ``pattern``: python-jsonschema's ``re.search`` lets ``$`` match before a trailing newline) and with
python-jsonschema otherwise. The broker's frame schemas are not recursive; a cycle is an error here.
"""

from __future__ import annotations

import functools
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

from spec import schema, schema_registry

try:  # installed with meshspec's test extra (schemathesis depends on it)
    import jsonschema_rs
except ImportError:  # pragma: no cover - depends on the environment
    jsonschema_rs = None


def _inline(node: Any, resolver: Any, seen: tuple[int, ...]) -> Any:
    """``node`` with every ``$ref`` replaced by its target; ``resolver`` is based where ``node`` lives."""
    if isinstance(node, list):
        return [_inline(item, resolver, seen) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _inline(value, resolver, seen) for key, value in node.items()
           if key not in ("$ref", "$id", "$schema", "$defs")}
    ref = node.get("$ref")
    if ref is None:
        return out
    resolved = resolver.lookup(ref)  # its resolver is based at the target's document, for the target's own refs
    if id(resolved.contents) in seen:
        raise ValueError(f"recursive $ref {ref!r}: not supported by the inlining validator")
    target = _inline(resolved.contents, resolved.resolver, (*seen, id(resolved.contents)))
    return {"allOf": [target], **out} if out else target


def inlined_schema(ref: str) -> dict[str, Any]:
    """The schema ``group/name`` (e.g. ``broker/send``) with every reference inlined."""
    document = schema(ref)
    return _inline(document, schema_registry().resolver(base_uri=document["$id"]), ())


class FrameSchema:
    """One frame type's schema; ``problem(frame)`` is None for a valid frame, else its first error as text."""

    def __init__(self, ref: str, prefer_rust: bool = True):
        self.ref = ref
        document = inlined_schema(ref)
        self.engine = "jsonschema_rs" if prefer_rust and jsonschema_rs is not None else "jsonschema"
        if self.engine == "jsonschema_rs":
            self._rs = jsonschema_rs.Draft202012Validator(document, validate_formats=True)
        else:
            self._py = Draft202012Validator(document, format_checker=FormatChecker())

    def problem(self, frame: Any) -> str | None:
        if self.engine == "jsonschema_rs":
            if self._rs.is_valid(frame):
                return None
            error = next(iter(self._rs.iter_errors(frame)))
            where = "/".join(str(part) for part in error.instance_path)
        else:
            errors = sorted(self._py.iter_errors(frame), key=lambda e: list(e.absolute_path))
            if not errors:
                return None
            error = errors[0]
            where = "/".join(str(part) for part in error.absolute_path)
        return f"{where or self.ref.rpartition('/')[2]}: {error.message}"


@functools.cache
def frame_schema(ref: str) -> FrameSchema:
    return FrameSchema(ref)
