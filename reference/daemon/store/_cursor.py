"""Opaque paging cursors: URL-safe base64 of a versioned text that only the listing that made it parses back."""

from __future__ import annotations

import base64
import binascii
import re

from reference.core.limits import limit

from ._sqlite import StoreError

MAX_CURSOR_CHARS = int(limit("ipc_cursor_chars"))


class InvalidCursor(StoreError, ValueError):
    """A paging cursor that this store did not produce (or that belongs to another listing)."""


def encode_cursor(text: str) -> str:
    """The opaque cursor for ``text`` (a listing's versioned position, e.g. ``i1:<seq>``)."""
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, pattern: re.Pattern[str]) -> re.Match[str]:
    """The position ``cursor`` names, matched against the listing's ``pattern``.

    Raises:
        InvalidCursor: not base64 of UTF-8 text that ``pattern`` matches (a forged cursor or another listing's).
    """
    # req: LIMIT-TABLE -- a cursor past ipc_cursor_chars is not one this store issued, and is not decoded
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidCursor("invalid cursor")
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8")
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor("invalid cursor") from exc
    match = pattern.fullmatch(text)
    if match is None:
        raise InvalidCursor("invalid cursor")
    return match
