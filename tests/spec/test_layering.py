"""The import directions of README's "Layers": every import in spec/, reference/, conformance/ and spark_checks/.

Rules of this file: a module belongs to the part whose name is its longest prefix in ``MAY_IMPORT`` and may import
only modules of the parts listed for it (a part includes its submodules). A module or name whose path has a
component starting with ``_`` is private to its part: another part importing it is a violation even where the
direction is allowed. Only the repository's own packages are checked; the standard library and third parties are
free. tests/ and bench/ are not checked: they may import anything.

What counts as an import:

- every ``import`` and ``from ... import``, at module level or inside a function, relative ones resolved against
  the importing package;
- a name reached through one: ``core._tables`` after ``from reference import core`` and ``reference.daemon.app``
  after ``import reference.core`` are judged like the imports they amount to (reported only where the import that
  bound the name was itself allowed, so one mistake is named once);
- the import machinery called with a literal: ``importlib.import_module`` (a relative name against its
  ``package=``, else the importing package), ``__import__`` (its ``fromlist`` and ``level`` too),
  ``importlib.util.find_spec``, ``runpy.run_module`` and ``run_path``, ``pkgutil.resolve_name``, ``sys.modules[...]``
  and ``sys.modules.get(...)``, ``getattr(module, "name")``, and the code text handed to ``exec`` or ``eval``
  (checked as code);
- anything else the machinery is given is a "dynamic import", a violation wherever it appears, because no reader
  can tell which part it reaches: a computed name (``"reference." + part``, an f-string, a variable), a computed
  ``package=``, ``exec``/``eval`` of anything but literal code, loading from a file location, ``sys.modules`` used
  other than for a literal lookup or an ``in`` test, a computed ``getattr`` on a first-party module or name, and any
  of these functions handed around instead of called.

Names are followed through ``import ... as``, ``from ... import``, the builtins and plain ``name = dotted.name``
assignments anywhere in the file (a name bound several ways is judged by each); the machinery's distinctive
function names (``import_module``, ``run_path``, ...) count however the function was reached.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

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
    # the client SDK (§11) imports nothing but the standard library: it must install alone
    "reference.client": ("reference.client",),
    "reference.daemon": ("spec", "reference.core", *SHARED, "reference.daemon", "reference.client"),
    "reference.broker": ("spec", "reference.core", *SHARED, "reference.broker"),
    "reference": ("spec", "reference"),  # reference/__init__.py and cli.py: meshd wires every part
    "conformance": ("spec", "reference.core", "spark_checks", "conformance"),  # the trace oracle judges run traces
    "spark_checks": ("spec", "reference.core", "spark_checks"),
}
BUILTINS = {"__import__": "builtins.__import__", "exec": "builtins.exec", "eval": "builtins.eval",
            "__builtins__": "builtins"}
# the import machinery, by the name each function is reached through when it is reached the ordinary way
IMPORT_MODULE = frozenset({"importlib.import_module", "importlib.util.find_spec"})
DUNDER_IMPORT = frozenset({"builtins.__import__", "importlib.__import__"})
LOADERS = frozenset({"runpy.run_module", "runpy.run_path", "pkgutil.resolve_name"})
CODE = frozenset({"builtins.exec", "builtins.eval"})
FILE_LOADERS = frozenset({"importlib.util.spec_from_file_location", "importlib.machinery.SourceFileLoader"})
MACHINERY = IMPORT_MODULE | DUNDER_IMPORT | LOADERS | CODE | FILE_LOADERS
# names no other library uses for anything else: these count however the function was reached
DISTINCTIVE = {name.rpartition(".")[2]: name for name in MACHINERY - CODE}
SYS_MODULES_LOOKUPS = frozenset({"get", "pop", "setdefault"})


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


def _relative(package: str, level: int, name: str) -> str:
    """The absolute name of ``<level dots><name>`` imported from inside ``package``."""
    if not level:
        return name
    pieces = package.split(".")
    base = pieces[:len(pieces) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _module_of(dotted: str, modules: frozenset[str]) -> str:
    """The longest prefix of ``dotted`` that is a module of the tree (``dotted`` itself when none is)."""
    pieces = dotted.split(".")
    return next((".".join(pieces[:n]) for n in range(len(pieces), 0, -1) if ".".join(pieces[:n]) in modules), dotted)


@dataclass(frozen=True)
class Found:
    """One import of a file: ``kind`` is "imports", "uses" (a name reached through an imported one, ``via``) or
    "dynamic" (``dotted`` is then the source text of the call)."""

    line: int
    kind: str
    target: str
    dotted: str
    via: str = ""


class _Scan:
    """The imports of one module's syntax tree, in the sense of this file's docstring."""

    def __init__(self, module: str, is_package: bool, modules: frozenset[str]):
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.bindings: dict[str, set[tuple[str, str]]] = {name: {(dotted, dotted)} for name, dotted in BUILTINS.items()}
        self.found: list[Found] = []
        self.line: int | None = None  # the exec call whose code text is being read: its findings are its line's
        self.parents: dict[int, ast.AST] = {}

    def run(self, tree: ast.AST) -> list[Found]:
        nodes = list(ast.walk(tree))
        self.parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
        self._bind(nodes)
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._add(node, "imports", alias.name, alias.name)
            elif isinstance(node, ast.ImportFrom):
                source = _relative(self.package, node.level, node.module or "")
                for alias in node.names:
                    dotted = f"{source}.{alias.name}"
                    self._add(node, "imports", dotted if dotted in self.modules else source, dotted)
            elif isinstance(node, ast.Call):
                for function in self._functions(node.func):
                    self._call(node, function)
            if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) and not isinstance(getattr(node, "ctx", None),
                                                                                         ast.Store):
                self._reference(node)
        return self.found

    # names

    def _bind(self, nodes: list[ast.AST]) -> None:
        """Every name the file binds to a dotted path: imports, then ``name = dotted.path`` until nothing changes."""
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.name if alias.asname else alias.name.partition(".")[0]
                    self._bind_name(alias.asname or bound, bound, alias.name)
            elif isinstance(node, ast.ImportFrom):
                source = _relative(self.package, node.level, node.module or "")
                for alias in node.names:
                    if alias.name != "*":
                        self._bind_name(alias.asname or alias.name, f"{source}.{alias.name}", f"{source}.{alias.name}")
        assignments = [(target.id, node.value) for node in nodes if isinstance(node, (ast.Assign, ast.AnnAssign))
                       and node.value is not None
                       for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                       if isinstance(target, ast.Name)]
        while True:
            before = sum(len(values) for values in self.bindings.values())
            for name, value in assignments:
                for dotted, via in self._resolve(value):
                    self._bind_name(name, dotted, via)
            if sum(len(values) for values in self.bindings.values()) == before:
                return

    def _bind_name(self, name: str, dotted: str, via: str) -> None:
        self.bindings.setdefault(name, set()).add((dotted, via))

    def _resolve(self, node: ast.AST) -> set[tuple[str, str]]:
        """The dotted paths an expression may stand for, each with the import that bound its first name."""
        if isinstance(node, ast.Name):
            return set(self.bindings.get(node.id, ()))
        if isinstance(node, ast.Attribute):
            return {(f"{dotted}.{node.attr}", via) for dotted, via in self._resolve(node.value)}
        if isinstance(node, ast.Call):
            name = self._getattr_name(node)
            if isinstance(name, str):
                return {(f"{dotted}.{name}", via) for dotted, via in self._resolve(node.args[0])}
            functions = self._functions(node.func)
            if functions & IMPORT_MODULE and node.args:
                target = self._module_name(node)
                return {(target, target)} if target else set()
            if (functions & DUNDER_IMPORT and (name := self._literal(_argument(node, 0, "name")))
                    and _argument(node, 4, "level") is None):
                fromlist = _argument(node, 3, "fromlist")
                whole = isinstance(fromlist, (ast.List, ast.Tuple)) and fromlist.elts
                return {(name if whole else name.partition(".")[0], name)}  # without a fromlist: the top package
        if isinstance(node, ast.Subscript) and any(dotted == "sys.modules" for dotted, _ in self._resolve(node.value)):
            name = self._literal(node.slice)
            return {(name, name)} if name else set()
        return set()

    def _functions(self, node: ast.AST) -> set[str]:
        """The import machinery ``node`` may be (empty for anything else)."""
        found = {dotted for dotted, _ in self._resolve(node) if dotted in MACHINERY}
        last = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if last in DISTINCTIVE:
            found.add(DISTINCTIVE[last])
        if isinstance(node, ast.Call) and self._getattr_name(node) in DISTINCTIVE:
            found.add(DISTINCTIVE[self._getattr_name(node)])
        return found

    @staticmethod
    def _getattr_name(node: ast.Call) -> str | ast.AST | None:
        """For ``getattr(x, name[, default])``: the name, a literal or the expression computing it."""
        if not (isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2):
            return None
        name = node.args[1]
        return name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else name

    def _literal(self, node: ast.AST | None) -> str | None:
        """A module name the source spells out: a string literal, ``__name__``, ``__package__``, ``__spec__.name``
        or ``__spec__.parent``."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in ("__name__", "__package__"):
            return self.module if node.id == "__name__" else self.package
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "__spec__"
                and node.attr in ("name", "parent")):
            return self.module if node.attr == "name" else self.package
        return None

    # findings

    def _add(self, node: ast.AST, kind: str, target: str, dotted: str, via: str = "") -> None:
        self.found.append(Found(self.line or node.lineno, kind, target, dotted, via))

    def _dynamic(self, node: ast.AST) -> None:
        self._add(node, "dynamic", "", ast.unparse(node))

    def _reference(self, node: ast.Name | ast.Attribute | ast.Call) -> None:
        """A name used: the machinery handed around, ``sys.modules``, or a path into another module."""
        parent = self.parents.get(id(node))
        if self._functions(node):
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self._dynamic(node)
            return
        resolved = self._resolve(node)
        if any(dotted == "sys.modules" for dotted, _ in resolved):
            self._sys_modules(node, parent)
            return
        if isinstance(node, ast.Call):
            name = self._getattr_name(node)
            if name is not None and not isinstance(name, str):
                if any(dotted.split(".")[0] in FIRST_PARTY for dotted, _ in self._resolve(node.args[0])):
                    self._dynamic(node)
                return
            if name is None:
                return
        elif isinstance(node, ast.Name):
            return  # the name itself is its import, judged where it is imported
        if isinstance(parent, ast.Attribute) or self._getattr_name_of(parent) is node:
            return  # only the whole of a dotted path is judged
        for dotted, via in sorted(resolved):
            if dotted.split(".")[0] in FIRST_PARTY:
                self._add(node, "uses", _module_of(dotted, self.modules), dotted, via)

    def _getattr_name_of(self, node: ast.AST | None) -> ast.AST | None:
        """The object ``getattr(obj, "literal")`` reads from, if ``node`` is such a call."""
        if isinstance(node, ast.Call) and isinstance(self._getattr_name(node), str):
            return node.args[0]
        return None

    def _sys_modules(self, node: ast.AST, parent: ast.AST | None) -> None:
        grandparent = self.parents.get(id(parent))
        if isinstance(parent, ast.Subscript) and parent.value is node:
            key = parent.slice
            site = parent
        elif (isinstance(parent, ast.Attribute) and parent.attr in SYS_MODULES_LOOKUPS
              and isinstance(grandparent, ast.Call) and grandparent.func is parent and grandparent.args):
            key = grandparent.args[0]
            site = grandparent
        elif (isinstance(parent, ast.Compare) and node in parent.comparators
              and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)):
            return
        else:
            self._dynamic(parent if isinstance(parent, ast.expr) else node)
            return
        name = self._literal(key)
        if name is None:
            self._dynamic(site)
        else:
            self._add(site, "imports", name, name)

    def _module_name(self, call: ast.Call) -> str | None:
        """The absolute module ``import_module(name, package)`` or ``find_spec(name, package)`` names, or None."""
        name = self._literal(_argument(call, 0, "name"))
        if name is None:
            return None
        dots = len(name) - len(name.lstrip("."))
        if not dots:
            return name
        package_node = _argument(call, 1, "package")
        package = self.package if package_node is None else self._literal(package_node)
        return None if package is None else _relative(package, dots, name[dots:])

    def _call(self, call: ast.Call, function: str) -> None:
        """A call of the import machinery: what it imports, or a dynamic import."""
        if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
            self._dynamic(call)
        elif function in IMPORT_MODULE:
            target = self._module_name(call)
            self._dynamic(call) if target is None else self._add(call, "imports", target, target)
        elif function in DUNDER_IMPORT:
            self._dunder_import(call)
        elif function == "runpy.run_path":
            module = _path_module(_argument(call, 0, "path_name"))
            self._dynamic(call) if module is None else self._add(call, "imports", module, module)
        elif function in LOADERS:
            name = self._literal(_argument(call, 0, "mod_name" if function == "runpy.run_module" else "name"))
            if name is None:
                self._dynamic(call)
            else:
                dotted = name.replace(":", ".")
                target = _module_of(dotted, self.modules)
                self._add(call, "imports", name.partition(":")[0] if target == dotted else target, dotted)
        elif function in CODE:
            self._code(call)
        else:
            self._dynamic(call)

    def _dunder_import(self, call: ast.Call) -> None:
        """``__import__(name, globals, locals, fromlist, level)``: the module and each name of its fromlist."""
        name = self._literal(_argument(call, 0, "name"))
        level_node, fromlist_node = _argument(call, 4, "level"), _argument(call, 3, "fromlist")
        level = 0 if level_node is None else getattr(level_node, "value", None)
        if fromlist_node is None or (isinstance(fromlist_node, ast.Constant) and fromlist_node.value is None):
            fromlist: list | None = []
        elif isinstance(fromlist_node, (ast.List, ast.Tuple)):
            fromlist = [getattr(item, "value", None) for item in fromlist_node.elts]
        else:
            fromlist = None
        if (name is None or not isinstance(level, int) or isinstance(level, bool) or fromlist is None
                or not all(isinstance(item, str) for item in fromlist)):
            self._dynamic(call)
            return
        base = _relative(self.package, level, name)
        self._add(call, "imports", base, base)
        for item in fromlist:
            dotted = f"{base}.{item}"
            self._add(call, "imports", dotted if dotted in self.modules else base, dotted)

    def _code(self, call: ast.Call) -> None:
        """``exec``/``eval`` of literal code text: its imports, at the call's line; of anything else: dynamic."""
        source = _argument(call, 0, "source")
        try:
            if not (isinstance(source, ast.Constant) and isinstance(source.value, str)):
                raise SyntaxError("not code text")
            tree = ast.parse(source.value)
        except SyntaxError:
            self._dynamic(call)
            return
        inner = _Scan(self.module, False, self.modules)
        inner.package, inner.line = self.package, self.line or call.lineno
        inner.bindings = {name: set(values) for name, values in self.bindings.items()}
        self.found += inner.run(tree)


