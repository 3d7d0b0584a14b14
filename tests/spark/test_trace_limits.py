"""The trace checks' limits (spec/tables/limits.yaml, ``applies_to: [trace_check]``, E-52), enforced alike by every
engine: the line limits are held at their boundaries by the malformed fixtures (``nesting_64``/``nesting_65``,
``mesh_100_digit_number``/``mesh_101_digit_number``, test_validation.py); the node limit here.

The full-size cases build a Parquet trace of ``trace_nodes_max`` (2^19) nodes and of one more, so they are `slow`
(CI runs them in ``make slow-bounded``); the fast cases hold the engines' refusal to the count and the Spark event
reference to the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_checks import format as fmt
from spark_checks import validity
from spark_checks.cli import main as meshtrace
from spark_checks.spark import SEQ_BITS
from spec import SPEC_DIR, load_table

LIMITS = load_table("limits")["limits"]
MAX_NODES = LIMITS["trace_nodes_max"]["value"]
SEQ_MAX = json.loads((SPEC_DIR / "schemas" / "trace" / "sse_event.json").read_text())["properties"]["seq"]["maximum"]
ENGINES = ("oracle", "duckdb", pytest.param("spark", marks=pytest.mark.spark))


def test_the_engines_load_the_trace_limits_from_the_table():
    loaded = (validity.MAX_CONTAINERS, validity.MAX_DIGITS, validity.MAX_NODES)
    assert loaded == (LIMITS["trace_line_containers_max"]["value"], LIMITS["trace_line_digits_max"]["value"], MAX_NODES)
    assert validity.REASONS["nesting"].startswith(f"more than {validity.MAX_CONTAINERS} objects")
    assert f"more than {validity.MAX_DIGITS} digits" in validity.REASONS["long_number"]


def test_the_spark_event_reference_holds_every_node_and_seq_the_limits_allow():
    """(node index << SEQ_BITS) | seq is a non-negative long for node indexes below trace_nodes_max and every seq
    the schemas allow, and no bit is shared: the largest reference is exactly 2^63 - 1."""
    assert SEQ_MAX == (1 << SEQ_BITS) - 1
    assert ((MAX_NODES - 1) << SEQ_BITS) | SEQ_MAX == (1 << 63) - 1
    for name in ("accept_commit", "delivery", "outbox_transition", "inbox_insert", "hook_run"):
        schema = json.loads((SPEC_DIR / "schemas" / "trace" / f"{name}.json").read_text())
        assert schema["properties"]["seq"]["maximum"] == SEQ_MAX, name


def _nodes_trace(root: Path, nodes: int) -> Path:
    """A Parquet trace of ``nodes`` nodes with one event each (at the largest seq but one), and on the last node (its
    index the largest) a second event, at the largest seq, whose event_id does not increase: TRC-EVENT-IDS-MONOTONIC
    names it by (node, seq). Built as columns (a row per dict would take most of the test's time)."""
    names = [f"n{k:07d}" for k in range(nodes)] + [f"n{nodes - 1:07d}"]
    count = nodes + 1
    given = {"v": pa.array([1] * count, pa.int8()), "source": pa.array(["daemon"] * count),
             "node": pa.array(names), "seq": pa.array([SEQ_MAX - 1] * nodes + [SEQ_MAX], pa.int64()),
             "line": pa.array([0] * nodes + [1], pa.int64()),
             "ts_ms": pa.array([1_795_549_814_519] * nodes + [1_795_549_814_520], pa.int64()),
             "kind": pa.array(["sse_event"] * count), "event": pa.array(["peer_join"] * nodes + ["peer_leave"]),
             "event_id": pa.array([5] * count, pa.int64())}
    table = pa.table({field.name: given.get(field.name, pa.nulls(count, field.type)) for field in fmt.FLAT_SCHEMA},
                     schema=fmt.FLAT_SCHEMA)
    (root / "bucket=00").mkdir(parents=True)
    pq.write_table(table, str(root / "bucket=00" / "part-0.parquet"), compression="zstd")
    return root


def test_a_node_past_the_limit_is_refused_naming_the_limit(monkeypatch, capsys):
    """Every engine counts the distinct nodes of the valid events and refuses one past the limit (exit 2, no
    report); ``meshtrace validate`` too. The limit is lowered here so the trace is small; the full-size case is
    test_the_node_limit_at_full_size."""
    mesh = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"
    nodes = {json.loads(line)["node"] for path in mesh.glob("*.jsonl") for line in path.read_text().splitlines()}
    monkeypatch.setattr(validity, "MAX_NODES", len(nodes) - 1)
    for engine in ("oracle", "duckdb"):
        assert meshtrace(["check", str(mesh), "--engine", engine]) == 2
        err = capsys.readouterr().err
        assert f"meshtrace check: the trace's valid events name {len(nodes)} nodes; the checks hold at most " \
               f"{len(nodes) - 1} (spec/tables/limits.yaml trace_nodes_max, E-52)" in err, err
        assert "Traceback" not in err
    assert meshtrace(["validate", str(mesh)]) == 2
    assert f"name {len(nodes)} nodes; the checks hold at most {len(nodes) - 1}" in capsys.readouterr().err
    monkeypatch.setattr(validity, "MAX_NODES", len(nodes))
    assert meshtrace(["check", str(mesh), "--engine", "oracle"]) in (0, 1)


@pytest.mark.spark
def test_spark_refuses_a_node_past_the_limit(spark, monkeypatch, capsys):
    monkeypatch.setattr(validity, "MAX_NODES", 2)
    mesh = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"
    assert meshtrace(["check", str(mesh), "--engine", "spark", "--master", "local[2]"]) == 2
    err = capsys.readouterr().err
    assert "name 3 nodes; the checks hold at most 2 (spec/tables/limits.yaml trace_nodes_max, E-52)" in err, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def full_size(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("nodes")
    return {n: _nodes_trace(root / str(n), n) for n in (MAX_NODES, MAX_NODES + 1)}


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_the_node_limit_at_full_size(engine: str, full_size: dict[int, Path], request, tmp_path: Path, capsys):
    """trace_nodes_max nodes are checked, the last node (the largest index, at the largest seq) named exactly;
    one node more is refused before any verdict."""
    options = ["--engine", engine]
    if engine == "spark":
        request.getfixturevalue("spark")
        options += ["--master", "local[2]"]
    report = tmp_path / "report.json"
    assert meshtrace(["check", str(full_size[MAX_NODES]), *options, "--report", str(report)]) == 1
    document = json.loads(report.read_text())
    assert document["events"] == MAX_NODES + 1
    [violation] = document["violations"]
    assert violation["invariant"] == "TRC-EVENT-IDS-MONOTONIC"
    assert (violation["event"]["node"], violation["event"]["seq"]) == (f"n{MAX_NODES - 1:07d}", SEQ_MAX)
    assert (violation["related"]["node"], violation["related"]["seq"]) == (f"n{MAX_NODES - 1:07d}", SEQ_MAX - 1)
    capsys.readouterr()
    assert meshtrace(["check", str(full_size[MAX_NODES + 1]), *options]) == 2
    assert f"name {MAX_NODES + 1:,} nodes; the checks hold at most {MAX_NODES:,}" in capsys.readouterr().err
