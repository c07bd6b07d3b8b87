-- The retention sweep (expire_responses) and the per-owner quota (trim_responses) find a
-- response by its age.
CREATE INDEX IF NOT EXISTS responses_age ON responses (created_at);
CREATE INDEX IF NOT EXISTS responses_owner_age ON responses (owner, created_at);
