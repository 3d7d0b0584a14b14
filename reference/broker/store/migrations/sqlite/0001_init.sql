-- 0001 — the broker schema on SQLite (§4.3, §4.7.1). Same tables and columns as migrations/postgres/0001_init.sql,
-- without the `mesh` schema. SQLite has no timestamp type: every *_at / lease_until column holds unix milliseconds.
-- Ids are TEXT: broker_message_id is a ULID minted in code (§4.7.2), and spec/schemas/common/defs.json admits any
-- printable token. Runs inside the migration's BEGIN IMMEDIATE transaction (statements end with `;` at line end).

CREATE TABLE mesh (
    id             TEXT PRIMARY KEY,
    slug           TEXT NOT NULL UNIQUE,
    dedupe_mode    TEXT NOT NULL CHECK (dedupe_mode IN ('retention_scoped', 'permanent')),
    retention_days INTEGER CHECK (retention_days IS NULL OR retention_days >= 3),
    CHECK (dedupe_mode = 'permanent' OR retention_days IS NOT NULL)
);

CREATE TABLE member (
    mesh_id      TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    pubkey       TEXT NOT NULL,
    display_name TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (mesh_id, pubkey)
);

CREATE TABLE topic (
    mesh_id TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    name    TEXT NOT NULL,
    PRIMARY KEY (mesh_id, name)
);

CREATE TABLE topic_subscription (
    mesh_id TEXT NOT NULL,
    topic   TEXT NOT NULL,
    pubkey  TEXT NOT NULL,
    PRIMARY KEY (mesh_id, topic, pubkey),
    FOREIGN KEY (mesh_id, topic) REFERENCES topic (mesh_id, name) ON DELETE CASCADE,
    FOREIGN KEY (mesh_id, pubkey) REFERENCES member (mesh_id, pubkey) ON DELETE CASCADE
);

-- A queue is a named set of consumers (member pubkeys); every send to it is delivered to each consumer.
CREATE TABLE queue (
    mesh_id TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    id      TEXT NOT NULL,
    PRIMARY KEY (mesh_id, id)
);

CREATE TABLE queue_consumer (
    mesh_id  TEXT NOT NULL,
    queue_id TEXT NOT NULL,
    pubkey   TEXT NOT NULL,
    PRIMARY KEY (mesh_id, queue_id, pubkey),
    FOREIGN KEY (mesh_id, queue_id) REFERENCES queue (mesh_id, id) ON DELETE CASCADE,
    FOREIGN KEY (mesh_id, pubkey) REFERENCES member (mesh_id, pubkey) ON DELETE CASCADE
);

-- §4.3, column for column. No FK to the message row: retention may prune it first (history_available flips).
CREATE TABLE client_message_dedupe (
    mesh_id             TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    client_message_id   TEXT NOT NULL,
    broker_message_id   TEXT NOT NULL,
    request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
    destination_kind    TEXT NOT NULL CHECK (destination_kind IN ('topic', 'dm', 'queue')),
    destination_ref     TEXT NOT NULL,
    first_seen_at       INTEGER NOT NULL,
    expires_at          INTEGER,
    history_available   INTEGER NOT NULL DEFAULT 1 CHECK (history_available IN (0, 1)),
    PRIMARY KEY (mesh_id, client_message_id)
);

CREATE INDEX client_message_dedupe_expires_idx ON client_message_dedupe (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX client_message_dedupe_message_idx ON client_message_dedupe (broker_message_id);

-- Topic sends land in topic_message; dm and queue sends in message_queue. Both carry client_message_id (§4.3,
-- nullable for legacy traffic that has no dedupe row).
CREATE TABLE topic_message (
    id                TEXT PRIMARY KEY,
    mesh_id           TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    client_message_id TEXT,
    sender_pubkey     TEXT NOT NULL,
    destination_kind  TEXT NOT NULL CHECK (destination_kind = 'topic'),
    destination_ref   TEXT NOT NULL,
    priority          TEXT NOT NULL CHECK (priority IN ('now', 'next', 'low')),
    reply_to_id       TEXT NOT NULL DEFAULT '',
    meta              TEXT,
    body              TEXT NOT NULL,
    created_at        INTEGER NOT NULL
);

CREATE INDEX topic_message_created_idx ON topic_message (created_at);
CREATE INDEX topic_message_client_idx ON topic_message (mesh_id, client_message_id);

CREATE TABLE message_queue (
    id                TEXT PRIMARY KEY,
    mesh_id           TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    client_message_id TEXT,
    sender_pubkey     TEXT NOT NULL,
    destination_kind  TEXT NOT NULL CHECK (destination_kind IN ('dm', 'queue')),
    destination_ref   TEXT NOT NULL,
    priority          TEXT NOT NULL CHECK (priority IN ('now', 'next', 'low')),
    reply_to_id       TEXT NOT NULL DEFAULT '',
    meta              TEXT,
    body              TEXT NOT NULL,
    created_at        INTEGER NOT NULL
);

CREATE INDEX message_queue_created_idx ON message_queue (created_at);
CREATE INDEX message_queue_client_idx ON message_queue (mesh_id, client_message_id);

-- The replay log. recipient_count records the fan-out so the orphan check can tell a lost delivery row from a send
-- that had no recipients. When retention prunes the message, its history row stays while a dedupe row names it (so a
-- duplicate still answers history_id, E-28) and goes when that dedupe row expires.
CREATE TABLE message_history (
    id                TEXT PRIMARY KEY,
    broker_message_id TEXT NOT NULL UNIQUE,
    mesh_id           TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    destination_kind  TEXT NOT NULL,
    destination_ref   TEXT NOT NULL,
    sender_pubkey     TEXT NOT NULL,
    recipient_count   INTEGER NOT NULL,
    created_at        INTEGER NOT NULL
);

-- One row per (message, recipient): leased by pending_deliveries, marked by ack_delivery, never re-inserted.
CREATE TABLE delivery_queue (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    broker_message_id TEXT NOT NULL,
    mesh_id           TEXT NOT NULL REFERENCES mesh (id) ON DELETE CASCADE,
    recipient_pubkey  TEXT NOT NULL,
    attempt           INTEGER NOT NULL DEFAULT 0,
    lease_until       INTEGER,
    acked_at          INTEGER,
    UNIQUE (broker_message_id, recipient_pubkey)
);

CREATE INDEX delivery_queue_pending_idx ON delivery_queue (recipient_pubkey, id) WHERE acked_at IS NULL;

-- Every accepted message, whichever table holds it.
CREATE VIEW accepted_message AS
    SELECT id, mesh_id, client_message_id, sender_pubkey, destination_kind, destination_ref, priority, reply_to_id,
           meta, body, created_at
      FROM topic_message
    UNION ALL
    SELECT id, mesh_id, client_message_id, sender_pubkey, destination_kind, destination_ref, priority, reply_to_id,
           meta, body, created_at
      FROM message_queue;
