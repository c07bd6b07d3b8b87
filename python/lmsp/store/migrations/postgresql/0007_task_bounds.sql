-- Task records hold whole responses: they fall under DELETE, the retention and the per-owner
-- quotas as stored responses do. Their creation time, response id and size, kept beside each
-- record (filled once from its JSON) and indexed as the responses' are.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS created_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS response_id TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS size BIGINT NOT NULL DEFAULT 0;
UPDATE tasks SET
    created_at = (convert_from(task, 'UTF8')::jsonb ->> 'created_at')::BIGINT,
    response_id = convert_from(task, 'UTF8')::jsonb ->> 'response_id',
    size = octet_length(task);
CREATE INDEX IF NOT EXISTS tasks_owner_size ON tasks (owner, created_at, id) INCLUDE (size);
CREATE INDEX IF NOT EXISTS tasks_response ON tasks (owner, response_id);
CREATE INDEX IF NOT EXISTS tasks_age ON tasks (created_at);
