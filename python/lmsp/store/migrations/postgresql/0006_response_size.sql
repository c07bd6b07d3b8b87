-- The per-owner byte quota (trim_response_bytes) sums each response's size: kept beside it
-- (its response and input as stored, JSON bytes) and in an index with the owner's order, so
-- that the sum reads the index, not every response's row.
ALTER TABLE responses ADD COLUMN IF NOT EXISTS size BIGINT NOT NULL DEFAULT 0;
UPDATE responses SET size = octet_length(response) + octet_length(input);
CREATE INDEX IF NOT EXISTS responses_owner_size ON responses (owner, created_at, id) INCLUDE (size);
