"""The broker writes an accepted send's accept_commit before its accept_decision (TRC-SIDE-EFFECTS).

Both are written after the COMMIT (E-32), one after the other; a broker killed between the two writes leaves one of
them. The trace catalogue allows a commit without its decision ("the broker may stop between the two") and flags a
BRK-ACCEPT decision without its commit, so the commit must come first. The broker suite's crash case (kill -9 under
load, traced) found the other order.
"""

from __future__ import annotations

import json

from broker_server_testkit import Member, joined, running_broker, send_frame


def test_an_accepts_commit_event_precedes_its_decision(tmp_path):
    alice = Member("alice")
    trace = tmp_path / "trace"
    with (running_broker(f"sqlite:///{tmp_path / 'broker.db'}", [alice], trace_dir=trace) as broker,
          joined(broker.url, alice) as client):
        for n in range(3):
            client.send(send_frame(f"c{n}", f"body {n}"))
            assert client.expect("ack", client_message_id=f"c{n}")["status"] == 201
    events = [json.loads(line) for path in trace.glob("*.jsonl") for line in path.read_text().splitlines()]
    for n in range(3):
        kinds = [e["kind"] for e in sorted(events, key=lambda e: e["seq"])
                 if e.get("client_message_id") == f"c{n}" and e["kind"] in ("accept_commit", "accept_decision")]
        assert kinds == ["accept_commit", "accept_decision"], (n, kinds)
