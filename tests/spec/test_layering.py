"""The import directions of README's "Layers": every import in spec/, reference/, conformance/ and spark_checks/.

Rules of this file: a module belongs to the part whose name is its longest prefix in ``MAY_IMPORT`` and may import
only modules of the parts listed for it (a part includes its submodules). A module or name whose path has a
component starting with ``_`` is private to its part: another part importing it is a violation even where the
direction is allowed. Every ``import`` and ``from ... import`` counts, at module level or inside a function, relative
ones resolved against the importing package, and so does a string literal handed to ``importlib.import_module`` or
``__import__``. Only the repository's own packages are checked; the standard library and third parties are free.
tests/ and bench/ are not checked: they may import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import spec as spec_pkg
from reference import core
from reference.cli import SPEC_TOOLS
from reference.cli import main as meshd
from spec.tools.implementation import Core

REPO = spec_pkg.SPEC_DIR.parent
CHECKED = ("spec", "reference", "conformance", "spark_checks")
FIRST_PARTY = frozenset({*CHECKED, "tests", "bench", "fixtures"})
# reference's shared leaves: the daemon and the broker may import them; they import neither
SHARED = ("reference.clock", "reference.trace", "reference.state_dir", "reference.sandbox")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "spec": ("spec",),
    "reference.core": ("spec", "reference.core"),
    **{leaf: ("spec", "reference.core", *SHARED) for leaf in SHARED},
    "reference.daemon": ("spec", "reference.core", *SHARED, "reference.daemon"),
    "reference.broker": ("spec", "reference.core", *SHARED, "reference.broker"),
    "reference": ("spec", "reference"),  # reference/__init__.py and cli.py: meshd wires every part
    "conformance": ("spec", "reference.core", "conformance"),
    "spark_checks": ("spec", "reference.core", "spark_checks"),
}
IMPORT_FUNCTIONS = frozenset({"import_module", "__import__"})


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str | None:
    matches = [part for part in MAY_IMPORT if module == part or module.startswith(f"{part}.")]
    return max(matches, key=len, default=None)


def _within(module: str, part: str) -> bool:
    return module == part or module.startswith(f"{part}.")


def _private(dotted: str) -> bool:
    return any(piece.startswith("_") and not piece.startswith("__") for piece in dotted.split("."))


def _resolve(module: str, is_package: bool, level: int, name: str) -> str:
    """The absolute name of ``from <level dots><name>`` inside ``module``."""
    if not level:
        return name
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports(path: Path, module: str, modules: frozenset[str]) -> Iterator[tuple[int, str, str]]:
    """Every first-party import in ``path``: (line, the module imported, the dotted path used, name included)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node.level, node.module or "")
            for alias in node.names:
                dotted = f"{source}.{alias.name}"
                yield node.lineno, dotted if dotted in modules else source, dotted
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in IMPORT_FUNCTIONS):
            literal: str = node.args[0].value
            dots = len(literal) - len(literal.lstrip("."))
            target = _resolve(module, is_package, dots, literal[dots:])
            yield node.lineno, target, target


def violations(root: Path) -> list[str]:
    """``path:line: what`` for every import under ``root``'s checked packages that the layers forbid."""
    files = sorted(path for package in CHECKED if (root / package).is_dir() for path in (root / package).rglob("*.py"))
    modules = frozenset(module_name(path, root) for path in files)
    found = []
    for path in files:
        module = module_name(path, root)
        part = part_of(module)
        where = path.relative_to(root).as_posix()
        for line, target, dotted in imports(path, module, modules):
            if target.split(".")[0] not in FIRST_PARTY:
                continue
            if part is None or not any(_within(target, allowed) for allowed in MAY_IMPORT[part]):
                found.append(f"{where}:{line}: {module} imports {target}; {part} may import "
                             f"{', '.join(MAY_IMPORT.get(part, ())) or 'nothing'}")
            elif part_of(target) != part and _private(dotted):
                found.append(f"{where}:{line}: {module} imports {dotted}, private to {part_of(target)}")
    return found


