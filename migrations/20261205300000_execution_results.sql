-- What a python session cell displayed (E2B's code-interpreter results: the final expression's
-- MIME bundle, figures from plt.show() as PNG), bounded by the execution's output_bytes.
-- Purged with stdout and stderr by retention.
ALTER TABLE executions ADD COLUMN results jsonb;
