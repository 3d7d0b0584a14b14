"""The sans-IO core a spec tool is handed: the spec never imports an implementation.

Three tools run the spec against a core: ``check`` (the outbox table names only effects the core knows, and the
vectors), ``vectors`` (each vector's ``expected`` against the core's answer) and ``model`` (every decision of the
model is the core's). Each takes the core as an argument; ``meshd spec`` hands them ``reference.core``, whose
module-level names satisfy ``Core``, and tests hand the same or a deliberately broken one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from spec.decision import DecisionTable

__all__ = ["Core"]


class Core(Protocol):
    """The names the spec tools call, as ``reference.core`` spells them."""

    KNOWN_EFFECTS: frozenset[str]  # every outbox effect the core applies to a row or hands its caller
    RequestError: type[Exception]  # carries ``code``, the error to answer with
    DestinationError: type[Exception]
    MaxAgeError: type[Exception]  # carries ``code``
    OutboxEvent: Callable[..., Any]
    OutboxPolicy: Callable[..., Any]
    OutboxRow: Callable[..., Any]

    # vectors: fingerprint, destination, max_age, features
    def parse_send(self, raw: bytes, idempotency_key: str | None = None) -> Any: ...
    def meta_canonical(self, meta: Mapping[str, Any] | None) -> bytes: ...
    def body_hash(self, body: str) -> str: ...
    def canonical_preimage(self, item: Any) -> bytes: ...
    def parse_destination(self, to: str) -> Any: ...
    def derive(self, mode: str, retention_days: int | None = None, config_default_hours: int | None = None,
               override_hours: int | None = None) -> Any: ...
    def negotiate(self, response: Mapping[str, Any], require: Sequence[str], optional: Sequence[str] = ()) -> Any: ...

    # model: the §4.5.1 decision, the outbox transitions, the broker's accept
    def decide_send(self, existing: Any, fingerprint: bytes, client_message_id: str,
                    decisions: DecisionTable | None = None) -> Any: ...
    def new_row(self, outbox_id: str, client_message_id: str, fingerprint: bytes, payload: bytes, now: int,
                policy: Any) -> Any: ...
    def accepted(self, row: Any, decisions: DecisionTable | None = None) -> Any: ...
    def apply(self, row: Any, event: Any, policy: Any, decisions: DecisionTable | None = None) -> Any: ...
    def settle(self, decisions: DecisionTable | None = None, **known: str) -> Any: ...

    # hook model: the hook-run table and the id of a hook's reply
    HookRun: Callable[..., Any]
    HookRunError: type[Exception]
    def hook_enqueue(self, message: str, hook: str, decisions: DecisionTable | None = None) -> Any: ...
    def hook_apply(self, run: Any, event: str, max_claims: int, decisions: DecisionTable | None = None) -> Any: ...
    def reply_client_message_id(self, message: str, hook: str) -> str: ...
