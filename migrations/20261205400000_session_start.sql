-- How a session got its sandbox: claimed from the warm pool ('warm'), started for it ('cold'),
-- or restored from a snapshot ('restored': a fork, DESIGN 15).
-- NULL for sessions from before, and for held sessions until their sandbox starts.
ALTER TABLE sessions ADD COLUMN start text CHECK (start IN ('warm', 'cold', 'restored'));
