"""Implementation anchors: every MUST names the code that enforces it; the scan names each way an anchor breaks."""

from __future__ import annotations

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
])
def test_a_malformed_anchor_is_named_and_counts_for_nothing(tmp_path, comment):
    root = repo(tmp_path, {"core.py": f"X = 1  # req: FP-TWO\nY = 2\n{comment}\nZ = 3\n"})
    assert audit(root).problems == [
        f"reference/core.py:3: malformed anchor {comment!r} (the format is `# req: ID[, ID...] [-- note]`)",
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
        "reference/core.py:3: anchor '# req: FP-ONE' is attached to no code (put it on or directly above the line "
        "that enforces the requirement)",
        "reference/core.py:6: anchor '# req: FP-TWO' sits on an import, not on the code that enforces the "
        "requirement",
        "reference/core.py:9: anchor '# req: FP-ONE' is attached to no code (put it on or directly above the line "
        "that enforces the requirement)",
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
    assert problems[0].startswith("reference/core.py: cannot be tokenized (")
    assert problems[1:] == [MISSING.format("FP-ONE", "FP-ONE"), MISSING.format("FP-TWO", "FP-TWO")]


def test_without_a_reference_tree_the_audit_says_so(tmp_path):
    root = repo(tmp_path, {})
    where = root.resolve() / "reference"
    assert audit(root).problems == [f"reference/: missing (implementation anchors are read from {where})"]
