-- What the log's followers remember: the relay's position, consumers' inboxes, leader epochs.

-- The outbox relay's last position acknowledged by Kafka, per relay name.
CREATE TABLE relay_positions (
    name        text        PRIMARY KEY,
    position    bigint      NOT NULL CHECK (position >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Events a consumer has applied, written in the same transaction as the effects, so that a
-- redelivered event changes nothing.
CREATE TABLE inbox (
    consumer      text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- The current epoch per leadership (the scheduler's is "scheduler"); appends that carry an
-- older epoch are refused in their own transaction.
CREATE TABLE leader_epochs (
    name        text        PRIMARY KEY,
    epoch       bigint      NOT NULL CHECK (epoch >= 1),
    leader_id   text        NOT NULL,
    elected_at  timestamptz NOT NULL DEFAULT now()
);
