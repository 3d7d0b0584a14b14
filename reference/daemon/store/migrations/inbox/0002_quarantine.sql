-- inbox.db schema 2: the quarantine of inbound frames a daemon could not take (E-41). A frame lands here, durably,
-- before the daemon acknowledges it, so a poison message is kept for an operator (`meshd inbox quarantine`) instead
-- of being lost or redelivered for ever. frame_key identifies a frame across redeliveries (its text without the
-- delivery attempt), so a frame pushed again is counted (seen), not stored twice. frame holds the frame as
-- received, or its first bytes when it was larger than the link's frame limit (frame_bytes is its whole size).
CREATE TABLE quarantine (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  frame_key         BLOB NOT NULL UNIQUE,
  first_seen_at     INTEGER NOT NULL,
  last_seen_at      INTEGER NOT NULL,
  seen              INTEGER NOT NULL DEFAULT 1,
  reason            TEXT NOT NULL,
  frame_type        TEXT,
  client_message_id TEXT,
  broker_message_id TEXT,
  delivery_id       TEXT,
  acked             INTEGER NOT NULL DEFAULT 0 CHECK (acked IN (0, 1)),
  frame_bytes       INTEGER NOT NULL,
  frame             BLOB NOT NULL
);

CREATE INDEX quarantine_last_seen_at ON quarantine (last_seen_at);
