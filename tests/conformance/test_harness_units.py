"""meshconform's parts without a daemon: attribution, verdicts kept apart by kind, exit codes, timeouts that hold
without the terminal plugin, the progress reporter, timing bounds, broker dialects, the claudemesh adapter, the
reference's clock hook, and the harness's import boundary."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conformance import member, plugin, registry, report, timing, wire
from conformance.adapters import claudemesh
from conformance.peer import DEFAULT_SUPPORTED, PeerConfig, ScriptedBroker, detect_dialect
from conformance.verdict import TARGET_FAILURES, Check, HarnessMisuse, Verdicts
from spec import SPEC_DIR, load_table, load_yaml, schema, validator

REPO = SPEC_DIR.parent


# --- attribution ----------------------------------------------------------------------------------------------------


def node(outcome: str, detail: str = "", attributed: bool = False) -> plugin.NodeResult:
    return plugin.NodeResult(outcome=outcome, detail=detail, attributed=attributed)


def test_a_failing_check_fails_only_its_requirement():
    recorder = Verdicts("n", ("A", "B", "C"))
    recorder.expect("A", True)
    with recorder.check("B"):
        raise AssertionError("B is wrong")
    checks = plugin._attribute(("A", "B", "C"), recorder, node("passed"))
    assert [(c.requirement, c.outcome) for c in checks] == [("A", "pass"), ("B", "fail")]


def test_an_unattributed_failure_fails_only_what_the_node_recorded_nothing_for():
    recorder = Verdicts("n", ("A", "B"))
    recorder.expect("A", True)
    checks = plugin._attribute(("A", "B"), recorder, node("failed", "boom"))
    assert {(c.requirement, c.outcome) for c in checks} == {("A", "pass"), ("B", "fail")}


def test_an_attributed_failure_adds_nothing():
    recorder = Verdicts("n", ("A", "B"))
    recorder.expect("A", False, "A broke")
    checks = plugin._attribute(("A", "B"), recorder, node("failed", "A broke", attributed=True))
    assert [(c.requirement, c.outcome) for c in checks] == [("A", "fail")]


def test_a_harness_fault_is_an_error_never_a_failure():
    checks = plugin._attribute(("A",), None, node("error", "NameError"))
    assert [(c.requirement, c.outcome) for c in checks] == [("A", "error")]


def test_blocked_requirements_are_skipped_never_passed():
    recorder = Verdicts("n", ("A", "B"))
    recorder.expect("A", True)
    with pytest.raises(Exception, match="precondition"):
        recorder.blocked(["A", "B"], "precondition")
    assert [(c.requirement, c.outcome) for c in recorder.checks] == [("A", "pass"), ("B", "skip")]


def test_an_undeclared_requirement_is_refused_as_the_harness_s_fault():
    with pytest.raises(HarnessMisuse) as raised:
        Verdicts("n", ("A",)).expect("B", True)
    assert not isinstance(raised.value, TARGET_FAILURES), "a misused recorder would read as the target's failure"


def test_a_harness_fault_after_a_pass_leaves_no_pass():
    declared = (SPEC_MUST, PROFILE_MUST)
    recorder = Verdicts("n", declared)
    recorder.expect(SPEC_MUST, True)
    checks = plugin._attribute(declared, recorder, node("error", "HarnessMisuse"))
    built = report.build_report(_state(checks, errors=["harness fault"]))
    verdicts = {r["id"]: r["verdict"] for r in built["requirements"] if r["id"] in declared}
    assert verdicts == {SPEC_MUST: "error", PROFILE_MUST: "error"}
    assert built["summary"]["exit_code"] == 2


# --- verdicts, kinds and exit codes -------------------------------------------------------------------------------


def _state(checks: list[Check], strict: bool = False, spec_only: bool = False, errors: list[str] | None = None):
    result = plugin.CaseResult("case.x", tuple({c.requirement for c in checks}))
    result.nodes["node"] = plugin.NodeResult(outcome="passed", checks=checks)
    return SimpleNamespace(results={"case.x": result}, deviations=[], strict=strict, spec_only=spec_only,
                           harness_errors=errors or [], target_spec="reference", seed=1, started=time.time(),
                           deadline_hit=0, target=None)


REQUIREMENTS = {r["id"]: r for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}
SPEC_MUST = next(r for r in REQUIREMENTS.values() if r["source"] == "spec" and r["level"] == "MUST")["id"]
PROFILE_MUST = next(r for r in REQUIREMENTS.values() if r["source"].startswith("errata") and r["level"] == "MUST")["id"]


def test_spec_and_profile_failures_are_reported_apart():
    built = report.build_report(_state([Check(SPEC_MUST, "pass"), Check(PROFILE_MUST, "fail", "differs")]))
    validator("report/conformance_report").validate(built)
    assert built["summary"]["spec"]["verdict"] == "pass" and built["summary"]["profile"]["verdict"] == "fail"
    row = next(r for r in built["requirements"] if r["id"] == PROFILE_MUST)
    assert row["kind"] == "profile" and row["cite"].startswith("meshspec E-")
    assert built["summary"]["exit_code"] == 1


def test_spec_only_counts_the_spec():
    built = report.build_report(_state([Check(PROFILE_MUST, "fail", "differs")], spec_only=True))
    assert built["summary"]["exit_code"] == 0 and built["summary"]["profile"]["verdict"] == "fail"


def test_a_spec_failure_cites_the_spec_sentence():
    built = report.build_report(_state([Check(SPEC_MUST, "fail", "broken")]))
    row = next(r for r in built["requirements"] if r["id"] == SPEC_MUST)
    assert row["kind"] == "spec" and "“" in row["cite"], row["cite"]


def test_exit_2_only_for_a_harness_fault():
    assert report.build_report(_state([Check(SPEC_MUST, "fail")]))["summary"]["exit_code"] == 1
    assert report.build_report(_state([Check(SPEC_MUST, "pass")], errors=["harness fault"]))["summary"][
        "exit_code"] == 2


def test_fail_beats_pass_and_skip_is_never_a_pass():
    assert report._verdict(["pass", "fail", "skip"]) == "fail"
    assert report._verdict(["skip"]) == "skip"
    assert report._verdict([]) == "not_checked"


# --- the harness cannot crash or hang ---------------------------------------------------------------------------------

SLEEPER = '''
import time
from conformance.registry import case


@case("unit.sleeper", "API-VERSION")
def test_sleeps_through_except_exception(verdict):
    while True:
        try:
            time.sleep(60)
        except Exception:
            pass


@case("unit.quick", "API-HEALTH")
def test_quick(verdict):
    verdict.expect("API-HEALTH", True)
'''


def test_the_case_timeout_holds_without_the_terminal_plugin(tmp_path):
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "test_sleeper.py").write_text(SLEEPER)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", str(cases), "-p", "conformance.plugin", "-p",
                             "no:terminal", "-p", "no:timeout", "-p", "no:cacheprovider", "-o", "addopts=",
                             "--meshspec-case-timeout=2", f"--meshspec-report-dir={tmp_path / 'r'}",
                             "--rootdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120,
                            check=False)
    assert time.monotonic() - started < 60, "the case timeout did not hold"
    built = json.loads((tmp_path / "r" / "report.json").read_text())
    rows = {r["id"]: r for r in built["requirements"]}
    assert rows["API-VERSION"]["verdict"] == "fail" and "case timeout" in rows["API-VERSION"]["reason"]
    assert rows["API-HEALTH"]["verdict"] == "pass"
    assert built["summary"]["exit_code"] == 1, result.stderr[-2000:]


SCENARIOS = '''
import time
from concurrent.futures import ThreadPoolExecutor

from conformance.plugin import next_scenario
from conformance.registry import case


@case("unit.scenarios", "API-VERSION")
def test_three_scenarios_each_within_the_timeout(verdict):
    for _ in range(3):
        next_scenario()
        time.sleep(1.2)
    verdict.expect("API-VERSION", True)


@case("unit.one-timeout", "API-HEALTH")
def test_three_scenarios_in_one_timeout(verdict):
    for _ in range(3):
        time.sleep(1.2)
    verdict.expect("API-HEALTH", True)


@case("unit.pooled", "API-OUTBOX")
def test_a_scenario_in_a_pool_thread(verdict):
    with ThreadPoolExecutor(1) as pool:
        pool.submit(next_scenario).result()
'''


def test_each_scenario_of_a_case_gets_the_case_timeout_in_the_cases_own_thread(tmp_path):
    """`next_scenario` re-arms the case's alarm for each of its scenarios run one after another (a fixed-port
    target's): three of 1.2 s pass under a 2 s case timeout, where the same three without it time out; asked from
    another thread it is a harness fault (the alarm stops only the case's own thread)."""
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "test_scenarios.py").write_text(SCENARIOS)
    subprocess.run([sys.executable, "-m", "pytest", str(cases), "-p", "conformance.plugin", "-p", "no:terminal",
                    "-p", "no:timeout", "-p", "no:cacheprovider", "-o", "addopts=", "--meshspec-case-timeout=2",
                    f"--meshspec-report-dir={tmp_path / 'r'}", "--rootdir", str(tmp_path)], cwd=REPO,
                   capture_output=True, text=True, timeout=120, check=False)
    built = json.loads((tmp_path / "r" / "report.json").read_text())
    rows = {r["id"]: r for r in built["requirements"]}
    assert rows["API-VERSION"]["verdict"] == "pass", rows["API-VERSION"]
    assert rows["API-HEALTH"]["verdict"] == "fail" and "case timeout (2 s)" in rows["API-HEALTH"]["reason"]
    assert rows["API-OUTBOX"]["verdict"] == "error"
    assert any("next_scenario() arms the case's alarm" in e for e in built["harness_errors"]), built["harness_errors"]


