-- Events the bus refused (over its record bound, or any other refusal no retry can fix): the
-- relay records each here, sends a note of it to the dead-letter topic and goes on, so that one
-- event can never stop the log from reaching its followers. The API's /readyz and metrics
-- report them; the event itself stays in the log (replay and audit still see it).
CREATE TABLE relay_dead_letters (
    relay        text        NOT NULL,
    position     bigint      NOT NULL,
    event_id     uuid        NOT NULL,
    stream       text        NOT NULL,
    type         text        NOT NULL,
    size_bytes   integer     NOT NULL,
    reason       text        NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (relay, position)
);
