"""The conformance suite as a pytest plugin (``pytest -p conformance.plugin conformance/cases``; ``meshconform run``
drives the same plugin).

It resolves the target, hands the cases their fixtures (the target, its scripted broker, clients whose every response
is validated against spec/openapi.yaml, the ``verdict`` recorder), filters cases by case or requirement id, turns
each test node's evidence into per-requirement checks, and at the end writes the reports.

Rules of this file — the harness cannot crash or hang:

* Every test node runs under an alarm (``--case-timeout``; by default the longer of 90 s and what the slowest case
  may wait on the target's declared timing, `case_timeout_s`; never past the run's ``--deadline``) that raises
  ``CaseTimeout``, a BaseException a case's ``except Exception`` cannot swallow; a second alarm breaks a hanging
  teardown. Nodes that would start after the deadline are skipped with that reason.
* A node's failure is attributed (verdict.py): explicit checks first; an unattributed target failure fails only the
  declared requirements the node recorded nothing for. An exception that is not a target failure is a fault of the
  harness: it is reported as a harness error (exit 2), never as the implementation's failure, and every requirement
  the node declares gets an ``error`` check (its checks did not all run, so none of them may read ``pass``).
* A response outside spec/openapi.yaml is evidence against API-CONFORMS (an OpenAPI-shape requirement) only.
* Every instance the harness launches gets its own ``{trace_dir}`` under the run's trace root (``--report-dir``'s
  ``trace/``, emptied first, else a temporary directory removed at the end); once the run is over and every instance
  has stopped, the traces are checked (traces.py) and the TRC verdicts join the report.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import registry, traces
from . import timing as timing_mod
from .contract import ContractClient
from .peer import ScriptedBroker
from .target import Target, TargetError
from .verdict import TARGET_FAILURES, Attributed, Blocked, Check, Verdicts, describe

CASES_DIR = registry.CASES_DIR
TEARDOWN_GRACE_S = 20.0


class CaseTimeout(BaseException):
    """A test node ran past its alarm."""


@dataclass
class NodeResult:
    """One test node: its outcome, its detail and the checks it recorded (attributed at the end of the node)."""

    outcome: str = "passed"  # passed | failed | skipped | error
    detail: str = ""
    attributed: bool = False  # the failure is already recorded against the requirement it breaks
    checks: list[Check] = field(default_factory=list)
    reported: bool = False  # a call report was taken: a node with subtests (schemathesis) reports once per subtest


#: a node's outcome is its worst report's: a subtest that failed is not undone by the node's own "passed"
RANK = {"skipped": 0, "passed": 1, "failed": 2, "error": 3}


@dataclass
class CaseResult:
    """One case (all its parametrisations)."""

    id: str
    requirements: tuple[str, ...]
    duration_s: float = 0.0
    nodes: dict[str, NodeResult] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        """error > failed > passed > skipped (only when every node skipped)."""
        seen = {n.outcome for n in self.nodes.values()}
        for outcome in ("error", "failed", "passed"):
            if outcome in seen:
                return outcome
        return "skipped"

    @property
    def detail(self) -> str:
        wanted = self.outcome
        return next((n.detail for n in self.nodes.values() if n.outcome == wanted), "")


@dataclass
class RunState:
    """What the plugin learned during the session."""

    target_spec: str
    strict: bool
    spec_only: bool
    seed: int
    report_dir: Path | None
    case_timeout: float | None  # None: `case_timeout_s` derives it from the target's timing
    deadline_s: float
    results: dict[str, CaseResult] = field(default_factory=dict)
    deviations: list[Any] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    harness_errors: list[str] = field(default_factory=list)
    target: Target | None = None
    verdicts: dict[str, Verdicts] = field(default_factory=dict)
    deadline_hit: int = 0
    trace_source: traces.TraceSource | None = None
    trace_verdicts: dict[str, Any] | None = None
    trace_root_made: Path | None = None

    @property
    def trace_root(self) -> Path:
        """Where the instances' ``{trace_dir}``s live: ``<report dir>/trace`` (emptied first), else a temporary
        directory (removed after the check); made on first use."""
        if self.trace_root_made is None:
            if self.report_dir is not None:
                self.trace_root_made = self.report_dir / "trace"
                shutil.rmtree(self.trace_root_made, ignore_errors=True)
                self.trace_root_made.mkdir(parents=True)
            else:
                self.trace_root_made = Path(tempfile.mkdtemp(prefix="meshconform-trace-"))
        return self.trace_root_made

    @property
    def remaining_s(self) -> float:
        return self.deadline_s - (time.time() - self.started)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("meshspec", "meshspec conformance")
    group.addoption("--meshspec-target", default="reference",
                    help="reference | unix:///path/daemon.sock | http://127.0.0.1:PORT")
    group.addoption("--meshspec-launch", default=None, help="launch template (see conformance/launch.py)")
    group.addoption("--meshspec-token-file", default=None, help="bearer token file for an http:// target")
    group.addoption("--meshspec-broker-listen", default="127.0.0.1:0", help="where the scripted broker listens")
    group.addoption("--meshspec-dialect", default="auto", help="broker dialect: auto | meshspec | claudemesh")
    group.addoption("--meshspec-timing", action="append", default=[], help="timing key=value (conformance/timing.py)")
    group.addoption("--meshspec-strict", action="store_true", help="SHOULD failures fail the run too")
    group.addoption("--meshspec-spec-only", action="store_true",
                    help="the exit code counts the spec's own requirements only, not meshspec's profile")
    group.addoption("--meshspec-select", action="append", default=[], help="case or requirement ids (prefixes)")
    group.addoption("--meshspec-deselect", action="append", default=[], help="case or requirement ids (prefixes)")
    group.addoption("--meshspec-seed", type=int, default=None, help="seed for randomised cases")
    group.addoption("--meshspec-report-dir", default=None, help="write JSON, JUnit XML, Markdown and HTML here")
    group.addoption("--meshspec-case-timeout", type=float, default=None,
                    help="per test node, seconds (default: the longer of 90 and what the slowest case may wait on the "
                         "target's declared timing)")
    group.addoption("--meshspec-deadline", type=float, default=1800.0, help="the whole run, seconds")
    group.addoption("--meshspec-broker-url", default=None, help="broker suite: ws://HOST:PORT of a running broker")
    group.addoption("--meshspec-broker-launch", default=None,
                    help="broker suite: launch template with {port} {state_dir} ('reference' for the reference)")
    group.addoption("--meshspec-store-dsn", default=None, help="broker suite: the broker's store, for the inventory")
    group.addoption("--meshspec-mesh-id", default="meshconform", help="broker suite: the mesh the members join")
    group.addoption("--meshspec-sdk-launch", default=None,
                    help="SDK suite: driver template with {scenario} {results} ('reference' for the Python SDK)")
    group.addoption("--meshspec-lease-s", type=float, default=None,
                    help="broker suite: the broker's delivery lease (default: its advertised one, else 30 s)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{registry.MARK}(case_id, *requirements): a meshspec conformance case")
    seed = config.getoption("--meshspec-seed")
    report_dir = config.getoption("--meshspec-report-dir")
    broker_spec = config.getoption("--meshspec-broker-url") or config.getoption("--meshspec-broker-launch")
    daemon_spec = (config.getoption("--meshspec-launch") and "launch") or config.getoption("--meshspec-target")
    sdk_spec = config.getoption("--meshspec-sdk-launch")
    config.stash[STATE] = RunState(
        target_spec=f"sdk {sdk_spec}" if sdk_spec else f"broker {broker_spec}" if broker_spec else daemon_spec,
        strict=config.getoption("--meshspec-strict"),
        spec_only=config.getoption("--meshspec-spec-only"),
        seed=seed if seed is not None else random.SystemRandom().randrange(2**31),
        report_dir=Path(report_dir) if report_dir else None,
        case_timeout=config.getoption("--meshspec-case-timeout"),
        deadline_s=config.getoption("--meshspec-deadline"),
    )
    _CONFIG[:] = [config]


STATE = pytest.StashKey[RunState]()
_CONFIG: list[pytest.Config] = []


def _selected(case_id: str, requirements: tuple[str, ...], patterns: list[str]) -> bool:
    names = [case_id, *requirements]
    return any(name == p or name.startswith(p.rstrip("*")) for p in patterns for name in names)


def _patterns(values: list[str]) -> list[str]:
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def _case_of(item: pytest.Item) -> tuple[str, tuple[str, ...]] | None:
    mark = item.get_closest_marker(registry.MARK)
    if mark is None:
        return None
    return mark.args[0], tuple(mark.args[1:])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    select = _patterns(config.getoption("--meshspec-select"))
    deselect = _patterns(config.getoption("--meshspec-deselect"))
    keep, drop = [], []
    for item in items:
        found = _case_of(item)
        if found is None:
            keep.append(item)
            continue
        case_id, requirements = found
        chosen = (not select or _selected(case_id, requirements, select)) and not (
            deselect and _selected(case_id, requirements, deselect))
        (keep if chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --- timeouts -------------------------------------------------------------------------------------------------------


def _raise_timeout(signum: int, frame: Any) -> None:
    raise CaseTimeout("the case ran past its timeout")


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01), TEARDOWN_GRACE_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


#: the case timeout when none is given and the target's timing is short or not known yet
CASE_TIMEOUT_FLOOR_S = 90.0
#: beside a case's waits: launching, killing and restarting instances, and a loaded machine
CASE_TIMEOUT_MARGIN_S = 30.0


def case_timeout_s(state: RunState) -> float:
    """Each test node's timeout: ``--case-timeout`` when given; else the longer of `CASE_TIMEOUT_FLOOR_S` and what
    the slowest cases may wait on the target's declared timing -- a row settled, the link back after a broker outage,
    a row settled through three retries (recovery.kill9_inflight) -- plus `CASE_TIMEOUT_MARGIN_S`. A target with
    slow declared timing (upstream's: 30 s reconnect cap, 15 s ack timeout) would otherwise have bounded waits read
    as "no verdict" on a loaded machine."""
    if state.case_timeout is not None:
        return state.case_timeout
    timing = getattr(state.target, "timing", None)
    if timing is None:
        return CASE_TIMEOUT_FLOOR_S
    waits = timing.settle_s() + timing.reconnect_wait_s + timing.settle_s(3)
    return max(CASE_TIMEOUT_FLOOR_S, round(waits + CASE_TIMEOUT_MARGIN_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    state = item.config.stash[STATE]
    budget = min(case_timeout_s(state), state.remaining_s)
    if _case_of(item) is not None and budget <= 0:
        state.deadline_hit += 1
        item.add_marker(pytest.mark.skip(reason=f"the run deadline ({state.deadline_s:g} s) was reached"))
        budget = 5.0
    with _alarm(budget):
        yield


def next_scenario() -> None:
    """Give the next of a case's independent scenarios the case timeout (within the run's deadline): a case that
    runs them one after another, because a fixed-port target runs one instance at a time, would otherwise fit N
    scenarios into one scenario's timeout. Call it in the case's own thread, before each scenario; the alarm (and
    the CaseTimeout it raises) stays in that thread, so no scenario outlives its case."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("next_scenario() arms the case's alarm: call it in the case's own thread")
    if not _CONFIG:
        return
    state = _CONFIG[0].stash[STATE]
    signal.setitimer(signal.ITIMER_REAL, max(min(case_timeout_s(state), state.remaining_s), 0.01), TEARDOWN_GRACE_S)


