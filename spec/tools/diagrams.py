"""Render the decision tables as Mermaid diagrams into spec/STATE_MACHINES.md (`meshd spec diagrams [--check]`).

Rules of this file: the diagrams are drawn from ``spec/tables/*.yaml`` and from nothing else, so they cannot drift
from the tables the core runs on. Each decision table owns one block of the Markdown file, between
``<!-- BEGIN GENERATED: <table id> -->`` and ``<!-- END GENERATED: <table id> -->``; regeneration rewrites only those
blocks and keeps every other line of the file (headings, notes) as it is. A new table gets a new section at the end;
the block of a table that no longer exists is dropped.

* A state machine (inputs ``state`` and ``event``, rows with an ``outcome``) becomes a ``stateDiagram-v2``: the
  ``none`` state is the initial pseudo-state ``[*]``; every ``transition`` pair is an edge, and events that share an
  edge share its label; terminal states lead to ``[*]``; ``ignore`` and ``impossible`` rows are not drawn and
  ``reject`` rows are listed in a table under the diagram.
* Any other decision table becomes a ``flowchart``: a decision tree that asks the inputs in declaration order,
  skipping an input wherever its value cannot change the outcome, down to one leaf per row, followed by the rows as
  a Markdown table.

Output is a pure function of the tables (domain and row order), so ``--check`` can compare it byte for byte.
"""

from __future__ import annotations

import argparse
import itertools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import spec as spec_pkg
from spec.decision import DecisionTable

__all__ = ["TARGET", "blocks", "cli", "problems", "render"]

TARGET = "STATE_MACHINES.md"
ORDER = ("outbox", "hook_runs", "ipc_lookup", "broker_accept")
INITIAL_STATE = "none"
BLOCK = re.compile(
    r"<!-- BEGIN GENERATED: (?P<id>[A-Za-z0-9_.-]+) -->\n(?P<body>.*?)<!-- END GENERATED: (?P=id) -->\n?", re.S
)
DIRECTION = {"ipc_lookup": "LR"}
QUESTIONS = {
    ("ipc_lookup", "row_state"): "outbox row for this client_message_id",
    ("ipc_lookup", "fingerprint"): "stored fingerprint vs this request",
    ("broker_accept", "b1"): "B1 validation, before any write",
    ("broker_accept", "drift"): "drift check: claimed vs recomputed fingerprint",
    ("broker_accept", "claim"): "dedupe claim: whose row is read back?",
    ("broker_accept", "fingerprint"): "stored fingerprint vs this request",
    ("broker_accept", "b2"): "B2 destination checks, in the transaction",
    ("broker_accept", "commit"): "side-effect inserts and COMMIT",
}
INTRO = """\
# State machines and decision tables

The diagrams below are generated from the decision tables in [`spec/tables/`](tables/) by `meshd spec diagrams`. The
tables are the source of truth: the reference core, the model checker and the conformance oracle read the same files.
Text between a `BEGIN GENERATED` and an `END GENERATED` marker is rewritten on every run; everything outside the
markers, like this paragraph, is kept, so notes can be added anywhere else. `meshd spec diagrams --check` (and
`meshd spec check`) fails, naming the table, when a block no longer matches its table.
"""


# --- loading ----------------------------------------------------------------------------------------------------


