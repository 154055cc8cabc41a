-- Tenancy: the keys that seal each team's secrets, and the index that authenticates tokens.

-- One key per team, kept OUTSIDE the append-only log on purpose: the log holds only secrets
-- sealed with it (TeamSecretSet.ciphertext), so deleting a team's row forgets every secret of
-- that team, even in old events (crypto-shredding). A new key is drawn on the next secret.
CREATE TABLE team_keys (
    key_id      uuid        PRIMARY KEY,
    team        text        NOT NULL UNIQUE,
    key         bytea       NOT NULL CHECK (length(key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Every API request looks its bearer token up in the log itself (so that issuing and revoking
-- take effect at once in every API process): the hashes of issued tokens, by hash.
CREATE INDEX events_token_sha256 ON events ((payload->>'token_sha256'))
    WHERE type IN ('TeamCreated', 'TeamTokenIssued');
