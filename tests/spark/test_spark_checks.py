"""The Spark checks on a real local Spark, held to the oracle's answers.

One Spark run checks every per-kind trace at once (each trace has its own seed, so its nodes and meshes are its
own): for every injectable kind, the violations on that trace's nodes must be exactly the injected one, and nothing
on the clean trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from detail_cases import hand_made
from trace_testkit import expected, found, nodes_of, same_answers, skewed_trace

from spark_checks import oracle
from spark_checks.catalogue import INJECTIONS
from spark_checks.cli import main as meshtrace
from spark_checks.spark import SparkChecker

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def combined(spark, traces):
    """One Spark run over the per-kind traces and the clean one."""
    names = [*INJECTIONS, "clean"]
    report = SparkChecker(spark, limit=None).check([traces[name][0] for name in names])
    return report


def test_every_injected_kind_is_reported_as_exactly_its_violation_and_clean_traces_pass(traces, combined):
    for name in [*INJECTIONS, "clean"]:
        trace, manifest = traces[name]
        want = expected(manifest)
        assert len(want) == (0 if name == "clean" else 1), name
        assert found(combined, nodes=nodes_of(trace)) == want, name


def test_spark_and_the_oracle_agree_on_every_generated_trace(traces, combined):
    reports = [oracle.check(traces[name][0]) for name in [*INJECTIONS, "clean"]]
    merged = oracle.Report("oracle", "", sum(r.events for r in reports), [], 0.0,
                           oracle.sort_violations(v for r in reports for v in r.violations), {})
    assert combined.events == merged.events
    assert same_answers(combined, merged) == []
    assert [v.evidence for v in combined.violations] == [v.evidence for v in merged.violations]


def test_all_kinds_in_one_trace_with_heavy_subjects_chunked(spark, traces):
    trace, manifest = traces["all"]
    report = SparkChecker(spark, chunk=64, limit=None).check(trace)
    assert report.settings["heavy_subjects"] > 0, "the hot keys must have been chunked"
    assert {(v.invariant, v.key) for v in report.violations} == expected(manifest)
    assert same_answers(report, oracle.check(trace)) == []


def test_violations_deep_inside_skewed_subjects_are_found_across_chunks(spark, tmp_path: Path):
    dataset, want = skewed_trace(tmp_path)
    report = SparkChecker(spark, chunk=32, limit=None).check(dataset)
    assert report.settings["heavy_subjects"] == 2
    assert {(v.invariant, v.key) for v in report.violations} == want
    assert same_answers(report, oracle.check(dataset)) == []


def test_spark_reports_the_oracles_details_and_evidence_for_hand_made_violations(spark, tmp_path: Path):
    from spark_checks import format as fmt

    jsonl, want = hand_made(tmp_path)
    dataset = tmp_path / "parquet"
    fmt.convert_jsonl([jsonl], dataset)
    report = SparkChecker(spark, limit=None).check(dataset)
    assert {(v.invariant, v.key): v.detail for v in report.violations} == want
    assert same_answers(report, oracle.check(dataset)) == []


def test_the_cli_checks_jsonl_and_writes_the_report(spark, traces, tmp_path: Path, capsys):
    from spark_checks import format as fmt

    trace, manifest = traces["duplicate_broker_message"]
    jsonl = tmp_path / "jsonl"
    fmt.write_jsonl(trace, jsonl)
    report = tmp_path / "report.json"
    assert meshtrace(["check", str(jsonl), "--master", "local[2]", "--report", str(report)]) == 1
    document = json.loads(report.read_text())
    assert document["engine"] == "spark" and document["events"] == manifest["events"]
    assert [(v["invariant"], tuple(v["key"].items())) for v in document["violations"]] == sorted(expected(manifest))
    assert "TRC-ONE-MESSAGE" in capsys.readouterr().out


def test_local_sessions_stay_on_loopback(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.ui.enabled") == "false"


@pytest.mark.slow  # a JVM of its own started by spark-submit (about a minute on 2 cores): CI's slow-bounded runs it
def test_spark_submit_runs_the_same_module(traces, tmp_path: Path):
    """Through ``spark-submit``, with the trace and the report on ``viewfs://`` (Hadoop's mount-table filesystem: a
    scheme only Hadoop resolves, set up with ``--conf spark.hadoop.…`` as an ``s3a://`` bucket's endpoint would be),
    the report is the oracle's, evidence and all."""
    import os
    import subprocess
    import sys

    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        pytest.skip("spark-submit is not installed next to this interpreter")
    trace, manifest = traces["missing_side_effect"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    loopback = [f"--conf=spark.driver.{name}=127.0.0.1" for name in ("bindAddress", "host")]
    module = Path(__file__).resolve().parents[2] / "spark_checks" / "spark.py"
    small = ["--conf=spark.ui.enabled=false", "--conf=spark.sql.shuffle.partitions=4", "--driver-memory", "1g"]
    mounts = [f"--conf=spark.hadoop.fs.viewfs.mounttable.sub.link./{name}=file://{target}"
              for name, target in (("traces", trace.parent), ("reports", tmp_path))]
    done = subprocess.run([str(submit), "--master", "local[2]", *loopback, *small, str(module),
                           f"viewfs://sub/traces/{trace.name}", *mounts, "--report", "viewfs://sub/reports/r.json"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["engine"] == "spark" and document["events"] == manifest["events"]
    assert document["trace"] == f"viewfs://sub/traces/{trace.name}"
    assert document["settings"]["master"] == "local[2]", "the master spark-submit set is kept"
    assert {(v["invariant"], tuple(v["key"].items())) for v in document["violations"]} == expected(manifest)
    answers = oracle.Oracle().check([trace]).as_dict()
    assert [{k: v[k] for k in ("invariant", "key", "event", "related", "detail", "evidence")}
            for v in document["violations"]] == \
           [{k: v[k] for k in ("invariant", "key", "event", "related", "detail", "evidence")}
            for v in answers["violations"]]
