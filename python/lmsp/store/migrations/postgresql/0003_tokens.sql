-- The bearer tokens (security/tokens.py), shared by every replica: the same columns as the
-- embedded tokens.sqlite3, so only each token's SHA-256 is kept here too.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    hash BYTEA NOT NULL,
    name TEXT,
    scopes TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
-- One row that every change to `tokens` moves, in that change's transaction (a trigger, so an
-- edit by hand counts as well): a replica reads it on each request and rereads the tokens only
-- when it moved, the way the embedded store watches SQLite's data_version.
CREATE TABLE token_changes (version BIGINT NOT NULL);
INSERT INTO token_changes (version) VALUES (0);
CREATE FUNCTION lmsp_token_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE token_changes SET version = version + 1;
    RETURN NULL;
END
$$;
CREATE TRIGGER tokens_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tokens
    FOR EACH STATEMENT EXECUTE FUNCTION lmsp_token_changed();