# --- fixtures -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mesh_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The implementation under test, started (or reached) once per run."""
    config = request.config
    state = config.stash[STATE]
    token = config.getoption("--meshspec-token-file")
    try:
        overrides = timing_mod.parse_cli(config.getoption("--meshspec-timing"))
        target = Target(config.getoption("--meshspec-target"), template=config.getoption("--meshspec-launch"),
                        token_file=Path(token) if token else None, trace_root=state.trace_root,
                        broker_listen=config.getoption("--meshspec-broker-listen"),
                        dialect=config.getoption("--meshspec-dialect"), timing_overrides=overrides)
        target.start()
    except (TargetError, ValueError) as exc:
        state.harness_errors.append(str(exc))
        with contextlib.suppress(Exception):
            target.close()
        pytest.exit(f"meshconform: {exc}", returncode=2)
    state.target = target
    state.trace_source = traces.TraceSource(
        handed=target.can_restart, silent=("broker", "the harness's scripted broker writes no trace"),
        instances=target.trace_dirs)
    yield target
    target.close()


@pytest.fixture
def sdk_state(tmp_path: Path) -> Path:
    """SDK suite: the state directory the scripted daemon serves from and the SDK discovers it in (not created)."""
    return tmp_path / "state"


@pytest.fixture
def run_sdk(request: pytest.FixtureRequest, tmp_path: Path):
    """SDK suite: run the SDK's driver on steps against a started scripted daemon; returns its result lines."""
    from .sdk_target import REFERENCE_SDK, SdkLaunchError, check_template, run_driver

    launch = request.config.getoption("--meshspec-sdk-launch") or "reference"
    template = REFERENCE_SDK if launch == "reference" else launch
    try:
        check_template(template)
    except SdkLaunchError as exc:
        request.config.stash[STATE].harness_errors.append(str(exc))
        pytest.exit(f"meshconform: {exc}", returncode=2)
    runs = iter(range(1_000))

    def run(daemon, steps: list[dict], timeout: float = 45.0) -> list[dict]:
        scenario = {"state_dir": str(daemon.state_dir), "mesh": daemon.mesh, "steps": steps}
        return run_driver(template, scenario, tmp_path / f"driver-{next(runs)}", timeout)

    return run


