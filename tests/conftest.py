"""Suite-wide rule: `slow` tests (soak and scale runs) run only when `-m` selects them.

`make test` deselects them (`-m "not slow"`); `make slow` runs them at full size and `make slow-bounded` (what CI
runs after `make test`) at sizes bounded by the MESHSPEC_SLOW_* variables. A bare `pytest` skips them instead of
soaking for minutes.
"""

from __future__ import annotations

import pytest

#: `make test` runs on pytest-xdist workers (--dist loadgroup): the files that share one expensive session fixture
#: run on one worker, so it is built once -- the full reference conformance run, and the local Spark session.
XDIST_GROUPS = {
    "tests/conformance/test_harness.py": "reference-run",
    "tests/spark/test_conformance_traces.py": "reference-run",
    "tests/spark/": "spark",
}


def _group(item: pytest.Item) -> str | None:
    path = item.nodeid.split("::", 1)[0]
    return next((group for prefix, group in XDIST_GROUPS.items() if path.startswith(prefix)), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    expression = config.option.markexpr or ""
    if "slow" in expression and "not slow" not in expression:
        return
    skip = pytest.mark.skip(reason="a soak or scale run: select it with -m slow (make slow)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def reference_conformance_run(tmp_path_factory: pytest.TempPathFactory):
    """ONE full `meshconform run` against the reference daemon, shared by the tests that read its report
    (tests/conformance/test_harness.py) and its trace (tests/spark/test_conformance_traces.py). It is launched
    through a template, as a user's implementation would be: the reference declares itself in the launch contract's
    target description, so the run times and ages it exactly as `--target reference` does
    (test_harness::test_the_reference_launched_by_a_template_declares_what_it_reads)."""
    import subprocess
    import sys
    from pathlib import Path

    from conformance.launch import REFERENCE_TEMPLATE

    root = tmp_path_factory.mktemp("reference-conformance-run")
    result = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--launch",
                             f"{REFERENCE_TEMPLATE} --trace-dir {root / 'trace'}", "--report-dir",
                             str(root / "report"), "--seed", "7", "--quiet"], capture_output=True, text=True,
                            timeout=900, check=False, cwd=Path(__file__).resolve().parents[1])
    return result, root / "report", root / "trace"