def _argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    """The argument a call passes at position ``index`` or as ``keyword``."""
    if index < len(call.args):
        return call.args[index]
    return next((kw.value for kw in call.keywords if kw.arg == keyword), None)


def _path_module(node: ast.AST | None) -> str | None:
    """The module a literal relative file path (``runpy.run_path``) names: ``reference/daemon/app.py`` ->
    ``reference.daemon.app``, a package directory -> the package; None for anything else."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return None
    path = PurePosixPath(node.value.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    parts = list(path.with_suffix("").parts if path.suffix == ".py" else path.parts)
    if parts and parts[-1] in ("__init__", "__main__"):
        parts.pop()
    return ".".join(part for part in parts if part != ".") or None


def imports(path: Path, module: str, modules: frozenset[str]) -> list[Found]:
    """Every import of ``path`` (module ``module`` of a tree whose modules are ``modules``), first party or not."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return _Scan(module, path.name == "__init__.py", modules).run(tree)


def _judge(part: str | None, target: str, dotted: str) -> str | None:
    """Why ``part`` may not import ``dotted`` (of module ``target``), or None if it may."""
    if part is None or not any(_within(target, allowed) for allowed in MAY_IMPORT[part]):
        return f"{target}; {part} may import {', '.join(MAY_IMPORT.get(part, ())) or 'nothing'}"
    if part_of(target) != part and _private(dotted):
        return f"{dotted}, private to {part_of(target)}"
    return None