@pytest.fixture
def verdict(request: pytest.FixtureRequest) -> Verdicts:
    """The checks this test node records (conformance/verdict.py)."""
    state = request.config.stash[STATE]
    found = _case_of(request.node)
    declared = found[1] if found else ()
    recorder = Verdicts(request.node.nodeid, declared)
    state.verdicts[request.node.nodeid] = recorder
    return recorder


@pytest.fixture
def timing(mesh_target: Target) -> timing_mod.Timing:
    return mesh_target.timing


@pytest.fixture
def broker(mesh_target: Target) -> ScriptedBroker:
    """The scripted broker the target is linked to. A launched target that never linked fails the node (its
    broker-dependent requirements cannot hold); an already-running one that is not pointed at us skips."""
    timeout = mesh_target.timing.reconnect_wait_s if mesh_target.launched else 2.0
    if mesh_target.broker is None or not mesh_target.wait_broker_link(timeout=timeout):
        if mesh_target.launched is not None:
            raise AssertionError(f"the implementation is not linked to the harness's broker: "
                                 f"{mesh_target.link_problem or 'its link went down and did not come back'}")
        pytest.skip("the target is not connected to the harness's scripted broker (start it with its broker URL "
                    "pointing at --broker-listen)")
    return mesh_target.broker


@pytest.fixture
def launcher(mesh_target: Target) -> Iterator[Target]:
    """The target, for cases that must start fresh instances or restart them; skips without a launch contract.
    Fresh instances are stopped afterwards (and a main instance a fixed port made us stop is restarted)."""
    if not mesh_target.can_restart:
        pytest.skip("restart-dependent: the target was not given a launch template (--launch)")
    try:
        yield mesh_target
    finally:
        mesh_target.release_fresh()


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
    from .broker_target import REFERENCE_TRACED_BROKER, BrokerTarget, BrokerTargetError

    config = request.config
    launch = config.getoption("--meshspec-broker-launch")
    target = BrokerTarget(url=config.getoption("--meshspec-broker-url"),
                          template=REFERENCE_TRACED_BROKER if launch == "reference" else launch,
                          mesh_id=config.getoption("--meshspec-mesh-id"),
                          store_dsn=config.getoption("--meshspec-store-dsn"),
                          lease_s=config.getoption("--meshspec-lease-s"))
    state = config.stash[STATE]
    if target.can_restart:
        target.trace_dir = state.trace_root / "broker"
    try:
        target.start()
    except BrokerTargetError as exc:
        state.harness_errors.append(str(exc))
        target.close()
        pytest.exit(f"meshconform: {exc}", returncode=2)
    state.trace_source = traces.TraceSource(
        handed=target.can_restart, silent=("daemon", "the harness's members write no trace"),
        instances={"broker": target.trace_dir} if target.trace_dir is not None else {})
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
    from .store_inventory import inventory

    return lambda: inventory(broker_target.store_dsn)


