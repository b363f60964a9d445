-- How the live event stream of an execution split its output: [["stdout", bytes], ["stderr",
-- bytes], ...] in order, one entry per event. A replay after the end cuts the stored stdout and
-- stderr along it, so it is the same sequence of events (and ids) as the live stream. NULL:
-- unknown (older records, a stream that dropped output at its event bound); the replay then
-- sends each channel as one event.
ALTER TABLE executions ADD COLUMN stream_layout jsonb;
