"""Trace-check benchmark: generate 1M and 10M (with --full also 100M) events, then run ``meshtrace check`` with
Spark, with DuckDB (the single-machine tool a user would otherwise reach for) and with the Python oracle (up to 10M),
each as its own ``meshtrace check`` process, and print events per second, wall time (the whole process: Python,
JVM start, session, check, report), peak memory (the whole process tree: the Spark JVM included) and the targets.

    .venv/bin/python bench/trace_check.py               # 1M and 10M
    .venv/bin/python bench/trace_check.py --full        # 1M, 10M and 100M (the 100M run takes a while)
    .venv/bin/python bench/trace_check.py --sizes 1M --engines spark --breakdown   # where Spark's wall time goes

``--breakdown`` adds, for each Spark check, a process of its own that times a check's steps one by one, twice in the
same process (cold: as ``meshtrace check`` runs them; warm: the JVM's code compiled, what no JIT can take off):
Python and session start-up, a first trivial job, the validating read with the statistics (the pass the catalogue is
planned from, which ``check`` cannot skip: every event is judged against the schema), one aggregation of the events
by a key of their own (the least a shuffled invariant costs), and each family of the catalogue on its own.

Targets (issues #6 and #12, on the 2-core reference machine), each printed as met or missed with its figure:

* ``meshtrace check`` (Spark) on 1M events in at most 20 s wall, start-up included;
* Spark's rate at least 0.5 of DuckDB's at 10M and 0.25 at 100M (a rate is events over the report's check seconds,
  start-up excluded);
* at 100M the check in at most 10 minutes wall with peak memory at most 12 GB, and the generator in at most
  10 minutes.

The load average is printed with every row: on a shared machine a figure is a lower bound. Needs the ``spark`` and
``bench`` extras (pyspark, pyarrow, duckdb, psutil) and Java 17.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MINUTES_10 = 600
TARGET_MEMORY = 12 * 1024**3
#: (events, wall seconds of ``meshtrace check`` with Spark, start-up included)
TARGET_WALL = (1_000_000, 20.0)
#: events -> the least Spark rate / DuckDB rate
TARGET_RATIO = {10_000_000: 0.5, 100_000_000: 0.25}
CHECK_ENGINES = ("spark", "duckdb", "oracle")


def _count(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[text[-1]]) if text[-1] in "kmg" else int(text)


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n:,}"


def _load() -> float:
    return os.getloadavg()[0]


class TreeMemory:
    """Samples the summed RSS of a process and all its descendants; ``peak`` is the largest sum seen."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil

        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                for process in [self.process, *self.process.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += process.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measured(argv: list[str], report: Path | None = None) -> dict[str, Any]:
    """Run ``argv`` while sampling its memory. Its result is ``report`` (a ``meshtrace check --report`` file) or the
    last line the child prints (JSON), plus its wall time, peak memory and the load average before and after."""
    load = _load()
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    with TreeMemory(process.pid) as memory:
        out, err = process.communicate()
    wall = time.monotonic() - started
    if process.returncode not in (0, 1):  # 1: violations found; 2: invalid input or usage
        raise RuntimeError(f"{argv} exited with {process.returncode}:\n{err[-2000:]}")
    if report is None:
        result = json.loads(out.strip().splitlines()[-1])
    else:
        document = json.loads(report.read_text())
        result = {"engine": document["engine"], "events": document["events"], "seconds": document["seconds"],
                  "violations": sum(inv["violations"] for inv in document["invariants"]),
                  "invalid": document["invalid"]["count"]}
        if "timings" in document["settings"]:
            result["timings"] = document["settings"]["timings"]
    result.update(peak_rss=memory.peak, wall=wall, load=(round(load, 2), round(_load(), 2)))
    return result


def child_generate(path: Path, events: int, daemons: int, seed: int) -> None:
    from spark_checks.generate import Params, generate

    manifest = generate(path, Params(events=events, daemons=daemons, seed=seed))
    print(json.dumps({"engine": "generator", "events": manifest["events"], "seconds": manifest["seconds"]}))


def child_breakdown(path: Path, driver_memory: str) -> None:
    """Print (JSON) the seconds of a Spark check's steps, each run and timed on its own, cold then warm."""
    started = time.monotonic()
    from pyspark.sql import functions as F

    from spark_checks.inputs import estimated_events
    from spark_checks.session import build_session
    from spark_checks.spark import SparkChecker

    spark = build_session("local[*]", driver_memory=driver_memory, expected_events=estimated_events([str(path)]))
    result: dict[str, Any] = {"engine": "spark-steps", "seconds": 0.0,
                              "start-up": round(time.monotonic() - started, 3)}
    begun = time.monotonic()
    spark.range(1).count()
    result["first job"] = round(time.monotonic() - begun, 3)
    for name in ("cold", "warm"):
        steps: dict[str, float] = {}
        begun = time.monotonic()
        checker = SparkChecker(spark)
        ev = checker.read([str(path)])
        stats = checker._stats(ev)
        steps["validating read and statistics"] = time.monotonic() - begun
        begun = time.monotonic()
        ev.groupBy("client_message_id").agg(F.max("seq").alias("s")).filter(F.col("s") < 0).collect()
        steps["one aggregation"] = time.monotonic() - begun
        begun = time.monotonic()
        families = checker.families(checker.indexed(ev, stats), stats)
        steps["planning the families"] = time.monotonic() - begun
        for family, candidates in families.items():
            begun = time.monotonic()
            candidates.groupBy("invariant").count().collect()
            steps[family] = time.monotonic() - begun
        result[name] = {step: round(seconds, 3) for step, seconds in steps.items()}
        result["events"] = stats["events"]
    print(json.dumps(result))


def check_argv(engine: str, trace: Path, report: Path, driver_memory: str) -> list[str]:
    """The ``meshtrace check`` command a user runs, as its own process."""
    argv = [sys.executable, "-m", "spark_checks.cli", "check", str(trace), "--engine", engine, "--report", str(report)]
    return argv + (["--driver-memory", driver_memory] if engine == "spark" else [])


# --- the bench --------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run 100M events (long)")
    parser.add_argument("--sizes", default=None, help="comma-separated event counts (default 1M,10M, or 1M,10M,100M)")
    parser.add_argument("--engines", default=",".join(CHECK_ENGINES))
    parser.add_argument("--oracle-max", type=_count, default=10_000_000, help="largest size the oracle runs on")
    parser.add_argument("--daemons", type=int, default=128)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None, help="keep traces here (default: a temp directory)")
    parser.add_argument("--reuse", action="store_true", help="reuse a trace already in --workdir")
    parser.add_argument("--driver-memory", default="8g", help="heap of the local Spark driver")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time each step of a Spark check on its own, cold and warm (a process of its own)")
    parser.add_argument("--json", type=Path, help="also write the results and targets here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        if args.child[0] == "breakdown":
            child_breakdown(Path(args.child[1]), args.child[2])
        else:
            child_generate(Path(args.child[1]), int(args.child[2]), args.daemons, args.seed)
        return 0
    sizes = [_count(s) for s in (args.sizes or ("1M,10M,100M" if args.full else "1M,10M")).split(",")]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(CHECK_ENGINES)
    if unknown:
        parser.error(f"unknown engines: {', '.join(sorted(unknown))}")
    scratch = None if args.workdir else tempfile.TemporaryDirectory(prefix="meshtrace-bench-")
    workdir = args.workdir or Path(scratch.name)  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve()), "--daemons", str(args.daemons), "--seed", str(args.seed),
          "--child"]
    results: list[dict[str, Any]] = []
    breakdowns: list[dict[str, Any]] = []
    try:
        for size in sizes:
            trace = workdir / f"trace-{_label(size)}"
            if not (args.reuse and (trace / "manifest.json").exists()):
                if trace.exists():
                    import shutil

                    shutil.rmtree(trace)
                print(f"generating {_label(size)} events …", flush=True)
                results.append({"size": size, **measured([*me, "generate", str(trace), str(size)])})
                _row(results[-1])
            for engine in engines:
                if engine == "oracle" and size > args.oracle_max:
                    continue
                print(f"checking {_label(size)} events with {engine} …", flush=True)
                report = workdir / f"report-{_label(size)}-{engine}.json"
                results.append({"size": size, **measured(check_argv(engine, trace, report, args.driver_memory),
                                                         report)})
                _row(results[-1])
                if engine == "spark" and args.breakdown:
                    print(f"timing the steps of a Spark check of {_label(size)} events one by one …", flush=True)
                    breakdowns.append({"size": size, **measured([*me, "breakdown", str(trace), args.driver_memory])})
                    _steps(breakdowns[-1])
    finally:
        if scratch is not None:
            scratch.cleanup()
    targets = _summary(results)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "targets": targets, "breakdowns": breakdowns},
                                        indent=2) + "\n")
    return 0


