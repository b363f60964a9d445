-- Human review (DESIGN 4.2/4.3): an execution whose decision says `require_approval` waits here,
-- with status `pending_approval`, until a reviewer approves or rejects it or it expires.
--
-- Written so that it composes with another migration that may create `approvals` with only the
-- named columns first: CREATE TABLE IF NOT EXISTS, then ADD COLUMN IF NOT EXISTS for the rest.
CREATE TABLE IF NOT EXISTS approvals (
    id               text PRIMARY KEY,                -- "ap_<uuid>"
    execution_id     text NOT NULL,
    status           text NOT NULL,                   -- pending, approved, rejected, expired
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    decided_at       timestamptz,                     -- approved, rejected or expired at
    reviewer_key_id  text,                            -- the key that approved or rejected
    comment          text
);
-- Who asked (key and principal: a reviewer of the same principal cannot approve).
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS requester_key_id text;
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS requester_principal text;
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS reviewer_principal text;
-- What was reviewed: the decision as the gateway will run it (backend, runtime, image, clamped
-- limits, mounts, network grant) and the policy's reasons for review.
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS runnable jsonb;
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS reasons jsonb NOT NULL DEFAULT '[]';
-- What was asked, without the code: the policy input's request (language, code sha256 and size,
-- files and sizes, network, mounts, limits, labels).
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS summary jsonb;
-- The request payload needed to run it later (language, code, files). Only kept while pending:
-- cleared when the approval is decided or expires, so program text does not linger here.
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS request jsonb;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'approvals_status_check') THEN
        ALTER TABLE approvals ADD CONSTRAINT approvals_status_check
            CHECK (status IN ('pending', 'approved', 'rejected', 'expired'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'approvals_execution_fk') THEN
        ALTER TABLE approvals ADD CONSTRAINT approvals_execution_fk
            FOREIGN KEY (execution_id) REFERENCES executions (id);
    END IF;
END;
$$;
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (expires_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS approvals_execution ON approvals (execution_id);

-- The person or system behind a key. Two keys with one principal are one party: a reviewer key
-- of the requesting principal cannot approve its own request. Default: the key's own id.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS principal text;
UPDATE api_keys SET principal = id WHERE principal IS NULL;
