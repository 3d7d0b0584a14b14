"""The sans-IO protocol core: pure functions over the tables in ``spec/tables``.

No sqlite, falcon, websocket, clock or random-number imports live here: callers pass ``now`` and jitter in, and
perform the effects the core hands back.
"""

from spec.decision import AmbiguousRow, DecisionTable, NoRow, Row, TableError, UnknownInput

from .ack import AckEvent, ack_event
from .broker_accept import Settled, settle
from .codes import close_code, exit_code
from .destination import Destination, DestinationError, parse_destination
from .features import CloseReason, Negotiation, negotiate
from .fingerprint import (
    ENVELOPE_VERSION,
    FingerprintInput,
    MetaError,
    body_hash,
    canonical_preimage,
    fingerprint_prefix,
    meta_canonical,
    request_fingerprint,
)
from .hooks import HookRun, HookRunError, HookStep, is_hook_reply_id, reply_client_message_id
from .hooks import apply as hook_apply
from .hooks import enqueue as hook_enqueue
from .ipc import IpcDecision, decide_send
from .maxage import MaxAge, MaxAgeError, derive
from .outbox import (
    KNOWN_EFFECTS,
    OutboxEvent,
    OutboxPolicy,
    OutboxRow,
    Transition,
    TransitionError,
    accepted,
    apply,
    backoff_ms,
    is_expired,
    new_row,
)
from .request import RequestError, SendRequest, is_client_message_id, parse_send, validate_send

__all__ = [
    "ENVELOPE_VERSION",
    "KNOWN_EFFECTS",
    "AckEvent",
    "AmbiguousRow",
    "CloseReason",
    "DecisionTable",
    "Destination",
    "DestinationError",
    "FingerprintInput",
    "HookRun",
    "HookRunError",
    "HookStep",
    "IpcDecision",
    "MaxAge",
    "MaxAgeError",
    "MetaError",
    "Negotiation",
    "NoRow",
    "OutboxEvent",
    "OutboxPolicy",
    "OutboxRow",
    "RequestError",
    "Row",
    "SendRequest",
    "Settled",
    "TableError",
    "Transition",
    "TransitionError",
    "UnknownInput",
    "accepted",
    "ack_event",
    "apply",
    "backoff_ms",
    "body_hash",
    "canonical_preimage",
    "close_code",
    "decide_send",
    "derive",
    "exit_code",
    "fingerprint_prefix",
    "hook_apply",
    "hook_enqueue",
    "is_client_message_id",
    "is_expired",
    "is_hook_reply_id",
    "meta_canonical",
    "negotiate",
    "new_row",
    "parse_destination",
    "parse_send",
    "reply_client_message_id",
    "request_fingerprint",
    "settle",
    "validate_send",
]
