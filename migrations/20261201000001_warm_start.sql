-- How each execution got its sandbox (`warm`: claimed from the pool; `cold`: started for it),
-- and the container that ran it (a pooled sandbox is named before it has an execution).
ALTER TABLE executions ADD COLUMN start text CHECK (start IN ('warm', 'cold'));
ALTER TABLE executions ADD COLUMN container text;