def _record_deviations(request: pytest.FixtureRequest, client: ContractClient) -> None:
    request.config.stash[STATE].deviations.extend(client.deviations)


# --- attribution ----------------------------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    found = _case_of(item)
    if found is None:
        return
    case_id, declared = found
    state = item.config.stash[STATE]
    result = state.results.setdefault(case_id, CaseResult(case_id, declared))
    result.duration_s += report.duration
    node = result.nodes.setdefault(item.nodeid, NodeResult())
    recorder = state.verdicts.get(item.nodeid)
    excinfo = call.excinfo
    if report.when == "setup" and report.skipped:
        node.outcome, node.detail = "skipped", _skip_reason(report)
        node.checks = _attribute(declared, recorder, node)
        return
    if report.when == "call" or (report.when == "setup" and report.failed):
        before = (node.outcome, node.detail, node.attributed, list(node.checks)) if node.reported else None
        node.reported = True
        exc = excinfo.value if excinfo is not None else None
        if report.skipped:
            node.outcome, node.detail = "skipped", _skip_reason(report)
        elif exc is None:
            node.outcome = "passed"
        elif isinstance(exc, Attributed):
            node.outcome, node.detail, node.attributed = "failed", str(exc), True
        elif isinstance(exc, Blocked):
            node.outcome, node.detail = "skipped", f"not checkable: {exc}"
            report.outcome = "skipped"
            report.longrepr = (str(item.path), 0, f"Skipped: not checkable: {exc}")
        elif isinstance(exc, CaseTimeout):
            node.outcome = "failed"
            node.detail = (f"no verdict within the case timeout ({min(case_timeout_s(state), state.deadline_s):g} s): "
                           f"the implementation did not answer or act in time\n{_where(report)}")
        elif isinstance(exc, TARGET_FAILURES):
            node.outcome, node.detail = "failed", f"{describe(exc)}\n{_where(report)}"
        else:
            node.outcome, node.detail = "error", report.longreprtext[-3000:]
            state.harness_errors.append(f"{item.nodeid}: harness fault {describe(exc)}")
        if report.when == "setup" and node.outcome == "failed" and isinstance(exc, AssertionError):
            node.detail = describe(exc)
        checks = _attribute(declared, recorder, node)
        if before is not None:  # a later subtest, or the node after its subtests: keep the worst, keep all evidence
            if RANK[before[0]] > RANK[node.outcome]:
                node.outcome, node.detail, node.attributed = before[0], before[1], before[2]
            checks = before[3] + [c for c in checks if c not in before[3]]
        node.checks = checks
    elif report.when == "teardown" and report.failed and node.outcome != "error":
        exc = excinfo.value if excinfo is not None else None
        if isinstance(exc, (CaseTimeout, *TARGET_FAILURES)):
            return  # a teardown that timed out or lost the target changes no verdict already recorded
        node.outcome, node.detail = "error", report.longreprtext[-3000:]
        state.harness_errors.append(f"{item.nodeid}: harness fault in teardown {describe(exc) if exc else ''}")


