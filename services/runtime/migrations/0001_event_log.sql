-- The event log: the only source of truth. Append-only, enforced here rather than by convention.

CREATE TABLE events (
    -- Gap-free and in commit order: appends are serialised on event_log_head (see below).
    position        bigint      PRIMARY KEY CHECK (position >= 1),
    stream          text        NOT NULL,
    version         integer     NOT NULL CHECK (version >= 1),
    event_id        uuid        NOT NULL UNIQUE,
    type            text        NOT NULL,
    schema_version  integer     NOT NULL CHECK (schema_version >= 1),
    payload         jsonb       NOT NULL,
    correlation_id  uuid,
    causation_id    uuid,
    producer        text        NOT NULL,
    epoch           bigint,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    -- Optimistic concurrency: two writers can never both record version N of a stream.
    CONSTRAINT events_stream_version_key UNIQUE (stream, version)
);

-- One row holding the last position. Every append updates it first, so its row lock serialises
-- appends: positions are handed out in commit order, a rolled-back append returns its numbers,
-- and a reader tailing by position never sees N+1 before N has committed.
CREATE TABLE event_log_head (
    id        boolean PRIMARY KEY DEFAULT true CHECK (id),
    position  bigint  NOT NULL CHECK (position >= 0)
);
INSERT INTO event_log_head (id, position) VALUES (true, 0);

CREATE FUNCTION events_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the event log is append-only: % on events is not allowed', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();

CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();

CREATE TRIGGER event_log_head_no_delete
    BEFORE DELETE OR TRUNCATE ON event_log_head
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();
