-- inbox.db schema 3: hook runs (§6, E-48), claim -> process -> mark. One row per (inbox row, matching hook),
-- inserted in the transaction that inserts the inbox row, so no message reaches a hook before it is stored and no
-- crash loses a run. state follows spec/tables/hook_runs.yaml; finished rows (done, failed, timed_out) are kept as
-- history. message_event is the SSE id of the message's `message` event (a hook_executed event names it). claim_owner names the daemon process holding a claim (a claim of another owner is a dead worker's);
-- pgid and pgid_started identify the hook's process group (its leader's start time, so a reused id is not killed).
CREATE TABLE hook_runs (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  inbox_seq         INTEGER NOT NULL REFERENCES inbox (seq),
  message_event     INTEGER,
  client_message_id TEXT NOT NULL,
  hook              TEXT NOT NULL,
  state             TEXT NOT NULL CHECK (state IN ('pending', 'claimed', 'done', 'failed', 'timed_out')),
  claims            INTEGER NOT NULL DEFAULT 0 CHECK (claims >= 0),
  enqueued_at       INTEGER NOT NULL,
  claimed_at        INTEGER,
  lease_until       INTEGER,
  claim_owner       TEXT,
  pgid              INTEGER,
  pgid_started      INTEGER,
  finished_at       INTEGER,
  result            TEXT CHECK (result IS NULL OR json_valid(result)),
  UNIQUE (inbox_seq, hook)
);

CREATE INDEX hook_runs_state ON hook_runs (state, id);
