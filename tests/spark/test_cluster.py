"""The checks on a real Spark standalone cluster, and the driver-address rules that make a cluster run deliberate.

The cluster test starts a master and two one-core workers from the pyspark install, everything on 127.0.0.1, then
runs the README's tested cluster commands word for word (its master port and a temporary ``/shared`` substituted):
``meshtrace check --master spark://…`` and ``spark-submit spark_checks/spark.py``. Both reports must equal local
mode's, and name exactly the violations the generator injected, as the oracle does. All processes run in their own
process groups, which are killed on the way out and must be empty afterwards; a sampler records every listening
socket of those groups while they run, and each must be on loopback. Executors get a ``PYSPARK_PYTHON`` that does not
exist: the checks must never start Python on them.

The cheap tests need no JVM: the driver-address decisions of ``spark_checks.session``, the exit 2 for a master on
another machine with no driver host, and the README's lines for starting the cluster against this file's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_checks.catalogue import INJECTIONS

REPO = Path(__file__).resolve().parents[2]
README = REPO / "spark_checks" / "README.md"
BIN = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"
DOCUMENTED_MASTER = "spark://127.0.0.1:7077"
DOCUMENTED_SHARED = "/shared"
CLUSTER_START_S = 120
COMMAND_S = 300
SPARK_HOME_LINE = "export SPARK_HOME=\"$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')\""


# --- the README's cluster section --------------------------------------------------------------------------------

def readme_block(marker: str) -> list[str]:
    """The commands of the README code block whose first line is a comment naming ``marker``: continuation lines
    joined, comments and blank lines dropped."""
    blocks = re.findall(r"^```\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    block = next(b for b in blocks if marker in re.match(r"(#.*\n)*", b)[0])
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def daemon_commands(port: int, ui_ports: tuple[int, int, int], work: str) -> list[list[str]]:
    """How a standalone master and two one-core workers start from the pyspark install, on 127.0.0.1."""
    spark_class = '"$SPARK_HOME/bin/spark-class"'
    master = [spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
              "--webui-port", str(ui_ports[0])]
    workers = [[spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://{LOOPBACK}:{port}", "--host",
                LOOPBACK, "--cores", "1", "--memory", "1g", "--webui-port", str(ui_ports[n]), "--work-dir",
                f"{work}/work/{n}"] for n in (1, 2)]
    return [master, *workers]


def test_the_readme_starts_the_cluster_as_this_test_does():
    lines = readme_block("start a standalone cluster")
    assert lines[0] == SPARK_HOME_LINE
    assert lines[1:] == [f"SPARK_LOCAL_IP={LOOPBACK} " + " ".join(argv) + " &"
                         for argv in daemon_commands(7077, (8080, 8081, 8082), DOCUMENTED_SHARED)]


# --- driver addresses, no JVM ------------------------------------------------------------------------------------

LOOPBACK_DRIVER = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK, "spark.ui.enabled": "false"}


@pytest.mark.parametrize("master, configured, host, bind, settings", [
    ("local[2]", {}, None, None, LOOPBACK_DRIVER),
    ("spark://127.0.0.1:7077", {}, None, None, LOOPBACK_DRIVER),
    ("spark://localhost:7077", {}, None, None, LOOPBACK_DRIVER),
    ("spark://127.0.0.1:7077,localhost:7078", {}, None, None, LOOPBACK_DRIVER),
    ("spark://[::1]:7077", {}, None, None, LOOPBACK_DRIVER),
    ("spark://127.0.0.1:7077", {"spark.driver.bindAddress": "127.0.0.2"}, None, None,
     {**LOOPBACK_DRIVER, "spark.driver.bindAddress": "127.0.0.2"}),
    ("spark://127.0.0.1:7077", {"spark.driver.host": LOOPBACK}, None, None,
     {"spark.driver.host": LOOPBACK, "spark.ui.enabled": "false"}),
    ("spark://spark-master:7077", {}, "10.0.0.12", None, {"spark.driver.host": "10.0.0.12"}),
    ("spark://spark-master:7077", {}, "10.0.0.12", LOOPBACK,
     {"spark.driver.host": "10.0.0.12", "spark.driver.bindAddress": LOOPBACK, "spark.ui.enabled": "false"}),
    ("spark://spark-master:7077", {}, "203.0.113.7", "10.0.0.12",
     {"spark.driver.host": "203.0.113.7", "spark.driver.bindAddress": "10.0.0.12"}),
    ("spark://spark-master:7077", {"spark.driver.host": "10.0.0.12"}, None, None, {"spark.driver.host": "10.0.0.12"}),
    ("yarn", {"spark.driver.host": "10.0.0.12"}, "10.0.0.13", None, {"spark.driver.host": "10.0.0.13"}),
    ("yarn", {"spark.submit.deployMode": "cluster"}, None, None, {}),
])
def test_driver_settings(master, configured, host, bind, settings):
    from spark_checks.session import driver_settings

    assert driver_settings(master, configured, host, bind) == settings


@pytest.mark.parametrize("master", ["spark://spark-master:7077", "spark://127.0.0.1:7077,10.0.0.5:7077", "yarn",
                                    "k8s://https://127.0.0.1:6443"])
def test_a_master_with_executors_elsewhere_needs_a_driver_host(master):
    from spark_checks.session import DriverUnreachable, driver_settings

    with pytest.raises(DriverUnreachable, match=f"^the executors of {re.escape(master)} connect back to this driver"):
        driver_settings(master, {"spark.submit.deployMode": "client"})


def test_spark_defaults_is_read_as_a_java_properties_file(tmp_path: Path, monkeypatch):
    pytest.importorskip("pyspark")
    from spark_checks.session import spark_defaults

    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\n! another\n\nspark.master   spark://spark-master:7077\nspark.driver.host=10.0.0.12\n"
        "spark.driver.bindAddress : 0.0.0.0\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert spark_defaults() == {"spark.master": "spark://spark-master:7077", "spark.driver.host": "10.0.0.12",
                                "spark.driver.bindAddress": "0.0.0.0"}


@pytest.mark.parametrize("command", [["meshtrace", "check"], ["python", "-m", "spark_checks.spark"]])
def test_a_remote_master_without_a_driver_host_exits_2_before_starting_spark(tmp_path: Path, command: list[str]):
    pytest.importorskip("pyspark")
    from trace_testkit import make_trace

    trace, _ = make_trace(tmp_path, "t", seed=5, events=500, daemons=2)
    env = {**os.environ, "SPARK_CONF_DIR": str(tmp_path)}  # no spark-defaults.conf
    started = time.monotonic()
    done = subprocess.run([str(BIN / command[0]), *command[1:], str(trace), "--master", "spark://192.0.2.1:7077"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "the executors of spark://192.0.2.1:7077 connect back to this driver, and no address for it is set: " \
           "give the address they reach this machine at with --driver-host HOST (spark.driver.host)" in done.stderr
    assert time.monotonic() - started < 60, "no JVM waited for an unreachable master"


# --- the standalone cluster ------------------------------------------------------------------------------------

def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    with contextlib.ExitStack() as stack:
        for sock in sockets:
            stack.enter_context(sock)
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def group_pids(groups: set[int]) -> set[int]:
    """The live processes of the process groups (not zombies: they hold nothing but a pid)."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) in groups and state != "Z":
                pids.add(int(stat.parent.name))
    return pids


