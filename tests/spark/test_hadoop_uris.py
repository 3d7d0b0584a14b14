"""A Hadoop filesystem other than ``file:``, for the trace and the report, and the exit codes when Hadoop cannot.

``viewfs://`` is Hadoop's own mount-table filesystem, shipped with Spark: a scheme only Hadoop resolves, configured
the way an ``s3a://`` bucket's endpoint and credentials are (``--conf spark.hadoop.KEY=VALUE``), so the paths a
check takes, lists, reads and writes all go through Hadoop's ``FileSystem`` rather than a local path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_testkit import expected, make_trace

from spark_checks.cli import main as meshtrace
from spark_checks.oracle import Oracle

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def mount(table: str, root: Path) -> str:
    """The setting that makes ``viewfs://<table>/data`` the local directory ``root``."""
    return f"fs.viewfs.mounttable.{table}.link./data=file://{root}"


def test_a_viewfs_trace_and_report_through_the_command_line(tmp_path: Path):
    pytest.importorskip("pyspark")
    shared = tmp_path / "shared"
    trace, manifest = make_trace(shared, "t", seed=21, inject=["fingerprint_changed", "unacked_delivery"],
                                 events=3_000, daemons=4)
    (shared / "reports").mkdir()
    done = subprocess.run(
        [str(BIN / "meshtrace"), "check", "viewfs://cl/data/t", "--master", "local[2]", "--conf",
         "spark.hadoop." + mount("cl", shared), "--report", "viewfs://cl/data/reports/r.json"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=os.environ)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((shared / "reports" / "r.json").read_text())
    oracle = Oracle().check([trace]).as_dict()
    assert report["trace"] == "viewfs://cl/data/t" and report["events"] == oracle["events"] == 3_000
    assert {(v["invariant"], tuple(v["key"].items())) for v in report["violations"]} == expected(manifest)
    assert [(v["invariant"], v["key"], v["event"], v["related"], v["detail"], v["evidence"])
            for v in report["violations"]] == \
           [(v["invariant"], v["key"], v["event"], v["related"], v["detail"], v["evidence"])
            for v in oracle["violations"]]


def test_what_hadoop_cannot_open_read_or_write_exits_2(spark, tmp_path: Path, capsys):
    make_trace(tmp_path, "t", seed=22, events=500, daemons=2)
    key, value = mount("ok", tmp_path).split("=", 1)
    spark.sparkContext._jsc.hadoopConfiguration().set(key, value)
    spark_check = ["--engine", "spark", "--master", "local[2]"]
    assert meshtrace(["check", "viewfs://ok/data/t", *spark_check]) == 0
    capsys.readouterr()
    for uri, says in (("s3a://bucket/trace", "Hadoop cannot read it: java.lang.RuntimeException: java.lang."
                                             "ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem "
                                             "not found"),  # no hadoop-aws on the class path
                      ("nosuch://bucket/trace", 'Hadoop cannot read it: org.apache.hadoop.fs.'
                                                'UnsupportedFileSystemException: No FileSystem for scheme "nosuch"'),
                      ("viewfs://unmounted/data/t", "Hadoop cannot read it: java.io.IOException: ViewFs: Cannot "
                                                    "initialize: Empty Mount table in config for viewfs://unmounted/")):
        assert meshtrace(["check", uri, *spark_check]) == 2, uri
        err = capsys.readouterr().err
        assert f"meshtrace check: {uri}: {says} (a filesystem's settings are given as --conf " \
               "spark.hadoop.KEY=VALUE)" in err, err
        assert "Traceback" not in err
    assert meshtrace(["check", "viewfs://ok/elsewhere/t", *spark_check]) == 2  # outside the mount table
    assert "meshtrace check: no such file or directory: viewfs://ok/elsewhere/t" in capsys.readouterr().err
    report = "viewfs://unmounted/data/r.json"
    assert meshtrace(["check", "viewfs://ok/data/t", *spark_check, "--report", report]) == 2
    err = capsys.readouterr().err
    assert f"meshtrace check: {report}: Hadoop cannot write it: " in err and "Traceback" not in err


@pytest.mark.parametrize("engine", ["oracle", "duckdb"])
def test_spark_settings_are_refused_for_another_engine(engine: str, tmp_path: Path, capsys):
    trace, _ = make_trace(tmp_path, "t", seed=23, events=300, daemons=2)
    assert meshtrace(["check", str(trace), "--engine", engine, "--conf", "spark.x=1"]) == 2
    assert f"--engine {engine} takes none" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        meshtrace(["check", str(trace), "--engine", engine, "--conf", "no-equals-sign"])
    assert exited.value.code == 2


def test_a_run_that_fails_exits_3_not_1(tmp_path: Path, capsys, monkeypatch):
    """Exit 1 says the trace violates an invariant; a check that did not finish says nothing about the trace."""
    trace, _ = make_trace(tmp_path, "t", seed=24, events=300, daemons=2)

    def broken(self, paths):
        raise RuntimeError("the engine stopped")

    monkeypatch.setattr(Oracle, "check", broken)
    assert meshtrace(["check", str(trace), "--engine", "oracle"]) == 3
    err = capsys.readouterr().err
    assert "meshtrace check: the run failed (RuntimeError: the engine stopped); this is no verdict" in err
