"""``python -m tests.conformance.planted FAULT[,FAULT] -- COMMAND ...``: a launch wrapper that plants trace faults.

It runs COMMAND (a launch template's daemon, tracing into ``$MESHCONFORM_TRACE_DIR``) in its own process group and,
once the harness has stopped it (SIGTERM to the group) and the daemon has exited, rewrites the trace the daemon wrote
so that it breaks exactly one invariant per FAULT, and records where in ``<trace_dir>.planted.json``:

* ``fingerprint`` -- the last transition of the first outbox row with more than one gets another request fingerprint
  (TRC-FP-FROZEN; a spec verdict: FP-FROZEN, REQUEUE-ATOMIC);
* ``seq`` -- the node's last event takes the seq of the event before it, so seq stops increasing while every subject's
  events keep their order (TRC-SEQ-MONOTONIC; a profile verdict: E-28). A copy of an event would be a second event
  of its subject as well: of an IPC-NEW decision, a second lookup that found no row (TRC-NEW-ROW-TRACED).

The daemon itself is untouched: everything the black-box cases see is the reference's. A SIGKILL of the group (a
crash case) kills the wrapper too and plants nothing. Run from the repository root (``tests`` must be importable).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

FAULTS = ("fingerprint", "seq")


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events), encoding="utf-8")


def plant_fingerprint(path: Path, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    rows: dict[str, list[int]] = {}
    for index, event in enumerate(events):
        if event["kind"] == "outbox_transition":
            rows.setdefault(event["outbox_id"], []).append(index)
    row = next((indices for indices in rows.values() if len(indices) > 1), None)
    if row is None:
        return None
    event = events[row[-1]]
    event["request_fingerprint"] = hashlib.sha256(f"planted {event['request_fingerprint']}".encode()).hexdigest()
    _write(path, events)
    return {"invariant": "TRC-FP-FROZEN", "key": {"node": event["node"], "outbox_id": event["outbox_id"]},
            "line": row[-1] + 1}


def plant_seq(path: Path, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    if len(events) < 2:
        return None
    events[-1]["seq"] = events[-2]["seq"]
    _write(path, events)
    return {"invariant": "TRC-SEQ-MONOTONIC", "key": {"node": events[-1]["node"]}, "line": len(events)}


def plant(trace_dir: Path, faults: list[str]) -> list[dict[str, Any]]:
    """Plant ``faults`` in the first daemon file of ``trace_dir`` that has room for each; returns what was planted."""
    planted = []
    for fault in faults:
        for path in sorted(trace_dir.glob("*.jsonl")):
            found = {"fingerprint": plant_fingerprint, "seq": plant_seq}[fault](path, _events(path))
            if found is not None:
                found["where"] = f"{trace_dir.name}/{path.name}:{found.pop('line')}"
                planted.append(found)
                break
    return planted


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not set(argv[0].split(",")) <= set(FAULTS):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    faults, command = argv[0].split(","), argv[2:]
    trace_dir = Path(os.environ["MESHCONFORM_TRACE_DIR"])
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the group's SIGTERM reaches the daemon too
    child = subprocess.Popen(command)
    code = child.wait()
    planted = plant(trace_dir, faults)
    manifest = trace_dir.with_name(f"{trace_dir.name}.planted.json")
    manifest.write_text(json.dumps(planted, indent=2) + "\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
