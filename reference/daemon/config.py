"""The daemon's configuration: `config.toml` in the state directory, read with tomllib.

Every key, its default and its meaning is in ``KEYS`` (the README's configuration table is generated from it, so
the two cannot drift). Unknown sections or keys are an error, not a silent no-op.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference.core.features import always_required
from reference.core.limits import limit, limits
from spec import load_table

_FEATURES = load_table("features")
_MAX_AGE = load_table("max_age")
_TIMING = load_table("timing")
_RETRY, _RECONNECT = _TIMING["backoff"]["outbox_retry"], _TIMING["backoff"]["reconnect"]


class ConfigError(ValueError):
    """The configuration cannot be used; the daemon exits 3 (E-15)."""


# section -> key -> (default, type, description)
KEYS: dict[str, dict[str, tuple[Any, type | tuple[type, ...], str]]] = {
    "daemon": {
        "mesh": ("default", str, "mesh slug this daemon serves (one daemon per mesh and state directory)"),
        "display_name": ("", str, "name announced to peers in hello"),
        "log_level": ("INFO", str, "DEBUG, INFO, WARNING or ERROR; SIGHUP re-reads it"),
        "drain_timeout_s": (5.0, (int, float), "how long SIGTERM waits for outstanding acks (E-15)"),
        "clock_file": ("", str, "testing only: a file whose number of seconds is added to the wall clock (the "
                       "conformance harness's clock hook, also --clock-file)"),
        "check_responses": (False, bool, "testing only: hold every IPC response to spec/openapi.yaml; one that "
                            "breaks it is logged (response_contract_violation) and answered 500 internal_error"),
    },
    "broker": {
        "url": ("", str, "broker WebSocket URL, e.g. ws://127.0.0.1:7900"),
        "mesh_id": ("", str, "mesh id the broker knows this mesh by"),
        "member_id": ("", str, "member id; defaults to the member public key"),
        "hello_timeout_s": (5.0, (int, float), "how long to wait for hello_ack and the negotiation response"),
        "request_timeout_s": (5.0, (int, float), "how long GET /v1/peers waits for peers_list"),
    },
    "ipc": {
        "tcp_enabled": (True, bool, "also listen on TCP (bearer token required)"),
        "http_bind": ("127.0.0.1", str, "TCP bind address; non-loopback needs allow_non_loopback = true"),
        "http_port": (0, int, "TCP port; 0 picks a free one and writes it to http.port"),
        "allow_non_loopback": (False, bool, "permit a non-loopback http_bind (not recommended)"),
        # req: LIMIT-TABLE, LIMIT-BODY-ROUTES -- defaults come from limits.yaml
        "max_body_bytes": (limit("ipc_send_body_bytes"), int, "POST /v1/send body limit (413 above)"),
        "max_inflight": (limit("ipc_inflight_per_transport"), int,
                         "requests in flight on one transport before 429 daemon_busy"),
        "max_streams": (limit("ipc_streams_per_transport"), int,
                        "concurrent /v1/events streams on one transport before 429 too_many_streams"),
        "keepalive_s": (float(_TIMING["sse_keepalive_s"]["value"]), (int, float), "SSE keepalive comment interval"),
        "threads": (limit("ipc_threads_per_transport"), int,
                    "request threads of each transport (must exceed max_inflight + max_streams)"),
        "max_connections": (limit("ipc_connections_per_transport"), int,
                            "open connections on one transport; more are closed at once"),
        "header_read_s": (limit("ipc_header_read_s"), (int, float),
                          "a request head must arrive within this of its first byte (408 request_timeout)"),
        "body_read_s": (limit("ipc_body_read_s"), (int, float),
                        "a request body must arrive within this of its head (408 request_timeout)"),
        "write_s": (limit("ipc_write_s"), (int, float), "longest wait on a client that does not read an answer"),
    },
    "outbox": {
        "max_age_hours": (_MAX_AGE["permanent_default_hours"], int,
                          f"permanent-mode max age (capped at {_MAX_AGE['permanent_cap_hours']}); "
                          "retention_scoped mode derives it (§4.9)"),
        "max_age_hours_override": (0, int, "operator override; 0 = none; must stay inside the dedupe window"),
        "retry_base_ms": (_RETRY["base_ms"], int, "first retry delay"),
        "retry_max_ms": (_RETRY["max_ms"], int, "retry delay cap"),
        "retry_jitter": (_RETRY["jitter"], (int, float), "± fraction of jitter on every retry delay"),
        "ack_timeout_s": (15.0, (int, float), "how long an inflight row waits for its ack"),
        "synchronous": ("FULL", str, "SQLite synchronous mode for outbox.db: FULL (default) or EXTRA"),
        "group_commit_ms": (0.0, (int, float),
                            "extra wait to gather accepts into one commit (0: those queued during the previous one)"),
    },
    "inbox": {
        "retention_days": (30, int, "inbox and event retention"),
        "event_retention": (100_000, int, "events kept for Last-Event-ID replay"),
    },
    "reconnect": {
        # req: WS-RECONNECT-SCHEDULE -- the §13 defaults (timing.yaml)
        "initial_ms": (_RECONNECT["base_ms"], int, "first reconnect delay"),
        "max_ms": (_RECONNECT["max_ms"], int, "reconnect delay cap"),
        "multiplier": (float(_RECONNECT["multiplier"]), (int, float), "backoff multiplier"),
        "jitter": (_RECONNECT["jitter"], (int, float), "± fraction of jitter"),
    },
    "features": {
        "require": (list(_FEATURES["daemon_defaults"]["require"]), list,
                    "bits the broker must offer; must include client_message_id_dedupe (§15.1)"),
        "optional": (list(_FEATURES["daemon_defaults"]["optional"]), list, "bits taken if offered"),
    },
    "identity": {
        "host_id_override": ("", str, "use this host_id instead of /etc/machine-id (host_fingerprint.id_override)"),
        "stable_mac_override": ("", str, "use this MAC instead of the first stable interface"),
    },
    "trace": {
        "dir": ("", str, "write JSONL trace events here (also --trace-dir)"),
    },
    "hooks": {
        # req: HOOK-CI-OFF -- off unless opted in
        "enabled": (False, bool, "run the hooks of hooks.toml on inbound messages (§6; off by default, CI included)"),
        "dir": ("hooks", str, "the folder of hooks.toml and the hook scripts; relative to the state directory"),
        "concurrency": (limit("hook_concurrency"), int, "hook processes run at once"),
        "default_timeout_s": (limit("hook_timeout_s"), (int, float), "a hook's timeout when hooks.toml sets none"),
        "max_claims": (limit("hook_max_claims"), int,
                       "claims of one run before it fails; a claim lost to a crash runs the hook again (E-48)"),
    },
}


@dataclass(frozen=True)
class Config:
    """The merged configuration: ``values[section][key]``."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __getitem__(self, section: str) -> dict[str, Any]:
        return self.values[section]


