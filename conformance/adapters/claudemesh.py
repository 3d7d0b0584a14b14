"""Launch adapter for the upstream claudemesh daemon (the TypeScript ``claudemesh`` CLI, ``daemon up``).

Upstream takes none of the launch contract's placeholders: it keeps everything under ``$HOME/.claudemesh/``, reads
its mesh (id, member key, broker URL) from ``$HOME/.claudemesh/config.json``, names its token file ``local-token``,
always listens on TCP 127.0.0.1:47823 and reads no ``config.toml``. This adapter, run as the launch template::

    meshconform run --launch "python -m conformance.adapters.claudemesh --cli PATH/cli.js [--node PATH/node] \\
        --state-dir {state_dir} --broker-url {broker_url} --target-file {target_file} --clock-file {clock_file}"

* gives the instance its own ``HOME`` (``{state_dir}/home``) and writes its ``config.json`` (0600) with one mesh
  whose ed25519 member key is minted once per state directory (kept in ``{state_dir}/adapter-identity.json``, so a
  restart is the same member);
* describes where the daemon really listens in ``{target_file}``: its socket, ``local-token``, the fixed port (so
  the harness runs fresh instances one at a time), its files, and its timing as read from its source (drain.ts,
  broker.ts: retries after 1, 2, 4 … 30 s polled every 500 ms, a 15 s ack timeout, reconnects after 1 … 30 s);
* loads ``clock_shim.cjs`` with ``node --require`` so the clock hook moves the daemon's ``Date``;
* execs ``node cli.js daemon up`` (``--foreground`` from 1.22 on, where ``up`` detaches by default).

Nothing of upstream is patched or configured beyond what a user would do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

FIXED_PORT = 47823
MESH_ID = "meshconform-mesh"
SHIM = Path(__file__).with_name("clock_shim.cjs")
# Read from upstream's source at the two builds (apps/cli/src/daemon/drain.ts, broker.ts / ws-lifecycle.ts): a failed
# attempt n waits min(30 s, 500 ms * 2^n), i.e. 1 s after the first; the drain polls every 500 ms; no jitter.
TIMING = {"retry_base_ms": 1000, "retry_max_ms": 30000, "retry_multiplier": 2, "retry_jitter": 0, "poll_ms": 500,
          "ack_timeout_s": 15, "reconnect_initial_ms": 1000, "reconnect_max_ms": 30000, "reconnect_multiplier": 2,
          "reconnect_jitter": 0, "hello_timeout_s": 5}


def identity(state_dir: Path) -> dict[str, str]:
    """The member key pair of this state directory, minted on first use (hex; libsodium secret = seed || public)."""
    path = state_dir / "adapter-identity.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()).hex()
    document = {"pubkey": public, "secret_key": seed + public, "member_id": f"member-{public[:12]}"}
    path.write_text(json.dumps(document), encoding="utf-8")
    path.chmod(0o600)
    return document


def version_of(cli: Path) -> tuple[int, ...]:
    try:
        text = json.loads((cli.parent / "package.json").read_text(encoding="utf-8"))["version"]
        return tuple(int(p) for p in text.split(".")[:3])
    except (OSError, ValueError, KeyError):
        return (0,)


def prepare(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Write the instance's HOME and target description; return the command and environment to exec."""
    state_dir = Path(args.state_dir).resolve()
    home = state_dir / "home"
    base = home / ".claudemesh"
    daemon_dir = base / "daemon"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    me = identity(state_dir)
    config = {"version": 1, "meshes": [{
        "meshId": MESH_ID, "memberId": me["member_id"], "slug": "meshconform", "name": "meshconform",
        "pubkey": me["pubkey"], "secretKey": me["secret_key"], "brokerUrl": args.broker_url,
        "joinedAt": "2026-01-01T00:00:00.000Z"}]}
    config_path = base / "config.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    config_path.chmod(0o600)
    cli = Path(args.cli).resolve()
    version = version_of(cli)
    description = {
        "name": f"claudemesh-cli {'.'.join(map(str, version))} (upstream daemon, conformance/adapters/claudemesh.py)",
        "socket": str(daemon_dir / "daemon.sock"), "token_file": str(daemon_dir / "local-token"),
        "port": FIXED_PORT, "fixed_port": True,
        "files": {"state_dir": str(daemon_dir), "outbox_db": str(daemon_dir / "outbox.db"),
                  "inbox_db": str(daemon_dir / "inbox.db"),
                  "host_fingerprint": str(daemon_dir / "host_fingerprint.json"),
                  "local_token": str(daemon_dir / "local-token")},
        "timing": TIMING, "clock_hook": bool(args.clock_file), "config_toml": False, "hooks": False,
    }
    if args.target_file:  # written whole, then renamed: the harness never reads half a description
        target = Path(args.target_file)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(description, indent=2), encoding="utf-8")
        os.replace(partial, target)
    node = args.node or os.environ.get("MESHCONFORM_NODE") or shutil.which("node") or "node"
    command = [node, str(cli), "daemon", "up"]
    if version >= (1, 22):
        command.append("--foreground")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAUDEMESH_")}
    env["HOME"] = str(home)
    if args.clock_file:
        env["MESHCONFORM_CLOCK_FILE"] = str(args.clock_file)
        env["NODE_OPTIONS"] = f"{env.get('NODE_OPTIONS', '')} --require {SHIM}".strip()
    return command, env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.adapters.claudemesh",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--cli", required=True, help="the claudemesh cli.js (a build of apps/cli)")
    parser.add_argument("--node", help="the node binary (default: $MESHCONFORM_NODE, then node on PATH)")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--target-file")
    parser.add_argument("--clock-file")
    parser.add_argument("--print", action="store_true", help="print the command instead of running it")
    args = parser.parse_args(argv)
    command, env = prepare(args)
    if args.print:
        print(" ".join(command))
        return 0
    sys.stdout.flush()
    os.execve(command[0] if os.path.isabs(command[0]) else shutil.which(command[0]) or command[0], command, env)
    return 1  # unreachable: execve replaces this process


if __name__ == "__main__":
    sys.exit(main())
