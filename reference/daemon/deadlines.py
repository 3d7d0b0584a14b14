"""Read deadlines that hold while a read blocks, and write bounds, for IPC connections (E-43).

Theory of operation. gunicorn reads a request's head and body with plain blocking ``recv`` calls on the connection
socket, and a deadline checked between them does not help while one of them blocks (a client that sends one byte,
or a Content-Length that lies, holds the thread for ever). So every accepted connection is wrapped in a
``DeadlineSocket``: the server *arms* it with an absolute deadline when a request starts (``ipc_header_read_s`` for
the head) and again when the head has been read (``ipc_body_read_s`` for the body); each ``recv`` then waits at most
until that deadline, whatever arrives in between, and past it raises ``ReadTimeout``. Writes wait at most
``ipc_write_s`` each, for a client that stops reading. Everything else is the plain socket's.

``ReadTimeout`` is deliberately not an ``OSError``: gunicorn hands it to the worker's ``handle_error`` (before
routing: a 408 problem) and Falcon to the app's error handler (during a body read: a 408 problem); neither mistakes it
for a vanished client.
"""

from __future__ import annotations

import errno
import select
import socket
import time
from typing import Any

__all__ = ["DeadlineSocket", "ReadTimeout", "peer_gone"]


class ReadTimeout(Exception):
    """A request's head or body did not arrive before its deadline; ``phase`` is ``head`` or ``body``."""

    def __init__(self, phase: str, seconds: float):
        super().__init__(f"the request {phase} did not arrive within {seconds:g} s")
        self.phase = phase
        self.seconds = seconds


class DeadlineSocket:
    """A connection socket whose reads share one absolute deadline and whose writes are bounded (see the module)."""

    __slots__ = ("_budget", "_deadline", "_phase", "_write_s", "raw")

    def __init__(self, sock: socket.socket, write_s: float):
        self.raw = sock
        self._write_s = write_s
        self._deadline: float | None = None
        self._phase = "head"
        self._budget = 0.0

    def arm(self, seconds: float, phase: str) -> None:
        """Every read from now on must finish within ``seconds`` in all (``phase`` names it in the 408)."""
        self._deadline = time.monotonic() + seconds
        self._phase = phase
        self._budget = seconds

    @property
    def deadline(self) -> float | None:
        """The absolute (``time.monotonic``) deadline of the reads, or None."""
        return self._deadline

    def until(self, deadline: float) -> None:
        """Move the deadline to ``deadline`` (absolute), keeping the phase."""
        self._deadline = deadline

    def disarm(self) -> None:
        self._deadline = None

    @property
    def armed(self) -> bool:
        return self._deadline is not None

    def _wait(self) -> None:
        if self._deadline is None:  # disarmed by a caller that set its own timeout (settimeout): keep it
            return
        # req: IPC-HEAD-DEADLINE, IPC-BODY-DEADLINE -- one absolute deadline holds while a read blocks
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise ReadTimeout(self._phase, self._budget)
        self.raw.settimeout(remaining)

    def recv(self, size: int, flags: int = 0) -> bytes:
        if self._deadline is None:
            return self.raw.recv(size, flags)
        self._wait()
        try:
            return self.raw.recv(size, flags)
        except TimeoutError as exc:
            raise ReadTimeout(self._phase, self._budget) from exc

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        if self._deadline is None:
            return self.raw.recv_into(buffer, nbytes, flags)
        self._wait()
        try:
            return self.raw.recv_into(buffer, nbytes, flags)
        except TimeoutError as exc:
            raise ReadTimeout(self._phase, self._budget) from exc

    def sendall(self, data: Any) -> None:
        self.raw.settimeout(self._write_s)
        try:
            self.raw.sendall(data)
        except TimeoutError as exc:
            # A client that does not read is a client that went away: gunicorn logs EPIPE quietly and closes.
            raise BrokenPipeError(errno.EPIPE, f"the client read nothing for {self._write_s:g} s") from exc

    def send(self, data: Any, flags: int = 0) -> int:
        self.raw.settimeout(self._write_s)
        try:
            return self.raw.send(data, flags)
        except TimeoutError as exc:
            raise BrokenPipeError(errno.EPIPE, f"the client read nothing for {self._write_s:g} s") from exc

    def setblocking(self, flag: bool) -> None:
        self.raw.setblocking(flag)

    def settimeout(self, value: float | None) -> None:
        # gunicorn's own bounded operations (the graceful close's linger) set a timeout and then read: they run with
        # the deadline off, under the timeout they chose.
        self._deadline = None
        self.raw.settimeout(value)

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self._deadline = None
        self.raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def peer_gone(sock: Any) -> bool:
    """Whether the client at the other end of ``sock`` has closed or reset the connection (never blocks).

    A client that sent more bytes (a pipelined request) is still there; only end-of-stream, a hang-up or an error
    count. ``sock`` may be a ``DeadlineSocket`` or a plain socket; anything else is never gone.
    """
    raw = getattr(sock, "raw", sock)
    if not isinstance(raw, socket.socket):
        return False
    poller = select.poll()
    try:
        poller.register(raw, select.POLLIN | _POLLRDHUP)
        events = poller.poll(0)
    except (OSError, ValueError):
        return True
    if not events:
        return False
    mask = events[0][1]
    if mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL | _POLLRDHUP):
        return True
    try:  # readable: data (still there) or end of stream (gone); the peek does not wait, there is something to see
        return raw.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


_POLLRDHUP = getattr(select, "POLLRDHUP", 0)