def violations(root: Path) -> list[str]:
    """``path:line: what`` for every import under ``root``'s checked packages that the layers forbid."""
    files = sorted(path for package in CHECKED if (root / package).is_dir() for path in (root / package).rglob("*.py"))
    modules = frozenset(module_name(path, root) for path in files)
    found = []
    for path in files:
        module = module_name(path, root)
        part = part_of(module)
        where = f"{path.relative_to(root).as_posix()}"
        for item in sorted(set(imports(path, module, modules)), key=lambda f: (f.line, f.kind, f.dotted)):
            if item.kind == "dynamic":
                found.append(f"{where}:{item.line}: {module} makes a dynamic import: {item.dotted}")
                continue
            if item.target.split(".")[0] not in FIRST_PARTY:
                continue
            why = _judge(part, item.target, item.dotted)
            if why is None or (item.kind == "uses" and _judge(part, _module_of(item.via, modules), item.via)):
                continue
            found.append(f"{where}:{item.line}: {module} {item.kind} {why}")
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
        "reference.core, spark_checks, conformance",
        "conformance/plugin.py:1: conformance.plugin imports tests.core; conformance may import spec, "
        "reference.core, spark_checks, conformance",
        "reference/broker/server.py:1: reference.broker.server imports reference.daemon.app; reference.broker may "
        "import spec, reference.core, reference.clock, reference.trace, reference.state_dir, reference.sandbox, "
        "reference.broker",
        "reference/core/outbox.py:1: reference.core.outbox imports reference.daemon.app; reference.core may import "
        "spec, reference.core",
        "reference/daemon/app.py:3: reference.daemon.app imports reference.core._private, private to reference.core",
        "reference/daemon/app.py:4: reference.daemon.app imports reference.broker.server; reference.daemon may "
        "import spec, reference.core, reference.clock, reference.trace, reference.state_dir, reference.sandbox, "
        "reference.daemon, reference.client",
        "reference/trace.py:1: reference.trace imports spec._patterns, private to spec",
        "spark_checks/oracle.py:2: spark_checks.oracle imports conformance.plugin; spark_checks may import spec, "
        "reference.core, spark_checks",
        "spec/tools/gate.py:4: spec.tools.gate imports reference.core.outbox; spec may import spec",
        "spec/tools/gate.py:5: spec.tools.gate imports conformance.registry; spec may import spec",
    ]


