-- Which gateway instance (its stable id, kept in the data directory) ran each execution, so a
-- restarted gateway can close what it left open, and only that.
ALTER TABLE executions ADD COLUMN instance text;
CREATE INDEX executions_open_by_instance ON executions (instance) WHERE finished_at IS NULL;
