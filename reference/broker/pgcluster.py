"""A throwaway PostgreSQL cluster started from the installed server binaries, for tests and local runs.

Rules of this file: the cluster lives in a fresh temporary directory, listens on a unix socket inside that directory
and on 127.0.0.1 at a port that was free a moment before, and keeps ``fsync = on`` (durability is what the broker
tests exercise). Its superuser has a random password, so a DSN from here can only ever log in to the cluster this
process started; nothing here connects to a server someone else left running. When running as root the binaries run
as the ``postgres`` OS user (initdb refuses root). ``stop()`` is idempotent: ``pg_ctl stop -m immediate`` (the
data is deleted next, so a shutdown checkpoint would be wasted), then ``-m fast``, then a SIGKILL of the postmaster
named in our own ``postmaster.pid``; then the directory is removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

SERVICE_USER = "postgres"
SEARCH_GLOB = "/usr/lib/postgresql/*/bin"
SUPERUSER = "meshspec"


class PgClusterError(RuntimeError):
    """The cluster could not be created or started; the message carries the server log's tail."""


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: PATH first, then /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob(SEARCH_GLOB), key=_version_key, reverse=True)
    for candidate in candidates:
        path = Path(candidate)
        if all((path / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return path
    return None


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgCluster:
    """A private PostgreSQL cluster; use as a context manager or call ``start()``/``stop()``.

    Attributes (after ``start()``): ``port``, ``host`` (127.0.0.1), ``socket_dir``, ``password`` and ``dsn`` (the
    default database ``meshspec``). ``admin_dsn`` points at the ``postgres`` maintenance database.
    """

    def __init__(self, bindir: Path | None = None, database: str = "meshspec", start_timeout_s: int = 60):
        self.bindir = bindir or find_bindir()
        if self.bindir is None:
            raise PgClusterError(f"no PostgreSQL server binaries on PATH or under {SEARCH_GLOB}")
        self.database = database
        self.start_timeout_s = start_timeout_s
        self.host = "127.0.0.1"
        self.port = 0
        self.password = secrets.token_urlsafe(24)
        self.root: Path | None = None
        self._finalizer: weakref.finalize | None = None

    # --- paths and commands --------------------------------------------------------------------------------------

    @property
    def datadir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.root is not None
        return self.root

    @property
    def logfile(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    def dsn_for(self, database: str) -> str:
        """A libpq URL for ``database`` on this cluster (TCP on 127.0.0.1, password auth)."""
        return f"postgresql://{SUPERUSER}:{self.password}@{self.host}:{self.port}/{database}"

    @property
    def dsn(self) -> str:
        return self.dsn_for(self.database)

    @property
    def admin_dsn(self) -> str:
        return self.dsn_for("postgres")

    def _as_service_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["runuser", "-u", SERVICE_USER, "--", *argv]

    def _run(self, argv: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self._as_service_user(argv), capture_output=True, text=True, timeout=timeout, cwd=self.root, check=False
        )
        if check and result.returncode != 0:
            raise PgClusterError(
                f"{Path(argv[0]).name} exited {result.returncode}: {result.stderr.strip() or result.stdout.strip()}"
                f"{self._log_tail()}"
            )
        return result

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.logfile.read_text(errors="replace").splitlines()[-lines:]
        except (OSError, AssertionError):
            return ""
        return "\n--- server log ---\n" + "\n".join(text) if text else ""

    # --- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> PgCluster:
        """initdb, start with ``pg_ctl -w``, create the database; returns ``self``. On failure nothing is left."""
        self.root = Path(tempfile.mkdtemp(prefix="meshspec-pg-"))
        self._finalizer = weakref.finalize(self, _cleanup, str(self.bindir), str(self.root), os.geteuid() == 0)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        assert self.root is not None
        if os.geteuid() == 0:
            record = pwd.getpwnam(SERVICE_USER)
            os.chown(self.root, record.pw_uid, record.pw_gid)
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, pwd.getpwnam(SERVICE_USER).pw_uid, -1)
        pwfile.chmod(0o600)
        self._run([
            str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER, "--pwfile", str(pwfile),
            "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
        ])
        pwfile.unlink()
        last_error: PgClusterError | None = None
        for _ in range(3):  # a port free a moment ago can be taken before the postmaster binds it
            self.port = _free_port()
            self._configure()
            try:
                self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile), "-w",
                           "-t", str(self.start_timeout_s), "start"], timeout=self.start_timeout_s + 30)
            except PgClusterError as exc:
                last_error = exc
                self._kill_postmaster()
                continue
            break
        else:
            raise last_error or PgClusterError("postgres did not start")
        self.create_database(self.database)

    def _configure(self) -> None:
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "fsync": "on",
            "synchronous_commit": "on",
            "max_connections": "100",
            "shared_buffers": "32MB",
            "log_min_messages": "warning",
        }
        with (self.datadir / "postgresql.conf").open("a") as conf:  # later lines win, so a retry may append again
            conf.write("\n# meshspec PgCluster\n" + "".join(f"{key} = {value}\n" for key, value in settings.items()))

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name``; returns its DSN."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE ``name`` WITH (FORCE), ending any session still connected to it."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        """Stop the server and delete the directory; safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()

    def _kill_postmaster(self) -> None:
        if self.root is not None:
            _kill_postmaster(self.datadir)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _postmaster_pid(datadir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((datadir / "postmaster.pid").read_text().splitlines()[0])
    return None


def _kill_postmaster(datadir: Path) -> None:
    pid = _postmaster_pid(datadir)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def _cleanup(bindir: str, root: str, as_root: bool) -> None:
    datadir = Path(root) / "data"
    if (datadir / "postmaster.pid").exists():
        for mode in ("immediate", "fast"):  # the data is deleted next, so no shutdown checkpoint is needed
            argv = [str(Path(bindir) / "pg_ctl"), "-D", str(datadir), "-m", mode, "-w", "-t", "30", "stop"]
            if as_root:
                argv = ["runuser", "-u", SERVICE_USER, "--", *argv]
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if subprocess.run(argv, capture_output=True, timeout=45, check=False).returncode == 0:
                    break
        if (datadir / "postmaster.pid").exists():
            _kill_postmaster(datadir)
    shutil.rmtree(root, ignore_errors=True)
