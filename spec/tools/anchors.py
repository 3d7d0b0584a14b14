"""Implementation anchors: where in ``reference/`` each requirement is enforced.

An anchor is a line comment ``# req: ID`` or ``# req: ID1, ID2``, optionally followed by `` -- a short note``, that
is the whole comment of its line. It marks the code that enforces the requirements it names (the check, the SQL, the
branch, the table lookup), so ``grep -rn 'req: AUTH-BEARER' reference/`` ends at the code that refuses the request.

Rules of this file. The scan reads files as text and syntax trees (``tokenize`` finds the comments, so a ``# req:``
inside a string is not an anchor) and imports nothing from ``reference`` or ``conformance``. An anchor is attached
to the code of its own line when it trails code, otherwise to the next line, with at most one comment line and no
blank line between. What it is attached to must run and do something; these are refused, each named:

- a line that only opens or continues a block or declares: ``else:``, ``try:``, ``finally:``, a ``def`` or ``class``
  header, ``global``/``nonlocal``, an import;
- a statement that does nothing: ``pass``, ``...``, a bare string, constant or name, a no-op ``lambda`` (one that
  returns a constant or its own argument, e.g. the value of a dict entry);
- code that never runs: under ``if False:``/``if 0:``/``if TYPE_CHECKING:`` (or the ``else`` of ``if True:``),
  after a ``return``/``raise``/``continue``/``break`` of the same block, or inside a function or class that nothing in
  ``reference/`` refers to. "Refers to" is approximated by name: the name occurs as code (not in a comment or a
  string) somewhere in ``reference/**/*.py`` other than where it is defined. Names a framework calls count as
  referred to: ``on_*`` responders (falcon), dunder methods, and the names a module's ``__all__`` lists.

Every comment that mentions ``req`` like an anchor (``req:`` anywhere in it, or ``req`` as its first word) and is not
exactly an anchor is malformed, wherever it sits (``# noqa # req: ID`` too). The audit reports every MUST of
spec/requirements.yaml without an anchor, every anchor naming an id the registry does not have, and every malformed,
detached or refused anchor; a refused anchor counts for nothing.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import spec as spec_pkg

#: the tree whose anchors count, relative to the repository root
PACKAGE = "reference"
REQUIREMENT_ID = r"[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+"
ANCHOR = re.compile(rf"# req: (?P<ids>{REQUIREMENT_ID}(?:, {REQUIREMENT_ID})*)(?: -- (?P<note>\S.*))?")
#: a comment meant as an anchor: ``req:`` anywhere, or ``req`` as the first word of the comment or of a ``#`` part
LOOKS_LIKE_ANCHOR = re.compile(r"\breq\s*:|(?:^|#)\s*req\b", re.IGNORECASE)
#: a line that only continues a compound statement
BLOCK_KEYWORD = re.compile(r"(else|try|finally)\s*:")
DEAD_TESTS = ("TYPE_CHECKING",)
EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
#: methods the tree defines that a framework calls by name (besides ``on_*`` responders and dunders)
FRAMEWORK_HOOKS = frozenset({
    "process_request", "process_resource", "process_response",  # falcon middleware
    "load_config", "get_thread_pool", "enqueue_req", "handle_error",  # gunicorn's BaseApplication and ThreadWorker
    "collect",  # prometheus_client custom collectors
})


@dataclass(frozen=True)
class Anchor:
    """One anchor comment: the file (relative to the repository root, POSIX), its line and the ids it names."""

    path: str
    line: int
    ids: tuple[str, ...]
    note: str | None = None


@dataclass
class Scan:
    """The anchors of a tree and the comments that look like anchors but are not well-formed or well-placed."""

    anchors: list[Anchor] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)

    def locations(self) -> dict[str, list[str]]:
        """Requirement id -> the files that anchor it, in path order, each once."""
        found: dict[str, list[str]] = {}
        for anchor in sorted(self.anchors, key=lambda a: (a.path, a.line)):
            for rid in anchor.ids:
                paths = found.setdefault(rid, [])
                if anchor.path not in paths:
                    paths.append(anchor.path)
        return found


def references(source: str) -> Counter[str]:
    """How often each name occurs as code in one file: names read, attributes, names imported and the entries of
    ``__all__``; the name a ``def`` or ``class`` defines, comments and other strings do not count."""
    counts: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            counts[node.id] += 1
        elif isinstance(node, ast.Attribute):
            counts[node.attr] += 1
        elif isinstance(node, ast.alias):
            counts[node.name.rpartition(".")[2]] += 1
        elif (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
              and isinstance(node.value, (ast.List, ast.Tuple))):
            counts.update(item.value for item in node.value.elts if isinstance(item, ast.Constant))
    return counts


class _Code:
    """One file's syntax tree, asked what a line of it is."""

    def __init__(self, source: str, referenced: Counter[str]):
        self.tree = ast.parse(source)
        self.lines = source.splitlines()
        self.referenced = referenced
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        self.blocks = [node for node in ast.walk(self.tree) if isinstance(node, (ast.stmt, ast.excepthandler))]

    def refusal(self, line: int) -> str | None:
        """Why the code of ``line`` enforces nothing, or None."""
        text = self.lines[line - 1].strip()
        keyword = BLOCK_KEYWORD.match(text)
        for node in self.blocks:
            if isinstance(node, DEFINITIONS) and any(d.lineno <= line <= d.end_lineno for d in node.decorator_list):
                return self._never_runs(node) or self._never_runs_as_code(node)
        containing = [node for node in self.blocks if node.lineno <= line <= node.end_lineno]
        if not containing:
            return "no code"
        statement = max(containing, key=lambda node: (node.lineno, -node.end_lineno, self._depth(node)))
        if keyword and (statement.lineno != line or isinstance(statement, ast.Try)):
            return f"`{keyword[1]}:`, which only continues a block"
        if isinstance(statement, DEFINITIONS) and line < statement.body[0].lineno:
            kind = "class" if isinstance(statement, ast.ClassDef) else "def"
            return f"the {kind} line of `{statement.name}`, not code inside it"
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            return "an import"
        what = self._does_nothing(statement, line)
        return what or self._never_runs(statement)

    def _depth(self, node: ast.AST) -> int:
        depth = 0
        while id(node) in self.parents:
            node = self.parents[id(node)]
            depth += 1
        return depth

    def _does_nothing(self, statement: ast.AST, line: int) -> str | None:
        if isinstance(statement, ast.Pass):
            return "`pass`, which does nothing"
        if isinstance(statement, (ast.Global, ast.Nonlocal)):
            return "a declaration, which does nothing"
        if isinstance(statement, ast.Expr) and _inert(statement.value):
            value = statement.value
            if isinstance(value, ast.Constant) and value.value is Ellipsis:
                return "`...`, which does nothing"
            if isinstance(value, ast.JoinedStr) or (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                return "a bare string, which does nothing"
            return "a bare expression, which does nothing"
        value = getattr(statement, "value", None)
        if line == statement.lineno and _no_op_lambda(value):
            return "a no-op lambda, which does nothing"
        if line > statement.lineno and not isinstance(statement, ast.excepthandler) and not hasattr(statement, "body"):
            first = [node for node in ast.walk(statement) if getattr(node, "lineno", None) == line
                     and self._line_of_parent(node) != line]
            if any(_no_op_lambda(node) for node in first) and all(
                    _no_op_lambda(node) or isinstance(node, ast.Constant) for node in first):
                return "a no-op lambda, which does nothing"
        return None

    def _line_of_parent(self, node: ast.AST) -> int | None:
        """The line of the nearest enclosing node that has one (``arguments`` and operators have none)."""
        parent = self.parents.get(id(node))
        while parent is not None and not hasattr(parent, "lineno"):
            parent = self.parents.get(id(parent))
        return getattr(parent, "lineno", None)

    def _never_runs(self, node: ast.AST) -> str | None:
        """Why ``node`` never runs: dead branch, unreachable, or inside an unreferenced function or class."""
        child = node
        parent = self.parents.get(id(child))
        while parent is not None:
            if isinstance(parent, (ast.If, ast.While)) and child in parent.body and _never_true(parent.test):
                keyword = "if" if isinstance(parent, ast.If) else "while"
                return f"code under `{keyword} {ast.unparse(parent.test)}:`, which never runs"
            if isinstance(parent, ast.If) and child in parent.orelse and _always_true(parent.test):
                return f"code in the else of `if {ast.unparse(parent.test)}:`, which never runs"
            for block in ("body", "orelse", "finalbody", "handlers"):
                siblings = getattr(parent, block, None)
                if isinstance(siblings, list) and child in siblings:
                    earlier = siblings[:siblings.index(child)]
                    exit_ = next((s for s in earlier if isinstance(s, EXITS)), None)
                    if exit_ is not None:
                        return (f"code after the `{type(exit_).__name__.lower()}` on line {exit_.lineno}, "
                                "which never runs")
            if isinstance(parent, DEFINITIONS) and not self._referred_to(parent):
                kind = "class" if isinstance(parent, ast.ClassDef) else "function"
                return f"code in {kind} `{parent.name}`, which nothing in {PACKAGE}/ refers to"
            child, parent = parent, self.parents.get(id(parent))
        return None

    def _never_runs_as_code(self, definition: ast.AST) -> str | None:
        if isinstance(definition, DEFINITIONS) and not self._referred_to(definition):
            kind = "class" if isinstance(definition, ast.ClassDef) else "function"
            return f"a decorator of {kind} `{definition.name}`, which nothing in {PACKAGE}/ refers to"
        return None

    def _referred_to(self, definition: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
        """Whether anything refers to ``definition`` by name; a method a framework calls needs no reference."""
        name = definition.name
        method = isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef) and isinstance(
            self.parents.get(id(definition)), ast.ClassDef)
        framework = name.startswith("on_") or (name.startswith("__") and name.endswith("__")) or name in FRAMEWORK_HOOKS
        return (method and framework) or self.referenced[name] > 0


def _never_true(test: ast.expr) -> bool:
    if isinstance(test, ast.Constant):
        return not test.value
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name in DEAD_TESTS


def _always_true(test: ast.expr) -> bool:
    return isinstance(test, ast.Constant) and bool(test.value)


def _inert(node: ast.AST) -> bool:
    """An expression whose evaluation has no effect: constants and names, and containers and operators of them."""
    if isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.JoinedStr):
        return all(_inert(value) for value in node.values)
    if isinstance(node, ast.FormattedValue):
        return _inert(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_inert(item) for item in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _inert(node.operand)
    if isinstance(node, ast.BoolOp):
        return all(_inert(value) for value in node.values)
    if isinstance(node, ast.Compare):
        return _inert(node.left) and all(_inert(item) for item in node.comparators)
    return isinstance(node, ast.Lambda)


def _no_op_lambda(node: ast.AST | None) -> bool:
    """A lambda returning a constant or one of its own arguments."""
    if not isinstance(node, ast.Lambda):
        return False
    parameters = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
    body = node.body
    return isinstance(body, ast.Constant) or (isinstance(body, ast.Name) and body.id in parameters)


def scan_source(source: str, path: str, referenced: Counter[str] | None = None) -> Scan:
    """The anchors of one file's text; ``path`` is how findings name the file, ``referenced`` the name counts of the
    whole tree (this file's alone when None)."""
    result = Scan()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        code = _Code(source, referenced if referenced is not None else references(source))
    except (tokenize.TokenError, SyntaxError) as exc:
        result.malformed.append(f"{path}: cannot be read as Python ({exc})")
        return result
    for token in tokens:
        if token.type != tokenize.COMMENT or not LOOKS_LIKE_ANCHOR.search(token.string):
            continue
        row = token.start[0]
        comment = token.string.strip()
        where = f"{path}:{row}"
        match = ANCHOR.fullmatch(token.string.rstrip())
        if match is None:
            result.malformed.append(f"{where}: malformed anchor {comment!r} (the format is "
                                    "`# req: ID[, ID...] [-- note]`, the whole comment)")
            continue
        inline = code.lines[row - 1][:token.start[1]].strip() != ""
        line, gap = (row, "") if inline else _next_code_line(code.lines, row)
        if line is None:
            result.malformed.append(f"{where}: anchor {comment!r} is attached to no code ({gap}; put it on or "
                                    "directly above the line that enforces the requirement)")
            continue
        refusal = code.refusal(line)
        if refusal is not None:
            result.malformed.append(f"{where}: anchor {comment!r} is attached to {refusal} (line {line}); put it at "
                                    "the code that enforces the requirement")
            continue
        result.anchors.append(Anchor(path, row, tuple(match["ids"].split(", ")), match["note"]))
    return result


def _next_code_line(lines: list[str], row: int) -> tuple[int | None, str]:
    """The line an anchor on its own line ``row`` (1-based) belongs to: the next one, or the one after a single
    comment line; else None and why."""
    for number, text in enumerate(lines[row:row + 2], start=row + 1):
        stripped = text.strip()
        if not stripped:
            return None, "a blank line follows it"
        if not stripped.startswith("#"):
            return number, ""
    if len(lines) > row + 1:
        return None, "more than one comment line follows it"
    return None, "nothing follows it"


def scan(repo_root: Path, package: str = PACKAGE) -> Scan:
    """The anchors of every ``*.py`` file under ``repo_root / package``. Parsing is remembered by the files' relative
    names and texts: a run of ``spec check`` asks twice, and a copy of the tree (the spec checker's own tests) is
    not parsed again."""
    files = [file for file in sorted((repo_root / package).rglob("*.py")) if "__pycache__" not in file.parts]
    sources = tuple((file.relative_to(repo_root).as_posix(), file.read_text(encoding="utf-8")) for file in files)
    found = _scan(sources)
    return Scan(list(found.anchors), list(found.malformed))


@functools.lru_cache(maxsize=4)
def _scan(sources: tuple[tuple[str, str], ...]) -> Scan:
    referenced: Counter[str] = Counter()
    for _, source in sources:
        try:
            referenced += references(source)
        except (tokenize.TokenError, SyntaxError):
            continue  # scan_source names the file
    result = Scan()
    for name, source in sources:
        found = scan_source(source, name, referenced)
        result.anchors += found.anchors
        result.malformed += found.malformed
    return result


@dataclass(frozen=True)
class Audit:
    """The findings of ``audit``: ``problems`` (empty when the tree passes) and a one-line ``summary``."""

    problems: list[str]
    summary: str
    scan: Scan


def _requirements(spec_dir: Path) -> list[dict]:
    document = spec_pkg.load_yaml(spec_dir / "requirements.yaml")
    requirements = document.get("requirements", []) if isinstance(document, dict) else []
    return [r for r in requirements if isinstance(r, dict) and isinstance(r.get("id"), str)]


def audit(spec_dir: Path = spec_pkg.SPEC_DIR, repo_root: Path | None = None,
          requirements: Iterable[dict] | None = None) -> Audit:
    """Check the anchors of ``repo_root / reference`` against the registry in ``spec_dir``.

    Problems: a MUST no anchor names, an anchor naming an id the registry lacks, a malformed or detached anchor.
    """
    repo_root = (repo_root or spec_dir.parent).resolve()
    registry = list(requirements) if requirements is not None else _requirements(spec_dir)
    known = {r["id"] for r in registry}
    musts = [r["id"] for r in registry if r.get("level") == "MUST"]
    if not (repo_root / PACKAGE).is_dir():
        return Audit([f"{PACKAGE}/: missing (implementation anchors are read from {repo_root / PACKAGE})"],
                     f"no {PACKAGE}/ to read anchors from", Scan())
    found = scan(repo_root)
    problems = list(found.malformed)
    for anchor in found.anchors:
        for rid in anchor.ids:
            if rid not in known:
                problems.append(f"{anchor.path}:{anchor.line}: anchor names {rid}, which is not a requirement "
                                "(spec/requirements.yaml)")
    anchored = found.locations()
    for rid in musts:
        if rid not in anchored:
            problems.append(f"{PACKAGE}/: MUST {rid} has no implementation anchor (`# req: {rid}` at the code that "
                            "enforces it)")
    places = sum(1 for anchor in found.anchors if any(rid in musts for rid in anchor.ids))
    covered = sum(1 for rid in musts if rid in anchored)
    others = sorted(rid for rid in anchored if rid in known and rid not in musts)
    files = len({anchor.path for anchor in found.anchors})
    summary = (f"{covered} of {len(musts)} MUSTs anchored at {places} places in {files} files of {PACKAGE}/; "
               f"{len(others)} SHOULD/MAY anchored")
    return Audit(problems, summary, found)
