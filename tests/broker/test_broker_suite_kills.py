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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from broken_brokers import CATALOGUE, CONTROL, Broken

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


def run_suite(broken: Broken, selection: tuple[str, ...], directory: Path, timeout: float = 600) -> SuiteRun:
    """``meshconform broker`` against ``broken`` (launched by the harness), restricted to ``selection``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "checks.json"
    template = (f"{sys.executable} {SCRIPT} {broken.name} --store sqlite:///{{state_dir}}/broker.db "
                f"--listen 127.0.0.1:{{port}} --dev --lease-s {broken.lease_s:g}")
    argv = [sys.executable, "-m", "conformance.cli", "broker", "--launch", template, "--lease-s",
            f"{broken.lease_s:g}", "--store-dsn", "sqlite:///{state_dir}/broker.db", "--quiet", "--case-timeout", "90",
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


def run_all(jobs: dict[str, tuple[Broken, tuple[str, ...]]], root: Path) -> dict[str, SuiteRun]:
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {name: pool.submit(run_suite, broken, selection, root / name)
                   for name, (broken, selection) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def all_selections() -> tuple[str, ...]:
    return tuple(sorted({case for broken in CATALOGUE.values() for case in broken.select}))


DEFAULT = sorted(name for name, broken in CATALOGUE.items() if broken.default)
OTHERS = sorted(name for name, broken in CATALOGUE.items() if not broken.default)


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory) -> dict[str, SuiteRun]:
    """One broken broker per class against the cases that see it, and the control against all those cases."""
    jobs = {name: (CATALOGUE[name], CATALOGUE[name].select) for name in DEFAULT}
    jobs[CONTROL.name] = (CONTROL, all_selections())
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
        req for broken in CATALOGUE.values() for req in broken.kills}


@pytest.mark.parametrize("name", DEFAULT)
def test_the_suite_fails_the_broken_broker_for_exactly_its_requirement(narrowed, name):
    assert_killed(name, narrowed[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHERS)
def test_the_suite_fails_every_other_broken_broker_for_exactly_its_requirement(narrowed_others, name):
    assert_killed(name, narrowed_others[name])


@pytest.mark.slow
def test_the_full_suite_fails_every_broken_broker(tmp_path):
    """The full matrix: every broken broker against the whole broker suite. Its requirement fails, the harness never
    breaks, and no requirement fails that the control passes."""
    runs = run_all({name: (broken, ()) for name, broken in CATALOGUE.items()} | {CONTROL.name: (CONTROL, ())},
                   tmp_path)
    control = runs.pop(CONTROL.name)
    assert not control.failed() and not control.harness_errors, {r: control.why(r) for r in control.failed()}
    problems = {}
    for name, run in runs.items():
        missed = set(CATALOGUE[name].kills) - run.failed()
        if missed or run.harness_errors:
            problems[name] = {"missed": sorted(missed), "harness_errors": run.harness_errors}
    assert not problems, problems