def test_the_tree_follows_the_layers():
    assert violations(REPO) == []


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_names_every_violation(tmp_path):
    write(tmp_path, {
        "spec/__init__.py": "import json\nimport yaml\n",
        "spec/tools/__init__.py": "",
        "spec/tools/gate.py": (
            "import importlib\n"
            "from spec import load_table\n"
            "def run():\n"
            "    from reference.core import outbox\n"
            "    return importlib.import_module('conformance.registry')\n"
        ),
        "reference/__init__.py": "",
        "reference/cli.py": "from reference import core, daemon\nfrom spec.tools import gate\n",
        "reference/trace.py": "from spec import _patterns, validator\n",
        "reference/core/__init__.py": "from spec.decision import DecisionTable\nfrom ._private import x\n",
        "reference/core/_private.py": "",
        "reference/core/outbox.py": "from reference.daemon import app\n",
        "reference/daemon/__init__.py": "",
        "reference/daemon/app.py": (
            "from reference.core import outbox\n"
            "from reference.trace import TraceWriter\n"
            "from ..core import _private\n"
            "from ..broker import server\n"
        ),
        "reference/broker/__init__.py": "",
        "reference/broker/server.py": "__import__('reference.daemon.app')\n",
        "conformance/__init__.py": "",
        "conformance/cases.py": (
            "from . import plugin\n"
            "from reference.core import parse_send\n"
            "from reference.core._private import x\n"
            "import reference.daemon.app\n"
        ),
        "conformance/plugin.py": "from tests.core import builders\n",
        "spark_checks/oracle.py": "from reference.core import outbox\nfrom conformance import plugin\n",
    })
    assert violations(tmp_path) == [
        "conformance/cases.py:3: conformance.cases imports reference.core._private.x, private to reference.core",
        "conformance/cases.py:4: conformance.cases imports reference.daemon.app; conformance may import spec, "
        "reference.core, conformance",
        "conformance/plugin.py:1: conformance.plugin imports tests.core; conformance may import spec, "
        "reference.core, conformance",
        "reference/broker/server.py:1: reference.broker.server imports reference.daemon.app; reference.broker may "
        "import spec, reference.core, reference.clock, reference.trace, reference.state_dir, reference.sandbox, "
        "reference.broker",
        "reference/core/outbox.py:1: reference.core.outbox imports reference.daemon.app; reference.core may import "
        "spec, reference.core",
        "reference/daemon/app.py:3: reference.daemon.app imports reference.core._private, private to reference.core",
        "reference/daemon/app.py:4: reference.daemon.app imports reference.broker.server; reference.daemon may "
        "import spec, reference.core, reference.clock, reference.trace, reference.state_dir, reference.sandbox, "
        "reference.daemon",
        "reference/trace.py:1: reference.trace imports spec._patterns, private to spec",
        "spark_checks/oracle.py:2: spark_checks.oracle imports conformance.plugin; spark_checks may import spec, "
        "reference.core, spark_checks",
        "spec/tools/gate.py:4: spec.tools.gate imports reference.core.outbox; spec may import spec",
        "spec/tools/gate.py:5: spec.tools.gate imports conformance.registry; spec may import spec",
    ]


@pytest.mark.parametrize("tool", SPEC_TOOLS)
def test_meshd_spec_dispatches_every_tool(tool, capsys):
    try:
        status = meshd(["spec", tool, "--help"])
    except SystemExit as exited:  # argparse's --help exits; `spec diff` turns that into its return value
        status = exited.code
    assert status == 0
    assert capsys.readouterr().out.startswith(f"usage: meshd spec {tool} ")


def test_reference_core_offers_every_name_the_spec_tools_call():
    names = set(Core.__annotations__) | {name for name in vars(Core) if not name.startswith("_")}
    assert len(names) == 19
    assert sorted(name for name in names if not hasattr(core, name)) == []
