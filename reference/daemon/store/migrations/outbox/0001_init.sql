-- outbox.db schema 1: the §4.5.2 outbox table plus E-20's history_id and max_age_at. Times are unix milliseconds.
-- Forward-only: a later change is a new file 0002_<name>.sql; this file is never edited once released.
-- Tightenings of the §4.5.2 text, each enforcing what it states in prose: request_fingerprint is exactly 32 bytes,
-- status and attempts are NOT NULL. outbox_enqueued is a meshspec addition serving the operator listing.
CREATE TABLE outbox (
  id                  TEXT PRIMARY KEY,
  client_message_id   TEXT NOT NULL UNIQUE,
  request_fingerprint BLOB NOT NULL CHECK (typeof(request_fingerprint) = 'blob' AND length(request_fingerprint) = 32),
  payload             BLOB NOT NULL,
  enqueued_at         INTEGER NOT NULL,
  attempts            INTEGER NOT NULL DEFAULT 0,
  next_attempt_at     INTEGER NOT NULL,
  status              TEXT NOT NULL CHECK (status IN ('pending', 'inflight', 'done', 'dead', 'aborted')),
  last_error          TEXT,
  delivered_at        INTEGER,
  broker_message_id   TEXT,
  aborted_at          INTEGER,
  aborted_by          TEXT,
  superseded_by       TEXT,
  history_id          TEXT,
  max_age_at          INTEGER
);

CREATE INDEX outbox_pending ON outbox (status, next_attempt_at);
CREATE INDEX outbox_aborted ON outbox (status, aborted_at) WHERE status = 'aborted';
CREATE INDEX outbox_enqueued ON outbox (enqueued_at, id);
