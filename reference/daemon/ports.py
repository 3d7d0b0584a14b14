"""What the IPC layer (app.py) calls on each part of the daemon, as ``typing.Protocol``s.

``DaemonContext`` is typed with these, not with the concrete classes: the runtime wires ``OutboxStore``,
``InboxStore``, ``BrokerLink``, ``EventBus``, ``GroupCommitter`` and ``DaemonMetrics`` (or a mutant's subclass), and a
test may wire anything that has these members. Only what a resource uses is listed here; tests/daemon/test_ports.py
checks that every real part accepts exactly these calls.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from reference.core import OutboxRow

from .link import LinkState
from .store import Accepted, AcceptItem, InboxRow


@runtime_checkable
class Outbox(Protocol):
    """``outbox.db`` as GET /v1/outbox and GET /v1/health read it."""

    def health(self) -> tuple[dict[str, int], int | None]:
        """Rows per status and the oldest pending row's ``enqueued_at`` (unix ms), from one snapshot."""
        ...

    def list(self, status: str | None = None, limit: int = 50, cursor: str | None = None
             ) -> tuple[builtins.list[OutboxRow], str | None]:
        """One page of rows, newest first, and the cursor of the next page (``None`` at the end)."""
        ...


@runtime_checkable
class Inbox(Protocol):
    """``inbox.db`` as GET /v1/inbox pages it (E-12)."""

    def page(self, cursor: str | None = None, since_ms: int | None = None, topic: str | None = None,
             sender: str | None = None, limit: int = 100) -> tuple[list[InboxRow], str | None]:
        """Rows after ``cursor`` in ascending ``seq``; raises a ``ValueError`` for a cursor it did not make."""
        ...


@runtime_checkable
class Link(Protocol):
    """The broker link, as the IPC layer reports it and asks it for things."""

    state: LinkState

    def wake(self) -> None:
        """A row was accepted: dispatch without waiting for the next tick."""
        ...

    def request_peers(self, timeout: float) -> list[dict[str, Any]]:
        """The broker's peer list; raises ``BrokerUnavailable`` or ``BrokerTimeout``."""
        ...

    def send_frames(self, frames: list[dict[str, Any]]) -> None:
        """Queue fire-and-forget frames; raises ``BrokerUnavailable`` when the link is down."""
        ...


@runtime_checkable
class EventStreams(Protocol):
    """The SSE event bus (E-13) as GET /v1/events opens a stream."""

    def open_stream(self, last_event_id: int | None, transport: str = "unix",
                    gone: Callable[[], bool] | None = None) -> Iterator[bytes]:
        """The stream's body; raises ``Problem`` ``too_many_streams`` when ``transport`` is full."""
        ...


@runtime_checkable
class Committer(Protocol):
    """The group commit POST /v1/send hands its accept to (§4.5.1 steps 3-6)."""

    def submit(self, item: AcceptItem, timeout: float | None = 30.0) -> Accepted:
        """Decide ``item`` durably and return the decision (and the ``OB-NONE-ACCEPT`` transition of a new row)."""
        ...


@runtime_checkable
class Metrics(Protocol):
    """The Prometheus registry as GET /v1/metrics renders it and the access log counts requests."""

    def render(self) -> bytes:
        """The text exposition format."""
        ...

    def ipc(self, endpoint: str, status: str, transport: str, seconds: float) -> None:
        """Count one IPC request by route template, status and transport, and observe its duration."""
        ...
