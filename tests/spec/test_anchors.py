"""Implementation anchors: every MUST names the code that enforces it; the scan names each way an anchor breaks."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
import yaml

import spec as spec_pkg
from spec.tools import anchors

REGISTRY = spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]
MUSTS = [r["id"] for r in REGISTRY if r["level"] == "MUST"]
MISSING = "reference/: MUST {} has no implementation anchor (`# req: {}` at the code that enforces it)"


def repo(tmp_path: Path, files: dict[str, str], requirements: dict[str, str] | None = None) -> Path:
    """A repository root with a registry (id -> level) and ``reference/`` files (path -> source)."""
    levels = requirements or {"FP-ONE": "MUST", "FP-TWO": "MUST", "FP-NICE": "SHOULD"}
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "requirements.yaml").write_text(yaml.safe_dump(
        {"id": "requirements", "requirements": [{"id": rid, "level": level} for rid, level in levels.items()]}))
    for name, source in files.items():
        path = tmp_path / "reference" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return tmp_path


def audit(root: Path) -> anchors.Audit:
    return anchors.audit(root / "spec", root)


def test_the_real_tree_anchors_every_must():
    result = anchors.audit()
    assert result.problems == []
    assert result.summary.startswith(f"{len(MUSTS)} of {len(MUSTS)} MUSTs anchored at ")
    assert set(MUSTS) <= set(result.scan.locations())


def test_the_real_tree_refers_to_what_its_anchors_need_by_name():
    """The hook names the unreferenced-function rule takes as called by a framework are methods the tree defines."""
    sources = [path.read_text(encoding="utf-8") for path in (spec_pkg.SPEC_DIR.parent / "reference").rglob("*.py")]
    methods = {item.name for source in sources for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)
               for item in node.body if isinstance(item, ast.FunctionDef)}
    assert sorted(anchors.FRAMEWORK_HOOKS - methods) == []


def test_the_check_reports_the_anchor_counts(capsys):
    from reference.cli import main as meshd

    assert meshd(["spec", "check"]) == 0
    assert f"anchors: {anchors.audit().summary}\n" in capsys.readouterr().out


def test_a_well_anchored_tree_passes_and_counts_places(tmp_path):
    root = repo(tmp_path, {
        "core.py": """\
            def check(x):
                # req: FP-ONE -- refused before anything is stored
                if x is None:
                    raise ValueError(x)
                return x  # req: FP-TWO, FP-NICE
            """,
        "daemon/cli.py": "from reference.core import check\n\nVALUE = check(1)\n",
        "daemon/app.py": """\
            # req: FP-ONE
            # (a second comment line between an anchor and its code is fine)
            LIMIT = 3
            """,
    })
    result = audit(root)
    assert result.problems == []
    assert result.summary == "2 of 2 MUSTs anchored at 3 places in 2 files of reference/; 1 SHOULD/MAY anchored"
    assert result.scan.anchors == [
        anchors.Anchor("reference/core.py", 2, ("FP-ONE",), "refused before anything is stored"),
        anchors.Anchor("reference/core.py", 5, ("FP-TWO", "FP-NICE")),
        anchors.Anchor("reference/daemon/app.py", 1, ("FP-ONE",)),
    ]
    assert result.scan.locations() == {"FP-ONE": ["reference/core.py", "reference/daemon/app.py"],
                                       "FP-TWO": ["reference/core.py"], "FP-NICE": ["reference/core.py"]}


def test_a_must_without_an_anchor_is_named(tmp_path):
    root = repo(tmp_path, {"core.py": "X = 1  # req: FP-ONE\n"})
    assert audit(root).problems == [MISSING.format("FP-TWO", "FP-TWO")]


def test_a_should_needs_no_anchor(tmp_path):
    root = repo(tmp_path, {"core.py": "X = 1  # req: FP-ONE, FP-TWO\n"})
    assert audit(root).problems == []


def test_an_anchor_naming_an_unknown_id_is_named(tmp_path):
    root = repo(tmp_path, {"core.py": "X = 1  # req: FP-ONE, FP-TWO, FP-GONE\n"})
    assert audit(root).problems == [
        "reference/core.py:1: anchor names FP-GONE, which is not a requirement (spec/requirements.yaml)"]


@pytest.mark.parametrize("comment", [
    "# req FP-ONE",  # no colon
    "# req:FP-ONE",  # no space
    "#req: FP-ONE",  # no space after the hash
    "# Req: FP-ONE",  # capitalised
    "# req: fp-one",  # not an id
    "# req: FP-ONE,FP-TWO",  # no space after the comma
    "# req: FP-ONE FP-TWO",  # no comma
    "# req: FP-ONE,",  # a trailing comma
    "# req: FP-ONE - a note",  # the note needs two dashes
    "# req: FP-ONE --",  # and some text
    "# req:",  # no id at all
    "# noqa # req: FP-ONE",  # not the whole comment
    "# req: FP-ONE  # noqa: E501",  # nor this
    "# see req: FP-ONE",
    "# REQ: FP-ONE",
    "# type: ignore  # req FP-ONE",
])
def test_a_malformed_anchor_is_named_and_counts_for_nothing(tmp_path, comment):
    root = repo(tmp_path, {"core.py": f"X = 1  # req: FP-TWO\nY = 2\n{comment}\nZ = 3\n"})
    assert audit(root).problems == [
        f"reference/core.py:3: malformed anchor {comment!r} (the format is `# req: ID[, ID...] [-- note]`, the whole "
        "comment)",
        MISSING.format("FP-ONE", "FP-ONE"),
    ]


def test_an_anchor_must_sit_on_or_directly_above_code(tmp_path):
    root = repo(tmp_path, {"core.py": """\
        import os

        # req: FP-ONE

        X = os.sep
        # req: FP-TWO
        import sys
        Y = sys.argv
        # req: FP-ONE
        """})
    assert audit(root).problems == [
        "reference/core.py:3: anchor '# req: FP-ONE' is attached to no code (a blank line follows it; put it on or "
        "directly above the line that enforces the requirement)",
        "reference/core.py:6: anchor '# req: FP-TWO' is attached to an import (line 7); put it at the code that "
        "enforces the requirement",
        "reference/core.py:9: anchor '# req: FP-ONE' is attached to no code (nothing follows it; put it on or "
        "directly above the line that enforces the requirement)",
        MISSING.format("FP-ONE", "FP-ONE"),
        MISSING.format("FP-TWO", "FP-TWO"),
    ]


def test_text_in_docstrings_and_strings_is_not_an_anchor(tmp_path):
    root = repo(tmp_path, {"core.py": '''\
        """Module docstring.

        # req: FP-ONE
        """
        TEXT = "# req: FP-TWO"
        '''})
    assert audit(root).problems == [MISSING.format("FP-ONE", "FP-ONE"), MISSING.format("FP-TWO", "FP-TWO")]


def test_a_file_that_cannot_be_tokenized_is_named(tmp_path):
    root = repo(tmp_path, {"core.py": "X = (1,\n# req: FP-ONE\n"})
    problems = audit(root).problems
    assert problems[0].startswith("reference/core.py: cannot be read as Python (")
    assert problems[1:] == [MISSING.format("FP-ONE", "FP-ONE"), MISSING.format("FP-TWO", "FP-TWO")]


def test_without_a_reference_tree_the_audit_says_so(tmp_path):
    root = repo(tmp_path, {})
    where = root.resolve() / "reference"
    assert audit(root).problems == [f"reference/: missing (implementation anchors are read from {where})"]


ANCHOR = "'# req: FP-ONE'"
ONLY_ONE = {"FP-ONE": "MUST"}


def refused(row: int, what: str, line: int) -> list[str]:
    return [f"reference/core.py:{row}: anchor {ANCHOR} is attached to {what} (line {line}); put it at the code that "
            "enforces the requirement", MISSING.format("FP-ONE", "FP-ONE")]


@pytest.mark.parametrize(("source", "row", "what", "line"), [
    ("def check(x):\n    # req: FP-ONE\n    pass\ncheck(1)\n", 2, "`pass`, which does nothing", 3),
    ("def check(x):\n    ...  # req: FP-ONE\ncheck(1)\n", 2, "`...`, which does nothing", 2),
    ("# req: FP-ONE\n'the fingerprint is frozen'\n", 1, "a bare string, which does nothing", 2),
    ("# req: FP-ONE\nf'{LIMIT} frozen'\n", 1, "a bare string, which does nothing", 2),
    ("# req: FP-ONE\nLIMIT\n", 1, "a bare expression, which does nothing", 2),
    ("# req: FP-ONE\nLIMIT == 3 and not LIMIT\n", 1, "a bare expression, which does nothing", 2),
    ("if LIMIT:\n    X = 1\n# req: FP-ONE\nelse:\n    X = 2\n", 3, "`else:`, which only continues a block", 4),
    ("# req: FP-ONE\ntry:\n    X = int(LIMIT)\nexcept ValueError:\n    X = 0\n", 1,
     "`try:`, which only continues a block", 2),
    ("try:\n    X = int(LIMIT)\nfinally:  # req: FP-ONE\n    X = 0\n", 3,
     "`finally:`, which only continues a block", 3),
    ("for x in LIMIT:\n    X = x\nelse:  # req: FP-ONE\n    X = 0\n", 3, "`else:`, which only continues a block", 3),
    ("# req: FP-ONE\ndef check(x):\n    return x\ncheck(1)\n", 1, "the def line of `check`, not code inside it", 2),
    ("def check(x,  # req: FP-ONE\n          y=1):\n    return x\ncheck(1)\n", 1,
     "the def line of `check`, not code inside it", 1),
    ("# req: FP-ONE\nclass Check:\n    X = 1\nCheck()\n", 1, "the class line of `Check`, not code inside it", 2),
    ("def check():\n    global X  # req: FP-ONE\n    X = 1\ncheck()\n", 2, "a declaration, which does nothing", 2),
    ("def on_get(req, resp):\n    raise PermissionError  # req: FP-ONE\n", 2,
     "code in function `on_get`, which nothing in reference/ refers to", 2),
    ("import os\n# req: FP-ONE\nfrom os import sep\nX = os.sep + sep\n", 2, "an import", 3),
    ("if False:\n    # req: FP-ONE\n    raise ValueError(LIMIT)\n", 2, "code under `if False:`, which never runs", 3),
    ("if 0:\n    for x in LIMIT:\n        raise ValueError(x)  # req: FP-ONE\n", 3,
     "code under `if 0:`, which never runs", 3),
    ("import typing\nif typing.TYPE_CHECKING:\n    X = check(LIMIT)  # req: FP-ONE\n", 3,
     "code under `if typing.TYPE_CHECKING:`, which never runs", 3),
    ("while False:\n    X = check(LIMIT)  # req: FP-ONE\n", 2, "code under `while False:`, which never runs", 2),
    ("if True:\n    X = 1\nelse:\n    X = check(LIMIT)  # req: FP-ONE\n", 4,
     "code in the else of `if True:`, which never runs", 4),
    ("def check(x):\n    return x\n    # req: FP-ONE\n    raise ValueError(x)\ncheck(1)\n", 3,
     "code after the `return` on line 2, which never runs", 4),
    ("for x in LIMIT:\n    continue\n    check(x)  # req: FP-ONE\n", 3,
     "code after the `continue` on line 2, which never runs", 3),
    ("EFFECTS = {\n    'insert': lambda row, ev: row,\n    # req: FP-ONE\n    'freeze': lambda row, ev: row,\n}\n", 3,
     "a no-op lambda, which does nothing", 4),
    ("EFFECTS = {\n    'freeze': lambda row: None,  # req: FP-ONE\n}\n", 2, "a no-op lambda, which does nothing", 2),
    ("freeze = lambda row, ev: row  # req: FP-ONE\nfreeze(1, 2)\n", 1, "a no-op lambda, which does nothing", 1),
    # the reviewer's decoy: a function nothing calls, in a module whose only mention of it is commented out
    ('"""Calls _never_called() at start-up."""\n\n\ndef _never_called(token, given):\n'
     '    # req: FP-ONE\n    return hmac.compare_digest(token, given)\n\n# _never_called(TOKEN, header)\n', 5,
     "code in function `_never_called`, which nothing in reference/ refers to", 6),
    ("class Decoy:\n    def on_get(self, req, resp):\n        # req: FP-ONE\n        resp.status = 401\n", 3,
     "code in class `Decoy`, which nothing in reference/ refers to", 4),
    ("class Guard:\n    def check(self, req):\n        raise PermissionError(req)  # req: FP-ONE\nGuard()\n", 3,
     "code in function `check`, which nothing in reference/ refers to", 3),
    ("def outer():\n    def inner():\n        raise PermissionError  # req: FP-ONE\n    return 1\nouter()\n", 3,
     "code in function `inner`, which nothing in reference/ refers to", 3),
    ("@decorate  # req: FP-ONE\ndef _unused(x):\n    return x\n", 1,
     "a decorator of function `_unused`, which nothing in reference/ refers to", 1),
])
def test_an_anchor_on_code_that_does_nothing_or_never_runs_is_refused(tmp_path, source, row, what, line):
    root = repo(tmp_path, {"core.py": source, "other.py": "LIMIT = 3\n"}, ONLY_ONE)
    assert audit(root).problems == refused(row, what, line)


@pytest.mark.parametrize("source", [
    "try:\n    X = int(LIMIT)\n# req: FP-ONE\nexcept ValueError:\n    X = 0\n",
    "if LIMIT:\n    X = 1\n# req: FP-ONE\nelif LIMIT > 3:\n    X = 2\n",
    "for x in LIMIT:  # req: FP-ONE\n    check(x)\n",
    "if LIMIT:\n    X = 1\nelse: raise ValueError(LIMIT)  # req: FP-ONE\n",
    "with open(LIMIT) as handle:  # req: FP-ONE\n    X = handle.read()\n",
    "def check(x):\n    if x is None:\n        return 0\n    # req: FP-ONE\n    raise ValueError(x)\nX = check\n",
    "def check(x):\n    return x\nX = f'{check(1)}'\ndef use():\n    raise ValueError  # req: FP-ONE\nY = [use]\n",
    "EFFECTS = {\n    # req: FP-ONE\n    'dispatch': lambda row, ev: bump(row, attempts=row.attempts + 1),\n}\n",
    "LIMITS = (\n    # req: FP-ONE\n    'ipc_send_body_bytes',\n)\n",
    "SQL = (\n    'UPDATE outbox SET status = ?'\n    # req: FP-ONE\n    ' WHERE status = \\'pending\\''\n)\n",
    "@decorate  # req: FP-ONE\ndef check(x):\n    return x\ncheck(1)\n",
    # names a framework calls: falcon responders and middleware, gunicorn's worker hooks, dunders, __all__
    "class Route:\n    def on_post(self, req, resp):\n        raise PermissionError  # req: FP-ONE\n"
    "ROUTES = [Route()]\n",
    "class Guard:\n    def process_request(self, req, resp):\n        raise PermissionError  # req: FP-ONE\n"
    "MIDDLEWARE = [Guard()]\n",
    "class Worker:\n    def get_thread_pool(self):\n        return pool(2)  # req: FP-ONE\nW = Worker\n",
    "class Token:\n    def __eq__(self, other):\n        return compare(self, other)  # req: FP-ONE\nT = Token\n",
    "__all__ = ['check']\ndef check(x):\n    raise ValueError(x)  # req: FP-ONE\n",
])
def test_an_anchor_on_code_that_runs_and_acts_is_counted(tmp_path, source):
    root = repo(tmp_path, {"core.py": source}, ONLY_ONE)
    assert audit(root).problems == []
    assert [anchor.ids for anchor in audit(root).scan.anchors] == [("FP-ONE",)]


def test_a_function_called_only_from_another_file_is_referred_to(tmp_path):
    guard = "def refuse(req):\n    raise PermissionError(req)  # req: FP-ONE\n"
    (tmp_path / "used").mkdir()
    root = repo(tmp_path / "used", {"daemon/guard.py": guard,
                                    "daemon/app.py": "from .guard import refuse as _refuse\n\n\nROUTES = [_refuse]\n"},
                ONLY_ONE)
    assert audit(root).problems == []
    (tmp_path / "alone").mkdir()
    root = repo(tmp_path / "alone", {"daemon/guard.py": guard,
                                     "daemon/app.py": "# from .guard import refuse\n'refuse'\n"}, ONLY_ONE)
    assert audit(root).problems == [
        "reference/daemon/guard.py:2: anchor '# req: FP-ONE' is attached to code in function `refuse`, which nothing "
        "in reference/ refers to (line 2); put it at the code that enforces the requirement",
        MISSING.format("FP-ONE", "FP-ONE")]


def test_at_most_one_comment_line_may_sit_between_an_anchor_and_its_code(tmp_path):
    root = repo(tmp_path, {"core.py": """\
        # req: FP-ONE
        # the one comment line allowed
        X = check(1)
        # req: FP-TWO
        # an explanation that runs on
        # to a second line
        Y = check(2)
        """})
    assert audit(root).problems == [
        "reference/core.py:4: anchor '# req: FP-TWO' is attached to no code (more than one comment line follows it; "
        "put it on or directly above the line that enforces the requirement)",
        MISSING.format("FP-TWO", "FP-TWO"),
    ]
