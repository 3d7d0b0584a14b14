"""How long the default conformance run takes on this machine (target: at most 120 s on 2 cores).

    python bench/conformance_run.py [--repeat N]

Runs `meshconform run --target reference` (the README's main job) N times and prints each wall time, the case
and requirement counts, and the ratio to the 120 s target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 120.0


def one_run(seed: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as reports:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--target", "reference", "--quiet",
                                 "--seed", str(seed), "--report-dir", reports], capture_output=True, text=True,
                                check=False, cwd=Path(__file__).resolve().parent.parent)
        elapsed = time.perf_counter() - started
        if result.returncode != 0:
            sys.exit(f"conformance run failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
        return elapsed, json.loads((Path(reports) / "report.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    times = []
    for n in range(args.repeat):
        elapsed, report = one_run(seed=n + 1)
        times.append(elapsed)
        summary = report["summary"]
        print(f"run {n + 1}: {elapsed:6.1f} s wall  cases {summary['cases']}  requirements {summary['requirements']}")
    median = statistics.median(times)
    print(f"\ncpus {os.cpu_count()}  median {median:.1f} s  target <= {TARGET_S:.0f} s  "
          f"ratio {median / TARGET_S:.2f} of the budget  -> {'target met' if median <= TARGET_S else 'NOT met'}")
    return 0 if median <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