def test_a_fixed_port_target_is_launched_only_from_the_cases_own_thread():
    """From another thread a fresh instance of a fixed-port target is refused before anything is stopped: the case's
    alarm stops only its own thread, and a pool's scenario launched after the teardown restarted the main instance
    would stop that again (the interop flake of a main instance `exited with -15 before answering`)."""
    from concurrent.futures import ThreadPoolExecutor

    from conformance.target import Target, TargetError

    def stop(*args, **kwargs):
        raise AssertionError("the main instance was stopped")

    target = Target.__new__(Target)
    target.template, target.launched = "unused {state_dir}", SimpleNamespace(fixed_port=True, running=True, stop=stop)
    with ThreadPoolExecutor(1) as pool, pytest.raises(TargetError, match="from the case's own thread"):
        pool.submit(target.launch, "fresh").result()


def test_the_default_case_timeout_covers_the_slowest_cases_waits_on_the_declared_timing():
    """Without --case-timeout each node gets the longer of 90 s and a row settled, a reconnect after an outage and
    a row settled through three retries on the target's declared timing, plus 30 s; --case-timeout is kept as
    given. Upstream's timing (1 s retries doubling, 0.5 s poll, 15 s ack timeout, 30 s reconnect cap) gives 22 + 40
    + 29 + 30 = 121 s, where its recovery.kill9_inflight took 86 s of the old fixed 90."""
    from conformance.plugin import RunState, case_timeout_s
    from conformance.timing import Timing

    upstream = Timing().with_values({"retry_base_ms": 1000, "retry_max_ms": 30000, "retry_multiplier": 2,
                                     "retry_jitter": 0, "poll_ms": 500, "ack_timeout_s": 15,
                                     "reconnect_initial_ms": 1000, "reconnect_max_ms": 30000,
                                     "reconnect_multiplier": 2, "reconnect_jitter": 0, "hello_timeout_s": 5}, "test")
    quick = Timing().with_values({"retry_base_ms": 50, "retry_max_ms": 200, "ack_timeout_s": 2,
                                  "reconnect_initial_ms": 50, "reconnect_max_ms": 500}, "test")

    def state(case_timeout, timing):
        run = RunState(target_spec="launch", strict=False, spec_only=False, seed=1, report_dir=None,
                       case_timeout=case_timeout, deadline_s=1800)
        run.target = None if timing is None else SimpleNamespace(timing=timing)
        return run

    assert upstream.settle_s() == 22 and upstream.reconnect_wait_s == 40 and upstream.settle_s(3) == 29
    assert case_timeout_s(state(None, upstream)) == 121
    assert case_timeout_s(state(None, quick)) == 90
    assert case_timeout_s(state(None, None)) == 90  # the target not started yet
    assert case_timeout_s(state(45.0, upstream)) == 45
    # the broker cases' clock budget reads the same timeout, not the raw option (None when --case-timeout is unset)
    from conformance.broker_cases._support import CASE_MARGIN_S, budget_s
    from conformance.plugin import STATE

    for case_timeout, declared, want in ((None, upstream, 121), (None, None, 90), (45.0, upstream, 45)):
        run = state(case_timeout, declared)
        request = SimpleNamespace(config=SimpleNamespace(stash={STATE: run}))
        assert budget_s(request) == min(want, run.remaining_s) - CASE_MARGIN_S


