"""reference.daemon.ports: every part the runtime wires accepts exactly the calls the IPC layer makes on it."""

from __future__ import annotations

import inspect
from dataclasses import FrozenInstanceError

import pytest

from reference.core import parse_send
from reference.daemon import ports
from reference.daemon.committer import GroupCommitter
from reference.daemon.events import EventBus
from reference.daemon.link import BrokerLink
from reference.daemon.metrics import DaemonMetrics
from reference.daemon.store import AcceptItem, InboxStore, OutboxStore

PARTS = [(ports.Outbox, OutboxStore), (ports.Inbox, InboxStore), (ports.Link, BrokerLink),
         (ports.EventStreams, EventBus), (ports.Committer, GroupCommitter), (ports.Metrics, DaemonMetrics)]


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def _shape(signature: inspect.Signature) -> list[tuple[str, inspect._ParameterKind, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(("protocol", "part"), PARTS, ids=[protocol.__name__ for protocol, _ in PARTS])
def test_each_part_has_its_ports_methods_with_the_same_parameters(protocol, part):
    methods = _methods(protocol)
    assert methods, f"{protocol.__name__} names no method"
    for name, wanted in methods.items():
        assert _shape(inspect.signature(getattr(part, name))) == _shape(wanted), f"{part.__name__}.{name}"


def test_the_ports_are_what_the_ipc_layer_calls():
    assert {protocol.__name__: sorted(_methods(protocol)) for protocol, _ in PARTS} == {
        "Outbox": ["health", "list"], "Inbox": ["page"], "Link": ["request_peers", "send_frames", "wake"],
        "EventStreams": ["open_stream"], "Committer": ["submit"], "Metrics": ["ipc", "render"]}
    assert ports.Link.__annotations__ == {"state": "LinkState"}


def test_accept_item_carries_the_spec_names_computed_once_on_the_request_thread():
    request = parse_send(b'{"to": "#general", "message": "hi"}', "cm-item")
    item = AcceptItem.of(request, "cm-item", "01ROW", 1_700_000_000_000)
    assert item == AcceptItem(client_message_id="cm-item", request_fingerprint=request.fingerprint(),
                              payload=request.payload(), outbox_id="01ROW", enqueued_at=1_700_000_000_000)
    assert len(item.request_fingerprint) == 32
    assert not hasattr(item, "__dict__")  # slots: no per-item dict on the hot path
    with pytest.raises(FrozenInstanceError):
        item.client_message_id = "other"  # type: ignore[misc]
