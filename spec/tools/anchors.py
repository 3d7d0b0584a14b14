"""Implementation anchors: where in ``reference/`` each requirement is enforced.

An anchor is a line comment ``# req: ID`` or ``# req: ID1, ID2``, optionally followed by `` -- a short note``, on or
directly above the line(s) of ``reference/**/*.py`` that enforce the requirements it names (the check, the SQL, the
branch, the table lookup). Comment lines may sit between an anchor and its code; a blank line may not, and the code
must not be an import. So ``grep -rn 'req: AUTH-BEARER' reference/`` ends at the code that refuses the request.

The scan reads files as text (``tokenize`` finds the comments, so a ``# req:`` inside a string is not an anchor) and
imports nothing from ``reference`` or ``conformance``. It reports every MUST of spec/requirements.yaml without an
anchor, every anchor naming an id the registry does not have, and every comment that looks like an anchor but does not
follow the format, or that is attached to no code.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import spec as spec_pkg

#: the tree whose anchors count, relative to the repository root
PACKAGE = "reference"
REQUIREMENT_ID = r"[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+"
ANCHOR = re.compile(rf"# req: (?P<ids>{REQUIREMENT_ID}(?:, {REQUIREMENT_ID})*)(?: -- (?P<note>\S.*))?")
#: a comment meant as an anchor: ``req`` as the comment's first word, in any case or spacing
LOOKS_LIKE_ANCHOR = re.compile(r"#\s*req\b", re.IGNORECASE)
IMPORT = re.compile(r"(?:import|from)\s")


@dataclass(frozen=True)
class Anchor:
    """One anchor comment: the file (relative to the repository root, POSIX), its line and the ids it names."""

    path: str
    line: int
    ids: tuple[str, ...]
    note: str | None = None


@dataclass
class Scan:
    """The anchors of a tree and the comments that look like anchors but are not well-formed."""

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


def scan_source(source: str, path: str) -> Scan:
    """The anchors of one file's text; ``path`` is how findings name the file."""
    result = Scan()
    lines = source.splitlines()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        result.malformed.append(f"{path}: cannot be tokenized ({exc})")
        return result
    for token in tokens:
        if token.type != tokenize.COMMENT or not LOOKS_LIKE_ANCHOR.match(token.string):
            continue
        row = token.start[0]
        where = f"{path}:{row}"
        match = ANCHOR.fullmatch(token.string.rstrip())
        if match is None:
            result.malformed.append(f"{where}: malformed anchor {token.string.strip()!r} (the format is "
                                    "`# req: ID[, ID...] [-- note]`)")
            continue
        code = _anchored_code(lines, row, inline=token.start[1] > 0 and lines[row - 1][:token.start[1]].strip() != "")
        if code is None:
            result.malformed.append(f"{where}: anchor {token.string.strip()!r} is attached to no code (put it on or "
                                    "directly above the line that enforces the requirement)")
            continue
        if IMPORT.match(code):
            result.malformed.append(f"{where}: anchor {token.string.strip()!r} sits on an import, not on the code "
                                    "that enforces the requirement")
            continue
        ids = tuple(match["ids"].split(", "))
        result.anchors.append(Anchor(path, row, ids, match["note"]))
    return result


def _anchored_code(lines: list[str], row: int, inline: bool) -> str | None:
    """The code an anchor on line ``row`` (1-based) belongs to: its own line's, or the next line that is not a
    comment, if no blank line comes first."""
    if inline:
        return lines[row - 1].strip()
    for text in lines[row:]:
        stripped = text.strip()
        if not stripped:
            return None
        if not stripped.startswith("#"):
            return stripped
    return None


def scan(repo_root: Path, package: str = PACKAGE) -> Scan:
    """The anchors of every ``*.py`` file under ``repo_root / package``."""
    result = Scan()
    for file in sorted((repo_root / package).rglob("*.py")):
        if "__pycache__" in file.parts:
            continue
        found = scan_source(file.read_text(encoding="utf-8"), file.relative_to(repo_root).as_posix())
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
