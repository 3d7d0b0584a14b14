"""The SparkSession the checks run in: local and loopback-only by default, any master URL unchanged.

A local session (``local``, ``local[N]``, ``local[*]``) binds the driver to 127.0.0.1 -- ``spark.driver.bindAddress``,
``spark.driver.host`` and ``SPARK_LOCAL_IP`` -- so nothing listens on or leaves through another interface, and runs
without the web UI. Its shuffle partition count suits a small machine (adaptive execution coalesces them further).
Any other master (``spark://…``, ``yarn``, ``k8s://…``) is passed through untouched and the cluster's own settings
apply. Under ``spark-submit`` the master and resources come from the command line; ``build_session(None)`` then keeps
them.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"

#: SQL settings every session gets (set again on a session that already existed): the semantics the checks are
#: written for.
SQL_CONF: dict[str, str] = {
    "spark.sql.ansi.enabled": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
}
#: Launch settings every new session gets.
COMMON_CONF: dict[str, str] = {**SQL_CONF, "spark.ui.showConsoleProgress": "false"}

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


def is_local(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


def build_session(master: str | None = DEFAULT_MASTER, app_name: str = "meshtrace-check",
                  driver_memory: str | None = None, conf: dict[str, Any] | None = None):
    """Get or create the SparkSession for the checks.

    Args:
        master: a master URL, or None to keep the one ``spark-submit`` (or an existing session) set.
        driver_memory: the driver heap for a local session (``MESHTRACE_DRIVER_MEMORY``, default 6g); the executors
            of a local session live in the driver JVM.
        conf: extra settings, applied last.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    settings = dict(COMMON_CONF)
    if master is not None:
        builder = builder.master(master)
    if master is not None and is_local(master):
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        settings.update(LOCAL_CONF)
        settings["spark.local.dir"] = os.environ.get("MESHTRACE_SPARK_TMP") or os.environ.get("TMPDIR") or "/tmp"
        settings["spark.driver.memory"] = driver_memory or os.environ.get("MESHTRACE_DRIVER_MEMORY", "6g")
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("MESHTRACE_SPARK_LOG", "ERROR"))
    for key, value in SQL_CONF.items():  # a session that already existed keeps its launch settings, not these
        session.conf.set(key, value)
    return session
