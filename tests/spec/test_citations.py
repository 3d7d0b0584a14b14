"""Every `cite` of spec/requirements.yaml is verbatim text of the round and section it names.

The rounds live in the upstream repository (alezmad/claudemesh, `.artifacts/specs/` at the v0.9.0 commit), not here:
set MESHSPEC_UPSTREAM_REPO to a clone (or a bare mirror) of it to check the citations; without it that test is
skipped. "Verbatim" means: equal after collapsing whitespace and dropping blockquote markers, with `…` standing for
left-out text; the pieces appear in order, each inside one of the named sections (a section includes its
subsections). The matcher itself is tested on a sample round below.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import spec as spec_pkg

UPSTREAM_COMMIT = "abaa4bcf872068b0d4cb36d740e5612dba7ecd71"
SPECS = ".artifacts/specs"
ROUND_FILES = {"v0.9.0": "2026-05-03-daemon-spec-v0.9.0.md", "v1": "2026-05-03-daemon-final-spec.md",
               **{f"v{n}": f"2026-05-03-daemon-final-spec-v{n}.md" for n in range(2, 11)}}
HEADING = re.compile(r"^(#{1,6})\s+(\d+(?:-\d+)?(?:\.\d+)*[a-z]?)\.?\s")


def _normal(text: str) -> str:
    return " ".join(text.split())


def sections(markdown: str) -> dict[str, tuple[int, str]]:
    """Section number -> (its heading's line, its text up to the next heading of its level or above, normalised)."""
    lines = [re.sub(r"^>\s?", "", line) for line in markdown.splitlines()]
    headings, fenced = [], False
    for number, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            headings.append((number, len(match[1]), match[2]))
    found: dict[str, tuple[int, str]] = {}
    for n, (start, level, key) in enumerate(headings):
        end = next((line for line, lvl, _ in headings[n + 1:] if lvl <= level), len(lines))
        found.setdefault(key, (start, _normal("\n".join(lines[start:end]))))
    return found


def cite_problem(ref: str, text: str, read_round) -> str | None:
    """None when ``text`` is verbatim in the sections ``ref`` names, else what is wrong."""
    round_name, _, rest = ref.partition(" ")
    wanted = [part.strip().removeprefix("§") for part in rest.split(",")]
    available = sections(read_round(round_name))
    missing = [s for s in wanted if s not in available]
    if missing:
        return f"{round_name} has no section {', '.join(missing)}"
    ordered = sorted(wanted, key=lambda s: available[s][0])
    index, position = 0, 0
    for piece in (_normal(p) for p in text.split("…")):
        if not piece:
            continue
        while index < len(ordered):
            found = available[ordered[index]][1].find(piece, position)
            if found >= 0:
                position = found + len(piece)
                break
            index, position = index + 1, 0
        else:
            return f"not found (in order) in {ref}: {piece[:80]!r}"
    return None


SAMPLE = """# Round
## 3. IPC surface
### 3.3 Auth
> `Host` header must be `localhost`
> or empty. Else 403.
### 3.4 Limits
```
# not a heading
```
- Max in-flight IPC requests: **64**.
## 4. Delivery
### 4.5b Broker duplicate response
First insert answers 201.
"""


def _sample(_round: str) -> str:
    return SAMPLE


def test_matcher_accepts_verbatim_text_across_lines_quotes_and_sections():
    assert cite_problem("v9 §3.3", "`Host` header must be `localhost` or empty. Else 403.", _sample) is None
    assert cite_problem("v9 §3", "must be `localhost` … Max in-flight IPC requests: **64**.", _sample) is None
    assert cite_problem("v9 §3.3, §4.5b", "Else 403. … First insert answers 201.", _sample) is None


def test_matcher_refuses_paraphrase_wrong_section_and_wrong_order():
    assert cite_problem("v9 §3.3", "Host must be localhost", _sample).startswith("not found")
    assert cite_problem("v9 §3.4", "Else 403.", _sample).startswith("not found")
    assert cite_problem("v9 §3", "Max in-flight … Else 403.", _sample).startswith("not found")
    assert cite_problem("v9 §3.9", "Else 403.", _sample) == "v9 has no section 3.9"


def test_a_heading_inside_a_code_fence_is_no_section():
    assert "not" not in " ".join(sections(SAMPLE))


@pytest.mark.skipif(not os.environ.get("MESHSPEC_UPSTREAM_REPO"),
                    reason="set MESHSPEC_UPSTREAM_REPO to a clone of alezmad/claudemesh to check the citations")
def test_every_cite_is_verbatim_upstream():
    repo = Path(os.environ["MESHSPEC_UPSTREAM_REPO"])
    cache: dict[str, str] = {}

    def read_round(name: str) -> str:
        if name not in cache:
            cache[name] = subprocess.run(
                ["git", "-C", str(repo), "show", f"{UPSTREAM_COMMIT}:{SPECS}/{ROUND_FILES[name]}"],
                check=True, capture_output=True, text=True).stdout
        return cache[name]

    registry = spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]
    problems = [f"{r['id']}: {p}" for r in registry if "cite" in r
                if (p := cite_problem(r["cite"]["ref"], r["cite"]["text"], read_round))]
    assert problems == []
