"""spec/tables/close_codes.yaml and spec/tables/exit_codes.yaml through ``close_code`` and ``exit_code``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reference.core.codes import close_code, close_codes, exit_code, exit_codes
from spec import load_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("table", "lookup", "every"), [
    ("close_codes", close_code, close_codes), ("exit_codes", exit_code, exit_codes)])
def test_every_entry_is_found_by_its_name_and_names_and_codes_are_unique(table, lookup, every):
    """E-07, E-15, E-22: one entry per code and per name, each read back by its name; an unknown name is a
    KeyError, never a default."""
    entries = load_table(table)["codes"]
    assert len({e["code"] for e in entries}) == len({e["name"] for e in entries}) == len(entries)
    assert [lookup(e["name"]) for e in entries] == [e["code"] for e in entries]
    assert dict(every()) == {e["name"]: e["code"] for e in entries}
    with pytest.raises(KeyError):
        lookup("no_such_code")


def test_no_python_spells_a_close_code():
    """Close codes are read by name: no integer literal in reference/, conformance/ or spark_checks/ is one of
    close_codes.yaml's codes -- the application codes and the RFC 6455 codes the spec's rules use (1001 on drain,
    1009 past the frame limit, 1011 never for a peer's frame, 1013 for a slow consumer and past the connection cap)."""
    codes = set(close_codes().values())
    assert {1001, 1009, 1011, 1013} <= codes
    paths = [path for folder in ("reference", "conformance", "spark_checks") for path in (ROOT / folder).rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}" for path in sorted(paths)
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and type(node.value) is int and node.value in codes]
    assert found == []