class _Clock:
    """A fake clock whose sleep advances it and lets the fake members' acks arrive on schedule."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Racer:
    def __init__(self, clock: _Clock, answer_at: float | None, closes_at: float | None = None):
        self.clock, self.answer_at, self.closes_at = clock, answer_at, closes_at

    def acks(self, key: str) -> list[dict]:
        came = self.answer_at is not None and self.clock.now >= self.answer_at
        return [{"type": "ack", "client_message_id": key, "status": 200}] if came else []

    @property
    def closed(self) -> bool:
        return self.closes_at is not None and self.clock.now >= self.closes_at


def test_racers_acks_are_waited_for_together_while_the_broker_keeps_answering():
    """first_acks: a broker answering 16 racers one every 3 s, the first racer last (48 s in all), gets every ack
    with a 10 s quiet bound, where a wait per racer in turn would give the first one up at 10 s; one that stops
    answering leaves the rest None 10 s after its last answer; a closed racer ends its own wait."""
    from conformance.broker_cases._support import first_acks

    clock = _Clock()
    serial = [_Racer(clock, 3.0 * (16 - n)) for n in range(16)]
    acks = first_acks([(r, "k") for r in serial], quiet_s=10.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert all(ack is not None for ack in acks) and 48.0 <= clock.now < 49.0

    clock = _Clock()
    stalled = [_Racer(clock, 2.0 * (n + 1) if n < 5 else None) for n in range(16)]
    acks = first_acks([(r, "k") for r in stalled], quiet_s=10.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert [ack is not None for ack in acks] == [True] * 5 + [False] * 11
    assert 20.0 <= clock.now < 20.6  # 10 s after the fifth ack at 10 s: never cut while answers keep coming

    clock = _Clock()
    closing = [_Racer(clock, 1.0), _Racer(clock, None, closes_at=2.0)]
    acks = first_acks([(r, "k") for r in closing], quiet_s=10.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert acks[0] is not None and acks[1] is None and clock.now <= 2.5

    clock = _Clock()
    silent = [_Racer(clock, None) for _ in range(3)]
    assert first_acks([(r, "k") for r in silent], quiet_s=10.0, poll_s=0.5, clock=clock,
                      sleep=clock.sleep) == [None] * 3
    assert 10.0 <= clock.now < 10.6


def test_the_run_deadline_skips_what_would_start_after_it(tmp_path):
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "test_sleeper.py").write_text(SLEEPER)
    subprocess.run([sys.executable, "-m", "pytest", str(cases), "-p", "conformance.plugin", "-p", "no:terminal",
                    "-p", "no:timeout", "-p", "no:cacheprovider", "-o", "addopts=", "--meshspec-case-timeout=30",
                    "--meshspec-deadline=2", f"--meshspec-report-dir={tmp_path / 'r'}", "--rootdir", str(tmp_path)],
                   cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    built = json.loads((tmp_path / "r" / "report.json").read_text())
    rows = {r["id"]: r for r in built["requirements"]}
    assert rows["API-HEALTH"]["verdict"] == "skip" and "deadline" in rows["API-HEALTH"]["reason"]
    assert built["summary"]["deadline_skips"] == 1


def test_the_progress_reporter_prints_any_case_id():
    from conformance.cli import _Progress

    progress = _Progress(quiet=True)
    progress.task = progress.progress.add_task("x", total=1)
    failed = SimpleNamespace(nodeid="cases/test_x.py::test_y[/v1/send] [bold]", when="call", outcome="failed",
                             failed=True)
    progress.pytest_runtest_logreport(failed)
    assert progress.failed == [failed.nodeid]


def test_case_arguments_must_be_literals(tmp_path):
    (tmp_path / "test_bad.py").write_text('from conformance.registry import case\nX = ("A",)\n'
                                          '@case("bad.case", *X)\ndef test_bad():\n    pass\n')
    with pytest.raises(ValueError, match="string literals"):
        registry.cases.__wrapped__(tmp_path)


# --- timing -------------------------------------------------------------------------------------------------------


def test_retry_bounds_follow_the_declared_schedule():
    schedule = timing.Timing(retry_base_ms=100, retry_max_ms=500, retry_jitter=0.25)
    assert [schedule.retry_delay_ms(n) for n in range(1, 6)] == [100, 200, 400, 500, 500]
    low, high = schedule.retry_gap_bounds(2)
    assert low == 200 * 0.75 - timing.EARLY_MS and high == 200 * 1.25 + timing.LATE_MS
    flat = timing.Timing(retry_base_ms=100, retry_max_ms=100, retry_jitter=0.25)
    assert flat.retry_delay_ms(3) < schedule.retry_gap_bounds(3)[0], "a non-growing backoff must fall outside"
    unbounded = 100 * 2 ** 5
    assert unbounded > schedule.retry_gap_bounds(6)[1], "a missing cap must fall outside"


def test_timing_from_config_and_the_command_line():
    parsed = timing.from_config_toml("[outbox]\nretry_base_ms = 100\n[reconnect]\ninitial_ms = 50\n")
    assert parsed == {"retry_base_ms": 100.0, "reconnect_initial_ms": 50.0}
    assert timing.parse_cli(["retry_base_ms=5,ack_timeout_s=2"]) == {"retry_base_ms": 5.0, "ack_timeout_s": 2.0}
    with pytest.raises(ValueError):
        timing.Timing().with_values({"nonsense": 1}, "x")


# --- dialects -----------------------------------------------------------------------------------------------------


def test_dialect_from_the_hello():
    assert detect_dialect({"type": "hello", "channel": "claudemesh-daemon"}) == "claudemesh"
    assert detect_dialect({"type": "hello", "sessionPubkey": "ab", "pid": 1}) == "claudemesh"
    assert detect_dialect({"type": "hello", "protocolVersion": "0.9.0"}) == "meshspec"


def test_an_upstream_send_frame_is_read_without_its_fields():
    seen = wire.send_seen({"type": "send", "id": "k1", "client_message_id": "k1", "request_fingerprint": "ab" * 32,
                           "targetSpec": "*", "priority": "next", "nonce": "n", "ciphertext": "aGk="})
    assert (seen.cmid, seen.claimed, seen.fields, seen.body) == ("k1", "ab" * 32, None, "hi")
    assert seen.fingerprint() == bytes.fromhex("ab" * 32)


def test_reads_never_raise_on_a_surprising_shape():
    assert wire.send_seen({"type": "send"}).cmid == ""
    assert wire.client_ack({"type": "client_ack", "clientMessageId": 5})["cmid"] == ""
    assert wire.json_object(SimpleNamespace(json=lambda: [1, 2])) == {}


# --- the claudemesh adapter and the clock hooks ------------------------------------------------------------------


def test_the_claudemesh_adapter_describes_where_upstream_listens(tmp_path):
    cli = tmp_path / "claudemesh-cli-1.37.0" / "cli.js"
    cli.parent.mkdir()
    cli.write_text("")
    (cli.parent / "package.json").write_text(json.dumps({"version": "1.37.0"}))
    state = tmp_path / "state"
    state.mkdir()
    args = SimpleNamespace(state_dir=str(state), broker_url="ws://127.0.0.1:1", target_file=str(tmp_path / "t.json"),
                           clock_file=str(tmp_path / "clock"), cli=str(cli), node="/usr/bin/node")
    command, env = claudemesh.prepare(args)
    assert command[-3:] == ["daemon", "up", "--foreground"] and env["HOME"] == str(state / "home")
    config = state / "home" / ".claudemesh" / "config.json"
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    mesh = json.loads(config.read_text())["meshes"][0]
    assert mesh["brokerUrl"] == "ws://127.0.0.1:1" and mesh["secretKey"].endswith(mesh["pubkey"])
    description = json.loads((tmp_path / "t.json").read_text())
    assert validator("harness/target").is_valid(description)
    assert description["fixed_port"] is True and description["port"] == 47823
    assert "clock_shim.cjs" in env["NODE_OPTIONS"]
    claudemesh.prepare(args)
    assert json.loads(config.read_text())["meshes"][0]["pubkey"] == mesh["pubkey"], "a restart is the same member"
    cli.parent.rename(tmp_path / "claudemesh-cli-1.21.1")
    (tmp_path / "claudemesh-cli-1.21.1" / "package.json").write_text(json.dumps({"version": "1.21.1"}))
    older, _ = claudemesh.prepare(SimpleNamespace(**{**vars(args), "cli": str(tmp_path / "claudemesh-cli-1.21.1"
                                                                              / "cli.js")}))
    assert "--foreground" not in older


@pytest.mark.skipif(shutil.which("node") is None, reason="no node on this machine")
def test_the_node_clock_shim_moves_date(tmp_path):
    clock = tmp_path / "clock"
    clock.write_text("3600")
    script = "console.log(JSON.stringify([Date.now(), new Date().getTime()]))"
    result = subprocess.run(["node", "--require", str(claudemesh.SHIM), "-e", script], capture_output=True, text=True,
                            env={**os.environ, "MESHCONFORM_CLOCK_FILE": str(clock)}, check=True)
    now, constructed = json.loads(result.stdout)
    assert abs(now / 1000 - (time.time() + 3600)) < 5 and abs(constructed - now) < 1000


def test_the_reference_clock_hook(tmp_path):
    from reference.clock import WallClock

    offset = tmp_path / "clock"
    clock = WallClock(offset)
    assert abs(clock() - time.time()) < 1
    offset.write_text("7200\n")
    time.sleep(0.06)
    assert abs(clock() - time.time() - 7200) < 1
    assert abs(WallClock()() - time.time()) < 1


# --- independence -----------------------------------------------------------------------------------------------------


def test_the_harness_depends_on_spec_and_the_public_core_only():
    """conformance/ imports spec, reference.core's public names (its __all__) and third-party packages — never the
    reference daemon or broker, never a private module of the core."""
    import reference.core as core

    public = set(core.__all__)
    for path in (REPO / "conformance").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for item in ast.walk(tree):
            if isinstance(item, ast.ImportFrom) and item.module and item.module.startswith("reference"):
                assert item.module == "reference.core", f"{path.relative_to(REPO)} imports {item.module}"
                assert {a.name for a in item.names} <= public, f"{path.relative_to(REPO)}: " \
                                                               f"{ {a.name for a in item.names} - public}"
            elif isinstance(item, ast.Import):
                assert not any(a.name.startswith("reference") for a in item.names), path


# --- what the harness's peers say is spec/tables/features.yaml's and the schemas' --------------------------------


def test_the_scripted_broker_advertises_every_bit_at_its_table_version():
    bits = load_table("features")["bits"]
    assert {bit: entry["params"]["version"] for bit, entry in DEFAULT_SUPPORTED.items()} == {
        bit: spec["version"] for bit, spec in bits.items()}


def test_a_member_negotiates_the_daemon_defaults():
    defaults = load_table("features")["daemon_defaults"]
    assert (defaults["require"], defaults["optional"]) == (member.REQUIRE, member.OPTIONAL)
    assert member.REQUIRE == ["client_message_id_dedupe", "concurrent_connection_policy"]


def test_frames_without_a_priority_take_the_send_requests_default():
    default = schema("ipc/send_request")["properties"]["priority"]["default"]
    assert default == "next"
    assert member.send_frame("c-1", "#t", "hi")["priority"] == default
    assert ScriptedBroker(PeerConfig()).push_frame(body="hi")["priority"] == default


def test_the_default_timing_is_the_timing_and_limits_tables():
    table = load_table("timing")
    retry, reconnect = table["backoff"]["outbox_retry"], table["backoff"]["reconnect"]
    limits = load_table("limits")["limits"]
    default = timing.Timing()
    assert (default.retry_base_ms, default.retry_max_ms, default.retry_multiplier, default.retry_jitter) == (
        retry["base_ms"], retry["max_ms"], retry["multiplier"], retry["jitter"])
    assert (default.reconnect_initial_ms, default.reconnect_max_ms, default.reconnect_multiplier,
            default.reconnect_jitter) == (reconnect["base_ms"], reconnect["max_ms"], reconnect["multiplier"],
                                          reconnect["jitter"])
    assert (default.keepalive_s, default.header_read_s, default.body_read_s) == (
        table["sse_keepalive_s"]["value"], limits["ipc_header_read_s"]["value"], limits["ipc_body_read_s"]["value"])


SUBTESTS = '''
from conformance.registry import case
from conformance.verdict import Attributed


@case("unit.subtests", "API-VERSION", "API-HEALTH")
def test_one_subtest_breaks(verdict, subtests):
    for n in range(3):
        with subtests.test(n=n):
            if n == 1:
                verdict.expect("API-VERSION", False, "subtest 1 broke")
                raise Attributed("subtest 1 broke")
            verdict.expect("API-VERSION", True)
    verdict.expect("API-HEALTH", True)


@case("unit.subtests_pass", "API-COMPAT")
def test_every_subtest_holds(verdict, subtests):
    for n in range(2):
        with subtests.test(n=n):
            verdict.expect("API-COMPAT", True)
'''


def test_a_failed_subtest_fails_its_case_though_the_node_passes(tmp_path):
    """schemathesis runs each API operation as a subtest of one node, whose own report then says passed: a subtest
    that failed must still fail the case and its requirement (the worst report of a node wins, its evidence adds
    up)."""
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "test_subtests.py").write_text(SUBTESTS)
    subprocess.run([sys.executable, "-m", "pytest", str(cases), "-p", "conformance.plugin", "-p", "no:terminal",
                    "-p", "no:timeout", "-p", "no:cacheprovider", "-o", "addopts=", "--meshspec-case-timeout=30",
                    f"--meshspec-report-dir={tmp_path / 'r'}", "--rootdir", str(tmp_path)],
                   cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    built = json.loads((tmp_path / "r" / "report.json").read_text())
    rows = {r["id"]: r for r in built["requirements"]}
    cases_by_id = {c["id"]: c for c in built["cases"]}
    assert rows["API-VERSION"]["verdict"] == "fail" and "subtest 1 broke" in rows["API-VERSION"]["reason"]
    assert rows["API-HEALTH"]["verdict"] == "pass" and rows["API-COMPAT"]["verdict"] == "pass"
    assert cases_by_id["unit.subtests"]["outcome"] == "failed"
    assert "subtest 1 broke" in cases_by_id["unit.subtests"]["detail"]
    assert cases_by_id["unit.subtests_pass"]["outcome"] == "passed"
    assert built["summary"]["exit_code"] == 1


def test_only_a_documented_answer_before_routing_is_exempt_from_the_operation_s_statuses():
    import httpx

    from conformance.cases.test_fuzz import before_routing_problem

    def answer(status: int, body, content_type: str = "application/problem+json") -> httpx.Response:
        return httpx.Response(status, headers={"Content-Type": content_type},
                              content=body if isinstance(body, bytes) else json.dumps(body).encode())

    def problem(code: str, status: int) -> dict:
        return {"type": f"urn:meshspec:error:{code}", "title": "t", "status": status, "detail": "d", "error": code}

    assert (before_routing_problem(answer(414, problem("uri_too_long", 414)))
            == "414 uri_too_long, answered before routing")
    assert before_routing_problem(answer(431, problem("header_fields_too_large", 431))) is not None
    assert before_routing_problem(answer(408, problem("request_timeout", 408))) is not None
    assert before_routing_problem(answer(400, problem("malformed_http", 400))) is not None
    assert before_routing_problem(answer(400, problem("invalid_json", 400))) is None  # a route's own 400
    assert before_routing_problem(answer(414, problem("malformed_http", 400))) is None  # code and status disagree
    assert before_routing_problem(answer(414, problem("uri_too_long", 414), "application/json")) is None
    assert before_routing_problem(answer(414, b"URI too long", "text/plain")) is None
    assert before_routing_problem(answer(414, {**problem("uri_too_long", 414), "type": "about:blank"})) is None
    assert before_routing_problem(answer(404, problem("not_found", 404))) is None
    missing = problem("uri_too_long", 414)
    del missing["title"]
    assert before_routing_problem(answer(414, missing)) is None  # not the problem schema
