"""JSON Schema patterns are ECMA-262: `$` never matches before a trailing newline (E-30)."""

from __future__ import annotations

import pytest

from spec import ecma_pattern, validator


@pytest.mark.parametrize(("ref", "value"), [
    ("common/defs#/$defs/client_message_id", "abc\n"),
    ("common/defs#/$defs/fingerprint_hex", "ab" * 32 + "\n"),
    ("common/defs#/$defs/ulid", "01ARZ3NDEKTSV4RRFFQ69G5FAV\n"),
])
def test_trailing_newline_is_refused(ref, value):
    assert validator(ref).is_valid(value.rstrip("\n"))
    assert not validator(ref).is_valid(value)


def test_pattern_translation_keeps_escapes_and_classes():
    assert ecma_pattern(r"^a\$[$]$").pattern == r"^a\$[$]\Z"
    assert ecma_pattern(r"^a\$[$]$").search("a$$")
    assert not ecma_pattern(r"^a$").search("a\n")


def test_trailing_newline_is_refused_through_refs_into_other_schema_files():
    """A `$ref` into another file (which declares its own `$schema`) keeps the ECMA-262 semantics: jsonschema would
    otherwise switch to its stock validator class for the referenced resource."""
    from test_wire_schemas import VALID

    ack = next(example for ref, _, example in VALID if ref == "broker/ack")
    assert validator("broker/frame#/$defs/broker_to_daemon").is_valid(ack)
    for member in ("id", "client_message_id"):
        if isinstance(ack.get(member), str):
            bad = {**ack, member: ack[member] + "\n"}
            assert not validator("broker/ack").is_valid(bad), member
            assert not validator("broker/frame#/$defs/broker_to_daemon").is_valid(bad), member
            assert not validator("broker/frame").is_valid(bad), member
