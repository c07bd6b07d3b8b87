-- Every change to the tokens is announced on the channel lmsp_tokens (delivered at commit):
-- each replica keeps the active tokens in memory and rereads them when told, so a request is
-- authenticated without a round trip to the database (tokens/postgres.py).
CREATE OR REPLACE FUNCTION lmsp_token_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE token_changes SET version = version + 1;
    PERFORM pg_notify('lmsp_tokens', '');
    RETURN NULL;
END
$$;
