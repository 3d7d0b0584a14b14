"""Testing the broker suite: `meshconform broker` fails each broken broker of broken_brokers.py for exactly the
requirement its mistake breaks, and passes the reference served the same way.

Each run is the real ``meshconform broker --launch`` (a subprocess, the broken broker launched by the harness on
SQLite, ``--store-dsn`` pointing into its state directory), with ``--select`` narrowed to the cases that see the
mistake; suite_checks.py records every check the suite made, so requirement ids the registry does not list yet are
judged too. The runs go several at a time (MESHSPEC_BROKER_KILL_WORKERS, default 4). `make test` runs one broken broker
per class of mistake (``Broken.default``); the others, and the full matrix — every broken broker against the whole
suite — are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from broken_brokers import CATALOGUE, CONTROL, Broken
from broker_miniatures import serving

from conformance import registry

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = HERE / "broken_brokers.py"
WORKERS = int(os.environ.get("MESHSPEC_BROKER_KILL_WORKERS", "4"))
VERDICT_ORDER = ("fail", "error", "pass", "skip")


@dataclass
class SuiteRun:
    """One `meshconform broker` run: its exit code, every recorded check and the verdict per requirement."""

    returncode: int
    checks: list[dict]
    cases: dict[str, str]
    harness_errors: list[str]
    stderr: str

    @property
    def verdicts(self) -> dict[str, str]:
        outcomes: dict[str, set[str]] = {}
        for check in self.checks:
            outcomes.setdefault(check["requirement"], set()).add(check["outcome"])
        return {req: next(v for v in VERDICT_ORDER if v in seen) for req, seen in outcomes.items()}

    def failed(self) -> set[str]:
        return {req for req, verdict in self.verdicts.items() if verdict in ("fail", "error")}

    def why(self, requirement: str) -> list[str]:
        return [f"{c['case']}: {c['outcome']} {c['detail'][:300]}" for c in self.checks
                if c["requirement"] == requirement and c["outcome"] != "pass"]


def launched(broken: Broken) -> list[str]:
    """The options that make the harness launch ``broken`` on SQLite in its state directory and read its store."""
    template = (f"{sys.executable} {SCRIPT} {broken.name} --store sqlite:///{{state_dir}}/broker.db "
                f"--listen 127.0.0.1:{{port}} --dev --lease-s {broken.lease_s:g}")
    return ["--launch", template, "--lease-s", f"{broken.lease_s:g}", "--store-dsn", "sqlite:///{state_dir}/broker.db"]


def run_suite(target: Broken | str, selection: tuple[str, ...], directory: Path, timeout: float = 600,
              case_timeout: float = 90) -> SuiteRun:
    """``meshconform broker`` against ``target`` — a broken broker the harness launches, or the ws:// URL of a
    running one — restricted to ``selection``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "checks.json"
    where = ["--url", target] if isinstance(target, str) else launched(target)
    argv = [sys.executable, "-m", "conformance.cli", "broker", *where, "--quiet", "--case-timeout", f"{case_timeout:g}",
            "--report-dir", str(directory), *(f"--select={s}" for s in selection)]
    paths = [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    # the broker suite needs no plugin of the environment's (hypothesis, schemathesis …): not loading them saves
    # seconds of start-up per run
    env = {**os.environ, "PYTEST_PLUGINS": "suite_checks", "PYTHONPATH": os.pathsep.join(paths),
           "MESHSPEC_SUITE_CHECKS": str(out), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    recorded = json.loads(out.read_text()) if out.exists() else {"checks": [], "cases": {}, "harness_errors": [
        f"no checks recorded (exit {result.returncode})"]}
    return SuiteRun(result.returncode, recorded["checks"], recorded["cases"], recorded["harness_errors"],
                    result.stderr[-4000:])


def run_all(jobs: dict[str, tuple[Broken | str, tuple[str, ...]]], root: Path) -> dict[str, SuiteRun]:
    """Every job, ``WORKERS`` at a time, in the order given."""
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {name: pool.submit(timed, name, target, selection, root / name)
                   for name, (target, selection) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def timed(name: str, target: Broken | str, selection: tuple[str, ...], directory: Path) -> SuiteRun:
    started = time.monotonic()
    run = run_suite(target, selection, directory)
    print(f"broker suite against {name}: {time.monotonic() - started:.1f} s, failed {sorted(run.failed())}")
    return run


def all_selections() -> tuple[str, ...]:
    return tuple(sorted({case for broken in CATALOGUE.values() for case in broken.select}))


DEFAULT = sorted(name for name, broken in CATALOGUE.items() if broken.default)
OTHERS = sorted(name for name, broken in CATALOGUE.items() if not broken.default)


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory) -> dict[str, SuiteRun]:
    """One broken broker per class against the cases that see it, the control against all those cases, and the
    whole suite against the garbage miniature (broker_miniatures.py)."""
    with serving("garbage") as url:
        jobs: dict[str, tuple[Broken | str, tuple[str, ...]]] = {"garbage": (url, ()),  # the longest runs first
                                                                  CONTROL.name: (CONTROL, all_selections())}
        jobs |= {name: (CATALOGUE[name], CATALOGUE[name].select) for name in DEFAULT}
        return run_all(jobs, tmp_path_factory.mktemp("broken-brokers"))


@pytest.fixture(scope="module")
def narrowed_others(tmp_path_factory) -> dict[str, SuiteRun]:
    jobs = {name: (CATALOGUE[name], CATALOGUE[name].select) for name in OTHERS}
    return run_all(jobs, tmp_path_factory.mktemp("broken-brokers-others"))


def assert_killed(name: str, run: SuiteRun) -> None:
    broken = CATALOGUE[name]
    assert not run.harness_errors and run.returncode != 2, (run.harness_errors, run.stderr)
    assert run.failed() == set(broken.kills), (
        f"{name} ({broken.description}): failed {sorted(run.failed())}, expected {sorted(broken.kills)}",
        {req: run.why(req) for req in run.failed() | set(broken.kills)})


def test_the_catalogue_selects_cases_that_check_what_it_breaks():
    cases = {c.id: set(c.requirements) for c in registry.cases(registry.BROKER_CASES_DIR)}
    for broken in CATALOGUE.values():
        assert broken.kills and broken.select, broken.name
        assert set(broken.select) <= set(cases), (broken.name, set(broken.select) - set(cases))
        checked = set().union(*(cases[c] for c in broken.select))
        assert set(broken.kills) <= checked, (broken.name, set(broken.kills) - checked)


def test_the_reference_served_the_same_way_passes(narrowed):
    run = narrowed[CONTROL.name]
    assert not run.harness_errors and run.returncode == 0, (run.harness_errors, run.stderr)
    assert not run.failed(), {req: run.why(req) for req in run.failed()}
    assert set(run.cases) == set(all_selections())


def test_every_class_has_a_broken_broker_in_the_default_run():
    classes = {case for name in DEFAULT for case in CATALOGUE[name].select}
    assert classes == set(all_selections())
    assert {req for name in DEFAULT for req in CATALOGUE[name].kills} == {
        req for broken in CATALOGUE.values() for req in broken.kills} - {"BRK-DELIVERY-COMMITTED"}  # slow only


@pytest.mark.parametrize("name", DEFAULT)
def test_the_suite_fails_the_broken_broker_for_exactly_its_requirement(narrowed, name):
    assert_killed(name, narrowed[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHERS)
def test_the_suite_fails_every_other_broken_broker_for_exactly_its_requirement(narrowed_others, name):
    assert_killed(name, narrowed_others[name])


@pytest.mark.slow
def test_the_full_suite_fails_every_broken_broker(tmp_path):
    """The full matrix: every broken broker against the whole broker suite. Exactly its requirement fails (no other
    case blames another requirement for the same mistake), the harness never breaks, and the control passes."""
    runs = run_all({CONTROL.name: (CONTROL, ())} | {name: (broken, ()) for name, broken in CATALOGUE.items()},
                   tmp_path)
    control = runs.pop(CONTROL.name)
    assert not control.failed() and not control.harness_errors, {r: control.why(r) for r in control.failed()}
    problems = {}
    for name, run in runs.items():
        if run.failed() != set(CATALOGUE[name].kills) or run.harness_errors:
            problems[name] = {"failed": sorted(run.failed()), "expected": CATALOGUE[name].kills,
                              "harness_errors": run.harness_errors,
                              "why": {r: run.why(r)[:2] for r in run.failed() - set(CATALOGUE[name].kills)}}
    assert not problems, problems


def assert_verdicts_without_harness_faults(run: SuiteRun) -> None:
    """A broker that is no broker gets failures and skips — never a harness error, never a pass of what it broke."""
    assert run.returncode == 1 and not run.harness_errors, (run.returncode, run.harness_errors, run.stderr)
    assert {"BRK-HELLO-AUTH", "BRK-ADVERTISE"} <= run.failed() or "BRK-FIRST-INSERT" in run.failed()
    assert set(run.cases) == {c.id for c in registry.cases(registry.BROKER_CASES_DIR)}


def test_a_broker_that_answers_garbage_gets_verdicts(narrowed):
    """Frames without their required members, acks without status, pushes without a delivery_id, a JSON array, text
    that is not JSON: the suite fails the broker, with no harness error and no KeyError."""
    run = narrowed["garbage"]
    assert_verdicts_without_harness_faults(run)
    assert {"BRK-FIRST-INSERT", "WS-ACK-STATUS", "BRK-HELLO-AUTH"} <= run.failed()


@pytest.mark.slow
def test_a_broker_that_never_answers_gets_verdicts_within_bounded_waits(tmp_path):
    """Every wait is bounded: a broker that accepts connections and says nothing is failed in about two minutes."""
    with serving("silent") as url:
        run = run_suite(url, (), tmp_path, timeout=400, case_timeout=60)
    assert_verdicts_without_harness_faults(run)
    assert {"BRK-HELLO-AUTH", "BRK-ADVERTISE"} <= run.failed()
