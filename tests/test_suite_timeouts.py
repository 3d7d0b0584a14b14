"""The suite's own rule for tests whose fixtures take longer than a test's timeout (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

SUITE_CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def suite_rules() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("suite_conftest_under_test", SUITE_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Item:
    """What `fixture_timeout` reads of a pytest item."""

    def __init__(self, fixturenames: list[str], module: object = None, timeout: float | None = None):
        self.fixturenames = fixturenames
        self.module = module
        self._marker = None if timeout is None else pytest.mark.timeout(timeout).mark

    def get_closest_marker(self, name: str):
        return self._marker if name == "timeout" else None


def test_a_bounded_fixture_adds_its_bound_to_the_tests_timeout():
    rules = suite_rules()
    assert rules.fixture_timeout(Item(["tmp_path", "reference_conformance_run"]), 300) == 300 + rules.REFERENCE_RUN_S
    assert rules.REFERENCE_RUN_S == 900
    module = types.SimpleNamespace(FIXTURE_BOUNDS_S={"conformance_traces": 600})
    both = Item(["spark", "conformance_traces", "reference_conformance_run"], module)
    assert rules.fixture_timeout(both, 300) == 300 + 900 + 600
    assert rules.fixture_timeout(Item(["conformance_traces"], module), 300) == 900  # the module's own bound


def test_other_tests_and_explicit_timeouts_are_left_alone():
    rules = suite_rules()
    assert rules.fixture_timeout(Item(["tmp_path", "spark"]), 300) is None
    assert rules.fixture_timeout(Item(["conformance_traces"]), 300) is None  # another module's fixture of that name
    assert rules.fixture_timeout(Item(["reference_conformance_run"], timeout=7200), 300) is None


def test_the_collected_consumers_of_the_reference_run_get_its_bound():
    """The hook marks the real items: collect the two files that use the run and read their timeouts."""
    import subprocess
    import sys

    root = SUITE_CONFTEST.parent.parent
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--collect-only", "-q",
         "tests/conformance/test_harness.py", "tests/spark/test_conformance_traces.py",
         "-p", "tests.timeout_report"], capture_output=True, text=True, timeout=120, cwd=root, check=False)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    timeouts = dict(line.split("\t", 1)[1].rsplit("\t", 1) for line in listed.stdout.splitlines()
                    if line.startswith("TIMEOUT\t"))
    assert timeouts["tests/conformance/test_harness.py::test_reference_passes_every_must"] == "1200.0"
    traced = "tests/spark/test_conformance_traces.py::test_the_daemon_conformance_run_trace_passes_every_check"
    assert timeouts[traced] == "1800.0"
