"""`meshd broker …`: serve, add-mesh, add-member, orphan-check, retention-sweep.

Every command opens the store named by ``--store`` (``sqlite:///PATH``, the embedded default, or ``postgresql://…``;
``$MESHD_BROKER_STORE`` sets the default) and applies its pending migrations first (under the engine's lock, so
several processes may start at once). Exit codes (spec/tables/exit_codes.yaml): 0 done, 1 failure (orphan-check: at
least one violation), 2 usage, 3 invalid configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference.clock import wall_ms
from reference.core.codes import exit_code
from spec import validator

#: E-15 (spec/tables/exit_codes.yaml): the broker's exit codes, with the daemon's meanings
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CONFIG = map(exit_code, ("ok", "error", "usage", "invalid_config"))
DEFAULT_STORE = "sqlite:///broker.db"
#: a member's public key (spec/schemas/common/defs.json pubkey_hex)
PUBKEY = validator("common/defs#/$defs/pubkey_hex")
DEV_BANNER = (
    "\n"
    "  !!! meshd broker --dev: ANY ed25519 key is admitted as a member of ANY mesh. Meshes and topics are created on\n"
    "  !!! first use and every member is subscribed to every topic of its mesh. For local development and the\n"
    "  !!! sandbox only: never expose this broker to anyone else.\n"
)


def _open(url: str) -> Any:
    from reference.broker.store import open_store

    store = open_store(url)
    store.migrate()
    return store


def _listen(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"\[?([^\]]+?)\]?:(\d{1,5})", text)
    if match is None or int(match.group(2)) > 65535:
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, not {text!r}")
    return match.group(1), int(match.group(2))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --- serve ---------------------------------------------------------------------------------------------------------

def cmd_serve(args: argparse.Namespace, *, open_store: Callable[[str], Any] | None = None,
              make_server: Callable[..., Any] | None = None) -> int:
    """``meshd broker serve``. ``open_store(url)`` (a migrated store; default: the engine's) and
    ``make_server(config, store)`` (default: ``BrokerServer``) are seams for tests that serve a deliberately different
    broker through the same command (tests/broker/broken_brokers.py)."""
    from reference.broker.config import BrokerConfig, BrokerConfigError, load_advertise
    from reference.broker.server import BrokerServer

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("meshbroker.websockets").setLevel(logging.WARNING)
    host, port = args.listen
    try:
        config = BrokerConfig(
            store_url=args.store, host=host, port=port, dev=args.dev, dedupe_mode=args.dedupe_mode,
            retention_days=args.retention_days, advertise=load_advertise(args.advertise) if args.advertise else None,
            inline_bytes=args.inline_bytes, blob_bytes=args.blob_bytes, connection_policy=args.connection_policy,
            hello_skew_s=args.hello_skew_s, lease_s=args.lease_s, rate_per_s=args.rate_limit,
            rate_burst=args.rate_burst, sweep_interval_s=args.sweep_interval_s,
            message_retention_days=args.message_retention_days, trace_dir=args.trace_dir,
            trace_node=args.trace_node, trace_strict=args.trace_strict, db_workers=args.db_workers,
            max_outbound_bytes=args.max_outbound_bytes, allow_non_loopback=args.allow_non_loopback,
        )
    except BrokerConfigError as exc:
        print(f"meshd broker: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if config.dev:
        print(DEV_BANNER, file=sys.stderr, flush=True)
        logging.getLogger("meshbroker").warning("dev mode: every member is admitted (not for production)")
    try:
        store = (open_store or _open)(config.store_url)
    except Exception as exc:
        print(f"meshd broker: cannot open the store: {exc}", file=sys.stderr)
        return EXIT_FAILED
    # The thread holding SQLite's write lock must get the GIL back as soon as its fsync returns; with the default
    # 5 ms switch interval it queues behind connection threads and every accept behind it waits too.
    sys.setswitchinterval(0.0001)
    broker = (make_server or BrokerServer)(config, store)
    try:
        bound = broker.start()
    except OSError as exc:
        print(f"meshd broker: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        store.close()
        return EXIT_FAILED
    stopper = threading.Thread(target=broker.stop, name="meshbroker-stop")

    def on_signal(signum: int, frame: Any) -> None:
        if not stopper.is_alive() and stopper.ident is None:
            logging.getLogger("meshbroker").info("signal %d: stopping", signum)
            stopper.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.port_file:
        _write_atomically(args.port_file, f"{bound}\n")
    print(f"meshd broker listening on ws://{host}:{bound} store={_redacted(config.store_url)}"
          f"{' (dev mode)' if config.dev else ''}", file=sys.stderr, flush=True)
    try:
        broker.serve_forever()
    finally:
        if stopper.ident is None:
            stopper.start()
        stopper.join()
        store.close()
    return EXIT_OK


def _redacted(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# --- administration ------------------------------------------------------------------------------------------------

def cmd_add_mesh(args: argparse.Namespace) -> int:
    from reference.broker.config import MIN_RETENTION_DAYS

    retention = args.retention_days if args.dedupe_mode == "retention_scoped" else None
    if retention is not None and retention < MIN_RETENTION_DAYS:
        print(f"meshd broker: --retention-days must be at least {MIN_RETENTION_DAYS}", file=sys.stderr)
        return EXIT_USAGE
    store = _open(args.store)
    try:
        store.add_mesh(args.mesh_id, args.slug or args.mesh_id, args.dedupe_mode, retention)
    except Exception as exc:
        print(f"meshd broker: cannot add mesh {args.mesh_id!r}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    print(f"mesh {args.mesh_id} ({args.dedupe_mode}{f', {retention} days' if retention else ''})")
    return EXIT_OK


def _pubkey(value: str) -> str:
    """A 64-hex ed25519 public key, or the ed25519_pubkey of a daemon state directory's keypair.json."""
    path = Path(value)
    if path.is_dir():
        from reference.state_dir import StateDir

        path = StateDir(path).keypair
    if path.is_file():
        value = json.loads(path.read_text(encoding="utf-8"))["ed25519_pubkey"]
    value = value.lower()
    if not PUBKEY.is_valid(value):
        raise argparse.ArgumentTypeError("--pubkey wants 64 hex characters, a keypair.json or a daemon state dir")
    return value


def cmd_add_member(args: argparse.Namespace) -> int:
    store = _open(args.store)
    try:
        store.add_member(args.mesh, args.pubkey, args.display_name)
        for topic in args.topic:
            store.create_topic(args.mesh, topic)
            store.subscribe(args.mesh, topic, args.pubkey)
    except Exception as exc:
        print(f"meshd broker: cannot add member to {args.mesh!r}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    topics = f" subscribed to {', '.join(args.topic)}" if args.topic else ""
    print(f"member {args.pubkey} in mesh {args.mesh}{topics}")
    return EXIT_OK


# --- maintenance ---------------------------------------------------------------------------------------------------

def cmd_orphan_check(args: argparse.Namespace) -> int:
    store = _open(args.store)
    try:
        violations = store.orphan_check(args.now_ms)
    finally:
        store.close()
    if args.json:
        print(json.dumps([{"kind": v.kind, "mesh_id": v.mesh_id, "ref": v.ref, "detail": v.detail}
                          for v in violations]))
    else:
        for v in violations:
            print(f"{v.kind}\tmesh={v.mesh_id}\tref={v.ref}\t{v.detail}")
        print(f"orphan-check: {len(violations)} violation(s)", file=sys.stderr)
    return EXIT_FAILED if violations else EXIT_OK


def cmd_retention_sweep(args: argparse.Namespace) -> int:
    from reference.broker.server import retention_sweep
    from reference.trace import TraceWriter

    store = _open(args.store)
    trace = TraceWriter(args.trace_dir, "broker", args.trace_node) if args.trace_dir else None
    try:
        now_ms = args.now_ms if args.now_ms is not None else wall_ms()
        result = retention_sweep(store, now_ms, int(args.message_retention_days * 86_400_000),
                                 trace.emit if trace else None)
    finally:
        store.close()
        if trace is not None:
            trace.close()
    print(json.dumps(result))
    return EXIT_OK


# --- the parser ----------------------------------------------------------------------------------------------------

def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``meshd broker <command>``."""
    from reference.broker.config import CONNECTION_POLICIES, MIN_RETENTION_DAYS, BrokerConfig
    from reference.broker.store import DEDUPE_MODES

    d = BrokerConfig(store_url="")
    broker = sub.add_parser("broker", help="the reference broker: serve, add-mesh, add-member, orphan-check, "
                            "retention-sweep")
    broker.set_defaults(func=lambda args: (broker.print_help(), EXIT_USAGE)[1])
    commands = broker.add_subparsers(dest="broker_command", metavar="<command>")

    def store_arg(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--store", default=os.environ.get("MESHD_BROKER_STORE", DEFAULT_STORE),
                            help="sqlite:///PATH (the embedded default) or postgresql://USER:PW@HOST:PORT/DB; "
                            f"default $MESHD_BROKER_STORE or {DEFAULT_STORE}")

    serve = commands.add_parser("serve", help="run the broker's WebSocket server")
    store_arg(serve)
    serve.add_argument("--listen", type=_listen, default=("127.0.0.1", 7900), metavar="HOST:PORT",
                       help="address to bind (default 127.0.0.1:7900; port 0 picks a free one)")
    serve.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    serve.add_argument("--dev", action="store_true",
                       help="admit any member; create meshes and topics on first use (local development only)")
    serve.add_argument("--advertise", type=Path, metavar="FILE.json",
                       help="use this JSON object verbatim as the negotiation response's `supported` map")
    serve.add_argument("--dedupe-mode", choices=DEDUPE_MODES, default=d.dedupe_mode,
                       help="dedupe policy of meshes this broker creates (--dev)")
    serve.add_argument("--retention-days", type=int, default=d.retention_days,
                       help=f"dedupe_retention_days of meshes this broker creates (>= {MIN_RETENTION_DAYS})")
    serve.add_argument("--inline-bytes", type=int, default=d.inline_bytes, help="max_payload.inline_bytes")
    serve.add_argument("--blob-bytes", type=int, default=d.blob_bytes, help="max_payload.blob_bytes")
    serve.add_argument("--connection-policy", choices=CONNECTION_POLICIES, default=d.connection_policy)
    serve.add_argument("--hello-skew-s", type=float, default=d.hello_skew_s, help="allowed hello clock skew")
    serve.add_argument("--lease-s", type=float, default=d.lease_s, help="redeliver an unacked push after this")
    serve.add_argument("--rate-limit", type=float, default=d.rate_per_s,
                       help="sends per second per member (token bucket; 0 = unlimited)")
    serve.add_argument("--rate-burst", type=int, default=d.rate_burst, help="token bucket size")
    serve.add_argument("--sweep-interval-s", type=float, default=d.sweep_interval_s,
                       help="retention sweep interval (0 = never; see retention-sweep)")
    serve.add_argument("--message-retention-days", type=float, default=d.message_retention_days,
                       help="messages older than this are pruned by the sweep")
    serve.add_argument("--trace-dir", type=Path, help="write JSONL trace events here")
    serve.add_argument("--trace-node", default=d.trace_node, help="trace node name (file broker-NODE.jsonl)")
    serve.add_argument("--trace-strict", action="store_true", help="validate every trace event against its schema")
    serve.add_argument("--db-workers", type=int, default=d.db_workers, help="database threads (= connections)")
    serve.add_argument("--max-outbound-bytes", type=int, default=d.max_outbound_bytes,
                       help="unread bytes queued for a member before it is closed 1013 slow_consumer (E-33)")
    serve.add_argument("--allow-non-loopback", action="store_true", help="permit binding a non-loopback address")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.set_defaults(func=cmd_serve)

    add_mesh = commands.add_parser("add-mesh", help="create a mesh")
    store_arg(add_mesh)
    add_mesh.add_argument("mesh_id")
    add_mesh.add_argument("--slug", help="unique slug (default: the mesh id)")
    add_mesh.add_argument("--dedupe-mode", choices=DEDUPE_MODES, default=d.dedupe_mode)
    add_mesh.add_argument("--retention-days", type=int, default=d.retention_days)
    add_mesh.set_defaults(func=cmd_add_mesh)

    add_member = commands.add_parser("add-member", help="admit a member (an ed25519 public key) to a mesh")
    store_arg(add_member)
    add_member.add_argument("--mesh", required=True, help="the mesh id")
    add_member.add_argument("--pubkey", required=True, type=_pubkey,
                            help="64 hex characters, a keypair.json, or a daemon state directory")
    add_member.add_argument("--display-name", default="")
    add_member.add_argument("--topic", action="append", default=[],
                            help="create this topic if needed and subscribe the member (repeatable)")
    add_member.set_defaults(func=cmd_add_member)

    orphans = commands.add_parser("orphan-check", help="verify the §4.7.3 inventory; exit 1 on any violation")
    store_arg(orphans)
    orphans.add_argument("--now-ms", type=int, help="judge expiry as of this unix ms (default: now)")
    orphans.add_argument("--json", action="store_true")
    orphans.set_defaults(func=cmd_orphan_check)

    sweep = commands.add_parser("retention-sweep", help="prune old messages and expire dedupe rows once")
    store_arg(sweep)
    sweep.add_argument("--message-retention-days", type=float, default=d.message_retention_days)
    sweep.add_argument("--now-ms", type=int, help="sweep as of this unix ms (default: now)")
    sweep.add_argument("--trace-dir", type=Path, help="write history_pruned events here")
    sweep.add_argument("--trace-node", default=d.trace_node)
    sweep.set_defaults(func=cmd_retention_sweep)
