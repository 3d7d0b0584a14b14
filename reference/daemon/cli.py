"""`meshd` daemon commands: up, down, status, version, accept-host, outbox, inbox, send, install-service,
uninstall-service.

Human output uses rich tables; every listing also has ``--json`` for scripts. Exit codes follow E-15.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from reference.client import Client, Endpoint, MeshError, Unavailable
from reference.clock import WallClock, rfc3339_ms
from reference.core.codes import exit_code
from reference.core.outbox import STATES as OUTBOX_STATES
from reference.core.request import DEFAULT_PRIORITY, PRIORITIES
from reference.state_dir import StateDir
from spec import openapi_parameter

from . import hooks_cli, identity, logs
from .config import Config, ConfigError, load

if TYPE_CHECKING:
    from .runtime import Components

#: E-15 (spec/tables/exit_codes.yaml): every command exits with these; ``up`` also with the daemon's refusals
EXIT_OK, EXIT_ERROR, EXIT_USAGE = exit_code("ok"), exit_code("error"), exit_code("usage")
CI_VARIABLES = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "CIRCLECI", "JENKINS_URL")
console = Console()
err = Console(stderr=True, soft_wrap=True)  # one line per message: a long path is never broken


def default_state_dir(mesh: str = "default") -> Path:
    env = os.environ.get("MESHD_STATE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".claudemesh" / "daemon" / mesh


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="state directory (default: $MESHD_STATE_DIR or ~/.claudemesh/daemon/<mesh>)")
    parser.add_argument("--mesh", default="default", help="mesh slug (selects the default state directory)")


def _state_dir(args: argparse.Namespace) -> Path:
    return (args.state_dir or default_state_dir(args.mesh)).resolve()


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    values: dict[str, dict[str, Any]] = {}

    def put(section: str, key: str, value: Any) -> None:
        if value is not None:
            values.setdefault(section, {})[key] = value

    put("broker", "url", getattr(args, "broker_url", None))
    put("broker", "mesh_id", getattr(args, "mesh_id", None))
    put("ipc", "http_port", getattr(args, "port", None))
    if getattr(args, "no_tcp", False):
        put("ipc", "tcp_enabled", False)
    put("trace", "dir", str(args.trace_dir) if getattr(args, "trace_dir", None) else None)
    put("daemon", "clock_file", str(args.clock_file) if getattr(args, "clock_file", None) else None)
    if getattr(args, "mesh", None) and args.mesh != "default":
        put("daemon", "mesh", args.mesh)
    return values


def cmd_up(args: argparse.Namespace, components: Components | None = None) -> int:
    """`meshd up`; ``components`` replaces parts of the daemon (runtime.Components, the seam tests start it with)."""
    from .runtime import PreflightError, Runtime, preflight
    from .server import record_exit, serve

    state_dir = _state_dir(args)
    config_path = args.config or StateDir(state_dir).config

    def current() -> Config:
        return load(config_path, _overrides(args))

    try:
        config = current()
    except ConfigError as exc:
        err.print(f"meshd: invalid configuration: {exc}")
        return exit_code("invalid_config")
    if args.detach:
        if components is not None:
            err.print("meshd: --detach starts the stock daemon; it cannot carry replaced components")
            return EXIT_USAGE
        return _detach(args, state_dir)
    logs.configure(config["daemon"]["log_level"])
    try:
        for note in preflight(state_dir, config, components):
            logging.getLogger("meshd").info("%s", note)
    # req: LIFE-EXIT-CODES, LIFE-STATE-REFUSED -- a refusal is its exit code and one line, never a traceback
    except PreflightError as exc:
        err.print(f"meshd: {exc}")
        return exc.code
    except Exception as exc:  # never a traceback for a state directory meshd cannot use (E-15, E-44)
        err.print(f"meshd: cannot start in {state_dir}: {type(exc).__name__}: {exc}")
        return EXIT_ERROR
    if getattr(args, "target_file", None) is not None:
        write_target_description(args.target_file, config)
    trace_dir = Path(config["trace"]["dir"]) if config["trace"]["dir"] else None

    def build():
        runtime = Runtime(state_dir, config, trace_dir, on_fatal=lambda code, reason: record_exit(state_dir, code,
                                                                                                   reason),
                          components=components)
        return runtime.app, runtime

    return serve(state_dir, config.values, build, lambda: current()["daemon"]["log_level"])


def write_target_description(path: Path, config: Config) -> None:
    """The launch contract's ``{target_file}`` (spec/schemas/harness/target.json): meshd reads config.toml, honours
    the clock hook, and declares the timing it runs with -- so a harness that launched it through a template of its
    own times it by the schedule it really follows, not by the spec's defaults."""
    from spec import SPEC_VERSION

    outbox, reconnect, broker, ipc = (config[k] for k in ("outbox", "reconnect", "broker", "ipc"))
    timing = {"retry_base_ms": outbox["retry_base_ms"], "retry_max_ms": outbox["retry_max_ms"],
              "retry_jitter": outbox["retry_jitter"], "ack_timeout_s": outbox["ack_timeout_s"],
              "reconnect_initial_ms": reconnect["initial_ms"], "reconnect_max_ms": reconnect["max_ms"],
              "reconnect_multiplier": reconnect["multiplier"], "reconnect_jitter": reconnect["jitter"],
              "hello_timeout_s": broker["hello_timeout_s"], "keepalive_s": ipc["keepalive_s"],
              "header_read_s": ipc["header_read_s"], "body_read_s": ipc["body_read_s"]}
    document = {"name": f"meshd (meshspec reference, v{SPEC_VERSION})", "config_toml": True, "clock_hook": True,
                "timing": timing}
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(scratch, path)


