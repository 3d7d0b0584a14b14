"""``meshtrace check``'s exit codes when its input or its report cannot be used (2, after printing the result when
the check ran), when a run fails (3), never 1 (violations found) and never a traceback for unusable input.

``viewfs://`` is Hadoop's own mount-table filesystem, shipped with Spark: a scheme only Hadoop resolves. A check
through it, set up with ``--conf spark.hadoop.KEY=VALUE`` as an ``s3a://`` bucket's endpoint would be, is
``test_spark_checks.test_spark_submit_runs_the_same_module``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_testkit import make_trace

from spark_checks.cli import main as meshtrace
from spark_checks.oracle import Oracle

MESH = Path(__file__).resolve().parents[2] / "fixtures" / "traces" / "mesh"
ENGINES = ("oracle", "duckdb")


def mount(table: str, root: Path) -> str:
    """The setting that makes ``viewfs://<table>/data`` the local directory ``root``."""
    return f"fs.viewfs.mounttable.{table}.link./data=file://{root}"


@pytest.mark.spark
def test_what_hadoop_cannot_open_read_or_write_exits_2(spark, tmp_path: Path, capsys):
    make_trace(tmp_path, "t", seed=22, events=500, daemons=2)
    key, value = mount("ok", tmp_path).split("=", 1)
    spark.sparkContext._jsc.hadoopConfiguration().set(key, value)
    spark_check = ["--engine", "spark", "--master", "local[2]"]
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
    report = "viewfs://unmounted/data/r.json"  # the trace is read through the mount, the report has none
    assert meshtrace(["check", "viewfs://ok/data/t", *spark_check, "--report", report]) == 2
    captured = capsys.readouterr()
    assert "spark: 500 events" in captured.out
    err = captured.err
    assert f"meshtrace check: {report}: Hadoop cannot write it: " in err and "Traceback" not in err


@pytest.mark.parametrize("engine", ENGINES)
def test_spark_settings_are_refused_and_an_unwritable_report_exits_2(engine: str, tmp_path: Path, capsys):
    trace, _ = make_trace(tmp_path, "t", seed=23, events=300, daemons=2)
    (tmp_path / "a-file").write_text("")
    os.mkfifo(tmp_path / "fifo")  # opening it to write would wait for a reader for ever
    for report, says in ((tmp_path, "not a regular file"), (tmp_path / "fifo", "not a regular file"),
                         (tmp_path / "a-file" / "r.json", f"{tmp_path / 'a-file'} is not a directory"),
                         (f"file://{tmp_path}/a%00b.json", "embedded null byte")):
        assert meshtrace(["check", str(trace), "--engine", engine, "--report", str(report)]) == 2
        captured = capsys.readouterr()
        assert f"meshtrace check: {report}: cannot write it: {says}" in captured.err
        assert "Traceback" not in captured.err and "300 events" in captured.out
    for report in ("", " ", f"{tmp_path}/new/"):  # refused before the check runs
        assert meshtrace(["check", str(trace), "--engine", engine, "--report", report]) == 2
        assert capsys.readouterr().err == f"meshtrace check: --report {report!r}: give the report's file name " \
                                          "(a path or URI)\n"
    assert not (tmp_path / "new").exists()
    events = trace / "events"
    part = next(events.rglob("*.parquet"))
    for report, says in ((part, "a trace file's name (.jsonl, .parquet)"),
                         (tmp_path / "r.jsonl", "a trace file's name (.jsonl, .parquet)"),
                         (events / "r.json", f"inside the trace directory {trace}"),
                         (f"file://{events}/b/r.json", f"inside the trace directory {trace}")):
        before = part.read_bytes()
        assert meshtrace(["check", str(trace), "--engine", engine, "--report", str(report)]) == 2
        assert capsys.readouterr().err == f"meshtrace check: --report {report}: {says}; write the report " \
                                          "elsewhere\n"
        assert part.read_bytes() == before and not (events / "r.json").exists()
    assert meshtrace(["check", str(trace), "--engine", engine, "--report", str(tmp_path / "beside.json")]) == 0
    assert meshtrace(["check", str(trace), "--engine", engine, "--conf", "spark.x=1"]) == 2
    assert f"--engine {engine} takes none" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        meshtrace(["check", str(trace), "--engine", engine, "--conf", "no-equals-sign"])
    assert exited.value.code == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_a_trace_file_that_is_not_a_regular_file_exits_2(engine: str, tmp_path: Path, capsys):
    os.mkfifo(tmp_path / "n.jsonl")  # reading it would wait for a writer for ever
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "dir" / "n.jsonl")
    for argument in (tmp_path / "n.jsonl", tmp_path / "dir"):
        assert meshtrace(["check", str(argument), "--engine", engine]) == 2
        assert "n.jsonl: not a regular file (a FIFO, device or socket is not a trace file)" in \
               capsys.readouterr().err


@pytest.mark.parametrize("engine", [*ENGINES, pytest.param("spark", marks=pytest.mark.spark)])
def test_a_corrupt_page_behind_an_intact_footer_is_unreadable_input(engine: str, request, tmp_path: Path, capsys):
    if engine == "spark":
        request.getfixturevalue("spark")  # the shared session
    from spark_checks import format as fmt

    fmt.convert_jsonl(sorted(MESH.glob("*.jsonl")), tmp_path / "t" / "events")
    parts = sorted((tmp_path / "t" / "events").rglob("*.parquet"))
    part = parts[-1]  # not the first file read: the message names the file that is corrupt
    assert len(parts) > 1
    data = bytearray(part.read_bytes())
    data[4:68] = b"\xff" * 64  # the first column chunk's page header; the footer (at the end) is untouched
    part.write_bytes(bytes(data))
    assert meshtrace(["check", str(tmp_path / "t"), "--engine", engine, "--master", "local[2]"]) == 2
    err = capsys.readouterr().err
    assert f"{part.relative_to(tmp_path / 't' / 'events')}: not a readable Parquet file (" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("engine", ENGINES)