def listening(pids: set[int]) -> set[tuple[int, str]]:
    """(pid, address:port) of every TCP socket the processes listen on (/proc/net/tcp and tcp6)."""
    owner: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        owner[target[8:-1]] = pid
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in owner:  # 0A: LISTEN
                continue
            raw, port = cols[1].split(":")
            packed = bytes.fromhex(raw)
            address = ipaddress.ip_address(b"".join(packed[i:i + 4][::-1] for i in range(0, len(packed), 4)))
            found.add((owner[cols[9]], f"{address}:{int(port, 16)}"))
    return found


def is_loopback_socket(address: str) -> bool:
    host = ipaddress.ip_address(address.rsplit(":", 1)[0])
    return (getattr(host, "ipv4_mapped", None) or host).is_loopback


class Processes:
    """Process groups this test started; a sampler records every socket they listen on until `stop`."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.groups: set[int] = set()
        self.started: list[subprocess.Popen] = []
        self.phases: list[tuple[str, float]] = []
        self.sockets: set[tuple[int, str]] = set()
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._done.wait(0.5):
            self.sockets |= listening(group_pids(set(self.groups)))

    def start(self, name: str, command: str, env: dict[str, str]) -> subprocess.Popen:
        process = subprocess.Popen(["bash", "-c", f"exec {command}"], env=env, start_new_session=True,
                                   stdout=(self.logs / f"{name}.log").open("w"), stderr=subprocess.STDOUT)
        self.groups.add(process.pid)
        self.started.append(process)
        return process

    def run(self, name: str, command: str, env: dict[str, str], cwd: Path) -> int:
        process = subprocess.Popen(["bash", "-c", command], env=env, start_new_session=True, cwd=cwd,
                                   stdout=(self.logs / f"{name}.log").open("w"), stderr=subprocess.STDOUT)
        self.groups.add(process.pid)
        started = time.monotonic()
        try:
            return process.wait(timeout=COMMAND_S)
        finally:
            self._kill(process.pid)
            self.phases.append((name, time.monotonic() - started))

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()[-3000:]

    def _kill(self, group: int) -> None:
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
            deadline = time.monotonic() + grace
            while group_pids({group}) and time.monotonic() < deadline:
                time.sleep(0.2)

    def stop(self) -> None:
        self._done.set()
        self._sampler.join()
        for group in self.groups:
            self._kill(group)
        for process in self.started:
            process.wait(timeout=5)

    def leftovers(self) -> set[int]:
        return group_pids(self.groups)


def master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{ui_port}/json/", timeout=2) as answer:
        return json.load(answer)


@contextlib.contextmanager
def standalone_cluster(root: Path, processes: Processes) -> Iterator[tuple[str, int]]:
    """A master and two workers on 127.0.0.1, started as the README says; yields (master URL, master UI port)."""
    from pyspark.find_spark_home import _find_spark_home

    port, *ui_ports = free_ports(4)
    env = {**os.environ, "SPARK_HOME": _find_spark_home(), "SPARK_LOCAL_IP": LOOPBACK,
           "SPARK_CONF_DIR": str(root / "conf"), "SPARK_LOCAL_DIRS": str(root / "scratch")}
    master, *workers = daemon_commands(port, (ui_ports[0], ui_ports[1], ui_ports[2]), str(root))
    master_process = processes.start("master", " ".join(master), env)
    for n, argv in enumerate(workers, start=1):
        processes.start(f"worker-{n}", " ".join(argv), env)
    started = time.monotonic()
    deadline = started + CLUSTER_START_S
    alive = 0
    while alive < 2:
        assert time.monotonic() < deadline, f"no cluster after {CLUSTER_START_S} s:\n{processes.log('master')}"
        assert master_process.poll() is None, processes.log("master")
        time.sleep(1)
        with contextlib.suppress(OSError, ValueError):
            alive = sum(w["state"] == "ALIVE" for w in master_state(ui_ports[0])["workers"])
    processes.phases.append(("cluster start", time.monotonic() - started))
    yield f"spark://{LOOPBACK}:{port}", ui_ports[0]


def comparable(document: dict) -> dict:
    """What a report says about the trace, not about the run that made it."""
    return {key: document[key] for key in ("events", "sources", "invalid", "invariants", "violations")}


def identities(document: dict) -> list[tuple]:
    return [(v["invariant"], v["key"], v["event"], v["related"]) for v in document["violations"]]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_standalone_cluster_reports_what_local_mode_and_the_oracle_report(tmp_path: Path):
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    started = time.monotonic()
    shared = tmp_path / "shared"
    logs = tmp_path / "logs"
    for directory in (shared, logs, tmp_path / "conf", tmp_path / "scratch"):
        directory.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SPARK_", "PYSPARK_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", SPARK_CONF_DIR=str(tmp_path / "conf"),
               PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON=str(tmp_path / "no-python-on-executors"))
    generate, check, submit = readme_block("tests/spark/test_cluster.py runs")
    assert [shlex.split(line)[:2] for line in (generate, check)] == [["meshtrace", "generate"], ["meshtrace", "check"]]
    assert submit.startswith("spark-submit --master spark://127.0.0.1:7077 ")
    trace = shared / "traces" / "t200k"

    processes = Processes(logs)
    try:
        assert processes.run("generate", generate.replace(DOCUMENTED_SHARED, str(shared)), env, tmp_path) == 0
        manifest = json.loads((trace / "manifest.json").read_text())
        assert sorted(i["kind"] for i in manifest["injections"]) == sorted(INJECTIONS)
        injected = sorted((i["invariant"], i["key"]) for i in manifest["injections"])
        for name, engine in (("local", "--master local[2] --driver-memory 2g"), ("oracle", "--engine oracle")):
            command = f"meshtrace check {trace} {engine} --report {tmp_path / name}.json"
            assert processes.run(name, command, env, tmp_path) == 1, processes.log(name)
        local_report = json.loads((tmp_path / "local.json").read_text())
        oracle_report = json.loads((tmp_path / "oracle.json").read_text())

        with standalone_cluster(tmp_path, processes) as (master, ui_port):
            for name, line in (("check", check), ("submit", submit)):
                command = line.replace(DOCUMENTED_MASTER, master).replace(DOCUMENTED_SHARED, str(shared))
                assert processes.run(name, command, env, tmp_path) == 1, processes.log(name)
            apps = master_state(ui_port)["completedapps"]
        stopping = time.monotonic()
        processes.stop()
        processes.phases.append(("teardown", time.monotonic() - stopping))
        assert processes.leftovers() == set(), "every process the test started is gone"

        reports = {name: json.loads((shared / f"t200k-{name}.json").read_text()) for name in ("check", "submit")}
        for name, report in reports.items():
            assert report["engine"] == "spark" and report["settings"]["master"] == master, name
            assert comparable(report) == comparable(local_report), name
        assert sorted((v["invariant"], v["key"]) for v in local_report["violations"]) == injected
        assert identities(local_report) == identities(oracle_report)
        assert [(i["id"], i["violations"]) for i in local_report["invariants"]] == \
               [(i["id"], i["violations"]) for i in oracle_report["invariants"]]
        assert local_report["events"] == oracle_report["events"] == 200_000

        assert sorted(app["cores"] for app in apps) == [2, 2], "each run had one executor on each worker"
        for worker in (1, 2):
            assert sorted(p.name for p in (tmp_path / "work" / str(worker)).iterdir()) == \
                   sorted(app["id"] for app in apps)
        assert processes.sockets, "the sampler saw the cluster listen"
        assert {s for s in processes.sockets if not is_loopback_socket(s[1])} == set()
    finally:
        processes.stop()
    print(f"cluster test: {time.monotonic() - started:.0f} s wall (" + ", ".join(
        f"{name} {seconds:.0f} s" for name, seconds in processes.phases) + f"); {len(processes.sockets)} listening "
        f"sockets seen, all on loopback")
