"""The conformance suite as a pytest plugin (``pytest -p conformance.plugin conformance/cases``; ``meshconform run``
drives the same plugin).

It resolves the target, hands the cases their fixtures (the target, its scripted broker, clients whose every response
is validated against spec/openapi.yaml), filters cases by case or requirement id, records each case's outcome, and
at the end turns them into one verdict per requirement and writes the reports.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import registry
from .contract import ContractClient
from .peer import ScriptedBroker
from .target import Target, TargetError

CASES_DIR = registry.CASES_DIR


@dataclass
class CaseResult:
    """One case (all its parametrisations): ``outcomes`` maps each pytest node to (outcome, detail)."""

    id: str
    requirements: tuple[str, ...]
    duration_s: float = 0.0
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """error (setup/teardown broke) > failed > passed > skipped (only when every node skipped)."""
        seen = {o for o, _ in self.outcomes.values()}
        for outcome in ("error", "failed", "passed"):
            if outcome in seen:
                return outcome
        return "skipped"

    @property
    def detail(self) -> str:
        wanted = self.outcome
        return next((d for o, d in self.outcomes.values() if o == wanted), "")


@dataclass
class RunState:
    """What the plugin learned during the session."""

    target_spec: str
    strict: bool
    seed: int
    report_dir: Path | None
    results: dict[str, CaseResult] = field(default_factory=dict)
    deviations: list[Any] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    harness_errors: list[str] = field(default_factory=list)
    target: Target | None = None
    argv_hint: str = ""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("meshspec", "meshspec conformance")
    group.addoption("--meshspec-target", default="reference",
                    help="reference | unix:///path/daemon.sock | http://127.0.0.1:PORT")
    group.addoption("--meshspec-launch", default=None, help="launch template (see conformance/launch.py)")
    group.addoption("--meshspec-token-file", default=None, help="bearer token file for an http:// target")
    group.addoption("--meshspec-broker-listen", default="127.0.0.1:0", help="where the scripted broker listens")
    group.addoption("--meshspec-strict", action="store_true", help="SHOULD failures fail the run too")
    group.addoption("--meshspec-select", action="append", default=[], help="case or requirement ids (prefixes)")
    group.addoption("--meshspec-deselect", action="append", default=[], help="case or requirement ids (prefixes)")
    group.addoption("--meshspec-seed", type=int, default=None, help="seed for randomised cases")
    group.addoption("--meshspec-report-dir", default=None, help="write JSON, JUnit XML, Markdown and HTML here")
    group.addoption("--meshspec-broker-url", default=None, help="broker suite: ws://HOST:PORT of a running broker")
    group.addoption("--meshspec-broker-launch", default=None,
                    help="broker suite: launch template with {port} {state_dir} ('reference' for the reference)")
    group.addoption("--meshspec-store-dsn", default=None, help="broker suite: the broker's store, for the inventory")
    group.addoption("--meshspec-mesh-id", default="meshconform", help="broker suite: the mesh the members join")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{registry.MARK}(case_id, *requirements): a meshspec conformance case")
    seed = config.getoption("--meshspec-seed")
    report_dir = config.getoption("--meshspec-report-dir")
    broker_spec = config.getoption("--meshspec-broker-url") or config.getoption("--meshspec-broker-launch")
    daemon_spec = (config.getoption("--meshspec-launch") and "launch") or config.getoption("--meshspec-target")
    config.stash[STATE] = RunState(
        target_spec=f"broker {broker_spec}" if broker_spec else daemon_spec,
        strict=config.getoption("--meshspec-strict"),
        seed=seed if seed is not None else random.SystemRandom().randrange(2**31),
        report_dir=Path(report_dir) if report_dir else None,
    )


STATE = pytest.StashKey[RunState]()


def _selected(case_id: str, requirements: tuple[str, ...], patterns: list[str]) -> bool:
    names = [case_id, *requirements]
    return any(name == p or name.startswith(p.rstrip("*")) for p in patterns for name in names)


def _patterns(values: list[str]) -> list[str]:
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    select = _patterns(config.getoption("--meshspec-select"))
    deselect = _patterns(config.getoption("--meshspec-deselect"))
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker(registry.MARK)
        if mark is None:
            keep.append(item)
            continue
        case_id, requirements = mark.args[0], tuple(mark.args[1:])
        item.user_properties.append(("case", case_id))
        item.user_properties.append(("requirements", " ".join(requirements)))
        chosen = (not select or _selected(case_id, requirements, select)) and not (
            deselect and _selected(case_id, requirements, deselect))
        (keep if chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def mesh_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The implementation under test, started (or reached) once per run."""
    config = request.config
    state = config.stash[STATE]
    token = config.getoption("--meshspec-token-file")
    target = Target(config.getoption("--meshspec-target"), template=config.getoption("--meshspec-launch"),
                    token_file=Path(token) if token else None,
                    broker_listen=config.getoption("--meshspec-broker-listen"))
    try:
        target.start()
    except TargetError as exc:
        state.harness_errors.append(str(exc))
        target.close()
        pytest.exit(f"meshconform: {exc}", returncode=2)
    state.target = target
    yield target
    target.close()


