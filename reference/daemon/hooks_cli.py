"""`meshd hooks list | test NAME --event FILE | audit`: the hooks of a state directory, one run by hand, and what ran.

``list`` and ``audit`` read ``hooks.toml`` and ``inbox.db`` beside a running daemon (WAL: reading is safe); ``test``
runs one hook's executable exactly as the daemon would -- its environment, the timeout, the process-group kill --
and prints what it did and the reply it asks for, without sending anything.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from reference.clock import WallClock
from reference.core import reply_client_message_id
from reference.core.codes import exit_code
from reference.core.limits import limit
from reference.state_dir import StateDir

from .config import ConfigError, load
from .hooks import (
    Hook,
    audit_record,
    hook_environment,
    load_hooks,
    network_namespace,
    parse_reply,
    resource_limits,
    run_hook,
    sandbox_prefix,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = exit_code("ok"), exit_code("error"), exit_code("usage")
console = Console()
err = Console(stderr=True, soft_wrap=True)


def _hooks(state_dir: Path) -> tuple[dict[str, Any], Path, list[Hook]]:
    from .runtime import hooks_folder

    config = load(StateDir(state_dir).config)
    folder = hooks_folder(state_dir, config)
    return config.values, folder, load_hooks(folder, float(config["hooks"]["default_timeout_s"]))


def _runs(state_dir: Path, config: dict[str, Any]):
    from .store import InboxStore
    from .store.hook_runs import HookRuns

    files = StateDir(state_dir)
    if not files.inbox_db.exists():
        return None
    store = InboxStore(files.inbox_db, clock=WallClock(config["daemon"]["clock_file"]).ms)
    return HookRuns(store, int(config["hooks"]["max_claims"]))


def cmd_hooks_list(args: argparse.Namespace, state_dir: Path) -> int:
    config, folder, hooks = _hooks(state_dir)
    runs = _runs(state_dir, config)
    try:
        counts = runs.counts_by_hook() if runs is not None else {}
    finally:
        if runs is not None:
            runs.inbox.close()
    records = [{"hook": hook.name, "command": str(hook.command), "timeout_s": hook.timeout_s,
                "output_size_limit": hook.output_limit, "allow_reply": hook.allow_reply,
                "runs": counts.get(hook.name, {})} for hook in hooks]
    enabled = bool(config["hooks"]["enabled"])
    if args.json:
        print(json.dumps({"enabled": enabled, "folder": str(folder), "hooks": records}, indent=2))
        return EXIT_OK
    title = f"hooks in {folder}" + ("" if enabled else " (hooks.enabled is false: the daemon runs none of them)")
    table = Table(title=title)
    for column in ("hook", "command", "timeout_s", "output_size_limit", "allow_reply", "runs"):
        table.add_column(column)
    for record in records:
        runs_text = ", ".join(f"{state} {n}" for state, n in sorted(record["runs"].items())) or "-"
        table.add_row(record["hook"], record["command"], str(record["timeout_s"]), str(record["output_size_limit"]),
                      "yes" if record["allow_reply"] else "no", runs_text)
    console.print(table)
    return EXIT_OK


def cmd_hooks_test(args: argparse.Namespace, state_dir: Path) -> int:
    config, folder, hooks = _hooks(state_dir)
    hook = next((h for h in hooks if h.name == args.name), None)
    if hook is None:
        err.print(f"meshd: no enabled hook {args.name!r} in {folder / 'hooks.toml'} "
                  f"(enabled: {', '.join(h.name for h in hooks) or 'none'})")
        return EXIT_USAGE
    try:
        raw = args.event.read_bytes()
        event = json.loads(raw)
    except OSError as exc:
        err.print(f"meshd: {args.event}: {exc.strerror or exc}")
        return EXIT_USAGE
    except ValueError as exc:
        err.print(f"meshd: {args.event}: not JSON ({exc})")
        return EXIT_USAGE
    if not isinstance(event, dict) or not isinstance(event.get("message"), dict):
        err.print(f"meshd: {args.event}: an event is a JSON object with a `message` object (as a hook reads it)")
        return EXIT_USAGE
    if len(raw) > int(limit("hook_stdin_bytes")):
        err.print(f"meshd: {args.event}: {len(raw)} bytes; a hook reads at most {limit('hook_stdin_bytes')} "
                  "(the daemon cuts a larger event, `_truncated`)")
        return EXIT_USAGE
    message = event["message"]
    event_id = str(event.get("event_id") or message.get("client_message_id") or "test")
    prefix, weakened = sandbox_prefix(hook, resource_limits(), network_namespace())
    if weakened:
        err.print(f"meshd: not enforced here ({', '.join(weakened)}): the hook runs without that part of its sandbox")
    # A test run sends nothing: the socket the hook is given leads to no daemon (not the running one's, where the
    # hook would call with no token and, not being a run the daemon started, unchecked), and its token is none.
    with tempfile.TemporaryDirectory(prefix="meshd-hooks-test-") as nowhere:
        socket_path = str(Path(nowhere) / "no-daemon.sock")
        token = "meshd-hooks-test-grants-nothing" if hook.scopes else None
        done = run_hook(hook, folder, hook_environment(config["daemon"]["mesh"], hook.name, event_id, socket_path,
                                                       token),
                        raw, float(limit("hook_kill_grace_s")), prefix=prefix)
    result: dict[str, Any] = {"hook": hook.name, **done.result(),
                              "stdout": done.stdout.decode("utf-8", "replace")}
    if done.event == "exit_ok":
        reply = parse_reply(done)
        if isinstance(reply, str):
            to = f"#{message['topic']}" if message.get("topic") else f"dm:{message.get('sender_pubkey')}"
            result["reply"] = ({"would_send": {"to": to, "message": reply,
                                               "client_message_id": reply_client_message_id(event_id, hook.name)}}
                               if hook.allow_reply else {"refused": "allow_reply_false"})
        else:
            result["reply"] = reply
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return EXIT_OK if done.event == "exit_ok" else EXIT_ERROR


def cmd_hooks_audit(args: argparse.Namespace, state_dir: Path) -> int:
    config = load(StateDir(state_dir).config).values
    runs = _runs(state_dir, config)
    if runs is None:
        err.print(f"meshd: no inbox in {state_dir}")
        return EXIT_ERROR
    try:
        finished = [run for state in ("done", "failed", "timed_out") for run in runs.list(state, args.limit)]
    finally:
        runs.inbox.close()
    records = [audit_record(run) for run in sorted(finished, key=lambda r: r.id, reverse=True)[:args.limit]]
    if args.json:
        print(json.dumps(records, indent=2))
        return EXIT_OK
    table = Table(title=f"finished hook runs ({len(records)} shown, newest first)")
    columns = ("ts", "hook", "event_id", "state", "claims", "exit", "duration_ms", "stdout_bytes", "replied")
    for column in columns:
        table.add_column(column)
    for record in records:
        table.add_row(*("" if record[c] is None else str(record[c]) for c in columns))
    console.print(table)
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common, state_dir) -> None:
    """Register `meshd hooks …`; ``common`` adds --state-dir/--mesh and ``state_dir`` resolves them."""
    hooks = sub.add_parser("hooks", help="the hooks of hooks.toml, one run by hand, and what ran (§6)")
    hooks_sub = hooks.add_subparsers(dest="hooks_command", required=True)
    listing = hooks_sub.add_parser("list", help="the enabled hooks and their runs by state")
    test = hooks_sub.add_parser("test", help="run one hook with an event file, as the daemon would; sends nothing")
    test.add_argument("name", help="the hook, e.g. on-message")
    test.add_argument("--event", type=Path, required=True, help="the event JSON the hook reads on stdin")
    audit = hooks_sub.add_parser("audit", help="finished runs, newest first: v2 §6.5's audit lines")
    audit.add_argument("--limit", type=int, default=100)
    for parser, func in ((listing, cmd_hooks_list), (test, cmd_hooks_test), (audit, cmd_hooks_audit)):
        common(parser)
        if parser is not test:
            parser.add_argument("--json", action="store_true")
        parser.set_defaults(func=lambda args, f=func: _configured(f, args, state_dir(args)))


def _configured(command, args: argparse.Namespace, state_dir: Path) -> int:
    """Run ``command``; a config.toml or hooks.toml it cannot use is exit 3, named."""
    try:
        return command(args, state_dir)
    except ConfigError as exc:
        err.print(f"meshd: invalid configuration: {exc}")
        return exit_code("invalid_config")