def _detach(args: argparse.Namespace, state_dir: Path) -> int:
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "reference.cli", *[a for a in sys.argv[1:] if a != "--detach"]]
    if "--state-dir" not in argv:
        argv += ["--state-dir", str(state_dir)]
    from reference.sandbox import private_log

    files = StateDir(state_dir)
    log = private_log(files.log)
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err.print(f"meshd: the daemon exited with {process.returncode}; see {files.log}")
            return process.returncode or EXIT_ERROR
        if is_running(state_dir):
            console.print(f"meshd running (pid {process.pid})\n  socket  {files.socket}")
            if files.http_port.exists():
                port = files.http_port.read_text().strip()
                console.print(f"  tcp     127.0.0.1:{port}\n  token   {files.local_token}")
            return EXIT_OK
        time.sleep(0.1)
    err.print("meshd: the daemon did not answer within 20 s")
    return EXIT_ERROR


def _pid(state_dir: Path) -> int | None:
    path = StateDir(state_dir).pid
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    pid = _pid(state_dir)
    if pid is None:
        err.print("meshd: no daemon is running in " + str(state_dir))
        return EXIT_ERROR
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            console.print(f"meshd stopped (pid {pid})")
            return EXIT_OK
        time.sleep(0.05)
    err.print(f"meshd: pid {pid} did not stop within {args.timeout:g} s")
    return EXIT_ERROR


def daemon_client(state_dir: Path, timeout: float = 10.0) -> Client:
    """The SDK's client of the daemon of ``state_dir``, on its unix socket (reference.client, §11)."""
    return Client(Endpoint(socket_path=str(StateDir(state_dir).socket)), timeout)


def is_running(state_dir: Path) -> bool:
    """True when the daemon answers GET /v1/health on its socket."""
    if not StateDir(state_dir).socket.exists():
        return False
    try:
        daemon_client(state_dir).health()
    except (MeshError, ValueError, TypeError):
        return False
    return True


def _refused(exc: MeshError) -> int:
    err.print(f"meshd: {exc.status} {exc.code}: {exc.problem.get('detail')}" if exc.status else f"meshd: {exc}")
    return EXIT_ERROR


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    if not is_running(state_dir):
        if args.json:
            print(json.dumps({"running": False, "state_dir": str(state_dir)}))
        else:
            err.print(f"meshd: not running ({state_dir})")
        return EXIT_ERROR
    try:
        health = asdict(daemon_client(state_dir).health())
    except MeshError as exc:
        return _refused(exc)
    if args.json:
        print(json.dumps({"running": True, **health}))
        return EXIT_OK
    table = Table(title=f"meshd {health['daemon_version']} — {state_dir}")
    table.add_column("")
    table.add_column("")
    for key in ("connected", "mesh", "member_pubkey", "queue_depth", "inflight", "uptime_s", "broker_version", "pid"):
        table.add_row(key, str(health.get(key)))
    console.print(table)
    return EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    from spec import SPEC_VERSION

    state_dir = _state_dir(args)
    info: dict[str, Any] = {"meshd": SPEC_VERSION}
    if is_running(state_dir):
        try:
            info["daemon"] = asdict(daemon_client(state_dir).version())
        except MeshError as exc:
            return _refused(exc)
    print(json.dumps(info, indent=None if args.json else 2))
    return EXIT_OK