def _where(report: pytest.TestReport) -> str:
    """The innermost frames of a failure's traceback (where in the case it happened)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    lines = [line for line in report.longreprtext.splitlines() if line.startswith(("conformance/", "cases/"))
             or "/conformance/" in line]
    located = f"at {crash.path}:{crash.lineno}" if crash is not None else ""
    return "\n".join([located, *lines[-4:]]).strip()


def _skip_reason(report: pytest.TestReport) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def _attribute(declared: tuple[str, ...], recorder: Verdicts | None, node: NodeResult) -> list[Check]:
    """The node's checks plus what its ending says about the declared requirements it recorded nothing for."""
    checks = list(recorder.checks) if recorder is not None else []
    seen = {c.requirement for c in checks}
    rest = [r for r in declared if r not in seen]
    if node.outcome == "passed":
        if not checks:
            checks += [Check(r, "pass") for r in rest]
    elif node.outcome == "skipped":
        checks += [Check(r, "skip", node.detail) for r in rest]
    elif node.outcome == "failed" and not node.attributed:
        checks += [Check(r, "fail", node.detail) for r in rest]
    elif node.outcome == "error":  # the node stopped part-way: no declared requirement's checks are complete
        checks += [Check(r, "error", node.detail) for r in declared]
    return checks


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from .report import build_report, write_reports

    state = session.config.stash[STATE]
    root = state.trace_root_made
    kept = state.report_dir is not None
    try:
        state.trace_verdicts = traces.judge(state.trace_source, root, kept)
    except Exception as exc:  # a fault of the trace check is the harness's, never the target's
        state.harness_errors.append(f"the trace check failed: {describe(exc)}")
        state.trace_verdicts = traces.not_judged(f"the trace check failed ({describe(exc)})", root, kept)
    if root is not None and not kept:
        shutil.rmtree(root, ignore_errors=True)
    report = build_report(state)
    session.config.stash[REPORT] = report
    if state.report_dir is not None:
        write_reports(report, state.report_dir)


REPORT = pytest.StashKey[dict]()
