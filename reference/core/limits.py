"""The limits of spec/tables/limits.yaml (E-40), and JSON parsing held to them.

Rules of this file: every number a daemon or broker uses to bound what a peer or a client may send comes from the
table, read once, by name (``limit("json_max_depth")``). ``loads`` is the one JSON parser for untrusted input (IPC
bodies, broker frames in both directions): it never raises anything but ``Unparsable`` or ``LimitExceeded`` (no
RecursionError, no int-conversion ValueError), and it never hands back a document past the limits. A document that
parsed but goes past a limit is attached to the ``LimitExceeded`` (``document``), so a broker can still answer a
too-deep ``send`` by its ``client_message_id`` in B1, and a daemon can still acknowledge the push it quarantines.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["DuplicateKey", "LimitExceeded", "Unparsable", "depth", "limit", "limits", "loads", "unique_keys"]


@functools.cache
def limits() -> Mapping[str, int | float]:
    """Every limit by name (spec/tables/limits.yaml ``value``s)."""
    from spec import load_table

    # req: LIMIT-TABLE -- every limit the reference enforces is read from limits.yaml by name
    return {name: entry["value"] for name, entry in load_table("limits")["limits"].items()}


def limit(name: str) -> Any:
    """One limit's value; a name the table does not define is a programming error (KeyError)."""
    return limits()[name]


class Unparsable(ValueError):
    """The text is not one JSON document (not UTF-8, not JSON, or NaN/Infinity)."""


class DuplicateKey(Unparsable):
    """An object names a key twice: not I-JSON (RFC 7493), and JSON readers disagree on which value it has."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``loads``' ``object_pairs_hook`` for I-JSON (E-19 for IPC bodies, E-46 for link frames).

    Raises:
        DuplicateKey: the object names one key more than once.
    """
    document = dict(pairs)
    if len(document) != len(pairs):  # the common case costs one dict and a comparison
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(f"duplicate object key {key!r} (RFC 7493 I-JSON)")
            seen.add(key)
    return document


class LimitExceeded(ValueError):
    """The document goes past ``limit`` (a name of limits.yaml); ``document`` is the parsed value, when there is one."""

    def __init__(self, name: str, detail: str, document: Any = None):
        super().__init__(detail)
        self.limit = name
        self.detail = detail
        self.document = document


class _LongInteger:
    """Stands in for an integer literal past json_max_integer_digits, so the rest of the document still parses."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits


def depth(document: Any) -> int:
    """How deep containers nest in ``document`` (a scalar is 0, ``{}`` is 1); iterative, so never a RecursionError."""
    deepest = 0
    stack = [(document, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _refuse_constant(name: str) -> Any:
    raise Unparsable(f"{name} is not JSON")


def loads(raw: str | bytes, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
          max_depth: int | None = None, max_integer_digits: int | None = None) -> Any:
    """Parse untrusted JSON held to json_max_depth and json_max_integer_digits.

    Raises:
        Unparsable: not UTF-8, not one JSON value, or NaN/Infinity.
        LimitExceeded: too deep or with a too-long integer literal; ``document`` is the parsed value, or None when
            the nesting was too deep to parse at all.
        Whatever ``object_pairs_hook`` raises (e.g. a duplicate-key refusal).
    """
    max_depth = limit("json_max_depth") if max_depth is None else max_depth
    max_digits = limit("json_max_integer_digits") if max_integer_digits is None else max_integer_digits
    long_integers: list[int] = []

    def parse_int(literal: str) -> Any:
        digits = len(literal) - (literal[0] == "-")
        # req: LIMIT-JSON
        if digits > max_digits:
            long_integers.append(digits)
            return _LongInteger(digits)
        return int(literal)

    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unparsable(f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        document = json.loads(raw, parse_int=parse_int, parse_constant=_refuse_constant,
                              object_pairs_hook=object_pairs_hook)
    # req: ERR-NO-5XX-ON-BAD-INPUT -- a parser failure is Unparsable or LimitExceeded, never a crash
    except json.JSONDecodeError as exc:
        raise Unparsable(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except RecursionError as exc:  # far past the limit: there is no document to attach
        raise LimitExceeded("json_max_depth", f"nests deeper than the parser goes; the limit is {max_depth}") from exc
    if long_integers:
        raise LimitExceeded("json_max_integer_digits", f"an integer literal has {max(long_integers)} digits; the "
                            f"limit is {max_digits}", document)
    # depth() walks every container; a document with no more brackets than the limit cannot go past it
    found = depth(document) if raw.count("[") + raw.count("{") > max_depth else 0
    # req: LIMIT-JSON
    if found > max_depth:
        raise LimitExceeded("json_max_depth", f"nests {found} levels deep; the limit is {max_depth}", document)
    return document
