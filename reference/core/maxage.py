"""Outbox max-age arithmetic (§4.9 with E-05), parameters from spec/tables/max_age.yaml.

``derive`` turns the negotiated dedupe mode into ``max_age_hours``; ``max_age_at`` and ``capped_max_age_at`` turn hours
into a row's deadline. A row is expired once ``now`` is past its ``max_age_at`` (``reference.core.outbox.is_expired``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from spec import load_table

HOUR_MS = 3_600_000


class MaxAgeError(ValueError):
    """The configuration cannot start: ``code`` is ``outbox_max_age_above_dedupe_window`` or ``invalid_config``."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class MaxAge:
    """The derived limit and how it was reached."""

    hours: int
    mode: str
    window_hours: int | None
    source: str  # derived | override | config_default


def _params() -> dict[str, Any]:
    return load_table("max_age")


def margin_hours(retention_days: int) -> int:
    p = _params()
    return max(p["margin_min_hours"], math.ceil(retention_days * 24 * p["margin_fraction"]))


def derive(mode: str, retention_days: int | None = None, config_default_hours: int | None = None,
           override_hours: int | None = None) -> MaxAge:
    """Derive ``max_age_hours`` for a negotiated dedupe ``mode`` (E-05).

    Raises:
        MaxAgeError: the override is outside its allowed range, or the inputs are not a valid negotiation.
    """
    p = _params()
    if mode == "permanent":
        cap = p["permanent_cap_hours"]
        if override_hours is not None:
            _check_override(override_hours, cap, "the permanent-mode cap")
            return MaxAge(override_hours, mode, None, "override")
        default = p["permanent_default_hours"] if config_default_hours is None else config_default_hours
        if default < p["override_min_hours"]:
            raise MaxAgeError(p["errors"]["below_minimum"], f"max_age_hours {default} is below 1")
        # req: MAXAGE-DERIVATION -- permanent mode: the configured default, capped
        return MaxAge(min(default, cap), mode, None, "config_default")
    if mode != "retention_scoped":
        raise MaxAgeError(p["errors"]["below_minimum"], f"unknown dedupe mode {mode!r}")
    if retention_days is None or retention_days < p["min_retention_days"]:
        raise MaxAgeError(p["errors"]["below_minimum"],
                          f"dedupe_retention_days {retention_days} is below {p['min_retention_days']}")
    window = retention_days * 24
    # req: MAXAGE-INSIDE-WINDOW -- at most W − 1 hours, whatever the formula gives
    ceiling = window - p["window_gap_hours"]
    if override_hours is not None:
        _check_override(override_hours, ceiling, f"the dedupe window ({window} h) minus {p['window_gap_hours']} h")
        return MaxAge(override_hours, mode, window, "override")
    # req: MAXAGE-DERIVATION
    hours = min(max(p["floor_hours"], window - margin_hours(retention_days)), ceiling)
    return MaxAge(hours, mode, window, "derived")


def _check_override(hours: int, ceiling: int, what: str) -> None:
    p = _params()
    if hours < p["override_min_hours"]:
        raise MaxAgeError(p["errors"]["below_minimum"], f"max_age_hours_override {hours} is below 1")
    # req: MAXAGE-OVERRIDE
    if hours > ceiling:
        raise MaxAgeError(p["errors"]["above_window"],
                          f"max_age_hours_override {hours} exceeds {ceiling} ({what})")


def max_age_at(enqueued_at: int, max_age_hours: int) -> int:
    """The ``max_age_at`` (unix ms) of a row enqueued at ``enqueued_at`` under ``max_age_hours``."""
    return enqueued_at + max_age_hours * HOUR_MS


def capped_max_age_at(enqueued_at: int, current: int | None, max_age_hours: int) -> int | None:
    """A live row's new ``max_age_at`` once a negotiated ``max_age_hours`` is adopted (§4.9), ``None`` to keep it.

    The deadline is lowered to ``max_age_at(enqueued_at, max_age_hours)`` when that is earlier (or the row had none),
    never raised: a shorter dedupe window makes rows expire sooner, a longer one never extends a promise already made.
    """
    capped = max_age_at(enqueued_at, max_age_hours)
    return capped if current is None or current > capped else None
