-- How a session got its sandbox: claimed from the warm pool ('warm') or started for it ('cold').
-- NULL for sessions from before, and for held sessions until their sandbox starts.
ALTER TABLE sessions ADD COLUMN start text CHECK (start IN ('warm', 'cold'));
