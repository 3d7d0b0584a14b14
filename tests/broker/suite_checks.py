"""A pytest plugin for the broker-suite runs of tests/broker/test_broker_suite_kills.py: at the end of a
``meshconform broker`` run it writes every check the suite recorded — per case, node and requirement, including
requirement ids the registry does not list yet (the report leaves those out) — to the file ``$MESHSPEC_SUITE_CHECKS``
names. Loaded into the real ``meshconform`` process with ``PYTEST_PLUGINS=suite_checks``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("MESHSPEC_SUITE_CHECKS")
    if not path:
        return
    from conformance.plugin import STATE

    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    checks = [{"case": result.id, "node": node_id, "requirement": check.requirement, "outcome": check.outcome,
               "detail": check.detail}
              for result in state.results.values() for node_id, node in result.nodes.items() for check in node.checks]
    cases = {result.id: result.outcome for result in state.results.values()}
    Path(path).write_text(json.dumps({"checks": checks, "cases": cases, "harness_errors": state.harness_errors}),
                          encoding="utf-8")
