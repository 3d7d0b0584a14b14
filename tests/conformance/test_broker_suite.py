"""meshconform broker itself: where the delivery lease comes from, the store inventory's independence, and the run
against a reference broker started with its defaults through --url (the README's second way to test a broker).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance import store_inventory
from conformance.broker_target import (
    DEFAULT_LEASE_S,
    REFERENCE_BROKER,
    REFERENCE_LEASE_S,
    BrokerTarget,
    BrokerTargetError,
)
from spec import SPEC_DIR, validator

REPO = SPEC_DIR.parent


def negotiation(**params: object) -> dict:
    return {"type": "feature_negotiation_response", "missing_required": [],
            "supported": {"client_message_id_dedupe": {"params": {"version": 1}},
                          "delivery": {"params": {"version": 1, **params}}}}


def test_the_lease_comes_from_the_command_line_then_the_broker_then_the_template_then_the_default(tmp_path):
    given = BrokerTarget(url="ws://127.0.0.1:1", lease_s=7.0, workdir=tmp_path)
    assert given.lease_for(negotiation(lease_ms=2500)) == (7.0, "--lease-s 7")
    running = BrokerTarget(url="ws://127.0.0.1:1", workdir=tmp_path)
    assert running.lease_for(negotiation(lease_ms=2500))[0] == 2.5
    assert running.lease_for(negotiation(lease_s=4))[0] == 4
    for unusable in ("30", True, -1, None):
        assert running.lease_for(negotiation(lease_ms=unusable))[0] == DEFAULT_LEASE_S
    assert running.lease_for(None)[0] == DEFAULT_LEASE_S
    assert running.lease_for({"supported": "garbage"})[0] == DEFAULT_LEASE_S
    reference = BrokerTarget(template=f"{REFERENCE_BROKER} --trace-dir /tmp/t", workdir=tmp_path)
    assert reference.lease_for(negotiation()) == (REFERENCE_LEASE_S, "the harness's reference launch template")


def test_a_redelivery_is_awaited_for_twice_the_lease_and_a_margin():
    assert BrokerTarget.redelivery_wait_s(1.0) == 5.0
    assert BrokerTarget.redelivery_wait_s(DEFAULT_LEASE_S) == 63.0  # more than the 30 s the suite used to wait
    assert BrokerTarget.redelivery_wait_s(100.0) == 210.0


def test_a_store_dsn_may_name_the_launched_brokers_state_directory(tmp_path):
    target = BrokerTarget(template=f"{sys.executable} -c pass", store_dsn="sqlite:///{state_dir}/broker.db",
                          workdir=tmp_path)
    with pytest.raises(BrokerTargetError):  # the "broker" exits at once; the DSN is resolved before
        target.start()
    assert target.store_dsn == f"sqlite:///{tmp_path / 'broker'}/broker.db"


def test_the_store_inventory_uses_no_implementation_code():
    tree = ast.parse(Path(store_inventory.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.startswith(("reference", "conformance"))}, imported


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_url_against_a_reference_broker_started_with_its_defaults_passes(tmp_path):
    """`meshd broker serve --dev` with every default (a 30 s lease), then `meshconform broker --url`: the suite
    reads no lease from the broker, takes the 30 s default and waits up to 63 s per redelivery — it passes,
    BRK-REDELIVER included (it failed when the suite waited a flat 30 s). About 70 s."""
    port = free_port()
    port_file = tmp_path / "broker.port"
    with (tmp_path / "broker.log").open("wb") as log:
        broker = subprocess.Popen([sys.executable, "-m", "reference.cli", "broker", "serve", "--store",
                                   f"sqlite:///{tmp_path / 'broker.db'}", "--listen", f"127.0.0.1:{port}",
                                   "--port-file", str(port_file), "--dev"],
                                  stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert broker.poll() is None and time.monotonic() < deadline, (tmp_path / "broker.log").read_text()
            time.sleep(0.05)
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "conformance.cli", "broker", "--url", f"ws://127.0.0.1:{port}",
                                 "--report-dir", str(tmp_path / "report"), "--quiet"],
                                capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
                                env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
        took = time.monotonic() - started
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(timeout=30)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    validator("report/conformance_report").validate(report)
    verdicts = {r["id"]: r["verdict"] for r in report["requirements"]}
    assert verdicts["BRK-REDELIVER"] == "pass" and verdicts["BRK-HELLO-AUTH"] == "pass"
    delivery = next(c for c in report["cases"] if c["id"] == "broker.delivery")
    assert delivery["outcome"] == "passed" and delivery["duration_s"] > DEFAULT_LEASE_S  # it really waited
    assert took < 150
