"""Mutants of the inbound path: pushes, inbox.db and GET /v1/inbox, server-sent events (broker_link, inbox_store,
event_bus)."""

from __future__ import annotations

import threading

from . import mutant


@mutant("inbox-upsert", "a redelivered message overwrites the stored one (ON CONFLICT DO UPDATE) instead of deduping",
        kills=("INB-DEDUPE", "INB-DEDUPE-EVENT"), select=("inbound.dedupe_and_ack",), seam="inbox_store")
def _inbox_upsert():
    from reference.daemon.store import inbox as store

    upsert = store._INBOX_INSERT.replace(
        "DO NOTHING", "DO UPDATE SET body = excluded.body, broker_message_id = excluded.broker_message_id, "
        "delivery_id = excluded.delivery_id")

    class Inbox(store.InboxStore):
        @staticmethod
        def _insert(conn, message):
            record = {name: getattr(message, name) for name in store._INBOX_MESSAGE_COLUMNS}
            if record["meta"] is not None:
                record["meta"] = store._json_text(record["meta"])
            found = conn.execute(upsert, record).fetchall()
            return store._inbox_row(found[0]) if found else None

    return Inbox


@mutant("ack-before-insert", "client_ack is sent first and the inbox row is written 0.3 s later (write-behind)",
        kills=("INB-DURABLE-BEFORE-ACK",), select=("inbound.dedupe_and_ack",), seam="broker_link")
def _ack_before_insert():
    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _on_push(self, ws, frame):
            if frame.get("subtype") == "system":
                return super()._on_push(ws, frame)
            self._send(ws, {"type": "client_ack", "clientMessageId": frame["client_message_id"],
                            "brokerMessageId": frame["messageId"], "delivery_id": frame.get("delivery_id", "")})
            threading.Timer(0.3, self.inbox.receive, (frame, self.mesh, self._now_ms())).start()
            return None

    return Link


@mutant("no-frame-validation", "inbound broker frames are not validated against the wire schema",
        kills=("INB-SCHEMA",), select=("inbound.invalid_frames",), seam="broker_link")
def _no_frame_validation():
    from reference.daemon.link import BrokerLink

    class AcceptsAnything:
        def iter_errors(self, instance):
            return iter(())

    class Link(BrokerLink):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._frame_check = AcceptsAnything()

    return Link


@mutant("inbox-topic-filter-ignored", "GET /v1/inbox?topic= returns every topic",
        kills=("INBOX-FILTERS", "INBOX-FILTERS-EXACT"),
        select=("inbound.cursor_paging",), seam="inbox_store")
def _inbox_topic_filter_ignored():
    from reference.daemon.store import InboxStore

    class Inbox(InboxStore):
        def page(self, cursor=None, since_ms=None, topic=None, sender=None, limit=100):
            return super().page(cursor, since_ms, None, sender, limit)

    return Inbox


@mutant("inbox-since-exclusive",
        "GET /v1/inbox?since= keeps rows received strictly after it, not at or after it (E-12)",
        kills=("INBOX-FILTERS-EXACT",), select=("inbound.cursor_paging",), seam="inbox_store")
def _inbox_since_exclusive():
    from reference.daemon.store import InboxStore

    class Inbox(InboxStore):
        def page(self, cursor=None, since_ms=None, topic=None, sender=None, limit=100):
            return super().page(cursor, None if since_ms is None else since_ms + 1, topic, sender, limit)

    return Inbox


@mutant("no-last-event-id-replay", "GET /v1/events ignores Last-Event-ID and streams only new events",
        kills=("SSE-REPLAY",), select=("events.replay",), seam="event_bus", est_s=20)
def _no_last_event_id_replay():
    from reference.daemon.events import EventBus

    class Bus(EventBus):
        def open_stream(self, last_event_id, *args, **kwargs):
            return super().open_stream(None, *args, **kwargs)

    return Bus


@mutant("no-stream-cap", "GET /v1/events opens any number of streams: no 429 too_many_streams above max_streams",
        kills=("SSE-STREAM-LIMIT",), select=("events.stream_limit",), seam="event_bus", est_s=20)
def _no_stream_cap():
    from reference.daemon.events import EventBus

    class Bus(EventBus):
        def __init__(self, inbox, max_streams=32, *args, **kwargs):
            super().__init__(inbox, 10**9, *args, **kwargs)

    return Bus
