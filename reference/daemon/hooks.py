"""Hooks (§6, E-48): ``hooks.toml``, which hooks match a message, and the runner that claims, runs and marks.

Theory of operation. A message that gets a new inbox row gets, in that transaction, one pending run per matching hook
(``matching``, written by ``store.hook_runs.enqueue``). ``HookRunner`` keeps ``concurrency`` worker threads; each
claims the oldest pending run, starts the hook's executable in a process group of its own (``start_new_session``)
with the event JSON on stdin and a bare environment, reads stdout and stderr up to the output limit, and on exit
stores the result and marks the run in one transaction. A hook that outruns its timeout gets SIGTERM to its group and
SIGKILL ``hook_kill_grace_s`` later; after any exit the group is killed, so a child the hook left behind cannot hold
its pipes or outlive it. A ``{"reply": "..."}`` on stdout of a hook with ``allow_reply`` is sent through the §4.5.1
lookup under ``reference.core.hooks.reply_client_message_id`` before the run is marked done: a run again after a
crash cannot send a second reply (E-48). At start the runner resets every claim of a previous process (killing the
group it recorded, when the group's leader is still the process it started), and a sweeper resets this process's
claims whose lease ran out with no worker holding them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spec
from reference.core import RequestError, reply_client_message_id
from reference.core.limits import limit
from reference.core.request import parse_json_object

from .capabilities import Capabilities, bind_scopes
from .config import ConfigError
from .store.hook_runs import HookRuns, StoredRun
from .store.inbox import InboxRow
from .store.outbox import AcceptItem

log = logging.getLogger("meshd.hooks")

HOOKS_FILE = "hooks.toml"
#: the hook names of §6 this daemon does not run (they react to something other than an inbound message)
NOT_RUN = ("on-mention", "on-file-share", "on-disconnect", "on-reconnect", "on-startup", "pre-send")
#: the §6 keys of a hook this daemon does not enforce yet; refused rather than silently ignored
NOT_ENFORCED = ("redact_payload", "network_allowlist", "fs_policy", "killpg_on_timeout", "audit", "sandbox")
PATH = "/usr/bin:/bin"  # §6: the whole PATH a hook gets


class HooksConfigError(ConfigError):
    """``hooks.toml`` cannot be used; the message names the file, the hook and the key."""


@dataclass(frozen=True)
class Hook:
    """One configured hook."""

    name: str
    command: Path
    timeout_s: float
    output_limit: int
    allow_reply: bool
    network_policy: str = "deny"  # deny: in a network namespace of its own where the machine allows one; allow
    scopes: tuple[str, ...] = ()  # capability_token_scope (E-50): a token for each run when not empty

    def matches(self, row: InboxRow) -> bool:
        """Whether this hook runs for the inbound ``row``."""
        if self.name == "on-message":
            return True
        if self.name == "on-dm":
            return row.topic is None
        return row.topic is not None and self.name == f"on-topic-{row.topic}"


def load_hooks(folder: Path, default_timeout_s: float) -> list[Hook]:
    """The enabled hooks of ``folder/hooks.toml`` (validated against spec/schemas/config/hooks.json).

    Raises:
        HooksConfigError: the file is missing or not TOML, a hook or key is unknown or refused, a value is out of
            range, or a hook's executable is missing or not executable.
    """
    path = folder / HOOKS_FILE
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        # req: HOOK-TOML-MANDATORY
        raise HooksConfigError(f"{path}: missing; hooks are enabled and §6 makes hooks.toml mandatory") from exc
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HooksConfigError(f"{path}: {exc}") from exc
    for name, entry in document.items():
        if name in NOT_RUN:
            raise HooksConfigError(f"{path}: [{name}]: this daemon runs on-message, on-dm and on-topic-<name> hooks; "
                                   f"{name} is not run")
        for key, value in (entry.items() if isinstance(entry, dict) else ()):
            if isinstance(value, float) and not math.isfinite(value):  # TOML has nan; a schema's bounds pass it
                raise HooksConfigError(f"{path}: [{name}.{key}]: {value} is not a finite number")
        refused = sorted(set(entry) & set(NOT_ENFORCED)) if isinstance(entry, dict) else []
        if isinstance(entry, dict) and entry.get("network_policy") == "allowlist":
            refused.append("network_policy = \"allowlist\"")
        if refused:
            raise HooksConfigError(f"{path}: [{name}]: {', '.join(refused)}: not enforced by this daemon, so refused "
                                   f"(a setting that would do nothing)")
    errors = sorted(spec.validator("config/hooks").iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        where = ".".join(str(p) for p in error.absolute_path)
        raise HooksConfigError(f"{path}: {f'[{where}]: ' if where else ''}{error.message}")
    hooks = []
    for name, entry in document.items():
        if not entry.get("enabled", True):
            continue
        command = _command(folder, name, entry.get("command"), path)
        hooks.append(Hook(name, command, float(entry.get("timeout_s", default_timeout_s)),
                          int(entry.get("output_size_limit", limit("hook_output_bytes"))),
                          bool(entry.get("allow_reply", False)), str(entry.get("network_policy", "deny")),
                          _scopes(name, entry.get("capability_token_scope", []), path)))
    return hooks


def _scopes(name: str, scopes: list[str], path: Path) -> tuple[str, ...]:
    """The scopes of hook ``name`` (schema-valid), refusing one that could never grant anything: v4 §6.2 binds a
    topic scope to the topic that fired the hook, so ``on-topic-a`` cannot hold ``topic:b:post``, nor ``on-dm`` any."""
    for scope in scopes:
        if not scope.startswith("topic:"):
            continue
        topic = scope[len("topic:"):-len(":post")]
        fires_on = name[len("on-topic-"):] if name.startswith("on-topic-") else None
        if name == "on-dm" or (fires_on is not None and fires_on != topic):
            raise HooksConfigError(f"{path}: [{name}.capability_token_scope]: {scope} can never be granted: a topic "
                                   "scope is bound to the topic of the message that fired the hook (v4 §6.2)")
    return tuple(scopes)


def _command(folder: Path, name: str, given: str | None, path: Path) -> Path:
    if given is not None and "\x00" in given:
        raise HooksConfigError(f"{path}: [{name}.command]: holds a NUL character")
    candidates = [folder / given] if given else [folder / name, folder / f"{name}.sh"]
    for candidate in candidates:
        try:
            found = candidate.is_file()
        except OSError as exc:  # a name too long for the file system, a loop of links
            raise HooksConfigError(f"{path}: [{name}.command]: {candidate}: {exc.strerror or exc}") from exc
        if found:
            if not os.access(candidate, os.X_OK):
                raise HooksConfigError(f"{path}: [{name}]: {candidate} is not executable")
            return candidate.resolve()
    raise HooksConfigError(f"{path}: [{name}]: no executable {' or '.join(str(c) for c in candidates)}")


def matching(hooks: Iterable[Hook], row: InboxRow) -> list[str]:
    """The names of the hooks that run for ``row``."""
    # req: HOOK-EVERY-MATCH -- every enabled hook that matches gets a run
    return [hook.name for hook in hooks if hook.matches(row)]


def event_document(row: InboxRow, hook: str, stdin_limit: int) -> bytes:
    """The event JSON a hook reads on stdin: the message as ``GET /v1/inbox`` gives it, within ``stdin_limit`` bytes
    (§6): when larger, ``_truncated`` is true and the body is cut to what fits, then the meta dropped, then the
    message left out, in that order."""
    from .app import inbox_item

    def encoded(document: dict[str, Any]) -> bytes:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()

    event = {"event": "message", "hook": hook, "event_id": row.client_message_id, "message": inbox_item(row.as_dict())}
    whole = encoded(event)
    if len(whole) <= stdin_limit:
        return whole
    # req: HOOK-STDIN-LIMIT -- cut to fit, and the event says so
    body = event["message"].get("body") or ""
    event["_truncated"] = True
    event["message"]["body"] = ""
    if len(encoded(event)) > stdin_limit:
        event["message"]["meta"] = None
    if len(encoded(event)) > stdin_limit:
        event.pop("message")
        return encoded(event)
    low, high = 0, len(body)  # the longest prefix of the body (in characters) that fits
    while low < high:
        middle = (low + high + 1) // 2
        event["message"]["body"] = body[:middle]
        if len(encoded(event)) <= stdin_limit:
            low = middle
        else:
            high = middle - 1
    event["message"]["body"] = body[:low]
    return encoded(event)


def process_started(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, /proc), None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_group(pgid: int | None, started: int | None, sig: int = signal.SIGKILL) -> bool:
    """Signal the process group ``pgid`` if its leader is still the process that started at ``started`` (a reused
    id is left alone); True when signalled."""
    if pgid is None or pgid <= 1:
        return False
    if started is not None and process_started(pgid) not in (started, None):
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class _Capped:
    """Reads a pipe to its end, keeping the first ``limit`` bytes and counting all of them."""

    def __init__(self, stream: Any, limit: int):
        self.kept, self.total, self._limit, self._stream = bytearray(), 0, limit, stream
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while chunk := self._stream.read1(65536):
                self.total += len(chunk)
                room = self._limit - len(self.kept)
                # req: HOOK-OUTPUT-LIMIT -- read to the end, kept up to the limit
                if room > 0:
                    self.kept += chunk[:room]
        except (OSError, ValueError):
            pass

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)


ReplySubmitter = Callable[[InboxRow, str, str], dict[str, Any]]


def outbox_reply(parse_send: Callable[[bytes, str | None], Any], accept: Callable[[AcceptItem], Any],
                 mint_id: Callable[[], str], now_ms: Callable[[], int], wake: Callable[[], None]) -> ReplySubmitter:
    """The daemon's way to send a hook's reply: POST /v1/send's validation and §4.5.1 accept (``accept`` returns
    the ``(IpcDecision, transition)`` of one item: the group committer's ``submit``), to the message's topic or, for
    a direct message, to its sender, answering the message, under the id derived from (message, hook) (E-48)."""

    def submit(row: InboxRow, hook: str, text: str) -> dict[str, Any]:
        cmid = reply_client_message_id(row.client_message_id, hook)
        to = f"#{row.topic}" if row.topic is not None else f"dm:{row.sender_pubkey}"
        body = {"to": to, "message": text, "client_message_id": cmid}
        if row.broker_message_id:
            body["reply_to_id"] = row.broker_message_id
        try:
            request = parse_send(json.dumps(body, ensure_ascii=False).encode(), cmid)
        except RequestError as exc:
            return {"client_message_id": cmid, "refused": exc.code, "detail": exc.detail}
        decision, _ = accept(AcceptItem.of(request, cmid, mint_id(), now_ms()))
        if decision.insert:
            wake()
        # req: HOOK-REPLY-ONCE -- a re-run's reply meets the first one's row: a match or a 409, never a second row
        return {"client_message_id": cmid, "http_status": decision.http_status, "table_row": decision.table_row}

    return submit


@dataclass
class HookProcess:
    """What one run of a hook's process did: the table event it ends with, and its output (kept up to the limit)."""

    event: str  # exit_ok, exit_error or timeout
    returncode: int | None
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    signalled: str | None = None
    error: str | None = None  # the process could not be started

    @property
    def truncated(self) -> bool:
        return self.stdout_bytes > len(self.stdout) or self.stderr_bytes > len(self.stderr)

    def result(self) -> dict[str, Any]:
        """The run's stored result (without its reply)."""
        if self.error is not None:
            return {"outcome": "spawn_failed", "error": self.error}
        result: dict[str, Any] = {
            "outcome": self.event, "exit": self.returncode, "duration_ms": self.duration_ms,
            "stdout_bytes": self.stdout_bytes, "stderr_bytes": self.stderr_bytes,
            "stderr": self.stderr.decode("utf-8", "replace")}
        if self.signalled:
            result["signalled"] = self.signalled
        if self.truncated:
            result["_truncated"] = True
        return result


