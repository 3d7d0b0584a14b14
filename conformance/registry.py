"""The conformance cases and the requirements they check, read from the case modules without importing them.

A case is a test function in ``conformance/cases/`` decorated ``@case("suite.name", "REQ-ID", ...)``. Reading the
decorators with ``ast`` keeps listing them cheap. The spec gate, which checks that every ``conformance::<id>`` the
requirement registry names exists, imports no harness: it reads ``conformance/case_ids.json``, which
``meshconform list --write`` writes from here (tests/conformance/test_case_ids.py fails while the file is stale).
"""

from __future__ import annotations

import ast
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

CASES_DIR = Path(__file__).resolve().parent / "cases"
BROKER_CASES_DIR = Path(__file__).resolve().parent / "broker_cases"
SDK_CASES_DIR = Path(__file__).resolve().parent / "sdk_cases"
CASE_IDS_FILE = Path(__file__).resolve().parent / "case_ids.json"
MARK = "meshspec"


@dataclass(frozen=True)
class CaseInfo:
    """A case id, the requirements it checks, and where it lives."""

    id: str
    requirements: tuple[str, ...]
    module: str
    function: str


def case(case_id: str, *requirements: str):
    """Tag a conformance test with its case id and the requirement ids it checks."""
    if not requirements:
        raise ValueError(f"case {case_id} names no requirement")
    return getattr(pytest.mark, MARK)(case_id, *requirements)


@functools.cache
def cases(*dirs: Path) -> tuple[CaseInfo, ...]:
    """Every case (of the daemon, broker and SDK suites, or of ``dirs``), in file and line order."""
    found: list[CaseInfo] = []
    suites = dirs or (CASES_DIR, BROKER_CASES_DIR, SDK_CASES_DIR)
    for path in [p for d in suites for p in sorted(d.glob("test_*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)
                        and decorator.func.id == "case"):
                    if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in decorator.args):
                        raise ValueError(f"{path.name}:{node.lineno}: @case arguments must be string literals "
                                         "(the spec gate reads them without importing the case)")
                    args = [a.value for a in decorator.args]
                    found.append(CaseInfo(args[0], tuple(args[1:]), path.stem, node.name))
    return tuple(found)


def case_ids() -> list[str]:
    return [c.id for c in cases()]


def case_ids_document() -> str:
    """``conformance/case_ids.json`` as it should read: every case id, in file and line order."""
    return json.dumps({"cases": case_ids()}, indent=2) + "\n"


def write_case_ids(path: Path | None = None) -> Path:
    """Write the case ids the spec gate reads (to ``CASE_IDS_FILE`` unless ``path`` is given)."""
    path = path or CASE_IDS_FILE
    path.write_text(case_ids_document(), encoding="utf-8")
    return path


def by_requirement() -> dict[str, list[str]]:
    """Requirement id -> the case ids that check it."""
    mapping: dict[str, list[str]] = {}
    for info in cases():
        for requirement in info.requirements:
            mapping.setdefault(requirement, []).append(info.id)
    return mapping
