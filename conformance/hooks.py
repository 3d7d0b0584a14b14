"""Hooks in a target (§6, E-48): what the harness installs in ``{hooks_dir}``, the ``[hooks]`` table of the config.toml
it writes, and when the hook cases run at all.

Theory of operation. Every instance the harness launches gets a ``{hooks_dir}`` (launch.py) holding a ``hooks.toml``
in the format of spec/schemas/config/hooks.json -- empty unless a hook case installs hooks -- and the hooks'
executables. A hook case starts a fresh instance with its own hooks (they are read at start), pushes messages from
its own scripted broker, and judges what the hooks observed: each hook is a small Python script (``python_hook``)
that writes what it saw (its stdin event, its environment, its pid, what the daemon answered it) as a JSON file in a
folder of the harness, at an absolute path baked into the script. A hook's PATH is ``/usr/bin:/bin``, so the script
names its interpreter by absolute path (this Python) in its ``#!`` line.

Whether hook cases run is decided once per run from the main instance (``skip_reason``): only a daemon that lists
``hooks`` in ``GET /v1/version`` ``ipc_features`` runs them, and only when the harness can install hooks in it (a
launch template, and a way for the daemon to find ``{hooks_dir}``). Any other daemon gets every hook case skipped
with the reason, never failed.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOOKS_FILE = "hooks.toml"
#: what a daemon that runs hooks lists in GET /v1/version ipc_features (E-48)
FEATURE = "hooks"
NO_HOOKS = "the daemon declares no hooks in /v1/version (ipc_features does not list \"hooks\")"
NO_LAUNCH = ("the daemon declares hooks, but the harness installs hooks only through the launch contract "
             "({hooks_dir}) and this target was not given a launch template (--launch)")
NO_INSTALL = ("the daemon declares hooks, but the harness cannot install any: its launch template names no "
              "{hooks_dir}, it does not read the harness's config.toml, and its {target_file} does not say "
              "\"hooks\": true")
#: the member of an RFC 9457 problem that names its code in meshspec (``error``), and the type URI's prefix
PROBLEM_TYPE_PREFIX = "urn:meshspec:error:"


@dataclass(frozen=True)
class HookScript:
    """One hook to install: its §6 name (``on-message``, ``on-dm``, ``on-topic-<name>``), the executable's text, and
    its ``hooks.toml`` keys (``allow_reply``, ``timeout_s``, ``output_size_limit``, ``capability_token_scope`` ...)."""

    name: str
    source: str
    settings: Mapping[str, Any] = field(default_factory=dict)


# The toolkit every harness hook starts with (standard library only: a hook runs with a bare environment).
PRELUDE = '''
import http.client, json, os, signal, socket, sys, time

def read_event():
    """stdin as bytes, and parsed when it is JSON."""
    raw = sys.stdin.buffer.read()
    try:
        return raw, json.loads(raw)
    except ValueError:
        return raw, None

def environment():
    """The environment the hook was started with (/proc: what the interpreter adds itself is left out)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = [p.split(b"=", 1) for p in f.read().split(b"\\0") if b"=" in p]
        return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}
    except OSError:
        return dict(os.environ)

def record(doc, kind="run"):
    """Write one observation, whole (written aside, then renamed), as OUT/<hook>.<kind>.<pid>.<ns>.json."""
    doc = dict(doc, hook=HOOK, pid=os.getpid(), pgid=os.getpgid(0), at=time.time())
    path = os.path.join(OUT, "%s.%s.%d.%d.json" % (HOOK, kind, os.getpid(), time.time_ns()))
    with open(path + ".part", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".part", path)

def observe(raw, parsed):
    """What a run saw: its stdin (the head and its size), whether it was cut, its environment."""
    return {"stdin_bytes": len(raw), "stdin_head": raw[:8192].decode("utf-8", "replace"),
            "truncated": parsed.get("_truncated") if isinstance(parsed, dict) else None,
            "parsed": isinstance(parsed, dict), "env": environment()}

def wait_file(path, limit):
    """Wait until path exists, at most limit seconds; True when it does."""
    deadline = time.time() + limit
    while not os.path.exists(path):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True

def reply(text):
    sys.stdout.write(json.dumps({"reply": text}))
    sys.stdout.flush()

