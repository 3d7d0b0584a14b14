"""Feature negotiation (§15.1, §15.5, E-06, E-07): validate a broker's feature_negotiation_response.

The daemon requires some bits and takes others if offered. The table's ``always_required`` bits
(client_message_id_dedupe, NEG-REQUIRE-DEDUPE) are required whatever the caller's ``require`` list says, so no
configuration runs a daemon against a broker without them. A required bit that is missing, or whose parameters fail
the rules in spec/tables/features.yaml, fails negotiation with a structured close reason; an optional bit with bad
parameters is dropped, and a bad optional parameter of an accepted bit is ignored, both with a warning.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spec import load_table

#: the bytes a 4010 close reason may take (spec/tables/close_codes.yaml ``reason_max_bytes``: RFC 6455's 123, E-07)
CLOSE_REASON_LIMIT: int = next(entry["reason_max_bytes"] for entry in load_table("close_codes")["codes"]
                               if entry["name"] == "feature_unavailable")


@dataclass(frozen=True)
class CloseReason:
    """The §15.5 close reason (bare form, E-07)."""

    kind: str
    feature: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "feature": self.feature, "detail": self.detail}

    def close_payload(self, limit: int = CLOSE_REASON_LIMIT) -> str:
        """Compact JSON of at most ``limit`` UTF-8 bytes; ``detail`` is shortened first, never the rest."""
        detail = self.detail
        while True:
            text = json.dumps({"kind": self.kind, "feature": self.feature, "detail": detail},
                              separators=(",", ":"), ensure_ascii=False)
            if len(text.encode("utf-8")) <= limit or not detail:
                break
            # req: NEG-CLOSE-REASON-FIT -- detail is shortened first, kind and feature never
            detail = detail[:-1]
        if len(text.encode("utf-8")) > limit:
            text = json.dumps({"kind": self.kind, "feature": self.feature}, separators=(",", ":"))
        return text


@dataclass(frozen=True)
class Negotiation:
    """The outcome: ``failure`` is ``None`` when every required bit was accepted."""

    accepted: Mapping[str, Mapping[str, Any]]
    failure: CloseReason | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.failure is None


class _ParamFailure(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    raise ValueError(f"features table: unknown parameter type {kind!r}")


def _check_param(name: str, rule: Mapping[str, Any], value: Any) -> None:
    # req: NEG-PARAM-KINDS
    if not _type_ok(value, rule["type"]):
        raise _ParamFailure("feature_param_invalid", f"{name} must be {rule['type']}, got {json.dumps(value)}")
    if "enum" in rule and value not in rule["enum"]:
        raise _ParamFailure("feature_param_invalid", f"{name}={json.dumps(value)} not in {rule['enum']}")
    if "const" in rule and value != rule["const"]:
        raise _ParamFailure("feature_param_invalid", f"{name} must be {json.dumps(rule['const'])}")
    if "minimum" in rule and value < rule["minimum"]:
        raise _ParamFailure("feature_param_invalid", f"{name}={value} is below {rule['minimum']}")
    # req: NEG-PARAM-KINDS -- below the floor is its own kind (§15.5)
    if "floor" in rule and value < rule["floor"]:
        raise _ParamFailure("feature_param_below_floor", f"{name}={value} is below the daemon floor {rule['floor']}")


def validate_params(bit: str, params: Any) -> tuple[dict[str, Any], list[str]]:
    """Check one bit's params; returns the accepted params and warnings for dropped optional ones.

    Raises:
        _ParamFailure: a required rule failed (kind is feature_param_invalid or feature_param_below_floor).
    """
    spec = load_table("features")["bits"][bit]
    if not isinstance(params, Mapping):
        raise _ParamFailure("feature_param_invalid", "params must be an object")
    version = params.get("version")
    # req: NEG-PARAM-VALIDATION
    if not _type_ok(version, "int") or version != spec["version"]:
        raise _ParamFailure("feature_param_invalid", f"params.version {json.dumps(version)} is not {spec['version']}")
    accepted: dict[str, Any] = {"version": version}
    for name, rule in spec["required"].items():
        condition = rule.get("required_when")
        needed = condition is None or all(params.get(k) == v for k, v in condition.items())
        if name not in params:
            # req: NEG-PARAM-VALIDATION -- a missing required parameter
            if needed:
                raise _ParamFailure("feature_param_invalid", f"required param {name} is missing")
            continue
        if needed:
            _check_param(name, rule, params[name])
            accepted[name] = params[name]
    warnings = []
    for name, rule in spec["optional"].items():
        if name in params:
            try:
                _check_param(name, rule, params[name])
                accepted[name] = params[name]
            except _ParamFailure as exc:
                # req: NEG-OPTIONAL-INVALID
                warnings.append(f"feature_optional_param_invalid: {bit}.{exc.detail}")
    return accepted, warnings


@functools.cache
def always_required() -> tuple[str, ...]:
    """The bits a daemon requires whatever it is configured to require (spec/tables/features.yaml)."""
    return tuple(load_table("features")["always_required"])


def required_bits(require: Sequence[str]) -> tuple[str, ...]:
    """What a daemon configured to require ``require`` requires: ``always_required()`` first, then ``require``."""
    # req: NEG-REQUIRE-DEDUPE -- client_message_id_dedupe is required even when a configuration leaves it out
    return tuple(dict.fromkeys((*always_required(), *require)))


def negotiate(response: Mapping[str, Any], require: Sequence[str], optional: Sequence[str] = ()) -> Negotiation:
    """Validate a ``feature_negotiation_response``: every bit of ``required_bits(require)`` must be offered with
    valid parameters, and the ``optional`` ones are taken when they are."""
    known = load_table("features")["bits"]
    supported = response.get("supported")
    if not isinstance(supported, Mapping):
        supported = {}
    missing = response.get("missing_required")
    missing_set = set(missing) if isinstance(missing, list) else set()
    accepted: dict[str, Mapping[str, Any]] = {}
    warnings: list[str] = []
    # req: NEG-REQUIRE-DEDUPE -- a broker without client_message_id_dedupe fails here, feature_unavailable
    for bit in required_bits(require):
        if bit not in known:
            raise ValueError(f"daemon requires unknown feature bit {bit!r}")
        offer = supported.get(bit)
        if bit in missing_set or not isinstance(offer, Mapping):
            # req: NEG-CLOSE-REASON-SHAPE
            return Negotiation(accepted, CloseReason("feature_unavailable", bit, f"{bit} not in supported"),
                               tuple(warnings))
        try:
            params, notes = validate_params(bit, offer.get("params"))
        except _ParamFailure as exc:
            # req: NEG-CLOSE-REASON-SHAPE
            return Negotiation(accepted, CloseReason(exc.kind, bit, exc.detail), tuple(warnings))
        accepted[bit] = params
        warnings.extend(notes)
    for bit in optional:
        offer = supported.get(bit)
        if bit not in known or not isinstance(offer, Mapping) or bit in accepted:
            continue
        try:
            params, notes = validate_params(bit, offer.get("params"))
        except _ParamFailure as exc:
            warnings.append(f"feature_optional_unusable: {bit}: {exc.detail}")
            continue
        accepted[bit] = params
        warnings.extend(notes)
    return Negotiation(accepted, None, tuple(warnings))
