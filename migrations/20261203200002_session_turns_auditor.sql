-- Auditors read relayed session requests without their payload (the code and files of the
-- execution asked for), as they read approvals (20261130000009): the default privileges gave
-- them every column of session_turns.
REVOKE SELECT ON session_turns FROM sandgate_auditor;
GRANT SELECT (id, session_id, owner, asked_by, key_id, kind, created_at, picked_at,
              abandoned_at, answered_at, execution_id, error_code, error)
    ON session_turns TO sandgate_auditor;
