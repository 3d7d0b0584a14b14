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
