-- Files collected from /output after a run, and payload retention.
-- `executions.outputs` (from 0001) holds the downloadable files: [{"path","bytes","sha256"}].
ALTER TABLE executions
    ADD COLUMN outputs_skipped   jsonb NOT NULL DEFAULT '[]',   -- [{"path","bytes"?,"reason"}] not collected
    ADD COLUMN outputs_truncated boolean NOT NULL DEFAULT false, -- the output limit stopped collection
    ADD COLUMN purged_at         timestamptz;                   -- stdout, stderr and files removed by retention
CREATE INDEX executions_unpurged ON executions (finished_at) WHERE purged_at IS NULL;
