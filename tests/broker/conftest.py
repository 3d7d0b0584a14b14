"""Fixtures for the broker store contract: a fresh, migrated store per test, on SQLite and on PostgreSQL.

The PostgreSQL cluster is private to the test session (reference.broker.pgcluster.PgCluster: a temporary directory,
127.0.0.1 on a free port, fsync on). Contract tests share one migrated database, emptied before each test; the
migration tests get a new database each. SQLite tests get a new file each. Builders live in store_testkit.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from store_testkit import populate

from reference.broker.pgcluster import PgCluster, PgClusterError, find_bindir
from reference.broker.store import BrokerStore, open_store
from reference.broker.store._sql import TABLES

ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL cluster for the session; skips when the server binaries or psycopg are missing."""
    if find_bindir() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin")
    pytest.importorskip("psycopg", reason="psycopg 3 is needed for the PostgreSQL store")
    try:
        cluster = PgCluster().start()
    except PgClusterError as exc:
        pytest.skip(f"could not start a private PostgreSQL cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_contract_dsn(pg_cluster: PgCluster) -> str:
    """One migrated database shared by the contract tests; ``store`` empties it before each test."""
    dsn = pg_cluster.create_database("broker_contract")
    store = open_store(dsn)
    try:
        store.migrate()
    finally:
        store.close()
    return dsn


def _empty(dsn: str) -> None:
    """Delete every row: every table cascades from mesh.mesh. (TRUNCATE would fsync a new file per table.)"""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM mesh.mesh")
        leftovers = {table: conn.execute(f"SELECT count(*) FROM mesh.{table}").fetchone()[0] for table in TABLES}
    assert not any(leftovers.values()), leftovers


@pytest.fixture(params=ENGINES)
def bare_store(request: pytest.FixtureRequest, tmp_path) -> Iterator[BrokerStore]:
    """A store on a new, empty database, not yet migrated."""
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
    else:
        cluster: PgCluster = request.getfixturevalue("pg_cluster")
        # not dropped afterwards: DROP DATABASE forces a checkpoint (slow with fsync on); the cluster goes anyway
        store = open_store(cluster.create_database(f"broker_test_{next(_databases)}"))
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=ENGINES)
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[BrokerStore]:
    """A migrated store holding store_testkit.populate's meshes and nothing else."""
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'broker.db'}")
        store.migrate()
    else:
        dsn = request.getfixturevalue("pg_contract_dsn")
        _empty(dsn)
        store = open_store(dsn)
    try:
        populate(store)
        yield store
    finally:
        store.close()


@pytest.fixture(params=ENGINES)
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """The URL of a new, empty store database (not migrated): a SQLite file, or a database on the session cluster.
    For the broker server tests (test_server*.py), which open the store themselves."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'broker.db'}"
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return cluster.create_database(f"broker_server_{next(_databases)}")
