"""`meshd spec diagrams`: STATE_MACHINES.md is generated from the tables, stays current, and keeps hand-written text."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import spec as spec_pkg
from reference.cli import main as meshd
from spec.decision import DecisionTable
from spec.tools import diagrams

EDGE = re.compile(r"^\s+(?P<source>\S+) --> (?P<target>\S+)(?: : (?P<label>.+))?$")


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "spec"
    shutil.copytree(spec_pkg.SPEC_DIR, root,
                    ignore=shutil.ignore_patterns("__pycache__", "tools", "vectors", "model", "schemas"))
    return root


def edit_table(spec_dir: Path, name: str, change: Callable[[Any], Any]) -> None:
    path = spec_dir / "tables" / f"{name}.yaml"
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), encoding="utf-8")


def block(text: str, table_id: str) -> str:
    match = re.search(rf"<!-- BEGIN GENERATED: {table_id} -->\n(.*?)<!-- END GENERATED: {table_id} -->", text, re.S)
    assert match, f"no block for {table_id}"
    return match[1]


def state_edges(text: str) -> dict[tuple[str, str], set[str]]:
    mermaid = block(text, "outbox").split("```mermaid\n", 1)[1].split("```", 1)[0]
    edges: dict[tuple[str, str], set[str]] = {}
    for line in mermaid.splitlines():
        if match := EDGE.match(line):
            labels = set(match["label"].split(" / ")) if match["label"] else set()
            edges.setdefault((match["source"], match["target"]), set()).update(labels)
    return edges


def test_render_is_deterministic(tree):
    assert diagrams.render(spec_pkg.SPEC_DIR) == diagrams.render(spec_pkg.SPEC_DIR)
    (tree / diagrams.TARGET).unlink()
    first = diagrams.render(tree)
    assert first == diagrams.render(tree)
    (tree / diagrams.TARGET).write_text(first, encoding="utf-8")
    assert diagrams.render(tree) == first  # regenerating a generated file is a fixed point


def test_committed_state_machines_md_is_current():
    assert diagrams.problems(spec_pkg.SPEC_DIR) == []


def test_check_passes_on_the_real_tree(capsys):
    assert meshd(["spec", "diagrams", "--check"]) == 0


def test_changed_row_names_its_table(tree, capsys):
    def change(document):
        next(r for r in document["rows"] if r["id"] == "IPC-DEAD-MATCH")["then"]["http_status"] = 410

    edit_table(tree, "ipc_lookup", change)
    found = diagrams.problems(tree)
    assert len(found) == 1, found
    assert "ipc_lookup" in found[0] and "stale" in found[0]
    assert diagrams.cli(["--check", "--spec-dir", str(tree)]) == 1
    assert "ipc_lookup" in capsys.readouterr().out


def test_changed_outbox_transition_names_outbox(tree):
    def change(document):
        next(r for r in document["rows"] if r["id"] == "OB-INFLIGHT-CONFLICT")["then"]["to"] = "pending"

    edit_table(tree, "outbox", change)
    found = diagrams.problems(tree)
    assert len(found) == 1 and "table outbox" in found[0], found


def test_missing_file_is_a_problem(tree):
    (tree / diagrams.TARGET).unlink()
    assert diagrams.problems(tree) == [f"{diagrams.TARGET}: missing (run `meshd spec diagrams`)"]


def test_hand_written_text_survives_regeneration(tree, capsys):
    path = tree / diagrams.TARGET
    text = path.read_text(encoding="utf-8")
    note_top = "A hand-written note at the top, kept across runs."
    note_between = "> Operator note: requeue is the only way out of `dead`."
    text = text.replace("## ", f"{note_top}\n\n## ", 1)
    text = text.replace("<!-- END GENERATED: outbox -->\n", f"<!-- END GENERATED: outbox -->\n\n{note_between}\n", 1)
    path.write_text(text, encoding="utf-8")
    assert diagrams.problems(tree) == []  # notes outside the markers are not staleness

    edit_table(tree, "outbox", lambda d: d["inputs"]["event"].append("heartbeat") or d["rows"].append(
        {"id": "OB-ANY-HEARTBEAT", "when": {"state": "pending", "event": "heartbeat"},
         "then": {"outcome": "transition", "to": "pending", "effects": []}}))
    edit_table(tree, "outbox", lambda d: d["rows"].append(
        {"id": "OB-OTHER-HEARTBEAT", "when": {"state": ["none", "inflight", "done", "dead", "aborted"],
                                              "event": "heartbeat"},
         "then": {"outcome": "ignore", "reason": "fixture"}}))
    assert diagrams.problems(tree) != []
    assert diagrams.cli(["--spec-dir", str(tree)]) == 0
    regenerated = path.read_text(encoding="utf-8")
    assert note_top in regenerated and note_between in regenerated
    assert "pending --> pending : heartbeat" in block(regenerated, "outbox")
    assert diagrams.problems(tree) == []


def test_new_table_gets_a_section_and_a_removed_table_loses_its_block(tree):
    source = yaml.safe_load((tree / "tables" / "ipc_lookup.yaml").read_text(encoding="utf-8"))
    source["id"] = "fixture_lookup"
    (tree / "tables" / "fixture_lookup.yaml").write_text(yaml.safe_dump(source, sort_keys=False), encoding="utf-8")
    (tree / "tables" / "broker_accept.yaml").unlink()
    assert any("fixture_lookup" in p for p in diagrams.problems(tree))
    assert any("broker_accept" in p for p in diagrams.problems(tree))
    rendered = diagrams.render(tree)
    assert "<!-- BEGIN GENERATED: fixture_lookup -->" in rendered
    assert "BEGIN GENERATED: broker_accept" not in rendered
    assert rendered.index("GENERATED: ipc_lookup") < rendered.index("GENERATED: fixture_lookup")


def test_every_outbox_transition_row_is_an_edge_label():
    text = (spec_pkg.SPEC_DIR / diagrams.TARGET).read_text(encoding="utf-8")
    edges = state_edges(text)
    table = DecisionTable(spec_pkg.load_table("outbox"))
    drawn = 0
    for row in table.rows:
        if row.then["outcome"] != "transition":
            continue
        for combo in table.combinations():
            if row.matches(combo):
                source = "[*]" if combo["state"] == "none" else combo["state"]
                assert combo["event"] in edges.get((source, row.then["to"]), set()), (row.id, combo)
                drawn += 1
    assert drawn == sum(len(labels) for (_, target), labels in edges.items() if target != "[*]")
    assert ("[*]", "pending") in edges and edges[("[*]", "pending")] == {"accept"}
    for state, meta in spec_pkg.load_table("outbox")["states"].items():
        if meta["terminal"]:
            assert (state, "[*]") in edges


def test_outbox_rejects_are_listed_and_quiet_rows_are_not_drawn():
    text = block((spec_pkg.SPEC_DIR / diagrams.TARGET).read_text(encoding="utf-8"), "outbox")
    document = spec_pkg.load_table("outbox")
    for row in document["rows"]:
        if row["then"]["outcome"] == "reject":
            assert f"`{row['then']['error']}` | `{row['id']}` |" in text
    edges = state_edges(f"<!-- BEGIN GENERATED: outbox -->\n{text}<!-- END GENERATED: outbox -->")
    assert not any(source == "done" and target != "[*]" for source, target in edges)


@pytest.mark.parametrize("table_id", ["ipc_lookup", "broker_accept"])
def test_flowcharts_have_one_leaf_per_row(table_id):
    text = block((spec_pkg.SPEC_DIR / diagrams.TARGET).read_text(encoding="utf-8"), table_id)
    assert "```mermaid\nflowchart " in text
    for row in spec_pkg.load_table(table_id)["rows"]:
        node = row["id"].replace("-", "_")
        leaf = rf'^\s+{node}\["{re.escape(row["id"])}<br/>{row["then"]["http_status"]}'
        assert re.search(leaf, text, re.M), row["id"]
        assert f"| `{row['id']}` |" in text


def test_broker_flowchart_follows_the_phases():
    text = block((spec_pkg.SPEC_DIR / diagrams.TARGET).read_text(encoding="utf-8"), "broker_accept")
    assert "flowchart TD" in text
    asks = dict(re.findall(r'^\s+(q\d+)\{"(\w+):', text, re.M))
    edges = {(asks.get(a, a), label, asks.get(b, b))
             for a, label, b in re.findall(r"^\s+(\S+) -->\|([^|]+)\| (\S+)$", text, re.M)}
    assert list(asks.values()) == ["b1", "drift", "claim", "b2", "commit", "fingerprint"]
    assert edges == {
        ("b1", "ok", "drift"), ("b1", "rejected", "BRK_B1_REJECT"),
        ("drift", "same", "claim"), ("drift", "differs", "BRK_DRIFT"),
        ("claim", "ours", "b2"), ("claim", "theirs", "fingerprint"),
        ("fingerprint", "match", "BRK_DUP_MATCH"), ("fingerprint", "mismatch", "BRK_DUP_MISMATCH"),
        ("b2", "ok", "commit"), ("b2", "rejected", "BRK_B2_REJECT"),
        ("commit", "ok", "BRK_ACCEPT"), ("commit", "failed", "BRK_COMMIT_FAIL"),
    }