def defaults() -> dict[str, dict[str, Any]]:
    return {section: {key: spec[0] for key, spec in keys.items()} for section, keys in KEYS.items()}


def load(path: Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Defaults, then ``path`` (if it exists), then ``overrides``; every value type-checked.

    Raises:
        ConfigError: unreadable TOML, an unknown section or key, or a value of the wrong type.
    """
    values = defaults()
    layers: list[tuple[str, dict[str, Any]]] = []
    if path is not None and path.exists():
        try:
            layers.append((str(path), tomllib.loads(path.read_text(encoding="utf-8"))))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    if overrides:
        layers.append(("command line", overrides))
    for origin, layer in layers:
        for section, entries in layer.items():
            if section not in KEYS or not isinstance(entries, dict):
                raise ConfigError(f"{origin}: unknown section [{section}]")
            for key, value in entries.items():
                if key not in KEYS[section]:
                    raise ConfigError(f"{origin}: unknown key {section}.{key}")
                expected = KEYS[section][key][1]
                if isinstance(value, bool) and expected is not bool:
                    raise ConfigError(f"{origin}: {section}.{key} must be {_name(expected)}, not a boolean")
                if not isinstance(value, expected):
                    raise ConfigError(f"{origin}: {section}.{key} must be {_name(expected)}")
                values[section][key] = value
    _validate(values)
    return Config(values)


def _name(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(t.__name__ for t in types)


def _validate(values: dict[str, dict[str, Any]]) -> None:
    ipc = values["ipc"]
    if ipc["threads"] <= ipc["max_inflight"] + ipc["max_streams"]:
        raise ConfigError("ipc.threads must exceed ipc.max_inflight + ipc.max_streams")
    # req: IPC-DURABLE-BEFORE-RESPONSE -- no mode that commits without an fsync
    if values["outbox"]["synchronous"] not in ("FULL", "EXTRA"):
        raise ConfigError("outbox.synchronous must be FULL or EXTRA (a 202 follows an fsync of its row)")
    if values["daemon"]["log_level"] not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("daemon.log_level must be DEBUG, INFO, WARNING or ERROR")
    for key in ("max_body_bytes", "max_inflight", "max_streams", "max_connections", "retry_base_ms", "retry_max_ms"):
        section = "ipc" if key.startswith("max_") else "outbox"
        if values[section][key] < 1:
            raise ConfigError(f"{section}.{key} must be at least 1")
    for key in ("header_read_s", "body_read_s", "write_s"):
        if not 0 < ipc[key] <= 600:
            raise ConfigError(f"ipc.{key} must be more than 0 and at most 600 seconds")
    hooks = values["hooks"]
    for key in ("concurrency", "max_claims"):
        if not 1 <= hooks[key] <= 256:
            raise ConfigError(f"hooks.{key} must be from 1 to 256")
    if not 0 < hooks["default_timeout_s"] <= 3600:
        raise ConfigError("hooks.default_timeout_s must be more than 0 and at most 3600 seconds")
    _validate_features(values["features"])


def _validate_features(features: dict[str, Any]) -> None:
    for key in ("require", "optional"):
        if not all(isinstance(bit, str) for bit in features[key]):
            raise ConfigError(f"features.{key} must be a list of feature bit names")
        unknown = [bit for bit in features[key] if bit not in _FEATURES["bits"]]
        if unknown:
            raise ConfigError(f"features.{key} names unknown feature bits: {', '.join(unknown)}")
    missing = [bit for bit in always_required() if bit not in features["require"]]
    # req: NEG-REQUIRE-DEDUPE -- a configuration that would run without client_message_id_dedupe is refused (exit 3)
    if missing:
        raise ConfigError(f"features.require must include {', '.join(missing)}: the daemon does not run without it "
                          f"(§15.1)")


def markdown_table() -> str:
    """The configuration reference, for the README: every key, then every limit of spec/tables/limits.yaml a daemon
    or broker enforces that no key sets (fixed by the spec; E-40). The trace checks' limits (``trace_check``, E-52)
    are meshtrace's, documented in spark_checks/README.md."""
    table = {name: entry for name, entry in load_table("limits")["limits"].items()
             if entry["applies_to"] != ["trace_check"]}
    configured = {entry["config"]: name for name, entry in table.items() if "config" in entry}
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for section, keys in KEYS.items():
        for key, (default, _, text) in keys.items():
            source = configured.get(f"{section}.{key}")
            note = f" (limits.yaml `{source}`)" if source else ""
            lines.append(f"| `{section}.{key}` | `{default!r}` | {text}{note} |")
    # req: LIMIT-TABLE -- the README documents every limit
    for name, entry in table.items():
        if "config" in entry:
            continue
        text = " ".join(entry["description"].split())
        lines.append(f"| `limits.{name}` | `{limits()[name]!r}` {entry['unit']} | fixed by the spec: {text} |")
    return "\n".join(lines)


def regenerate_readme(readme: Path) -> bool:
    """Rewrite the README's configuration table (between its GENERATED markers); True when it changed."""
    text = readme.read_text(encoding="utf-8")
    begin, end = "<!-- BEGIN GENERATED: config -->\n", "\n<!-- END GENERATED: config -->"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    updated = f"{head}{begin}{markdown_table()}{end}{tail}"
    if updated != text:
        readme.write_text(updated, encoding="utf-8")
    return updated != text


if __name__ == "__main__":  # python -m reference.daemon.config [README.md]
    import sys

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "README.md"
    print(f"{target}: {'regenerated' if regenerate_readme(target) else 'already current'}")
