"""The Python client of the mesh daemon's /v1 IPC (§11): standard library only, versioned with /v1.

    from reference.client import discover

    daemon = discover(mesh="team")                      # the unix socket, else TCP with the bearer token (§8)
    result = daemon.send("#alerts", "disk full")        # one key for every retry: sent once, whatever happens
    for page in daemon.inbox_pages():                   # received messages, oldest first, page by page
        ...
    for event in daemon.events(last_event_id=40):       # each event once, resumed with Last-Event-ID after a drop
        ...
"""

from ._client import (
    IPC_API,
    Client,
    Conflict,
    DaemonNotFound,
    Endpoint,
    MeshError,
    Unavailable,
    default_state_dir,
    discover,
    new_client_message_id,
    retry_after,
)
from ._types import (
    Event,
    Health,
    InboxItem,
    InboxPage,
    OutboxItem,
    OutboxPage,
    ProfileResult,
    RequeueResult,
    SendResult,
    Version,
)

__all__ = [
    "IPC_API", "Client", "Conflict", "DaemonNotFound", "Endpoint", "Event", "Health", "InboxItem", "InboxPage",
    "MeshError", "OutboxItem", "OutboxPage", "ProfileResult", "RequeueResult", "SendResult", "Unavailable", "Version",
    "default_state_dir", "discover", "new_client_message_id", "retry_after",
]