def ipc(method, path, body=None, token=None, scheme="ClaudeMesh-Capability"):
    """One request on the daemon's unix socket (CLAUDEMESH_DAEMON_SOCK): (status, the problem code or None)."""
    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(os.environ.get("CLAUDEMESH_DAEMON_SOCK", SOCKET))
    headers = {"Host": "localhost"}
    if token is not None:
        headers["Authorization"] = "%s %s" % (scheme, token)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        connection = Unix("localhost", timeout=10)
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        text = response.read(65536) if not path.startswith("/v1/events") or response.status != 200 else b""
        connection.close()
    except (OSError, http.client.HTTPException) as exc:
        return None, "%s: %s" % (type(exc).__name__, exc)
    try:
        problem = json.loads(text)
    except ValueError:
        problem = None
    code = None
    if isinstance(problem, dict):
        code = problem.get("error") or problem.get("code")
        kind = problem.get("type")
        if code is None and isinstance(kind, str) and kind.startswith(PROBLEM_TYPE_PREFIX):
            code = kind[len(PROBLEM_TYPE_PREFIX):]
    return response.status, code
'''


def python_hook(name: str, body: str, out: Path, settings: Mapping[str, Any] | None = None,
                **constants: Any) -> HookScript:
    """A hook written in Python: this interpreter's ``#!`` line, the toolkit (``PRELUDE``), ``HOOK`` (its name),
    ``OUT`` (the folder it records in), the ``constants`` given, and ``body``."""
    values = {"HOOK": name, "OUT": str(out), "SOCKET": "", "PROBLEM_TYPE_PREFIX": PROBLEM_TYPE_PREFIX, **constants}
    lines = [f"#!{sys.executable}", "# a meshconform hook (conformance/hooks.py)", PRELUDE]
    lines += [f"{key} = {value!r}" for key, value in values.items()]
    lines.append(textwrap.dedent(body))
    return HookScript(name, "\n".join(lines) + "\n", dict(settings or {}))


def _toml_value(value: Any) -> str:
    # hooks.toml holds booleans, numbers, strings and lists of strings only; no TOML writer ships with Python
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"hooks.toml cannot hold {value!r}")


def hooks_toml(hooks: Iterable[HookScript]) -> str:
    """The ``hooks.toml`` naming ``hooks``: one table per hook, its command the executable of the same name."""
    parts = ["# written by meshconform (conformance/hooks.py): spec/schemas/config/hooks.json\n"]
    for hook in hooks:
        keys = {"command": hook.name, **hook.settings}
        parts.append(f"\n[{hook.name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in keys.items()))
    return "".join(parts)


def install_hooks(folder: Path, hooks: Iterable[HookScript]) -> None:
    """Fill ``folder`` (``{hooks_dir}``) with ``hooks``: each executable (0755) under its hook's name, then
    ``hooks.toml`` (renamed into place, so a daemon never reads half of it)."""
    hooks = list(hooks)
    folder.mkdir(parents=True, exist_ok=True)
    for hook in hooks:
        path = folder / hook.name
        path.write_text(hook.source, encoding="utf-8")
        path.chmod(0o755)
    partial = folder / (HOOKS_FILE + ".partial")
    partial.write_text(hooks_toml(hooks), encoding="utf-8")
    os.replace(partial, folder / HOOKS_FILE)


def config_section(folder: Path) -> str:
    """The ``[hooks]`` table the harness appends to the config.toml it writes: hooks on, from ``{hooks_dir}``."""
    return f"[hooks]\nenabled = true\ndir = {_toml_value(str(folder))}\n"


def with_hooks(config: str, folder: Path) -> str:
    """``config`` with the ``[hooks]`` table, unless it has one of its own."""
    if any(line.strip() == "[hooks]" for line in config.splitlines()):
        return config
    return config.rstrip("\n") + "\n" + config_section(folder)


def features(version: Any) -> list[str] | None:
    """The ``ipc_features`` of a ``GET /v1/version`` body; None when it has no such list."""
    listed = version.get("ipc_features") if isinstance(version, dict) else None
    return [f for f in listed if isinstance(f, str)] if isinstance(listed, list) else None


def skip_reason(declared: list[str] | None, can_restart: bool, installs: bool) -> str | None:
    """Why the hook cases cannot run against a target (None: they run). ``declared``: its ipc_features."""
    if FEATURE not in (declared or []):
        return NO_HOOKS
    if not can_restart:
        return NO_LAUNCH
    if not installs:
        return NO_INSTALL
    return None


def observations(out: Path, hook: str, kind: str = "run") -> list[dict[str, Any]]:
    """What the hook ``hook`` recorded in ``out`` (one dict per record, oldest first); unreadable files are skipped."""
    found = []
    for path in out.glob(f"{hook}.{kind}.*.json"):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(document, dict):
            found.append(document)
    return sorted(found, key=lambda d: d.get("at") or 0)