def _decision_tables(spec_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((spec_dir / "tables").glob("*.yaml")):
        document = spec_pkg.load_yaml(path)
        if isinstance(document, dict) and document.get("kind") == "decision":
            found.append(document)
    rank = {name: index for index, name in enumerate(ORDER)}
    return sorted(found, key=lambda d: (rank.get(d["id"], len(ORDER)), d["id"]))


# --- Markdown helpers -------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|")


def _when(cell: frozenset[str] | None, domain: tuple[str, ...]) -> str:
    if cell is None:
        return "*"
    return ", ".join(v for v in domain if v in cell)


def _label(text: str) -> str:
    """Text inside a quoted Mermaid label."""
    return text.replace('"', "#quot;")


def _node_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _source(document: Mapping[str, Any]) -> str:
    return (f"Generated from [`tables/{document['id']}.yaml`](tables/{document['id']}.yaml) "
            f"(§{document.get('section', '?')}, *{document.get('title', document['id'])}*).")


# --- state machines ---------------------------------------------------------------------------------------------


def _is_state_machine(table: DecisionTable) -> bool:
    return list(table.inputs) == ["state", "event"] and all("outcome" in row.then for row in table.rows)


def _state_machine(document: Mapping[str, Any], table: DecisionTable) -> str:
    states, events = table.inputs["state"], table.inputs["event"]
    edges: dict[tuple[str, str], list[str]] = {}
    rejects: list[tuple[str, str, str, str]] = []
    skipped: dict[str, int] = {}
    for row in table.rows:
        pairs = [(s, e) for s in states for e in events if row.matches({"state": s, "event": e})]
        outcome = row.then["outcome"]
        if outcome == "transition":
            for state, event in pairs:
                edges.setdefault((state, row.then["to"]), []).append(event)
        elif outcome == "reject":
            rejects.extend((state, event, row.then.get("error", ""), row.id) for state, event in pairs)
        else:
            skipped[outcome] = skipped.get(outcome, 0) + len(pairs)

    def name(state: str) -> str:
        return "[*]" if state == INITIAL_STATE else state

    rank = {s: i for i, s in enumerate(states)}
    lines = ["```mermaid", "stateDiagram-v2"]
    for (source, target), labels in sorted(edges.items(), key=lambda item: (rank[item[0][0]], rank[item[0][1]])):
        ordered = sorted(set(labels), key=events.index)
        lines.append(f"    {name(source)} --> {name(target)} : {' / '.join(ordered)}")
    declared = document.get("states") or {}
    for state in states:
        if isinstance(declared.get(state), Mapping) and declared[state].get("terminal"):
            lines.append(f"    {state} --> [*]")
    lines.append("```")
    body = [_source(document), "", *lines, ""]
    if skipped:
        counts = " and ".join(f"{n} `{outcome}` pairs" for outcome, n in sorted(skipped.items()))
        body += [f"Not drawn: {counts} (they change nothing; see the table).", ""]
    if rejects:
        rank_event = {e: i for i, e in enumerate(events)}
        body += ["Refused requests (`reject` rows; nothing changes):", "",
                 "| State | Event | Error | Row |", "|---|---|---|---|"]
        for state, event, error, row_id in sorted(rejects, key=lambda r: (rank[r[0]], rank_event[r[1]])):
            body.append(f"| {state} | {event} | `{error}` | `{row_id}` |")
        body.append("")
    return "\n".join(body)


# --- decision trees ---------------------------------------------------------------------------------------------


def _outcome(table: DecisionTable, combo: Mapping[str, str]) -> str:
    rows = table.matching(combo)
    if len(rows) == 1:
        return rows[0].id
    return "no row" if not rows else "ambiguous: " + ", ".join(r.id for r in rows)


def _completions(table: DecisionTable, known: Mapping[str, str], skip: str = "") -> list[dict[str, str]]:
    unknown = [n for n in table.inputs if n not in known and n != skip]
    return [{**known, **dict(zip(unknown, values, strict=True))}
            for values in itertools.product(*(table.inputs[n] for n in unknown))]


def _matters(table: DecisionTable, known: Mapping[str, str], name: str) -> bool:
    for combo in _completions(table, known, skip=name):
        if len({_outcome(table, {**combo, name: value}) for value in table.inputs[name]}) > 1:
            return True
    return False


def _tree(table: DecisionTable, known: dict[str, str]) -> tuple:
    """``("leaf", row id)`` or ``("ask", input, ((values, subtree), ...))``: the table as a decision tree."""
    outcomes = {_outcome(table, combo) for combo in _completions(table, known)}
    if len(outcomes) == 1:
        return ("leaf", outcomes.pop())
    name = next(n for n in table.inputs if n not in known and _matters(table, known, n))
    branches: dict[tuple, list[str]] = {}
    for value in table.inputs[name]:
        branches.setdefault(_tree(table, {**known, name: value}), []).append(value)
    return ("ask", name, tuple((tuple(values), subtree) for subtree, values in branches.items()))


def _leaf_label(row_id: str, table: DecisionTable) -> str:
    row = next((r for r in table.rows if r.id == row_id), None)
    if row is None:
        return row_id
    then = row.then
    headline = " ".join(str(then[k]) for k in ("http_status", "status", "conflict") if k in then)
    if then.get("duplicate") is True:
        headline += " duplicate"
    parts = [row_id, headline] if headline else [row_id]
    if "transaction" in then:
        parts.append(f"transaction: {then['transaction']}")
    return "<br/>".join(_label(p) for p in parts)


def _flowchart(document: Mapping[str, Any], table: DecisionTable) -> str:
    lines = ["```mermaid", f"flowchart {DIRECTION.get(table.id, 'TD')}"]
    leaves: dict[str, str] = {}
    questions: dict[int, str] = {}
    counter = itertools.count(1)

    def number(node: tuple) -> None:
        """Number the questions in pre-order, the order they are drawn in."""
        if node[0] == "ask":
            questions[id(node)] = f"q{next(counter)}"
            for _, subtree in node[2]:
                number(subtree)

    def node_id(node: tuple) -> str:
        if node[0] == "leaf":
            return leaves.setdefault(node[1], _node_id(node[1]))
        return questions[id(node)]

    def draw(node: tuple) -> None:
        """Declare a question and its edges, then each question below it (top-down, in domain order)."""
        _, name, branches = node
        question = QUESTIONS.get((table.id, name))
        text = f"{name}: {question}" if question else name
        lines.append(f'    {node_id(node)}{{"{_label(text)}"}}')
        for values, subtree in branches:
            lines.append(f"    {node_id(node)} -->|{' / '.join(values)}| {node_id(subtree)}")
        for _, subtree in branches:
            if subtree[0] == "ask":
                draw(subtree)

    root = _tree(table, {})
    number(root)
    if root[0] == "ask":
        draw(root)
    else:
        node_id(root)
    for row_id, node_id in leaves.items():
        lines.append(f'    {node_id}["{_leaf_label(row_id, table)}"]')
    lines.append("```")
    return "\n".join([_source(document), "", *lines, "", _rows_table(table), ""])


def _rows_table(table: DecisionTable) -> str:
    outcome_keys: list[str] = []
    for row in table.rows:
        outcome_keys += [k for k in row.then if k not in outcome_keys]
    header = ["Row", *table.inputs, *outcome_keys, "Requirements"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.rows:
        cells = [f"`{row.id}`", *(_when(row.when[n], table.inputs[n]) for n in table.inputs),
                 *(_cell(row.then.get(k)) for k in outcome_keys), ", ".join(row.requirements)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the document -----------------------------------------------------------------------------------------------


def _body(document: Mapping[str, Any]) -> str:
    table = DecisionTable(document)
    if _is_state_machine(table):
        return _state_machine(document, table)
    return _flowchart(document, table)


def blocks(spec_dir: Path = spec_pkg.SPEC_DIR) -> dict[str, str]:
    """The generated text of each decision table's block, by table id, in document order."""
    return {document["id"]: _body(document) for document in _decision_tables(spec_dir)}


def _block(table_id: str, body: str) -> str:
    return f"<!-- BEGIN GENERATED: {table_id} -->\n{body}<!-- END GENERATED: {table_id} -->\n"


def _section(document: Mapping[str, Any], body: str) -> str:
    heading = f"## {document.get('title', document['id'])} — `{document['id']}` (§{document.get('section', '?')})"
    return f"{heading}\n\n{_block(document['id'], body)}"


def render(spec_dir: Path = spec_pkg.SPEC_DIR) -> str:
    """The whole STATE_MACHINES.md: the current file with every generated block brought up to date."""
    documents = {d["id"]: d for d in _decision_tables(spec_dir)}
    generated = {table_id: _body(document) for table_id, document in documents.items()}
    path = spec_dir / TARGET
    text = path.read_text(encoding="utf-8") if path.exists() else INTRO
    present: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        table_id = match["id"]
        if table_id not in generated or table_id in present:
            return ""
        present.add(table_id)
        return _block(table_id, generated[table_id])

    text = BLOCK.sub(replace, text)
    for table_id, document in documents.items():
        if table_id not in present:
            text = text.rstrip("\n") + "\n\n" + _section(document, generated[table_id])
    return text.rstrip("\n") + "\n"


def problems(spec_dir: Path = spec_pkg.SPEC_DIR) -> list[str]:
    """Empty when STATE_MACHINES.md equals what ``render`` produces; otherwise names each stale table's block."""
    path = spec_dir / TARGET
    hint = "run `meshd spec diagrams`"
    if not path.exists():
        return [f"{TARGET}: missing ({hint})"]
    current = path.read_text(encoding="utf-8")
    found = {m["id"]: m["body"] for m in BLOCK.finditer(current)}
    expected = blocks(spec_dir)
    issues = []
    for table_id, body in expected.items():
        if table_id not in found:
            issues.append(f"{TARGET}: no diagram block for table {table_id} ({hint})")
        elif found[table_id] != body:
            issues.append(f"{TARGET}: diagram for table {table_id} is stale (tables/{table_id}.yaml changed; {hint})")
    for table_id in found:
        if table_id not in expected:
            issues.append(f"{TARGET}: block {table_id} names no decision table ({hint})")
    if not issues and current != render(spec_dir):
        issues.append(f"{TARGET}: stale ({hint})")
    return issues


def cli(argv: list[str]) -> int:
    """`meshd spec diagrams [--check]`: write STATE_MACHINES.md, or with --check exit 1 naming stale blocks."""
    parser = argparse.ArgumentParser(prog="meshd spec diagrams", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"only report whether {TARGET} is current")
    parser.add_argument("--spec-dir", type=Path, default=spec_pkg.SPEC_DIR)
    args = parser.parse_args(argv)
    spec_dir = args.spec_dir.resolve()
    if args.check:
        found = problems(spec_dir)
        for problem in found:
            print(problem)
        return 1 if found else 0
    target = spec_dir / TARGET
    target.write_text(render(spec_dir), encoding="utf-8")
    print(f"wrote {target}")
    return 0
