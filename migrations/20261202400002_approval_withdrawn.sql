-- An agent may withdraw its own request while it waits for review (issue 16 item 11): the
-- approval becomes `withdrawn`, its execution `cancelled` (reason `approval.withdrawn`).
ALTER TABLE approvals DROP CONSTRAINT IF EXISTS approvals_status_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_status_check
    CHECK (status IN ('pending', 'approved', 'rejected', 'expired', 'withdrawn'));
