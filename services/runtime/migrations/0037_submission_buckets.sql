-- Per-team submission rate (a team policy's submissions_per_second): one token bucket per team,
-- shared by every API process (services/api/ratelimit.py), so that several API workers hold a
-- team to its rate together, not each to the whole rate. Not an event: a rate is a short-term
-- property of the traffic, not a fact of the cluster; losing the table loses a second's burst.
CREATE TABLE submission_buckets (
    team        text             PRIMARY KEY,
    tokens      double precision NOT NULL,
    updated_at  timestamptz      NOT NULL
);

-- Take `count` tokens of `team`'s bucket (refilled at `rate` a second up to `burst`) in one
-- round trip: the row's lock serialises concurrent takes, the database's clock refills it.
-- `granted` false leaves the tokens there are (`tokens`) untouched.
CREATE FUNCTION submission_take(team text, rate double precision, burst double precision,
                                count double precision,
                                OUT granted boolean, OUT tokens double precision)
    LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := clock_timestamp();
    have double precision;
BEGIN
    INSERT INTO submission_buckets AS b (team, tokens, updated_at)
    VALUES (submission_take.team, burst, now_)
    ON CONFLICT ON CONSTRAINT submission_buckets_pkey DO NOTHING;
    SELECT LEAST(burst, b.tokens
                        + rate * GREATEST(0, extract(epoch FROM now_ - b.updated_at))::float8)
      INTO have
      FROM submission_buckets b WHERE b.team = submission_take.team FOR UPDATE;
    granted := have >= count;
    tokens := CASE WHEN granted THEN have - count ELSE have END;
    UPDATE submission_buckets b
       SET tokens = submission_take.tokens, updated_at = GREATEST(b.updated_at, now_)
     WHERE b.team = submission_take.team;
END
$$;
