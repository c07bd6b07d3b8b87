-- Which replica holds a running idempotency claim, and when each replica was last seen: the
-- claim of a replica that stopped is free again (its request died with it), as the embedded
-- store frees every running claim at start-up.
ALTER TABLE idempotency ADD COLUMN holder TEXT;
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    seen_at DOUBLE PRECISION NOT NULL
);
