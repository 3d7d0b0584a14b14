-- inbox.db schema 1: the §4.10 inbox table (v3 §4.5) and the E-13 SSE event log. Times are unix milliseconds.
-- Forward-only: a later change is a new file 0002_<name>.sql; this file is never edited once released.
-- seq is the E-12 paging sequence: AUTOINCREMENT, so a value is never reused even after retention deletes rows.
-- id (the ULID) stays unique; it is not the rowid so that seq can be.
CREATE TABLE inbox (
  seq               INTEGER PRIMARY KEY AUTOINCREMENT,
  id                TEXT NOT NULL UNIQUE,
  client_message_id TEXT NOT NULL UNIQUE,
  broker_message_id TEXT,
  mesh              TEXT NOT NULL,
  topic             TEXT,
  sender_pubkey     TEXT NOT NULL,
  sender_name       TEXT NOT NULL,
  body              TEXT,
  meta              TEXT CHECK (meta IS NULL OR json_valid(meta)),
  received_at       INTEGER NOT NULL,
  reply_to_id       TEXT,
  delivery_id       TEXT
);

CREATE INDEX inbox_received_at ON inbox (received_at);
CREATE INDEX inbox_topic ON inbox (topic);
CREATE INDEX inbox_sender_pubkey ON inbox (sender_pubkey);

-- SSE events (E-13): persisted before they are streamed; the SSE id is events.id. AUTOINCREMENT keeps ids strictly
-- increasing across pruning, so a Last-Event-ID never names a different event later.
CREATE TABLE events (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  name       TEXT NOT NULL,
  payload    TEXT NOT NULL CHECK (json_valid(payload)),
  created_at INTEGER NOT NULL
);

CREATE INDEX events_created_at ON events (created_at);
