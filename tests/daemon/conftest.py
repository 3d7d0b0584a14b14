"""Real daemons for the integration tests: `meshd up` under gunicorn, connected to a scripted broker peer."""

from __future__ import annotations

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


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Start daemons (each with its own state dir) against a broker; every one is stopped at teardown."""
    started: list[Launched] = []

    def make(broker_url: str, config: str = FAST, name: str = "d", start: bool = True, **env: str) -> Launched:
        state_dir = tmp_path / name
        state_dir.mkdir(mode=0o700)
        (state_dir / "config.toml").write_text(config)
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
