"""reference.state_dir: the state directory is named in one place, and the daemon writes only what it names."""

from __future__ import annotations

import logging
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from reference.daemon import identity
from reference.daemon.config import load
from reference.daemon.runtime import Runtime, preflight
from reference.daemon.server import record_exit, recorded_exit
from reference.daemon.store import InboxStore
from reference.state_dir import StateDir, quarantine_path

NAMES = {
    "config": "config.toml", "outbox_db": "outbox.db", "inbox_db": "inbox.db", "keypair": "keypair.json",
    "host_fingerprint": "host_fingerprint.json", "local_token": "local_token", "socket": "daemon.sock",
    "http_port": "http.port", "pid": "daemon.pid", "lock": "daemon.lock", "exit_record": "exit_reason.json",
    "log": "daemon.log",
}


def test_every_file_of_the_state_directory(tmp_path):
    files = StateDir(tmp_path)
    named = {name: getattr(files, name) for name, value in vars(StateDir).items() if isinstance(value, property)}
    assert named == {name: tmp_path / file for name, file in NAMES.items()}


def test_the_root_is_a_path_and_the_layout_frozen(tmp_path):
    assert StateDir(str(tmp_path)) == StateDir(tmp_path)
    assert StateDir(str(tmp_path)).outbox_db == tmp_path / "outbox.db"
    with pytest.raises(FrozenInstanceError):
        StateDir(tmp_path).root = Path("/elsewhere")  # type: ignore[misc]


def test_quarantine_path_is_beside_the_database():
    assert quarantine_path(Path("/state/inbox.db"), 1_700_000_000_123) == Path("/state/inbox.db.corrupt-1700000000123")


def test_preflight_writes_only_named_files(tmp_path):
    state = tmp_path / "daemon"
    preflight(state, load(None, {"ipc": {"tcp_enabled": False}}))
    files = StateDir(state)
    sidecars = {"outbox.db-wal", "outbox.db-shm", "inbox.db-wal", "inbox.db-shm"}
    assert {p.name for p in state.iterdir()} - sidecars == {
        files.lock.name, files.pid.name, files.host_fingerprint.name, files.keypair.name, files.local_token.name,
        files.outbox_db.name, files.inbox_db.name}
    assert identity.load_or_mint_token(state) == files.local_token.read_text(encoding="ascii").strip()


def test_the_exit_record_and_a_quarantined_inbox_use_the_layout(tmp_path):
    files = StateDir(tmp_path)
    record_exit(tmp_path, 10, "feature negotiation failed")
    assert files.exit_record.exists()
    assert recorded_exit(tmp_path) == (10, "feature negotiation failed")
    assert not files.exit_record.exists()
    files.inbox_db.write_bytes(b"not a database" * 100)
    store, quarantined = InboxStore.open_or_quarantine(files.inbox_db, clock=lambda: 1_700_000_000_000)
    store.close()
    assert quarantined == quarantine_path(files.inbox_db, 1_700_000_000_000)
    assert quarantined == tmp_path / "inbox.db.corrupt-1700000000000"


@pytest.mark.parametrize("finder", ["preflight", "replacement worker"])
def test_a_corrupt_inbox_is_logged_alike_by_whoever_finds_it(tmp_path, caplog, finder):
    """REC-INBOX-QUARANTINE: preflight, and a worker gunicorn starts in place of a killed one (which runs no
    preflight), each quarantine a corrupt inbox.db and log inbox_corruption_recovered with where it went."""
    state = tmp_path / "daemon"
    files = StateDir(state)
    config = load(None, {"ipc": {"tcp_enabled": False}})

    def corrupt() -> None:
        for sidecar in ("inbox.db-wal", "inbox.db-shm"):
            (state / sidecar).unlink(missing_ok=True)
        files.inbox_db.write_bytes(b"not a database" * 100)

    if finder == "preflight":
        state.mkdir()
        corrupt()
    with caplog.at_level(logging.WARNING, logger="meshd"):
        preflight(state, config)
        if finder == "replacement worker":
            corrupt()
            worker = Runtime(state, config)  # never started: only its stores and committer are open
            worker.committer.close()
            worker.outbox.close()
            worker.inbox.close()
    (quarantined,) = state.glob("inbox.db.corrupt-*")
    recovered = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if "inbox_corruption" in r.getMessage()]
    assert recovered == [("meshd", logging.WARNING, f"inbox_corruption_recovered moved to {quarantined}")]
    with InboxStore(files.inbox_db) as fresh:
        assert fresh.page() == ([], None)
