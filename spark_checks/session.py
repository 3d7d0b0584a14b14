"""The SparkSession the checks run in: local and loopback-only by default, any master URL unchanged.

A local session (``local``, ``local[N]``, ``local[*]``) binds the driver to 127.0.0.1 -- ``spark.driver.bindAddress``,
``spark.driver.host`` and ``SPARK_LOCAL_IP`` -- so nothing listens on or leaves through another interface, and runs
without the web UI. Its shuffle partition count suits a small machine (adaptive execution coalesces them further).
Any other master (``spark://…``, ``yarn``, ``k8s://…``) keeps the cluster's own settings, but not an accidental driver
address: in client deploy mode the executors connect back to the driver, at ``spark.driver.host``, and the driver
listens on ``spark.driver.bindAddress`` (by default that host) -- left unset, Java picks whichever interface the host
name resolves to. So a standalone master on loopback (``spark://127.0.0.1:…``, ``spark://localhost:…``, every
executor on this machine) gets the driver on 127.0.0.1 and no web UI, as a local session does, and any other master
needs the driver host given -- by the caller, or already set (``spark-defaults.conf``, ``spark-submit --conf``) --
else `DriverUnreachable` says what to set. In cluster deploy mode the cluster manager starts the driver on one of its
machines and sets its address. Under ``spark-submit`` the master and resources come from the command line;
``build_session(None)`` then keeps them and reads the settings spark-submit started the JVM with.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
#: a line of a Java properties file (spark-defaults.conf): a key, then ``=``, ``:`` or blanks, then the value
PROPERTY = re.compile(r"([^\s=:]+)\s*[=:\s]\s*(.*)")

#: SQL settings every session gets (set again on a session that already existed): the semantics the checks are
#: written for.
SQL_CONF: dict[str, str] = {
    "spark.sql.ansi.enabled": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # HotSpot never JIT-compiles a method over 8000 bytes of bytecode (-XX:HugeMethodLimit): a whole-stage method
    # that big (the schema's validity expression) runs interpreted, 2x slower than Spark's split, compiled code
    # without whole-stage codegen for that stage. Spark's documentation of this setting suggests 8000 on HotSpot.
    "spark.sql.codegen.hugeMethodLimit": "8000",
}
#: Launch settings every new session gets.
COMMON_CONF: dict[str, str] = {
    **SQL_CONF, "spark.ui.showConsoleProgress": "false",
    # PySpark otherwise records the Python call site in the JVM around every Column operation (five py4j round trips
    # each, for error messages of ANSI mode, which is off): about a third of a check's driver calls.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

#: Settings for local sessions only.
LOCAL_CONF: dict[str, str] = {
    "spark.driver.bindAddress": LOOPBACK,
    "spark.driver.host": LOOPBACK,
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "64",
    "spark.sql.adaptive.advisoryPartitionSizeInBytes": "64m",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC -Djava.net.preferIPv4Stack=true",
    "spark.local.dir": "",  # filled in from MESHTRACE_SPARK_TMP or the system temp directory
}


#: A local driver checking at most this many events compiles with C1 alone (``-XX:TieredStopAtLevel=1``), with
#: tiered compilation's code cache (C1 alone gets a fifth of it, which a check fills: HotSpot then stops compiling
#: and the rest runs interpreted). Each of a check's stages is new generated code, which tiered compilation compiles
#: again with C2 once it runs hot: on 2 cores a 1M-event check spent 40 CPU-seconds in C2 (-XX:+CITime) and took
#: 44 s wall, 38.5 s with C1 alone in its own code cache and 32 s in tiered compilation's (with shared positions found
#: in the statistics pass too, which alone took 0.5 s off); a 10M-event check took 116 s tiered and 157 s with C1
#: alone, its code running long enough to repay C2. A session kept for many checks (the tests') gains nothing: from
#: its third check on, tiered code is faster.
SMALL_TRACE_EVENTS = 2_000_000
SMALL_TRACE_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def local_settings(driver_memory: str | None = None, expected_events: int | None = None) -> dict[str, str]:
    """The launch settings of a local session (`build_session`'s arguments)."""
    settings = dict(LOCAL_CONF)
    settings["spark.local.dir"] = os.environ.get("MESHTRACE_SPARK_TMP") or os.environ.get("TMPDIR") or "/tmp"
    settings["spark.driver.memory"] = driver_memory or os.environ.get("MESHTRACE_DRIVER_MEMORY", "6g")
    if expected_events is not None and expected_events <= SMALL_TRACE_EVENTS:
        settings["spark.driver.extraJavaOptions"] += " " + SMALL_TRACE_JAVA_OPTIONS
    return settings


def is_local(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


class DriverUnreachable(ValueError):
    """A master whose executors run elsewhere, in client deploy mode, and no driver host for them to connect back
    to."""


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def on_loopback(master: str) -> bool:
    """Whether every executor of ``master`` runs on this machine: a standalone master (or each of its standby
    masters) on a loopback address, or ``local-cluster[…]``. Not a Kubernetes API server on loopback: its executors
    are pods."""
    if master.startswith("local-cluster["):
        return True
    if not master.startswith("spark://"):
        return False
    return all(is_loopback(address.rsplit(":", 1)[0]) for address in master[len("spark://"):].split(","))


def driver_settings(master: str, configured: Mapping[str, str], driver_host: str | None = None,
                    bind_address: str | None = None) -> dict[str, str]:
    """The driver address settings for ``master``: 127.0.0.1 when every executor is on this machine, else the
    driver host given or configured; a driver on loopback runs without web UI.

    Args:
        configured: the settings the driver already has (spark-defaults.conf, spark-submit's command line).
        driver_host: the address executors connect back to (``spark.driver.host``); overrides ``configured``.
        bind_address: the address the driver listens on (``spark.driver.bindAddress``; default: the driver host).
    Raises:
        DriverUnreachable: ``master`` runs executors elsewhere, in client deploy mode, and no driver host is known.
    """
    if configured.get("spark.submit.deployMode") == "cluster":
        return {}
    host = driver_host or configured.get("spark.driver.host")
    bind = bind_address or configured.get("spark.driver.bindAddress")
    if (is_local(master) or on_loopback(master)) and host is None:
        host, bind = LOOPBACK, bind or LOOPBACK
    if host is None:
        raise DriverUnreachable(
            f"the executors of {master} connect back to this driver, and no address for it is set: give the address "
            f"they reach this machine at with --driver-host HOST (spark.driver.host) and, if this machine must "
            f"listen on another interface than that, --driver-bind-address ADDRESS (spark.driver.bindAddress); "
            f"behind a firewall also fix and open spark.driver.port and spark.blockManager.port "
            f"(spark-defaults.conf or --conf)")
    settings = {"spark.driver.host": host, **({"spark.driver.bindAddress": bind} if bind else {})}
    if is_loopback(bind or host):  # the web UI would not be: it listens on SPARK_LOCAL_IP, else on every interface
        settings["spark.ui.enabled"] = "false"
    return settings


def spark_defaults() -> dict[str, str]:
    """``spark-defaults.conf`` of ``SPARK_CONF_DIR``, else of the Spark home's ``conf/`` (what a JVM the driver
    launches will read)."""
    from pyspark.find_spark_home import _find_spark_home

    directory = os.environ.get("SPARK_CONF_DIR") or os.path.join(_find_spark_home(), "conf")
    path = os.path.join(directory, "spark-defaults.conf")
    settings: dict[str, str] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                pair = PROPERTY.match(line.strip())
                if pair and not pair[1].startswith(("#", "!")):
                    settings[pair[1]] = pair[2].strip()
    return settings


def launch_settings() -> dict[str, str]:
    """The settings the driver JVM started with: under spark-submit (``PYSPARK_GATEWAY_PORT``) or once a JVM is up,
    its own (spark-submit's command line over spark-defaults.conf); else spark-defaults.conf."""
    from pyspark import SparkConf, SparkContext

    if "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._jvm is not None:
        SparkContext._ensure_initialized()
        return dict(SparkConf().getAll())
    return spark_defaults()


def build_session(master: str | None = DEFAULT_MASTER, app_name: str = "meshtrace-check",
                  driver_memory: str | None = None, conf: dict[str, Any] | None = None,
                  driver_host: str | None = None, driver_bind_address: str | None = None,
                  expected_events: int | None = None):
    """Get or create the SparkSession for the checks.

    Args:
        master: a master URL, or None to keep the one ``spark-submit`` (or an existing session) set.
        driver_memory: the heap of a driver this process starts (``MESHTRACE_DRIVER_MEMORY``): default 6g for a
            local session, whose executors live in the driver JVM, and 2g for another master (the catalogue's plan
            alone outgrows Spark's 1g default); spark-submit sets its own (``--driver-memory``).
        conf: extra settings, applied last.
        driver_host, driver_bind_address: where executors reach the driver and where it listens (`driver_settings`).
        expected_events: how many events the session will check, when known (``inputs.estimated_events``): a local
            driver for at most `SMALL_TRACE_EVENTS` compiles with C1 alone.
    Raises:
        DriverUnreachable: from `driver_settings`, before any JVM starts (unless spark-submit started it).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    settings = dict(COMMON_CONF)
    if master is not None:
        builder = builder.master(master)
    if master is not None and is_local(master):
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        settings.update(local_settings(driver_memory, expected_events))
    elif master is not None:
        settings["spark.driver.memory"] = driver_memory or os.environ.get("MESHTRACE_DRIVER_MEMORY", "2g")
    if SparkContext._active_spark_context is None:  # a running context's driver is bound already
        configured = {} if master is not None and is_local(master) else launch_settings()
        target = master or configured.get("spark.master")
        address = driver_settings(target, configured, driver_host, driver_bind_address) if target else {}
        if is_loopback(address.get("spark.driver.bindAddress", address.get("spark.driver.host", ""))):
            os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        settings.update(address)
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("MESHTRACE_SPARK_LOG", "ERROR"))
    if "MESHTRACE_SPARK_LOG" not in os.environ:
        # A generated method over Java's 64 KB is logged at ERROR with its whole source, then run without whole-stage
        # code generation: an expected fallback (the JSONL read), not an error of the check.
        jvm = session._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator", jvm.org.apache.logging.log4j.Level.OFF)
    for key, value in SQL_CONF.items():  # a session that already existed keeps its launch settings, not these
        session.conf.set(key, value)
    cache_jvm_lookups(session.sparkContext._jvm)
    return session


def cache_jvm_lookups(jvm: Any) -> None:
    """Make the driver's py4j view of the JVM (``SparkContext._jvm``) remember the classes it finds and their static
    methods, for this process's life.

    PySpark resolves ``org.apache.spark.sql.functions`` and then the function's name, one py4j round trip each, on
    every ``F.col``, ``F.lit``, ``F.when`` …, before the call itself: two of a check's three driver round trips
    (about 13,000 per check) were lookups whose answer never changes. A class, once found, and a static method of it
    are kept on the view's and the class's objects; a package, a field's value and a name that is not found are
    asked again each time."""
    from py4j.java_gateway import JavaClass, JavaMember, JVMView

    class KeptClass(JavaClass):
        def __getattr__(self, name: str) -> Any:
            found = super().__getattr__(name)
            if isinstance(found, JavaMember | JavaClass):  # a static method or an inner class
                if type(found) is JavaClass:
                    found.__class__ = KeptClass
                self.__dict__[name] = found
            return found

    class KeptView(JVMView):
        def __getattr__(self, name: str) -> Any:
            found = super().__getattr__(name)
            if type(found) is JavaClass:
                found.__class__ = KeptClass
                self.__dict__[name] = found
            return found

    if type(jvm) is JVMView:  # not already kept (a session built again in this process)
        jvm.__class__ = KeptView