def hook_environment(mesh: str, hook: str, event_id: str, socket_path: str,
                     capability_token: str | None = None) -> dict[str, str]:
    """The whole environment of a hook's process (§6)."""
    # req: HOOK-ENVIRONMENT -- a bare environment: no broker credential, PATH=/usr/bin:/bin
    env = {"PATH": PATH, "CLAUDEMESH_MESH": mesh, "CLAUDEMESH_HOOK_NAME": hook, "CLAUDEMESH_EVENT_ID": event_id,
           "CLAUDEMESH_DAEMON_SOCK": socket_path}
    if capability_token is not None:
        # req: HOOK-CAP-ENV -- only when a scope is configured
        env["CLAUDEMESH_CAPABILITY_TOKEN"] = capability_token
    return env


#: how a hook is started in a network namespace of its own, tried in order (``network_namespace``): in a user
#: namespace too, so the hook holds no capability over the daemon's network namespace (a root hook in a bare
#: ``unshare --net`` keeps CAP_SYS_ADMIN and could ``nsenter`` back); else, as root, a bare one with every capability
#: dropped from the bounding set (``setpriv``). Never a bare ``unshare --net`` with the capabilities kept.
NAMESPACE_COMMANDS = (("unshare", "--user", "--map-root-user", "--net", "--"),
                      ("unshare", "--net", "--", "setpriv", "--bounding-set=-all", "--inh-caps=-all",
                       "--ambient-caps=-all", "--"))


