"""``--dev``: a broker that admits whoever says hello, for trying the reference out (never for production).

A hello from an unknown mesh creates the mesh (with the broker's configured dedupe policy), a hello from an unknown
member admits it and subscribes it to every topic of the mesh, and a send to an unknown topic creates the topic and
subscribes every member. Each happens once per process, under the writer lock, before the store is asked.
"""

from __future__ import annotations

import threading
from typing import Any

from .config import BrokerConfig
from .store import BrokerStore


class DevMode:
    """What ``--dev`` adds to the store on first use: meshes, members, topics (``lock`` guards the sets)."""

    def __init__(self, config: BrokerConfig, store: BrokerStore, writer: Any):
        self.config = config
        self.store = store
        self.writer = writer
        self.lock = threading.Lock()
        self.members: set[tuple[str, str]] = set()
        self.topics: set[tuple[str, str]] = set()

    def register(self, mesh_id: str, pubkey: str, display_name: str) -> None:
        """Create the mesh on first use, admit the member, subscribe it to every topic of the mesh."""
        with self.lock, self.writer:
            if (mesh_id, pubkey) in self.members:
                return
            if self.store.mesh_policy(mesh_id) is None:
                retention = self.config.retention_days if self.config.dedupe_mode == "retention_scoped" else None
                try:
                    self.store.add_mesh(mesh_id, mesh_id, self.config.dedupe_mode, retention)
                except Exception:
                    if self.store.mesh_policy(mesh_id) is None:  # not a concurrent creation: a real failure
                        raise
            self.store.add_member(mesh_id, pubkey, display_name)
            for topic in self.store.topics(mesh_id):
                self.store.subscribe(mesh_id, topic, pubkey)
            self.members.add((mesh_id, pubkey))

    def topic(self, mesh_id: str, topic: str) -> None:
        """Create a topic on first use and subscribe every member of the mesh to it."""
        with self.lock, self.writer:
            if (mesh_id, topic) in self.topics:
                return
            self.store.create_topic(mesh_id, topic)
            for member in self.store.members(mesh_id):
                self.store.subscribe(mesh_id, topic, member["pubkey"])
            self.topics.add((mesh_id, topic))
