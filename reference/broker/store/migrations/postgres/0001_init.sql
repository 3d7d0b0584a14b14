-- 0001 — the broker schema on PostgreSQL (§4.3, §4.7.1), in the `mesh` schema. Same tables and columns as
-- migrations/sqlite/0001_init.sql. Times are TIMESTAMPTZ; the store speaks unix milliseconds and converts with the
-- two helpers below. Ids are TEXT: broker_message_id is a ULID minted in code (§4.7.2), and
-- spec/schemas/common/defs.json admits any printable token. Runs inside the migration transaction, which holds
-- pg_advisory_xact_lock, so two brokers starting at once apply it exactly once.

CREATE FUNCTION mesh.ms_to_ts(ms BIGINT) RETURNS TIMESTAMPTZ
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT to_timestamp(ms::double precision / 1000) $$;

CREATE FUNCTION mesh.ts_to_ms(ts TIMESTAMPTZ) RETURNS BIGINT
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    AS $$ SELECT round(extract(epoch FROM ts) * 1000)::BIGINT $$;

CREATE TABLE mesh.mesh (
    id             TEXT PRIMARY KEY,
    slug           TEXT NOT NULL UNIQUE,
    dedupe_mode    TEXT NOT NULL CHECK (dedupe_mode IN ('retention_scoped', 'permanent')),
    retention_days INTEGER CHECK (retention_days IS NULL OR retention_days >= 3),
    CHECK (dedupe_mode = 'permanent' OR retention_days IS NOT NULL)
);

CREATE TABLE mesh.member (
    mesh_id      TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    pubkey       TEXT NOT NULL,
    display_name TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (mesh_id, pubkey)
);

CREATE TABLE mesh.topic (
    mesh_id TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    name    TEXT NOT NULL,
    PRIMARY KEY (mesh_id, name)
);

CREATE TABLE mesh.topic_subscription (
    mesh_id TEXT NOT NULL,
    topic   TEXT NOT NULL,
    pubkey  TEXT NOT NULL,
    PRIMARY KEY (mesh_id, topic, pubkey),
    FOREIGN KEY (mesh_id, topic) REFERENCES mesh.topic (mesh_id, name) ON DELETE CASCADE,
    FOREIGN KEY (mesh_id, pubkey) REFERENCES mesh.member (mesh_id, pubkey) ON DELETE CASCADE
);

-- A queue is a named set of consumers (member pubkeys); every send to it is delivered to each consumer.
CREATE TABLE mesh.queue (
    mesh_id TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    id      TEXT NOT NULL,
    PRIMARY KEY (mesh_id, id)
);

CREATE TABLE mesh.queue_consumer (
    mesh_id  TEXT NOT NULL,
    queue_id TEXT NOT NULL,
    pubkey   TEXT NOT NULL,
    PRIMARY KEY (mesh_id, queue_id, pubkey),
    FOREIGN KEY (mesh_id, queue_id) REFERENCES mesh.queue (mesh_id, id) ON DELETE CASCADE,
    FOREIGN KEY (mesh_id, pubkey) REFERENCES mesh.member (mesh_id, pubkey) ON DELETE CASCADE
);

-- §4.3, column for column. No FK to the message row: retention may prune it first (history_available flips).
CREATE TABLE mesh.client_message_dedupe (
    mesh_id             TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    client_message_id   TEXT NOT NULL,
    broker_message_id   TEXT NOT NULL,
    request_fingerprint BYTEA NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    destination_kind    TEXT NOT NULL CHECK (destination_kind IN ('topic', 'dm', 'queue')),
    destination_ref     TEXT NOT NULL,
    first_seen_at       TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    expires_at          TIMESTAMPTZ,
    history_available   BOOLEAN NOT NULL DEFAULT TRUE,
    PRIMARY KEY (mesh_id, client_message_id)
);

CREATE INDEX client_message_dedupe_expires_idx ON mesh.client_message_dedupe (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX client_message_dedupe_message_idx ON mesh.client_message_dedupe (broker_message_id);

-- Topic sends land in topic_message; dm and queue sends in message_queue. Both carry client_message_id (§4.3,
-- nullable for legacy traffic that has no dedupe row).
CREATE TABLE mesh.topic_message (
    id                TEXT PRIMARY KEY,
    mesh_id           TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    client_message_id TEXT,
    sender_pubkey     TEXT NOT NULL,
    destination_kind  TEXT NOT NULL CHECK (destination_kind = 'topic'),
    destination_ref   TEXT NOT NULL,
    priority          TEXT NOT NULL CHECK (priority IN ('now', 'next', 'low')),
    reply_to_id       TEXT NOT NULL DEFAULT '',
    meta              TEXT,
    body              TEXT NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL
);

CREATE INDEX topic_message_created_idx ON mesh.topic_message (created_at);
CREATE INDEX topic_message_client_idx ON mesh.topic_message (mesh_id, client_message_id);

CREATE TABLE mesh.message_queue (
    id                TEXT PRIMARY KEY,
    mesh_id           TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    client_message_id TEXT,
    sender_pubkey     TEXT NOT NULL,
    destination_kind  TEXT NOT NULL CHECK (destination_kind IN ('dm', 'queue')),
    destination_ref   TEXT NOT NULL,
    priority          TEXT NOT NULL CHECK (priority IN ('now', 'next', 'low')),
    reply_to_id       TEXT NOT NULL DEFAULT '',
    meta              TEXT,
    body              TEXT NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL
);

CREATE INDEX message_queue_created_idx ON mesh.message_queue (created_at);
CREATE INDEX message_queue_client_idx ON mesh.message_queue (mesh_id, client_message_id);

-- The replay log. recipient_count records the fan-out so the orphan check can tell a lost delivery row from a send
-- that had no recipients. When retention prunes the message, its history row stays while a dedupe row names it (so a
-- duplicate still answers history_id, E-28) and goes when that dedupe row expires.
CREATE TABLE mesh.message_history (
    id                TEXT PRIMARY KEY,
    broker_message_id TEXT NOT NULL UNIQUE,
    mesh_id           TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    destination_kind  TEXT NOT NULL,
    destination_ref   TEXT NOT NULL,
    sender_pubkey     TEXT NOT NULL,
    recipient_count   INTEGER NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL
);

-- One row per (message, recipient): leased by pending_deliveries, marked by ack_delivery, never re-inserted.
CREATE TABLE mesh.delivery_queue (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    broker_message_id TEXT NOT NULL,
    mesh_id           TEXT NOT NULL REFERENCES mesh.mesh (id) ON DELETE CASCADE,
    recipient_pubkey  TEXT NOT NULL,
    attempt           INTEGER NOT NULL DEFAULT 0,
    lease_until       TIMESTAMPTZ,
    acked_at          TIMESTAMPTZ,
    UNIQUE (broker_message_id, recipient_pubkey)
);

CREATE INDEX delivery_queue_pending_idx ON mesh.delivery_queue (recipient_pubkey, id) WHERE acked_at IS NULL;

-- Every accepted message, whichever table holds it.
CREATE VIEW mesh.accepted_message AS
    SELECT id, mesh_id, client_message_id, sender_pubkey, destination_kind, destination_ref, priority, reply_to_id,
           meta, body, created_at
      FROM mesh.topic_message
    UNION ALL
    SELECT id, mesh_id, client_message_id, sender_pubkey, destination_kind, destination_ref, priority, reply_to_id,
           meta, body, created_at
      FROM mesh.message_queue;
