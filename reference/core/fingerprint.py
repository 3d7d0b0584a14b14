"""The §4.4 request fingerprint: canonical preimage and sha256 (E-03, E-04, E-19).

preimage = envelope_version 0x00 destination_kind 0x00 destination_ref 0x00 reply_to_id_or_empty 0x00
           priority 0x00 meta_canonical_json 0x00 body_hash
where meta_canonical_json is RFC 8785 (empty string for absent, null or {} meta) and body_hash is the lowercase hex
sha256 of the body's UTF-8 bytes. Every field is UTF-8; the fingerprint is sha256(preimage).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from spec import schema

#: the one envelope version of v0.9.0: the ``const`` of spec/schemas/broker/send.json
ENVELOPE_VERSION: str = schema("broker/send")["properties"]["envelope_version"]["const"]
SEPARATOR = b"\x00"


class MetaError(ValueError):
    """``meta`` cannot be canonicalised with RFC 8785."""


@dataclass(frozen=True)
class FingerprintInput:
    """Exactly the fields that enter the fingerprint, already defaulted and resolved."""

    destination_kind: str
    destination_ref: str
    reply_to_id: str
    priority: str
    meta: Mapping[str, Any] | None
    body: str
    envelope_version: str = ENVELOPE_VERSION


def meta_canonical(meta: Mapping[str, Any] | None) -> bytes:
    """RFC 8785 text of ``meta``; empty for ``None`` and ``{}`` (E-04)."""
    # req: FP-EMPTY-META
    if not meta:
        return b""
    try:
        # req: FP-JCS
        return rfc8785.dumps(meta)
    except (rfc8785.CanonicalizationError, rfc8785.IntegerDomainError, rfc8785.FloatDomainError,
            UnicodeEncodeError) as exc:  # a lone surrogate in a key fails while rfc8785 sorts by UTF-16
        raise MetaError(str(exc)) from exc


def body_hash(body: str) -> str:
    """Lowercase hex sha256 of the body's UTF-8 bytes."""
    try:
        # req: FP-BODY-HASH-HEX
        return hashlib.sha256(body.encode("utf-8")).hexdigest()
    except UnicodeEncodeError as exc:
        raise MetaError(f"message is not valid Unicode text: {exc}") from exc


def canonical_preimage(item: FingerprintInput) -> bytes:
    """The exact bytes hashed by the fingerprint."""
    # req: FP-CANONICAL-FORM -- seven fields in §4.4 order, joined by single 0x00 bytes
    parts = [
        item.envelope_version.encode("utf-8"),
        item.destination_kind.encode("utf-8"),
        item.destination_ref.encode("utf-8"),
        item.reply_to_id.encode("utf-8"),
        item.priority.encode("utf-8"),
        meta_canonical(item.meta),
        body_hash(item.body).encode("ascii"),
    ]
    return SEPARATOR.join(parts)


def request_fingerprint(item: FingerprintInput) -> bytes:
    """sha256 of the canonical preimage: 32 raw bytes."""
    return hashlib.sha256(canonical_preimage(item)).digest()


def fingerprint_prefix(fingerprint: bytes) -> str:
    """The first 8 bytes as 16 lowercase hex characters, as every 409 carries it."""
    # req: FP-PREFIX-409-WHICH -- 8 bytes as 16 lowercase hex characters
    return fingerprint[:8].hex()
