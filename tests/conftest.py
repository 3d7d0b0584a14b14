"""Suite-wide rule: `slow` tests (soak and scale runs) run only when `-m` selects them.

`make test` deselects them (`-m "not slow"`); `make slow` runs them at full size and `make slow-bounded` (what CI
runs after `make test`) at sizes bounded by the MESHSPEC_SLOW_* variables. A bare `pytest` skips them instead of
soaking for minutes.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

#: `make test` runs on pytest-xdist workers (`--dist loadfile`, with the scheduler below): each file runs whole on one
#: worker, and the files that share one expensive session fixture run on the same worker, so it is built once -- the
#: full reference conformance run, and the local Spark session (`SPARK_GROUP`).
XDIST_GROUPS = {
    "tests/conformance/test_harness.py": "reference-run",
    "tests/spark/test_conformance_traces.py": "reference-run",
}
#: The group of the files under tests/spark/ that use the shared Spark session: a function (test or fixture) taking
#: the `spark` fixture, or asking for it by name. The trace checks' other files (the oracle's, DuckDB's, the
#: format's) run on any worker: the Spark worker is the suite's longest, and they need no JVM.
SPARK_GROUP = "spark"
USES_SPARK = re.compile(r'\bdef \w+\((?:.*[ ,(])?spark\b|getfixturevalue\("spark"\)')
ROOT = Path(__file__).resolve().parent.parent
#: The bound of the full reference conformance run (`reference_conformance_run`'s subprocess timeout).
REFERENCE_RUN_S = 900
#: Fixtures that may take longer than a test's own timeout (`timeout` in pyproject.toml), with their bounds in seconds.
#: pytest-timeout counts a test's setup, so the first test asking for one of them would be stopped while the fixture
#: is still inside its own bound (on a loaded 2-core machine the reference run alone took 268 s of the 300); every
#: test whose fixture closure holds one gets its timeout raised by that bound (`fixture_timeout`). A module adds
#: its own in a module-level `FIXTURE_BOUNDS_S` dict.
FIXTURE_BOUNDS_S = {"reference_conformance_run": REFERENCE_RUN_S}


@functools.cache
def _uses_spark(path: str) -> bool:
    try:
        return USES_SPARK.search((ROOT / path).read_text(encoding="utf-8")) is not None
    except OSError:
        return True  # unreadable here: keep it with the session rather than start a second JVM elsewhere


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: a listed group, the Spark group, else the test's own file -- a module's tests
    stay together (module-scoped fixtures are built once, and a test may read what an earlier one of its module
    recorded)."""
    path = nodeid.split("::", 1)[0]
    listed = next((group for prefix, group in XDIST_GROUPS.items() if path.startswith(prefix)), None)
    if listed is not None:
        return listed
    if path.startswith("tests/spark/") and _uses_spark(path):
        return SPARK_GROUP
    return path


@pytest.hookimpl(optionalhook=True)  # the suite also runs without xdist (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile` grouped by `scope_of`. Not `xdist_group` marks with `--dist loadgroup`: on pytest 9.2 those
    are silently ignored (xdist writes the group into `item._nodeid`, which pytest no longer reads; pytest-xdist
    issue #1386), and the files sharing a fixture ran on two workers."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return GroupedFileScheduling(config, log)


def fixture_timeout(item: pytest.Item, default_s: float) -> float | None:
    """The timeout ``item`` needs when its fixtures include a bounded one (`FIXTURE_BOUNDS_S`, the suite's and its
    module's): ``default_s`` plus the bounds of every such fixture it uses; None when it uses none, or when it sets
    its own timeout."""
    if item.get_closest_marker("timeout") is not None:
        return None
    bounds = {**FIXTURE_BOUNDS_S, **getattr(getattr(item, "module", None), "FIXTURE_BOUNDS_S", {})}
    extra = sum(bound for name, bound in bounds.items() if name in getattr(item, "fixturenames", ()))
    return default_s + extra if extra else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        default_s = float(config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout not loaded: no timeouts to raise
        default_s = 0.0
    for item in items:
        needed = fixture_timeout(item, default_s) if default_s else None
        if needed is not None:
            item.add_marker(pytest.mark.timeout(needed))
    expression = config.option.markexpr or ""
    if "slow" in expression and "not slow" not in expression:
        return
    skip = pytest.mark.skip(reason="a soak or scale run: select it with -m slow (make slow)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def reference_conformance_run(tmp_path_factory: pytest.TempPathFactory):
    """ONE full `meshconform run` against the reference daemon, shared by the tests that read its report and its
    TRC verdicts (tests/conformance/test_harness.py) and its trace (tests/spark/test_conformance_traces.py). It is
    launched through a template, as a user's implementation would be: the reference declares itself in the launch
    contract's target description, so the run times and ages it exactly as `--target reference` does
    (test_harness::test_the_reference_launched_by_a_template_declares_what_it_reads), and it traces into the
    `{trace_dir}` the harness hands each instance, which `--report-dir` keeps in `report/trace/<instance>/`.

    One run per pytest session, whichever xdist workers ask for it: the first to ask runs it in the session's common
    temporary directory, under an exclusive lock, and records its result there; the others wait on the lock and read
    that result (the two files using it are often on different workers, and the run takes minutes)."""
    import fcntl
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conformance.launch import REFERENCE_TRACED_TEMPLATE

    common = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is a directory of the session's common one
        common = common.parent
    root = common / "reference-conformance-run"
    argv = [sys.executable, "-m", "conformance.cli", "run", "--launch", REFERENCE_TRACED_TEMPLATE, "--report-dir",
            str(root / "report"), "--seed", "7", "--quiet"]
    with open(common / "reference-conformance-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        recorded = root / "result.json"
        if not recorded.exists():
            root.mkdir(exist_ok=True)
            run = subprocess.run(argv, capture_output=True, text=True, timeout=REFERENCE_RUN_S, check=False,
                                 cwd=Path(__file__).resolve().parents[1])
            recorded.write_text(json.dumps({"returncode": run.returncode, "stdout": run.stdout,
                                            "stderr": run.stderr}))
        done = json.loads(recorded.read_text())
    result = subprocess.CompletedProcess(argv, done["returncode"], done["stdout"], done["stderr"])
    return result, root / "report", root / "report" / "trace"