def _rate(result: dict[str, Any]) -> float:
    return result["events"] / result["seconds"] if result["seconds"] else 0.0


def _row(result: dict[str, Any]) -> None:
    timings = f"  steps {result['timings']}" if "timings" in result else ""
    print(f"  {result['engine']:<9} {result['events']:>13,} events  {result['seconds']:8.1f} s  "
          f"{_rate(result):>12,.0f} ev/s  wall {result['wall']:7.1f} s  peak {result['peak_rss'] / 1024**3:5.2f} GB  "
          f"load {result['load'][0]:.1f}→{result['load'][1]:.1f}{timings}", flush=True)


def _steps(breakdown: dict[str, Any]) -> None:
    """Print ``--breakdown``'s steps, cold and warm side by side."""
    print(f"  start-up (Python, JVM, session) {breakdown['start-up']:6.1f} s   "
          f"first job {breakdown['first job']:5.1f} s")
    print(f"  {'step':<34} {'cold s':>7} {'warm s':>7}")
    for step, cold in breakdown["cold"].items():
        print(f"  {step:<34} {cold:7.2f} {breakdown['warm'][step]:7.2f}")
    cold, warm = sum(breakdown["cold"].values()), sum(breakdown["warm"].values())
    print(f"  {'sum':<34} {cold:7.2f} {warm:7.2f}   (whole process {breakdown['wall']:.1f} s wall, "
          f"load {breakdown['load'][0]:.1f}→{breakdown['load'][1]:.1f})", flush=True)


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target the results can judge: what it asks, the figure measured and whether it is met."""
    rows = {(r["size"], r["engine"]): r for r in results}
    found: list[dict[str, Any]] = []

    def judge(target: str, figure: str, met: bool) -> None:
        found.append({"target": target, "figure": figure, "met": met})

    size, seconds = TARGET_WALL
    if (spark := rows.get((size, "spark"))) is not None:
        judge(f"{_label(size)}: meshtrace check (Spark) ≤ {seconds:.0f} s wall, start-up included",
              f"{spark['wall']:.1f} s", spark["wall"] <= seconds)
    for size, least in TARGET_RATIO.items():
        spark, duck = rows.get((size, "spark")), rows.get((size, "duckdb"))
        if spark is not None and duck is not None:
            ratio = _rate(spark) / _rate(duck)
            judge(f"{_label(size)}: Spark's rate ≥ {least} of DuckDB's",
                  f"{ratio:.2f} ({_rate(spark):,.0f} / {_rate(duck):,.0f} events/s)", ratio >= least)
    if (spark := rows.get((100_000_000, "spark"))) is not None:
        judge("100M: Spark check ≤ 10 min wall", f"{spark['wall']:.0f} s", spark["wall"] <= MINUTES_10)
        judge("100M: Spark peak memory ≤ 12 GB", f"{spark['peak_rss'] / 1024**3:.2f} GB",
              spark["peak_rss"] <= TARGET_MEMORY)
    if (generator := rows.get((100_000_000, "generator"))) is not None:
        judge("100M: generator ≤ 10 min wall", f"{generator['wall']:.0f} s", generator["wall"] <= MINUTES_10)
    return found


def _summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    print(f"\nload average at the end: {_load():.2f} on {os.cpu_count()} cores")
    print("size   engine     events/s   check s    wall s   peak GB   Spark rate / this rate")
    for size in sorted({r["size"] for r in results}):
        rows = {r["engine"]: r for r in results if r["size"] == size}
        spark = rows.get("spark")
        for engine, r in rows.items():
            ratio = f"{_rate(spark) / _rate(r):.2f}" if spark is not None and engine in ("duckdb", "oracle") else ""
            print(f"{_label(size):<6} {engine:<10} {_rate(r):>9,.0f} {r['seconds']:>9.1f} {r['wall']:>9.1f} "
                  f"{r['peak_rss'] / 1024**3:>9.2f}   {ratio}")
    judged = targets(results)
    if judged:
        print("\ntargets")
    for t in judged:
        print(f"  {t['target']}: {t['figure']} -- {'met' if t['met'] else 'NOT MET'}")
    return judged


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