TO_BROKER = ("imports reference.broker.server; reference.daemon may import spec, reference.core, reference.clock, "
             "reference.trace, reference.state_dir, reference.sandbox, reference.daemon, reference.client")
# reference/daemon/app.py of PLANTED: the statement under test is line 10, in a function given `name` and `part`
PLANTED_HEAD = (
    "import importlib\n"
    "import pkgutil\n"
    "import runpy\n"
    "import sys\n"
    "from importlib import import_module as load\n"
    "from reference import core\n"
    "from reference.core import DecisionTable, codes\n"
    "from . import store\n"
    "def planted(name, part):\n"
)
PLANTED = {
    **{f"{package}/__init__.py": "" for package in ("spec", "reference", "reference/core", "reference/daemon",
                                                    "reference/broker", "conformance")},
    "reference/core/_tables.py": "",
    "reference/core/codes.py": "",
    "reference/core/outbox.py": "",
    "reference/broker/server.py": "",
    "reference/daemon/store.py": "",
}


@pytest.mark.parametrize(("statement", "reported"), [
    # another part's private names, reached through an imported name
    ("core._tables.DecisionTable", "uses reference.core._tables.DecisionTable, private to reference.core"),
    ("codes._TABLE", "uses reference.core.codes._TABLE, private to reference.core"),
    ("DecisionTable._rows", "uses reference.core.DecisionTable._rows, private to reference.core"),
    ("getattr(core, '_tables')", "uses reference.core._tables, private to reference.core"),
    ("alias = codes; alias._TABLE", "uses reference.core.codes._TABLE, private to reference.core"),
    ("sys.modules['reference.core']._tables", "uses reference.core._tables, private to reference.core"),
    ("__import__('reference.core').core._tables", "uses reference.core._tables, private to reference.core"),
    ("store._connect", None),  # the daemon's own private names are its own
    ("core.outbox.Outbox, core.__name__", None),
    # the import machinery with a literal is an import like any other
    ("importlib.import_module('.store', package='reference.daemon')", None),
    ("importlib.import_module('.server', package='reference.broker')", TO_BROKER),
    ("load('._tables', 'reference.core')", "imports reference.core._tables, private to reference.core"),
    ("importlib.util.find_spec('reference.broker.server')", TO_BROKER),
    ("__import__('reference.core', fromlist=['_tables'])", "imports reference.core._tables, private to reference.core"),
    ("runpy.run_module('reference.broker.server')", TO_BROKER),
    ("runpy.run_path('reference/broker/server.py')", TO_BROKER),
    ("pkgutil.resolve_name('reference.core.codes:_TABLE')", "imports reference.core.codes._TABLE, private to "
                                                            "reference.core"),
    ("pkgutil.resolve_name('reference.core:DecisionTable')", None),
    ("exec('from reference.broker import server')", TO_BROKER),
    ("eval('core._tables')", "uses reference.core._tables, private to reference.core"),
    ("eval('1 + 1')", None),
    ("sys.modules['reference.broker.server']", TO_BROKER),
    ("sys.modules.get('reference.core._tables')", "imports reference.core._tables, private to reference.core"),
    ("sys.modules[__name__], 'reference.broker' in sys.modules", None),
    # anything else handed to the machinery: a dynamic import
    ("importlib.import_module(name)", "makes a dynamic import: importlib.import_module(name)"),
    ("importlib.import_module('reference.' + 'broker.server')",
     "makes a dynamic import: importlib.import_module('reference.' + 'broker.server')"),
    ("load(f'reference.{part}')", "makes a dynamic import: load(f'reference.{part}')"),
    ("importlib.import_module('.server', package=part)",
     "makes a dynamic import: importlib.import_module('.server', package=part)"),
    ("__import__(name)", "makes a dynamic import: __import__(name)"),
    ("__import__('reference', fromlist=[part])", "makes a dynamic import: __import__('reference', fromlist=[part])"),
    ("runpy.run_module(name)", "makes a dynamic import: runpy.run_module(name)"),
    ("runpy.run_path('/srv/reference/broker/server.py')",
     "makes a dynamic import: runpy.run_path('/srv/reference/broker/server.py')"),
    ("pkgutil.resolve_name(name)", "makes a dynamic import: pkgutil.resolve_name(name)"),
    ("exec(name)", "makes a dynamic import: exec(name)"),
    ("eval(compile(name, 'x', 'eval'))", "makes a dynamic import: eval(compile(name, 'x', 'eval'))"),
    ("exec('import (')", "makes a dynamic import: exec('import (')"),
    ("sys.modules[name]", "makes a dynamic import: sys.modules[name]"),
    ("sys.modules.get(f'reference.{part}')", "makes a dynamic import: sys.modules.get(f'reference.{part}')"),
    ("modules = sys.modules", "makes a dynamic import: sys.modules"),
    ("loader = importlib.import_module", "makes a dynamic import: importlib.import_module"),
    ("getattr(importlib, 'import_module')(name)", "makes a dynamic import: getattr(importlib, 'import_module')(name)"),
    ("lib = importlib; lib.import_module(name)", "makes a dynamic import: lib.import_module(name)"),
    ("__builtins__.__import__(name)", "makes a dynamic import: __builtins__.__import__(name)"),
    ("importlib.util.spec_from_file_location(part, name)",
     "makes a dynamic import: importlib.util.spec_from_file_location(part, name)"),
    ("getattr(core, name)", "makes a dynamic import: getattr(core, name)"),
    ("importlib.import_module(*part)", "makes a dynamic import: importlib.import_module(*part)"),
])
def test_the_checker_follows_names_and_the_import_machinery(tmp_path, statement, reported):
    write(tmp_path, {**PLANTED, "reference/daemon/app.py": f"{PLANTED_HEAD}    {statement}\n"})
    expected = [f"reference/daemon/app.py:10: reference.daemon.app {reported}"] if reported else []
    assert violations(tmp_path) == expected


def test_a_name_is_judged_through_the_import_that_bound_it_once(tmp_path):
    write(tmp_path, {**PLANTED, "spark_checks/__init__.py": "", "conformance/cases.py": (
        "import reference.core\n"
        "from reference.core import _tables\n"
        "_tables.rows\n"
        "reference.core.codes.CLOSE\n"
        "reference.daemon.store.open_store()\n"
    ), "spark_checks/oracle.py": "def check(name):\n    return __import__(name)\n"})
    assert violations(tmp_path) == [
        "conformance/cases.py:2: conformance.cases imports reference.core._tables, private to reference.core",
        "conformance/cases.py:5: conformance.cases uses reference.daemon.store; conformance may import spec, "
        "reference.core, spark_checks, conformance",
        "spark_checks/oracle.py:2: spark_checks.oracle makes a dynamic import: __import__(name)",
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
    assert len(names) == 24  # five of them the hook model's (spec/tools/hook_model.py)
    assert sorted(name for name in names if not hasattr(core, name)) == []
