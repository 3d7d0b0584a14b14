"""`meshtrace` end to end without Spark: generate, check with the oracle and DuckDB, convert, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_checks.catalogue import INJECTIONS, catalogue_markdown
from spark_checks.cli import main as meshtrace


def test_generate_then_check_names_the_injected_violation(tmp_path: Path, capsys):
    out = tmp_path / "t"
    assert meshtrace(["generate", "--events", "4k", "--daemons", "6", "--seed", "3", "--inject", "id_freed",
                      "--fault-rate", "0.2", "--workers", "1", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["events"] == 4_000 and [i["kind"] for i in manifest["injections"]] == ["id_freed"]
    capsys.readouterr()
    for engine in ("oracle", "duckdb"):
        report = tmp_path / f"{engine}.json"
        assert meshtrace(["check", str(out), "--engine", engine, "--report", str(report)]) == 1
        document = json.loads(report.read_text())
        assert [(v["invariant"], v["key"]) for v in document["violations"]] == [
            (INJECTIONS["id_freed"], manifest["injections"][0]["key"])]
        assert "TRC-ID-NEVER-FREED" in capsys.readouterr().out


def test_a_clean_trace_passes_and_converts_to_jsonl_and_back(tmp_path: Path):
    out = tmp_path / "t"
    assert meshtrace(["generate", "--events", "3000", "--daemons", "4", "--workers", "1", "--out", str(out)]) == 0
    assert meshtrace(["check", str(out), "--engine", "oracle"]) == 0
    assert meshtrace(["convert", str(out), "--to", "jsonl", "--out", str(tmp_path / "jsonl")]) == 0
    assert meshtrace(["validate", *map(str, sorted((tmp_path / "jsonl").glob("*.jsonl")))]) == 0
    assert meshtrace(["check", str(tmp_path / "jsonl"), "--engine", "duckdb"]) == 0
    assert meshtrace(["convert", str(tmp_path / "jsonl"), "--out", str(tmp_path / "back")]) == 0
    assert meshtrace(["check", str(tmp_path / "back"), "--engine", "oracle"]) == 0


def test_the_catalogue_command_prints_the_catalogue(capsys):
    assert meshtrace(["catalogue"]) == 0
    assert capsys.readouterr().out.strip() == catalogue_markdown()


@pytest.mark.parametrize("argv, message", [
    (["generate", "--events", "1k", "--daemons", "2", "--inject", "bogus"], "unknown injection kind"),
    (["generate", "--events", "-5", "--daemons", "2"], "events must be at least 1"),
    (["generate", "--events", "1k", "--daemons", "0"], "daemons must be at least 1"),
    (["generate", "--events", "1k", "--daemons", "2", "--fault-rate", "1.5"], "fault_rate must be between 0 and 1"),
    (["check", "{tmp}/nowhere", "--engine", "oracle"], "no such file or directory"),
    (["convert", "{tmp}/nowhere"], "no such file or directory"),
])
def test_bad_input_is_a_clear_error_with_exit_2(tmp_path: Path, capsys, argv: list[str], message: str):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] in ("generate", "convert"):
        argv += ["--out", str(tmp_path / "out")]
    assert meshtrace(argv) == 2
    assert message in capsys.readouterr().err
    assert not list((tmp_path).rglob("*.parquet")), "nothing is written"


def test_an_existing_trace_is_never_overwritten(tmp_path: Path, capsys):
    out = tmp_path / "t"
    argv = ["generate", "--events", "2000", "--daemons", "2", "--workers", "1", "--out", str(out)]
    assert meshtrace(argv) == 0
    before = sorted(p.stat().st_mtime_ns for p in out.rglob("*.parquet"))
    assert meshtrace(argv) == 2
    assert "already holds a trace" in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in out.rglob("*.parquet")) == before


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_a_trace_without_valid_events_is_not_a_pass(tmp_path: Path, capsys, engine: str):
    (tmp_path / "garbage.jsonl").write_text('{"v":1,"sou\n')
    assert meshtrace(["check", str(tmp_path / "garbage.jsonl"), "--engine", engine]) == 2
    assert "1 invalid event(s) (1 not_json)" in capsys.readouterr().err
    assert meshtrace(["check", str(tmp_path / "garbage.jsonl"), "--engine", engine, "--tolerate", "invalid"]) == 2
    assert "no valid trace events in" in capsys.readouterr().err
