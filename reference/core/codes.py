"""The numbers the spec names: WebSocket close codes and process exit codes.

Rules of this file: code reads a close code (spec/tables/close_codes.yaml, E-07, E-22, E-33, E-40) or an exit code
(spec/tables/exit_codes.yaml, E-15) by its name -- ``close_code("feature_unavailable")``,
``exit_code("state_dir_locked")`` -- and never spells the number. A name the table does not define is a programming
error (KeyError), as with ``limit()``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from spec import load_table

__all__ = ["close_code", "close_codes", "exit_code", "exit_codes"]


def _by_name(table: str) -> dict[str, int]:
    return {entry["name"]: int(entry["code"]) for entry in load_table(table)["codes"]}


@functools.cache
def close_codes() -> Mapping[str, int]:
    """Every close code by name: the application codes and the RFC 6455 ones the table lists."""
    return _by_name("close_codes")


@functools.cache
def exit_codes() -> Mapping[str, int]:
    """Every exit code by name."""
    return _by_name("exit_codes")


def close_code(name: str) -> int:
    """The close code the table names ``name``."""
    return close_codes()[name]


def exit_code(name: str) -> int:
    """The exit code the table names ``name``."""
    return exit_codes()[name]

