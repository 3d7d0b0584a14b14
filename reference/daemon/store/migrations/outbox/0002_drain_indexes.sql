-- The drain loop runs expire() and due() on every pass; without these indexes both scan every pending row, so the
-- cost of a pass (and the time the writer lock is held) grew with the backlog.
CREATE INDEX outbox_expiry ON outbox(status, max_age_at) WHERE max_age_at IS NOT NULL;
CREATE INDEX outbox_due ON outbox(status, next_attempt_at, enqueued_at, id);