def test_a_closed_stdout_or_stderr_changes_no_exit_code(engine: str, tmp_path: Path):
    """``meshtrace check … | head`` closes the pipe: the report is still written and the exit code is the verdict's,
    not rich's SystemExit(1); with stderr on a full device an unusable input still exits 2."""
    meshtrace_bin = Path(sys.executable).parent / "meshtrace"
    report = tmp_path / "r.json"
    process = subprocess.Popen([str(meshtrace_bin), "check", str(MESH), "--engine", engine, "--report",
                                str(report)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    process.stdout.close()
    assert process.wait(timeout=120) == 0 and report.exists()
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(meshtrace_bin), "check", str(tmp_path / "missing"), "--engine", engine],
                              stdout=subprocess.DEVNULL, stderr=full, timeout=120)
    assert done.returncode == 2


def test_a_run_that_fails_exits_3_not_1(tmp_path: Path, capsys, monkeypatch):
    """Exit 1 says the trace violates an invariant; a check that did not finish says nothing about the trace."""
    trace, _ = make_trace(tmp_path, "t", seed=24, events=300, daemons=2)

    def broken(self, paths):
        raise RuntimeError("the engine stopped")

    monkeypatch.setattr(Oracle, "check", broken)
    assert meshtrace(["check", str(trace), "--engine", "oracle"]) == 3
    err = capsys.readouterr().err
    assert "meshtrace check: the run failed (RuntimeError: the engine stopped); this is no verdict" in err


@pytest.mark.parametrize("argv, says", [
    (["--conf", "spark.master=local[1]"], "argument --conf: spark.master is set with --master, not --conf"),
    (["--conf", "spark.driver.memory=1g"], "spark.driver.memory is set with --driver-memory, not --conf"),
    (["--conf", "spark.driver.host=10.0.0.1"], "spark.driver.host is set with --driver-host, not --conf"),
    (["--conf", "spark.driver.bindAddress=0.0.0.0"], "is set with --driver-bind-address, not --conf"),
    (["--driver-memory", "lots"], "argument --driver-memory: 'lots' is not a heap size"),
    (["--driver-memory", "6 g"], "argument --driver-memory: '6 g' is not a heap size"),
    (["--driver-memory", "0g"], "argument --driver-memory: '0g' is not a heap size"),
])
def test_settings_an_option_owns_and_a_bad_heap_size_are_usage_errors(argv: list[str], says: str, tmp_path: Path,
                                                                       capsys):
    with pytest.raises(SystemExit) as exited:
        meshtrace(["check", str(tmp_path), "--engine", "spark", *argv])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.spark
def test_a_setting_spark_refuses_exits_2_naming_it(tmp_path: Path):
    """A --conf value Spark's own check refuses, or one its JVM fails to start with, is a usage error; Spark is
    started again without the settings (in a process of its own) to tell it from a Spark that starts at all."""
    trace, _ = make_trace(tmp_path, "t", seed=25, events=300, daemons=2)
    for setting, says in (("spark.sql.shuffle.partitions=abc", "The value 'abc' in the config "
                                                                '"spark.sql.shuffle.partitions" is invalid'),
                          ("spark.network.timeout=soon", "The value 'soon' in the config \"spark.network.timeout\" is "
                                                          "invalid")):
        done = subprocess.run([sys.executable, "-m", "spark_checks.cli", "check", str(trace), "--conf", setting,
                               "--master", "local[1]"], capture_output=True, text=True, timeout=600,
                              cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 2, done.stderr[-3000:]
        assert "meshtrace check: Spark does not start with the --conf settings given" in done.stderr
        assert says in done.stderr, done.stderr[-3000:]
        assert "it starts without them" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("engine", [*ENGINES, pytest.param("spark", marks=pytest.mark.spark)])
def test_a_local_name_read_as_a_uri_scheme_says_how_to_name_it(engine: str, request, tmp_path: Path, capsys,
                                                                monkeypatch):
    """``d:1`` is a URI of scheme ``d`` to every engine (Hadoop's reading); when a local ``d:1`` exists, the error
    says to write ``./d:1``, which each engine then reads."""
    if engine == "spark":
        request.getfixturevalue("spark")  # the shared session
    monkeypatch.chdir(tmp_path)
    # written by a relative name, as a user would (Arrow read d:1/... as a URI too)
    assert meshtrace(["generate", "--events", "300", "--daemons", "2", "--seed", "26", "--out", "d:1"]) == 0
    capsys.readouterr()
    spark_check = ["--master", "local[2]"] if engine == "spark" else []
    assert meshtrace(["check", "d:1", "--engine", engine, *spark_check]) == 2
    err = capsys.readouterr().err
    assert "d:1: read as a URI of scheme 'd', yet a local path of that name exists; a local path whose first part " \
           "holds ':' is written ./d:1" in err, err
    if engine != "spark":  # the shared session's JVM resolves a relative path from the directory it started in
        assert meshtrace(["check", "./d:1", "--engine", engine]) in (0, 1)
        assert f"{engine}: 300 events" in capsys.readouterr().out
