"""The ``to`` grammar of POST /v1/send (E-18): every accepted destination maps to exactly one (kind, ref)."""

from __future__ import annotations

import re
from dataclasses import dataclass

TOPIC_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
QUEUE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
PUBKEY_HEX = re.compile(r"[0-9A-Fa-f]{64}")


class DestinationError(ValueError):
    """``to`` does not name a v0.9.0 destination; the message says why."""


@dataclass(frozen=True)
class Destination:
    """A resolved destination: ``kind`` is topic, dm or queue; ``ref`` is what the fingerprint hashes."""

    kind: str
    ref: str


def parse_destination(to: str) -> Destination:
    """Resolve ``to`` to its (kind, ref).

    Raises:
        DestinationError: group (``@x``) and broadcast (``*``) addressing, an unknown prefix, or a bad name.
    """
    # req: DEST-GRAMMAR
    if to.startswith("#"):
        return _topic(to[1:], to)
    prefix, sep, rest = to.partition(":")
    if sep and prefix == "topic":
        return _topic(rest, to)
    if sep and prefix == "dm":
        return _dm(rest, to)
    if sep and prefix == "queue":
        if not QUEUE_ID.fullmatch(rest):
            raise DestinationError(f"queue id {rest!r} does not match {QUEUE_ID.pattern}")
        return Destination("queue", rest)
    if PUBKEY_HEX.fullmatch(to):
        return _dm(to, to)
    # req: DEST-GRAMMAR -- group and broadcast addressing are not v0.9.0 kinds
    if to.startswith("@"):
        raise DestinationError("group addressing (@name) is not a v0.9.0 destination kind")
    if to == "*":
        raise DestinationError("broadcast (*) is not a v0.9.0 destination kind")
    raise DestinationError(f"{to!r} is not #topic, topic:<name>, <64-hex pubkey>, dm:<pubkey> or queue:<id>")


def _topic(name: str, to: str) -> Destination:
    if not TOPIC_NAME.fullmatch(name):
        raise DestinationError(f"topic name in {to!r} does not match {TOPIC_NAME.pattern}")
    return Destination("topic", name)


def _dm(pubkey: str, to: str) -> Destination:
    if not PUBKEY_HEX.fullmatch(pubkey):
        raise DestinationError(f"{to!r} is not a 64-hex ed25519 public key")
    # req: DEST-GRAMMAR -- a pubkey is lower-cased
    return Destination("dm", pubkey.lower())
