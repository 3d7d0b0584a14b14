"""``spec.fast_validator``: the reference validator's verdicts and errors, with jsonschema-rs deciding "valid".

It is exact only if jsonschema-rs never accepts what the reference validator refuses; every hand-written wire
example (valid and invalid, against its own schema and its union) checks that, and that the fast path is really taken
for valid frames. Patterns must be portable (E-30): ECMA-262 and Rust's regex crate must read them alike.
"""

from __future__ import annotations

import pytest
from test_wire_schemas import INVALID, VALID, union_for

from spec import SPEC_DIR, _patterns, _schema_files, fast_validator, load_json, portable_pattern, validator

CASES = [(ref, f"#{i}", ex, True) for ref, i, ex in VALID] + [(ref, label, ex, False) for ref, label, ex in INVALID]


@pytest.mark.parametrize(("ref", "label", "example", "valid"), CASES, ids=[f"{r}{lbl}" for r, lbl, _, _ in CASES])
def test_fast_path_never_accepts_what_the_reference_refuses(ref, label, example, valid):
    for name in (ref, union_for(ref)):
        fast, reference = fast_validator(name), validator(name)
        assert fast._fast is not None, "every spec pattern is portable, so the fast path is in use"
        if fast._fast.is_valid(example):
            assert reference.is_valid(example), f"jsonschema-rs accepted {label} against {name}"
        if valid:
            assert fast._fast.is_valid(example), f"the fast path is not taken for {label} against {name}"
        assert [e.message for e in fast.iter_errors(example)] == [e.message for e in reference.iter_errors(example)]
        assert fast.verdict(example) is fast.is_valid(example), f"{label} against {name}"


def test_trailing_newline_ids_are_refused_by_the_fast_path():
    check = fast_validator("common/defs#/$defs/client_message_id")
    assert check.is_valid("abc") and not check._fast.is_valid("abc\n") and not check.is_valid("abc\n")


def test_every_spec_pattern_is_portable():
    patterns = {p for path in _schema_files(SPEC_DIR) for p in _patterns(load_json(path))}
    assert patterns and all(portable_pattern(p) for p in patterns), sorted(p for p in patterns
                                                                            if not portable_pattern(p))


@pytest.mark.parametrize("pattern", [r"^\d+$", r"^a.b$", r"^(?=a)b$", r"^\w+$", r"^\s$", "^a\\", "[", "^é$",
                                     r"^[\d]$", r"^(?<x>a)$"])
def test_patterns_the_engines_may_read_differently_are_not_portable(pattern):
    assert not portable_pattern(pattern)
