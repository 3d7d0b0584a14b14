"""A pytest plugin for tests/test_suite_timeouts.py: prints each collected test's timeout marker."""

from __future__ import annotations


def pytest_collection_finish(session) -> None:
    for item in session.items:
        marker = item.get_closest_marker("timeout")
        if marker is not None:
            print(f"TIMEOUT\t{item.nodeid}\t{float(marker.args[0])}")
