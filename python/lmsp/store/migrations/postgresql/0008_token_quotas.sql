-- Each token's quota (security/quota.py; NULL: no bound), changed by `lmsp token set`: a change
-- to `tokens`, so every replica hears of it as of a revoke.
ALTER TABLE tokens ADD COLUMN rpm BIGINT, ADD COLUMN tpm BIGINT, ADD COLUMN streams BIGINT;
-- What each token has used, every replica adding its own counts every few seconds: a table
-- of its own, so that counting moves no token version and wakes no replica.
CREATE TABLE token_usage (
    id TEXT PRIMARY KEY,
    requests BIGINT NOT NULL DEFAULT 0,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    limited BIGINT NOT NULL DEFAULT 0
);