def network_namespace() -> tuple[list[str] | None, str]:
    """The command prefix that runs a hook with no network (a fresh network namespace: only a loopback of its own,
    down), and why there is none: ``unshare`` of util-linux when this user may make the namespace (root, or
    unprivileged user namespaces), tried for real; on other systems none (§6.3: best effort)."""
    import shutil
    import sys

    if not sys.platform.startswith("linux"):
        return None, "platform"
    if shutil.which("unshare") is None:
        return None, "no_unshare"
    for command in NAMESPACE_COMMANDS:
        try:
            probe = subprocess.run([*command, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return list(command), ""
    return None, "namespace_refused"


def resource_limits() -> tuple[list[str] | None, str]:
    """The command prefix that starts a hook under the rlimits of limits.yaml (E-49): no core file, at most
    ``hook_rlimit_nofile`` open files, no file larger than ``hook_rlimit_fsize_bytes``; util-linux ``prlimit``
    sets them on itself and execs the hook, so the hook and every child it forks inherit them. None, and why, where
    there is no prlimit (other systems)."""
    import shutil
    import sys

    if not sys.platform.startswith("linux"):
        return None, "platform"
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return None, "no_prlimit"
    nofile, fsize = int(limit("hook_rlimit_nofile")), int(limit("hook_rlimit_fsize_bytes"))
    return [prlimit, f"--core={int(limit('hook_rlimit_core_bytes'))}", f"--nofile={nofile}:{nofile}",
            f"--fsize={fsize}:{fsize}", "--"], ""


def sandbox_prefix(hook: Hook, rlimits: tuple[list[str] | None, str],
                   network: tuple[list[str] | None, str]) -> tuple[list[str], list[str]]:
    """The command prefix a run of ``hook`` gets (rlimits, then its network namespace when it asks for deny), and
    the reasons for what could not be enforced (``cm_daemon_hook_unenforceable_total``'s ``reason``)."""
    # req: HOOK-RLIMITS, HOOK-NETWORK-BEST-EFFORT -- what the machine allows; each thing it does not is counted
    prefix, weakened = list(rlimits[0] or []), [] if rlimits[0] is not None else [rlimits[1]]
    if hook.network_policy == "deny":
        if network[0] is None:
            weakened.append(network[1])
        prefix.extend(network[0] or [])
    return prefix, weakened


def run_hook(hook: Hook, folder: Path, env: dict[str, str], stdin: bytes, kill_grace_s: float,
             spawned: Callable[[subprocess.Popen], None] = lambda process: None,
             prefix: list[str] | None = None,
             exited: Callable[[subprocess.Popen], None] = lambda process: None) -> HookProcess:
    """Run ``hook``'s executable once in a process group of its own, with ``stdin`` and ``env`` (behind ``prefix``,
    the sandbox's commands, when given); on timeout SIGTERM to the group and SIGKILL ``kill_grace_s`` later; after
    any exit the group is killed. ``spawned`` is called with the process as soon as it runs, ``exited`` as soon as
    it has exited (before its group is killed and its output read to the end); the duration ends there too."""
    started = time.monotonic()
    if not (hook.command.is_file() and os.access(hook.command, os.X_OK)):  # also when behind unshare
        return HookProcess("exit_error", None, 0, b"", b"", 0, 0, error=f"{hook.command}: gone or not executable")
    try:
        process = subprocess.Popen([*(prefix or []), str(hook.command)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env, cwd=folder, start_new_session=True,
                                   close_fds=True)
    except OSError as exc:  # gone since the start, no longer executable, no interpreter: a failed run
        return HookProcess("exit_error", None, 0, b"", b"", 0, 0, error=f"{type(exc).__name__}: {exc}")
    spawned(process)
    stdout, stderr = _Capped(process.stdout, hook.output_limit), _Capped(process.stderr, hook.output_limit)
    threading.Thread(target=_feed, args=(process, stdin), daemon=True).start()
    event, signalled = "exit_ok", None
    try:
        process.wait(hook.timeout_s)
    except subprocess.TimeoutExpired:
        # req: HOOK-TIMEOUT-KILLPG -- SIGTERM to the group, SIGKILL after the grace
        event, signalled = "timeout", "SIGTERM"
        kill_group(process.pid, None, signal.SIGTERM)
        try:
            process.wait(kill_grace_s)
        except subprocess.TimeoutExpired:
            signalled = "SIGKILL"
    ended = time.monotonic()
    exited(process)
    kill_group(process.pid, None)  # what the hook left running in its group goes with it
    process.wait()
    for reader in (stdout, stderr):
        reader.thread.join(kill_grace_s)
    if event == "exit_ok" and process.returncode != 0:
        # req: HOOK-NONZERO-NOT-RETRIED -- failed: a finished run never runs again
        event = "exit_error"
    return HookProcess(event, process.returncode, int((ended - started) * 1000), bytes(stdout.kept),
                       bytes(stderr.kept), stdout.total, stderr.total, signalled)


def parse_reply(done: HookProcess) -> str | dict[str, str] | None:
    """The reply a hook that exited 0 asks for: its text, None for an empty stdout, or why its stdout is none."""
    text = done.stdout.strip()
    if not text:
        return None
    if done.stdout_bytes > len(done.stdout):
        return {"refused": "stdout_truncated"}
    try:
        # req: HOOK-REPLY-CONTRACT -- a JSON object with a non-empty string reply, and allow_reply; read as strictly
        # and within the same JSON limits (E-40) as an IPC body: a hook may echo what any sender wrote
        document = parse_json_object(text)
    except RequestError as exc:
        return {"refused": {"invalid_json": "stdout_not_json", "limit_exceeded": "stdout_past_json_limits",
                            "invalid_request": "no_reply_member"}.get(exc.code, "stdout_not_json")}
    if "reply" not in document:
        return {"refused": "no_reply_member"}
    reply = document["reply"]
    if not isinstance(reply, str) or not reply:
        return {"refused": "reply_not_a_string"}
    try:
        reply.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a \ud800 escape) is no text a message can carry
        return {"refused": "reply_not_unicode"}
    return reply


def audit_record(run: StoredRun) -> dict[str, Any]:
    """The audit line of a finished run (v2 §6.5's members, and its state); ``capability_calls`` counts the requests
    the hook made with its capability token, granted or refused (E-50)."""
    from reference.clock import rfc3339_ms

    result = run.result or {}
    reply = result.get("reply") or {}
    return {"hook": run.hook, "event_id": run.client_message_id, "state": run.state, "claims": run.claims,
            "exit": result.get("exit"), "duration_ms": result.get("duration_ms"),
            "stdout_bytes": result.get("stdout_bytes"), "stderr_bytes": result.get("stderr_bytes"),
            "replied": reply.get("http_status") in (200, 202),
            "capability_calls": result.get("capability_calls", 0),
            "ts": rfc3339_ms(run.finished_at) if run.finished_at is not None else None}


class HookRunner:
    """The worker pool of one daemon process."""

    def __init__(self, runs: HookRuns, hooks: list[Hook], folder: Path, *, inbox_row: Callable[[int], InboxRow | None],
                 submit_reply: ReplySubmitter, mesh: str, socket_path: str, clock_ms: Callable[[], int],
                 concurrency: int, on_finish: Callable[[StoredRun], None] | None = None,
                 on_unenforceable: Callable[[str, str], None] | None = None,
                 publish: Callable[[str, dict[str, Any]], Any] | None = None,
                 network: tuple[list[str] | None, str] | None = None, capabilities: Capabilities | None = None,
                 rlimits: tuple[list[str] | None, str] | None = None):
        self.runs, self.folder, self.mesh, self.socket_path = runs, folder, mesh, socket_path
        self.hooks = {hook.name: hook for hook in hooks}
        self.inbox_row, self.submit_reply, self.clock_ms = inbox_row, submit_reply, clock_ms
        self.concurrency, self.on_finish, self.on_unenforceable = concurrency, on_finish, on_unenforceable
        self.publish = publish
        self.capabilities = capabilities if capabilities is not None else Capabilities(hooks_enabled=True)
        # req: HOOK-NETWORK-BEST-EFFORT -- probed once: a fresh network namespace where this machine allows one
        self.network = network if network is not None else network_namespace()
        if self.network[0] is None and any(hook.network_policy == "deny" for hook in hooks):
            log.warning("hook_network_unenforceable reason=%s: hooks with network_policy deny run with the daemon's "
                        "network", self.network[1])
        # req: HOOK-RLIMITS -- probed once, like the namespace
        self.rlimits = rlimits if rlimits is not None else resource_limits()
        if self.rlimits[0] is None:
            log.warning("hook_rlimits_unenforceable reason=%s: hooks run with the daemon's rlimits", self.rlimits[1])
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.kill_grace_s = float(limit("hook_kill_grace_s"))
        self.stdin_limit = int(limit("hook_stdin_bytes"))
        longest = max((hook.timeout_s for hook in hooks), default=1.0)
        self.lease_ms = int((longest + self.kill_grace_s + 5.0) * 1000)
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._held: dict[int, subprocess.Popen | None] = {}
        self._held_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # --- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Reset the previous process's claims, then start the workers and the lease sweeper."""
        self._reset(self.runs.reset_lost(self.clock_ms(), keep_owner=self.owner))
        # req: HOOK-POOL -- concurrency workers; the other runs wait pending, the link never waits
        for n in range(self.concurrency):
            thread = threading.Thread(target=self._work, name=f"meshd-hook-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        sweeper = threading.Thread(target=self._sweep, name="meshd-hook-sweeper", daemon=True)
        sweeper.start()
        self._threads.append(sweeper)

    def notify(self) -> None:
        """A message was stored with runs: wake a worker."""
        with self._wake:
            self._wake.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop claiming and kill the running hooks' groups; their runs stay claimed and run again at the next start
        (a stop is a crash to a hook: E-48)."""
        self._stop.set()
        self.notify()
        with self._held_lock:
            running = [p for p in self._held.values() if p is not None]
        for process in running:
            kill_group(process.pid, None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _reset(self, reset: list[tuple[StoredRun, Any]]) -> None:
        for run, step in reset:
            # req: HOOK-CLAIM-RESET -- the lost claim's process group is killed before the hook runs again
            if "kill_group" in step.effects:
                kill_group(run.pgid, run.pgid_started)
            log.warning("hook_claim_reset hook=%s run=%d claims=%d now=%s", run.hook, run.id, run.claims,
                        step.run.state)
            if step.run.state != "pending":  # its last claim lost: finished (failed), audited and counted like any
                after = self.runs.get(run.id)
                if after is not None:
                    self._finished(after, {})
        if reset:
            self.notify()

    def _sweep(self) -> None:
        while not self._stop.wait(1.0):
            with self._held_lock:
                held = list(self._held)
            try:
                self._reset(self.runs.reset_lost(self.clock_ms(), keep_owner=self.owner, held=held))
            except Exception:
                log.exception("hook lease sweep failed; it runs again in 1 s")

    # --- the workers ------------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                claimed = self.runs.claim(self.owner, self.clock_ms(), self.lease_ms)
            except Exception:
                log.exception("hook claim failed")
                claimed = None
            if claimed is None:
                with self._wake:
                    self._wake.wait(0.5)
                continue
            run, _ = claimed
            with self._held_lock:
                self._held[run.id] = None
            try:
                self._run(run)
            except Exception:
                log.exception("hook run %d failed in the daemon; its claim is reset by the sweeper", run.id)
            finally:
                with self._held_lock:
                    self._held.pop(run.id, None)

    def _run(self, run: StoredRun) -> None:
        hook = self.hooks.get(run.hook)
        row = self.inbox_row(run.inbox_seq)
        if hook is None or row is None:
            reason = "hook_not_configured" if hook is None else "message_gone"
            self._finish(run, "exit_error", {"outcome": reason})
            return

        capability = None
        if hook.scopes:
            # req: HOOK-CAP-SCOPE -- every scope bound to this message when the token is minted
            capability = self.capabilities.mint(hook.name, run.id, bind_scopes(
                hook.scopes, row.topic, row.sender_pubkey, row.broker_message_id))
        group: list[int] = []

        def spawned(process: subprocess.Popen) -> None:
            self.capabilities.enter(process.pid, capability)  # start_new_session: the pid is the group's id
            group.append(process.pid)
            with self._held_lock:
                self._held[run.id] = process
            self.runs.record_process(run.id, self.owner, process.pid, process_started(process.pid))

        prefix, weakened = sandbox_prefix(hook, self.rlimits, self.network)
        for reason in weakened:
            if self.on_unenforceable is not None:
                self.on_unenforceable(hook.name, reason)
        environment = hook_environment(self.mesh, hook.name, row.client_message_id, self.socket_path,
                                       None if capability is None else capability.token)
        try:
            done = run_hook(hook, self.folder, environment, event_document(row, hook.name, self.stdin_limit),
                            self.kill_grace_s, spawned, prefix,
                            exited=lambda _process: self.capabilities.revoke(capability))
        finally:
            self.capabilities.leave(group[0] if group else None, capability)
        result = done.result()
        if capability is not None:
            result["capability_calls"] = capability.calls
        if done.truncated:
            log.warning("hook_output_truncated hook=%s run=%d stdout_bytes=%d stderr_bytes=%d limit=%d", hook.name,
                        run.id, done.stdout_bytes, done.stderr_bytes, hook.output_limit)
        if done.event == "exit_ok":
            reply = parse_reply(done)
            if isinstance(reply, str):
                # req: HOOK-REPLY-ONCE -- the §4.5.1 lookup under the pair's id, before the run is marked done
                result["reply"] = (self.submit_reply(row, hook.name, reply) if hook.allow_reply
                                   else {"refused": "allow_reply_false"})
            else:
                result["reply"] = reply
        self._finish(run, done.event, result)

    def _finish(self, run: StoredRun, event: str, result: dict[str, Any]) -> None:
        finished = self.runs.finish(run.id, self.owner, event, result, self.clock_ms())
        if finished is None:
            log.warning("hook_run_lost run=%d hook=%s: its claim was reset while it ran", run.id, run.hook)
            return
        self._finished(finished[0], result)

    def _finished(self, after: StoredRun, result: dict[str, Any]) -> None:
        """A run reached its final state: its audit line, its hook_executed event (when its process ran), the
        metric."""
        level = logging.INFO if after.state == "done" else logging.WARNING
        log.log(level, "hook_audit %s", json.dumps(audit_record(after), separators=(",", ":")))
        if self.publish is not None and result.get("exit") is not None and after.message_event is not None:
            from reference.clock import rfc3339_ms

            # req: HOOK-EXECUTED-EVENT -- after the mark: a stream never shows a run the inbox does not hold
            self.publish("hook_executed", {"hook": after.hook, "event_id": after.message_event,
                                           "exit": result["exit"], "duration_ms": result["duration_ms"],
                                           "ts": rfc3339_ms(after.finished_at)})
        if self.on_finish is not None:
            self.on_finish(after)


def _feed(process: subprocess.Popen, data: bytes) -> None:
    """Write the event to the hook's stdin and close it; a hook that does not read it is not waited for."""
    try:
        process.stdin.write(data)
        process.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass
