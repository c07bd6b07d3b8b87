-- The embedded store's tables (store/sqlite.py), in PostgreSQL's types: JSON kept as the
-- bytes the service wrote (orjson), so both engines read back exactly what was kept.
CREATE TABLE responses (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    response BYTEA NOT NULL,
    input BYTEA NOT NULL,
    PRIMARY KEY (owner, id)
);
CREATE TABLE idempotency (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    status INTEGER,
    headers BYTEA,
    body BYTEA,
    PRIMARY KEY (owner, key)
);
CREATE INDEX idempotency_age ON idempotency (created_at);
CREATE TABLE tasks (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,
    model TEXT NOT NULL,
    last_event_id BIGINT NOT NULL,
    task BYTEA NOT NULL,
    PRIMARY KEY (owner, id)
);
-- Only the few tasks still running are looked up by status (the lease sweep, every second or so).
CREATE INDEX tasks_running ON tasks (status) WHERE status = 'in_progress';
