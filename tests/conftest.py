"""Suite-wide rule: `slow` tests (soak and scale runs) run only when `-m` selects them.

`make test` deselects them (`-m "not slow"`); `make slow` runs them at full size and `make slow-bounded` (what CI
runs after `make test`) at sizes bounded by the MESHSPEC_SLOW_* variables. A bare `pytest` skips them instead of
soaking for minutes.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    expression = config.option.markexpr or ""
    if "slow" in expression and "not slow" not in expression:
        return
    skip = pytest.mark.skip(reason="a soak or scale run: select it with -m slow (make slow)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
