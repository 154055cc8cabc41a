-- Snapshots of the scheduler's folded state: a cache that shortens replay, never the truth.
-- A snapshot covers the log up to `position`; `code_version` names the code and event schemas
-- that produced it, and a scheduler only loads snapshots of its own version.
CREATE TABLE scheduler_snapshots (
    id            bigserial   PRIMARY KEY,
    position      bigint      NOT NULL CHECK (position >= 0),
    code_version  text        NOT NULL,
    state         bytea       NOT NULL,
    size_bytes    integer     NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX scheduler_snapshots_latest ON scheduler_snapshots (code_version, position DESC);
