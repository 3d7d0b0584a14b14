"""Fixtures for the trace checks: one local SparkSession for the whole run, and the generated test traces."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from trace_testkit import make_trace

from spark_checks.catalogue import INJECTIONS


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local[2] session bound to 127.0.0.1, shared by every Spark test."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    from spark_checks.session import build_session

    session = build_session("local[2]", app_name="meshtrace-tests", driver_memory="2g",
                            conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """One small generated trace per injection kind (each its own seed, so node and mesh names never collide), a
    clean one, and one with every kind injected at once."""
    root = tmp_path_factory.mktemp("traces")
    made = {kind: make_trace(root, kind, seed=100 + k, inject=[kind]) for k, kind in enumerate(INJECTIONS)}
    made["clean"] = make_trace(root, "clean", seed=99)
    made["all"] = make_trace(root, "all", seed=98, inject=list(INJECTIONS), events=20_000, daemons=16,
                             hot_fraction=0.02)
    return made
