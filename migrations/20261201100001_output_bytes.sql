-- stdout and stderr are stored as the program wrote them: bytes, NUL and invalid UTF-8
-- included. As text, one NUL byte made the whole completion fail (PostgreSQL text refuses
-- 0x00), and the record lost its outcome. Read them as text with
-- convert_from(stdout, 'UTF8') where they are valid UTF-8, or encode(stdout, 'escape').
ALTER TABLE executions
    ALTER COLUMN stdout TYPE bytea USING convert_to(stdout, 'UTF8'),
    ALTER COLUMN stderr TYPE bytea USING convert_to(stderr, 'UTF8');
