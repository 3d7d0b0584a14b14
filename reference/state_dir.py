"""The daemon's state directory: every file the reference keeps there, named in this one place.

§1 lists the directory's files; the reference follows it except that the socket and the pid file are ``daemon.sock``
and ``daemon.pid`` (as the launch contract's ``{socket}`` placeholder and upstream's implementation name them), and it
adds three of its own: ``daemon.lock`` (the singleton lock, E-15), ``exit_reason.json`` (why the worker asked the
master to stop, read back by ``serve`` for its exit code) and the quarantined copies of a corrupt database,
``<name>.corrupt-<unix-ms>`` beside it (E-16; their ``-wal``/``-shm`` sidecars keep SQLite's naming).

It lives beside the daemon package, not in it: the broker CLI (``--pubkey`` a state directory) and the sandbox read
the same names, and neither may import the daemon (README, "Layers").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

QUARANTINE_INFIX = ".corrupt-"


@dataclass(frozen=True)
class StateDir:
    """The files of the state directory ``root`` (a path; nothing is created or read here)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(os.fspath(self.root)))

    @property
    def config(self) -> Path:
        """``config.toml``: the daemon's configuration."""
        return self.root / "config.toml"

    @property
    def outbox_db(self) -> Path:
        """``outbox.db`` (0600): the outbox (§4.5.2)."""
        return self.root / "outbox.db"

    @property
    def inbox_db(self) -> Path:
        """``inbox.db`` (0600): received messages, the quarantine and the SSE event log."""
        return self.root / "inbox.db"

    @property
    def keypair(self) -> Path:
        """``keypair.json`` (0600): the member's ed25519 identity."""
        return self.root / "keypair.json"

    @property
    def host_fingerprint(self) -> Path:
        """``host_fingerprint.json`` (0600): the host this state directory is pinned to."""
        return self.root / "host_fingerprint.json"

    @property
    def local_token(self) -> Path:
        """``local_token`` (0600): the IPC bearer token."""
        return self.root / "local_token"

    @property
    def socket(self) -> Path:
        """``daemon.sock`` (0600): the unix socket the IPC API listens on."""
        return self.root / "daemon.sock"

    @property
    def http_port(self) -> Path:
        """``http.port`` (0644): the TCP loopback port the daemon bound."""
        return self.root / "http.port"

    @property
    def pid(self) -> Path:
        """``daemon.pid``: the serving process's id."""
        return self.root / "daemon.pid"

    @property
    def lock(self) -> Path:
        """``daemon.lock``: held by the one daemon serving this directory."""
        return self.root / "daemon.lock"

    @property
    def exit_record(self) -> Path:
        """``exit_reason.json``: the exit code and reason the worker recorded before stopping the master."""
        return self.root / "exit_reason.json"

    @property
    def log(self) -> Path:
        """``daemon.log``: the detached daemon's log."""
        return self.root / "daemon.log"


def quarantine_path(database: Path, stamp_ms: int) -> Path:
    """Where a corrupt ``database`` is moved aside: ``<name>.corrupt-<stamp_ms>`` in its directory."""
    return database.with_name(f"{database.name}{QUARANTINE_INFIX}{stamp_ms}")