@pytest.fixture
def broker(mesh_target: Target) -> ScriptedBroker:
    """The scripted broker the target is connected to; skips the case when the target is not."""
    if mesh_target.broker is None or not mesh_target.wait_broker_link(timeout=5 if mesh_target.launched else 2):
        pytest.skip("the target is not connected to the harness's scripted broker (start it with --broker-url "
                    "pointing at --broker-listen)")
    return mesh_target.broker


@pytest.fixture
def launcher(mesh_target: Target) -> Target:
    """The target, for cases that must start fresh instances or restart them; skips without a launch contract."""
    if not mesh_target.can_restart:
        pytest.skip("restart-dependent: the target was not given a launch template (--launch)")
    return mesh_target


@pytest.fixture
def api(request: pytest.FixtureRequest, mesh_target: Target) -> Iterator[ContractClient]:
    """A client on the target's first transport; every response is validated against spec/openapi.yaml."""
    with ContractClient(mesh_target.client(mesh_target.transports[0])) as client:
        yield client
        _record_deviations(request, client)


@pytest.fixture
def tcp_api(request: pytest.FixtureRequest, mesh_target: Target) -> Iterator[ContractClient]:
    if "tcp" not in mesh_target.transports:
        pytest.skip("the target's TCP listener is not reachable by the harness")
    with ContractClient(mesh_target.client("tcp")) as client:
        yield client
        _record_deviations(request, client)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    seed = request.config.stash[STATE].seed
    return random.Random(f"{seed}:{request.node.nodeid}")


@pytest.fixture(scope="session")
def broker_target(request: pytest.FixtureRequest):
    """The broker under test (broker suite)."""
    from .broker_target import REFERENCE_BROKER, BrokerTarget, BrokerTargetError

    config = request.config
    launch = config.getoption("--meshspec-broker-launch")
    target = BrokerTarget(url=config.getoption("--meshspec-broker-url"),
                          template=REFERENCE_BROKER if launch == "reference" else launch,
                          mesh_id=config.getoption("--meshspec-mesh-id"),
                          store_dsn=config.getoption("--meshspec-store-dsn"))
    try:
        target.start()
    except BrokerTargetError as exc:
        config.stash[STATE].harness_errors.append(str(exc))
        target.close()
        pytest.exit(f"meshconform: {exc}", returncode=2)
    yield target
    target.close()


@pytest.fixture
def member(broker_target):
    """A factory of member connections to the broker under test; all are closed after the case."""
    from .member import Member

    made: list[Member] = []

    def make(name: str = "meshconform") -> Member:
        made.append(Member(broker_target.url, broker_target.mesh_id, name=name))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


@pytest.fixture
def store_inventory(broker_target):
    """A callable returning the §4.7.3 inventory violations read directly from the broker's store."""
    if not broker_target.store_dsn:
        pytest.skip("needs --store-dsn: the broker's store is checked directly")
    from reference.broker.store import open_store

    def inventory() -> list[str]:
        store = open_store(broker_target.store_dsn)
        try:
            return [f"{v.kind} {v.ref}: {v.detail}" for v in store.orphan_check()]
        finally:
            store.close()

    return inventory


def _record_deviations(request: pytest.FixtureRequest, client: ContractClient) -> None:
    state = request.config.stash[STATE]
    if client.deviations:
        state.deviations.extend(client.deviations)
        details = "; ".join(f"{d.method} {d.path} -> {d.status}: {d.error}" for d in client.deviations[:3])
        pytest.fail(f"responses deviate from spec/openapi.yaml: {details}", pytrace=False)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    if "case" not in props or not _CONFIG:
        return
    state = _CONFIG[0].stash[STATE]
    result = state.results.setdefault(props["case"], CaseResult(props["case"], tuple(props["requirements"].split())))
    result.duration_s += report.duration
    previous = result.outcomes.get(report.nodeid, ("passed", ""))[0]
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        result.outcomes[report.nodeid] = ("skipped", reason.removeprefix("Skipped: "))
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
        if previous not in ("failed", "error"):
            result.outcomes[report.nodeid] = (outcome, report.longreprtext[-2000:])
    elif report.when == "call" and previous != "skipped":
        result.outcomes[report.nodeid] = ("passed", "")


_CONFIG: list[pytest.Config] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[:] = [session.config]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from .report import build_report, write_reports

    state = session.config.stash[STATE]
    report = build_report(state)
    session.config.stash[REPORT] = report
    if state.report_dir is not None:
        write_reports(report, state.report_dir)


REPORT = pytest.StashKey[dict]()
