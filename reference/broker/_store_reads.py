"""The few reads the server needs that ``BrokerStore`` does not offer (yet): membership at hello, a mesh's policy for
negotiation, a mesh's members and topics (dev mode), and which messages a retention sweep is about to prune (for the
history_pruned trace).

Rules of this file: read-only, one short read transaction per call, through the SQL stores' own transaction helper;
``mesh_policy`` and ``member_exists`` are the stores' named statements, the rest is written once per engine here.
This is a seam, not a second store: these methods belong on ``BrokerStore`` and should move there.
"""

from __future__ import annotations

from typing import Any

from reference.broker.store import BrokerStore

_SQL: dict[str, dict[str, str]] = {
    "sqlite": {
        "mesh_members": "SELECT pubkey, display_name FROM member WHERE mesh_id = :mesh_id ORDER BY pubkey",
        "mesh_topics": "SELECT name FROM topic WHERE mesh_id = :mesh_id ORDER BY name",
        "prunable": (
            "SELECT m.mesh_id, m.id AS broker_message_id, m.client_message_id FROM accepted_message m "
            "JOIN client_message_dedupe d ON d.mesh_id = m.mesh_id AND d.client_message_id = m.client_message_id "
            "AND d.broker_message_id = m.id WHERE m.created_at < :before AND d.history_available = 1 ORDER BY m.id"
        ),
    },
    "postgres": {
        "mesh_members": "SELECT pubkey, display_name FROM mesh.member WHERE mesh_id = %(mesh_id)s ORDER BY pubkey",
        "mesh_topics": "SELECT name FROM mesh.topic WHERE mesh_id = %(mesh_id)s ORDER BY name",
        "prunable": (
            "SELECT m.mesh_id, m.id AS broker_message_id, m.client_message_id FROM mesh.accepted_message m "
            "JOIN mesh.client_message_dedupe d ON d.mesh_id = m.mesh_id "
            "AND d.client_message_id = m.client_message_id AND d.broker_message_id = m.id "
            "WHERE m.created_at < mesh.ms_to_ts(%(before)s) AND d.history_available ORDER BY m.id"
        ),
    },
}


class StoreReads:
    """Read-only queries over a SQL ``BrokerStore``; safe from any thread (the store keeps one connection each)."""

    def __init__(self, store: BrokerStore):
        engine = getattr(store, "engine", None)
        if engine not in _SQL or not hasattr(store, "_transaction"):
            raise TypeError(f"StoreReads needs one of the SQL stores, not {type(store).__name__}")
        self.store: Any = store
        self._sql = {**_SQL[engine], "mesh_policy": store.SQL["mesh_policy"],
                     "member_exists": store.SQL["member_exists"]}

    def _rows(self, name: str, **params: Any) -> list[Any]:
        with self.store._transaction(write=False) as cur:
            cur.execute(self._sql[name], params)
            return [dict(row) for row in cur.fetchall()]

    def mesh_policy(self, mesh_id: str) -> dict[str, Any] | None:
        """``{dedupe_mode, retention_days}`` of the mesh, or None when there is no such mesh."""
        rows = self._rows("mesh_policy", mesh_id=mesh_id)
        return rows[0] if rows else None

    def is_member(self, mesh_id: str, pubkey: str) -> bool:
        return bool(self._rows("member_exists", mesh_id=mesh_id, pubkey=pubkey))

    def members(self, mesh_id: str) -> list[dict[str, Any]]:
        """``[{pubkey, display_name}]`` of the mesh, by pubkey."""
        return self._rows("mesh_members", mesh_id=mesh_id)

    def topics(self, mesh_id: str) -> list[str]:
        return [row["name"] for row in self._rows("mesh_topics", mesh_id=mesh_id)]

    def prunable(self, before_ms: int) -> list[dict[str, Any]]:
        """``[{mesh_id, broker_message_id, client_message_id}]``: the messages ``prune_messages(before_ms)`` will
        delete whose dedupe row it will flip to history_available = false."""
        return self._rows("prunable", before=before_ms)