def cmd_accept_host(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    config = load(StateDir(state_dir).config)
    fingerprint = identity.accept_host(state_dir, config["identity"]["host_id_override"],
                                       config["identity"]["stable_mac_override"],
                                       clock=WallClock(config["daemon"]["clock_file"]))
    console.print(f"host fingerprint re-pinned: {fingerprint[:16]} (keypair kept)")
    return EXIT_OK


#: ``meshd outbox list``'s filters: one per outbox state (common/defs outbox_status), dead rows' spelled ``--failed``
OUTBOX_FILTERS = {("failed" if state == "dead" else state): state for state in OUTBOX_STATES}


def _outbox_store(state_dir: Path):
    from .runtime import policy_for
    from .store import OutboxStore

    files = StateDir(state_dir)
    config = load(files.config)
    return OutboxStore(files.outbox_db, policy_for(config), clock=WallClock(config["daemon"]["clock_file"]).ms)


def cmd_outbox_list(args: argparse.Namespace) -> int:
    from .app import outbox_item

    state_dir = _state_dir(args)
    status = next((OUTBOX_FILTERS[name] for name in OUTBOX_FILTERS if getattr(args, name)), None)
    if not StateDir(state_dir).outbox_db.exists():
        err.print(f"meshd: no outbox in {state_dir}")
        return EXIT_ERROR
    store = _outbox_store(state_dir)
    try:
        rows, _ = store.list(status=status, limit=args.limit)
    finally:
        store.close()
    items = [outbox_item(row) for row in rows]
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_OK
    table = Table(title=f"outbox ({status or 'all'})")
    for column in ("id", "client_message_id", "status", "attempts", "enqueued_at", "last_error", "superseded_by"):
        table.add_column(column)
    for item in items:
        table.add_row(*(str(item[c] if item[c] is not None else "") for c in (
            "id", "client_message_id", "status", "attempts", "enqueued_at", "last_error", "superseded_by")))
    console.print(table)
    return EXIT_OK


def cmd_inbox_quarantine(args: argparse.Namespace) -> int:
    """`meshd inbox quarantine`: the inbound frames the daemon could not take, newest first, with why (E-41)."""
    from .store import InboxStore

    state_dir = _state_dir(args)
    files = StateDir(state_dir)
    if not files.inbox_db.exists():
        err.print(f"meshd: no inbox in {state_dir}")
        return EXIT_ERROR
    # WAL: reading beside a running daemon is safe; a migration it applies is stamped by the daemon's clock
    store = InboxStore(files.inbox_db, clock=WallClock(load(files.config)["daemon"]["clock_file"]).ms)
    try:
        records = [frame.as_dict() for frame in store.quarantined(limit=args.limit)]
    finally:
        store.close()
    if not args.frames:
        for record in records:
            record["frame"] = record["frame"][:2048]
    if args.json:
        print(json.dumps(records, indent=2, ensure_ascii=False))
        return EXIT_OK
    table = Table(title=f"quarantined inbound frames ({len(records)} shown)")
    for column in ("id", "last_seen_at", "seen", "frame_type", "client_message_id", "acked", "frame_bytes", "reason"):
        table.add_column(column)
    for record in records:
        seen_at = rfc3339_ms(record["last_seen_at"])
        table.add_row(str(record["id"]), seen_at, str(record["seen"]), str(record["frame_type"] or ""),
                      str(record["client_message_id"] or ""), "yes" if record["acked"] else "no",
                      str(record["frame_bytes"]), record["reason"][:200])
    console.print(table)
    return EXIT_OK


def cmd_outbox_requeue(args: argparse.Namespace) -> int:
    from .problems import Problem
    from .runtime import requeue

    state_dir = _state_dir(args)
    row_id = args.row_id or args.id
    if not row_id:
        err.print("meshd outbox requeue: give the outbox row id")
        return EXIT_USAGE
    if is_running(state_dir):
        try:
            result = asdict(daemon_client(state_dir).requeue(row_id, args.new_client_id))
        except MeshError as exc:
            return _refused(exc)
    else:
        store = _outbox_store(state_dir)
        try:
            result = requeue(store, row_id, args.new_client_id, "operator")
        except Problem as exc:
            err.print(f"meshd: {exc.code}: {exc.detail}")
            return EXIT_ERROR
        finally:
            store.close()
    print(json.dumps(result) if args.json else
          f"aborted {result['aborted_row_id']}; new row {result['new_row_id']} "
          f"with client_message_id {result['new_client_message_id']}")
    return EXIT_OK


def cmd_send(args: argparse.Namespace) -> int:
    """`meshd send`: the SDK's send, so a busy daemon or a lost connection is retried under the one key."""
    state_dir = _state_dir(args)
    try:
        meta = json.loads(args.meta) if args.meta else None
    except ValueError as exc:
        err.print(f"meshd send: --meta is not JSON: {exc}")
        return EXIT_USAGE
    try:
        result = daemon_client(state_dir).send(args.to, args.message, client_message_id=args.id,
                                               priority=args.priority, meta=meta, reply_to_id=args.reply_to,
                                               deadline_s=args.deadline)
    except Unavailable as exc:
        err.print(f"meshd: cannot reach the daemon: {exc}")
        return EXIT_ERROR
    except MeshError as exc:
        return _refused(exc)
    body = asdict(result)
    if not result.duplicate:  # 202 SendAccepted has no broker_message_id or history_id
        del body["broker_message_id"], body["history_id"]
    print(json.dumps(body))
    return EXIT_OK


def systemd_unit(state_dir: Path) -> str:
    """The systemd user unit (§9 hardening)."""
    exe = Path(sys.executable).resolve()
    return f"""[Unit]
Description=meshd (claudemesh daemon v0.9.0 reference)
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
Type=simple
ExecStart={exe} -m reference.cli up --state-dir {state_dir}
Restart=on-failure
RestartSec=5s
# Exit codes that need a human, not a restart loop (E-15): config, host mismatch, outbox integrity, negotiation.
RestartPreventExitStatus=3 4 5 10
MemoryMax=256M
TasksMax=128
LimitNOFILE=4096
NoNewPrivileges=true
PrivateTmp=true
ProtectSystem=strict
ProtectHome=read-only
ReadWritePaths={state_dir}
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=default.target
"""


def launchd_plist(state_dir: Path) -> str:
    exe = Path(sys.executable).resolve()
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>dev.meshspec.meshd</string>
  <key>ProgramArguments</key>
  <array><string>{exe}</string><string>-m</string><string>reference.cli</string><string>up</string>
    <string>--state-dir</string><string>{state_dir}</string></array>
  <key>RunAtLoad</key><true/>
  <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>
  <key>StandardOutPath</key><string>{StateDir(state_dir).log}</string>
  <key>StandardErrorPath</key><string>{StateDir(state_dir).log}</string>
</dict>
</plist>
"""


def _service_path(kind: str) -> Path:
    if kind == "launchd":
        return Path.home() / "Library" / "LaunchAgents" / "dev.meshspec.meshd.plist"
    return Path.home() / ".config" / "systemd" / "user" / "meshd.service"


def cmd_install_service(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    kind = args.kind or ("launchd" if sys.platform == "darwin" else "systemd")
    text = launchd_plist(state_dir) if kind == "launchd" else systemd_unit(state_dir)
    if args.dry_run:
        print(text, end="")
        return EXIT_OK
    if any(os.environ.get(name) for name in CI_VARIABLES) and not args.force:
        err.print("meshd: refusing to install a persistent service in CI (pass --force to override)")
        return EXIT_USAGE
    path = _service_path(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    console.print(f"wrote {path}")
    if args.no_start:
        return EXIT_OK
    commands = ([["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)]] if kind == "launchd" else
                [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", "meshd.service"]])
    for command in commands:
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            err.print(f"meshd: {' '.join(command)} failed ({result.returncode})")
            return EXIT_ERROR
    return EXIT_OK


def cmd_uninstall_service(args: argparse.Namespace) -> int:
    kind = args.kind or ("launchd" if sys.platform == "darwin" else "systemd")
    path = _service_path(kind)
    if not args.no_start:
        command = (["launchctl", "bootout", f"gui/{os.getuid()}", str(path)] if kind == "launchd" else
                   ["systemctl", "--user", "disable", "--now", "meshd.service"])
        subprocess.run(command, check=False)
    if path.exists():
        path.unlink()
        console.print(f"removed {path}")
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the daemon commands on the top-level `meshd` parser."""
    up = sub.add_parser("up", help="run the daemon (foreground unless --detach)")
    _common(up)
    up.add_argument("--config", type=Path, help="config.toml (default: <state-dir>/config.toml)")
    up.add_argument("--broker-url", help="broker WebSocket URL (broker.url)")
    up.add_argument("--mesh-id", help="mesh id at the broker (broker.mesh_id)")
    up.add_argument("--port", type=int, help="TCP port (0 picks one)")
    up.add_argument("--no-tcp", action="store_true", help="unix socket only")
    up.add_argument("--trace-dir", type=Path, help="write JSONL trace events here")
    up.add_argument("--clock-file", type=Path, help="testing: add the seconds in this file to the wall clock")
    up.add_argument("--target-file", type=Path,
                    help="testing: write the launch contract's target description (what meshd reads and its timing)")
    up.add_argument("--detach", action="store_true", help="start in the background and return once it answers")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the daemon (SIGTERM, bounded drain)")
    _common(down)
    down.add_argument("--timeout", type=float, default=15.0)
    down.set_defaults(func=cmd_down)

    for name, func, text in (("status", cmd_status, "is the daemon running, and how is it"),
                             ("version", cmd_version, "meshd and daemon versions")):
        parser = sub.add_parser(name, help=text)
        _common(parser)
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(func=func)

    accept = sub.add_parser("accept-host", help="re-pin the host fingerprint to this machine, keeping the keypair")
    _common(accept)
    accept.set_defaults(func=cmd_accept_host)

    outbox = sub.add_parser("outbox", help="inspect and recover the outbox")
    outbox_sub = outbox.add_subparsers(dest="outbox_command", required=True)
    listing = outbox_sub.add_parser("list", help="list outbox rows")
    _common(listing)
    group = listing.add_mutually_exclusive_group()
    for name in OUTBOX_FILTERS:
        group.add_argument(f"--{name}", action="store_true", help=f"only {OUTBOX_FILTERS[name]} rows")
    listing.add_argument("--limit", type=int, default=openapi_parameter("/v1/outbox", "get", "limit")["default"],
                         help="at most this many rows (GET /v1/outbox's default)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_outbox_list)
    requeue = outbox_sub.add_parser("requeue", help="retire a dead or pending row and retry it under a fresh id")
    _common(requeue)
    requeue.add_argument("row_id", nargs="?", help="the outbox row id")
    requeue.add_argument("--id", help="alias of the positional row id (§4.5.3 spelling)")
    fresh = requeue.add_mutually_exclusive_group()
    fresh.add_argument("--new-client-id", help="the new client_message_id")
    fresh.add_argument("--auto", action="store_true", help="mint a ULID (the default)")
    requeue.add_argument("--json", action="store_true")
    requeue.set_defaults(func=cmd_outbox_requeue)

    inbox = sub.add_parser("inbox", help="inspect the inbox")
    inbox_sub = inbox.add_subparsers(dest="inbox_command", required=True)
    quarantine = inbox_sub.add_parser("quarantine", help="inbound frames the daemon could not take, and why (E-41)")
    _common(quarantine)
    quarantine.add_argument("--limit", type=int, default=100)
    quarantine.add_argument("--frames", action="store_true", help="print whole frames (default: the first 2 KiB)")
    quarantine.add_argument("--json", action="store_true")
    quarantine.set_defaults(func=cmd_inbox_quarantine)

    send = sub.add_parser("send", help="POST /v1/send through the running daemon")
    _common(send)
    send.add_argument("--to", required=True)
    send.add_argument("--message", required=True)
    send.add_argument("--priority", default=DEFAULT_PRIORITY, choices=PRIORITIES)
    send.add_argument("--meta", help="a JSON object")
    send.add_argument("--reply-to")
    send.add_argument("--id", help="the client_message_id (default: a fresh ULID, kept for every retry)")
    send.add_argument("--deadline", type=float, default=60.0,
                      help="seconds to keep retrying a busy or unreachable daemon under the same id (default 60)")
    send.set_defaults(func=cmd_send)

    install = sub.add_parser("install-service", help="install a systemd user unit or launchd agent")
    _common(install)
    install.add_argument("--kind", choices=["systemd", "launchd"])
    install.add_argument("--dry-run", action="store_true", help="print the unit and change nothing")
    install.add_argument("--force", action="store_true", help="install even in CI")
    install.add_argument("--no-start", action="store_true", help="write the unit but do not enable it")
    install.set_defaults(func=cmd_install_service)
    hooks_cli.add_commands(sub, _common, _state_dir)

    uninstall = sub.add_parser("uninstall-service", help="disable and remove the service unit")
    _common(uninstall)
    uninstall.add_argument("--kind", choices=["systemd", "launchd"])
    uninstall.add_argument("--no-start", action="store_true", help="only remove the file")
    uninstall.set_defaults(func=cmd_uninstall_service)
