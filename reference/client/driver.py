"""The Python SDK's driver for `meshconform sdk`: runs a scenario with reference.client and writes what happened.

    python -m reference.client.driver SCENARIO RESULTS

SCENARIO is a JSON document (spec/schemas/harness/sdk_scenario.json): the state directory to discover the daemon in,
the mesh, and the steps. RESULTS gets one JSON line per step (spec/schemas/harness/sdk_result.json), written as each
step ends. A driver for another SDK does the same with its own calls; this one is the model.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from . import _client as sdk
from ._client import Client


def error(exc: sdk.MeshError) -> dict:
    kind = ("conflict" if isinstance(exc, sdk.Conflict) else "not_found" if isinstance(exc, sdk.DaemonNotFound)
            else "unavailable" if isinstance(exc, sdk.Unavailable) else "refused")
    return {"kind": kind, "status": exc.status, "code": exc.code, "conflict": exc.problem.get("conflict"),
            "client_message_id": exc.problem.get("client_message_id"), "message": str(exc)[:500]}


def events(client: Client, step: dict) -> list[dict]:
    """Up to ``count`` events, stopping after ``idle_s`` without one."""
    found: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            for event in client.events(step.get("last_event_id"), reconnect_s=step.get("idle_s", 5.0) * 2):
                found.put(event)
        except sdk.MeshError as exc:
            found.put(exc)

    threading.Thread(target=read, daemon=True).start()
    got = []
    while len(got) < step["count"]:
        try:
            item = found.get(timeout=step.get("idle_s", 5.0))
        except queue.Empty:
            break
        if isinstance(item, sdk.MeshError):
            raise item
        got.append({"id": item.id, "event": item.event, "data": item.data})
    return got


def run(scenario: dict, out) -> None:
    client = None
    for n, step in enumerate(scenario["steps"]):
        started = time.monotonic()
        try:
            if client is None or step["op"] == "discover":
                client = sdk.discover(scenario["state_dir"], mesh=scenario.get("mesh"))
            if step["op"] == "discover":
                value = {"transport": "unix" if client.endpoint.socket_path else "tcp"}
            elif step["op"] == "version":
                value = asdict(client.version())
            elif step["op"] == "send":
                value = asdict(client.send(step["to"], step["message"], client_message_id=step.get("client_message_id"),
                                           deadline_s=step.get("deadline_s", 30.0)))
            elif step["op"] == "inbox":
                pages = list(client.inbox_pages(limit=step.get("limit")))
                value = {"items": [asdict(item) for page in pages for item in page.items],
                         "next_cursor": pages[-1].next_cursor if pages else None}
            elif step["op"] == "events":
                value = events(client, step)
            else:
                raise ValueError(f"unknown op {step['op']!r}")
            line = {"step": n, "op": step["op"], "ok": True, "value": value}
        except sdk.MeshError as exc:
            line = {"step": n, "op": step["op"], "ok": False, "error": error(exc)}
        line["duration_s"] = round(time.monotonic() - started, 3)
        out.write(json.dumps(line) + "\n")
        out.flush()


if __name__ == "__main__":
    with open(sys.argv[2], "w", encoding="utf-8") as results:
        run(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")), results)
