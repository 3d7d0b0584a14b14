"""Real daemons for the integration tests: `meshd up` under gunicorn, connected to a scripted broker peer."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_testkit import FAST

from conformance.launch import REFERENCE_TEMPLATE, Launched
from conformance.peer import ScriptedBroker


@pytest.fixture
def broker() -> Iterator[ScriptedBroker]:
    with ScriptedBroker() as peer:
        yield peer


def checking_responses(config: str) -> str:
    """``config`` with ``[daemon] check_responses = true`` unless it sets that key: every test daemon holds each of
    its responses to spec/openapi.yaml (API-CONFORMS) and answers 500 naming any deviation."""
    if "check_responses" in tomllib.loads(config).get("daemon", {}):
        return config
    header = re.compile(r"^\[daemon\][ \t]*$", re.MULTILINE)
    if header.search(config):
        return header.sub("[daemon]\ncheck_responses = true", config, count=1)
    return f"{config.rstrip()}\n[daemon]\ncheck_responses = true\n"


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Start daemons (each with its own state dir) against a broker; every one is stopped at teardown."""
    started: list[Launched] = []

    def make(broker_url: str, config: str = FAST, name: str = "d", start: bool = True, **env: str) -> Launched:
        state_dir = tmp_path / name
        state_dir.mkdir(mode=0o700)
        (state_dir / "config.toml").write_text(checking_responses(config))
        daemon = Launched(REFERENCE_TEMPLATE, state_dir, broker_url, env=env)
        started.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield make
    for daemon in started:
        daemon.stop(timeout=10)


@pytest.fixture
def daemon(broker: ScriptedBroker, make_daemon) -> Launched:
    launched = make_daemon(broker.url)
    launched.wait_connected()
    return launched
