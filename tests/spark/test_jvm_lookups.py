"""The driver's py4j view keeps the classes it found and their static methods (``session.cache_jvm_lookups``): a
Column built twice costs one round trip to the JVM the second time, and what can change is still asked for."""

from __future__ import annotations

from typing import Any

import pytest

from spark_checks.session import build_session, cache_jvm_lookups


def _round_trips(spark: Any, monkeypatch: pytest.MonkeyPatch, build) -> int:
    client = spark.sparkContext._gateway._gateway_client
    sent = client.send_command
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return sent(*args, **kwargs)

    monkeypatch.setattr(client, "send_command", counted)
    try:
        build()
    finally:
        monkeypatch.undo()
    return count[0]


@pytest.mark.spark
def test_a_function_is_looked_up_once_then_only_called(spark, monkeypatch: pytest.MonkeyPatch):
    from pyspark.sql import functions as F

    F.col("warm")  # the class and the method are found (kept from here on)
    assert _round_trips(spark, monkeypatch, lambda: F.col("a")) == 1
    assert _round_trips(spark, monkeypatch, lambda: F.lit(5)) <= 2  # lit is found once, then called
    assert _round_trips(spark, monkeypatch, lambda: F.lit(6)) == 1
    # the columns are right: the kept lookups call the same methods
    row = spark.range(1).select(F.lit(6).alias("six"), (F.col("id") + 1).alias("one")).collect()[0]
    assert (row["six"], row["one"]) == (6, 1)


@pytest.mark.spark
def test_fields_packages_and_unknown_names_are_asked_each_time(spark, monkeypatch: pytest.MonkeyPatch):
    from py4j.java_gateway import JavaPackage

    jvm = spark.sparkContext._jvm
    integer = getattr(jvm, "java.lang.Integer")
    assert integer.MAX_VALUE == 2**31 - 1
    assert "MAX_VALUE" not in vars(integer)  # a field's value may change: never kept
    assert _round_trips(spark, monkeypatch, lambda: integer.MAX_VALUE) == 1
    assert integer.valueOf(7) == 7
    assert _round_trips(spark, monkeypatch, lambda: integer.valueOf) == 0  # a static method is kept
    # a name that is no class is a package to py4j, and a package is asked again: a class may be loaded later
    assert _round_trips(spark, monkeypatch, lambda: getattr(jvm, "no.such.Klass")) == 1
    assert _round_trips(spark, monkeypatch, lambda: getattr(jvm, "no.such.Klass")) == 1
    assert "no.such.Klass" not in vars(jvm) and "java" not in vars(jvm)
    assert type(getattr(jvm, "no.such.Klass")) is JavaPackage


@pytest.mark.spark
def test_a_session_built_again_keeps_the_same_view(spark):
    jvm = spark.sparkContext._jvm
    kind = type(jvm)
    assert kind.__name__ == "KeptView"
    again = build_session("local[2]", app_name="meshtrace-tests")
    assert again.sparkContext._jvm is jvm and type(jvm) is kind
    cache_jvm_lookups(jvm)  # a second call changes nothing
    assert type(jvm) is kind
