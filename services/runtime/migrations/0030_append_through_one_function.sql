-- The log's rules held by the database, not only by the Python store: the application role
-- appends only through event_log_append (gap-free positions from the head, the current leader
-- epoch for fenced writes) and raises an epoch only through leader_epoch_bump. migrate.py
-- revokes its direct INSERT on events and every write on event_log_head and leader_epochs.
--
-- SECURITY DEFINER: these run with the owner's rights; search_path is pinned so that a caller
-- cannot put objects of its own in front of ours.

-- Takes the head row's lock (serialising appends, see 0001) and says where the log ends.
-- The lock is the transaction's: it is held until the caller commits or rolls back.
CREATE FUNCTION event_log_head_lock(OUT head bigint, OUT now timestamptz)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
    SELECT h.position, clock_timestamp() FROM public.event_log_head h FOR UPDATE
$$;

-- Appends rows at head+1 .. head+n (n = the arrays' length), raises the head and notifies the
-- followers on `channel`. Refuses positions that do not continue the head (a gap, a forged
-- position), and rows whose epoch is not the current epoch of `leadership`.
CREATE FUNCTION event_log_append(
    positions bigint[], streams text[], versions integer[], event_ids uuid[], types text[],
    schema_versions integer[], payloads text[], correlation_ids uuid[], causation_ids uuid[],
    producers text[], epochs bigint[], recorded timestamptz, leadership text, channel text
) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
DECLARE
    last bigint;
    n integer := coalesce(cardinality(positions), 0);
    current_epoch bigint;
BEGIN
    SELECT h.position INTO last FROM public.event_log_head h FOR UPDATE;
    IF n = 0 THEN
        RETURN last;
    END IF;
    IF positions IS DISTINCT FROM ARRAY(SELECT generate_series(last + 1, last + n)) THEN
        RAISE EXCEPTION 'positions must continue the log at %', last + 1
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(epochs) AS e(epoch) WHERE e.epoch IS NOT NULL) THEN
        SELECT l.epoch INTO current_epoch FROM public.leader_epochs l
        WHERE l.name = leadership FOR SHARE;
        IF current_epoch IS NULL
           OR EXISTS (SELECT 1 FROM unnest(epochs) AS e(epoch)
                      WHERE e.epoch IS DISTINCT FROM current_epoch) THEN
            RAISE EXCEPTION 'stale leader epoch for %: the current one is %',
                leadership, coalesce(current_epoch, 0)
                USING ERRCODE = 'GW001';
        END IF;
    END IF;
    INSERT INTO public.events (position, stream, version, event_id, type, schema_version,
                               payload, correlation_id, causation_id, producer, epoch,
                               recorded_at)
    SELECT u.position, u.stream, u.version, u.event_id, u.type, u.schema_version,
           u.payload::jsonb, u.correlation_id, u.causation_id, u.producer, u.epoch, recorded
    FROM unnest(positions, streams, versions, event_ids, types, schema_versions, payloads,
                correlation_ids, causation_ids, producers, epochs)
         AS u(position, stream, version, event_id, type, schema_version, payload,
              correlation_id, causation_id, producer, epoch);
    UPDATE public.event_log_head SET position = last + n;
    PERFORM pg_notify(channel, (last + n)::text);
    RETURN last + n;
END;
$$;

-- The current epoch of `leadership` (NULL: never elected), its row share-locked until the
-- caller's transaction ends, so that a new leader's bump waits for an append fenced by it.
CREATE FUNCTION leader_epoch_share(leadership text) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
    SELECT l.epoch FROM public.leader_epochs l WHERE l.name = leadership FOR SHARE
$$;

-- A new leader of `name`: its epoch goes up by one (1 for the first), returned.
CREATE FUNCTION leader_epoch_bump(name text, leader_id text) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
    INSERT INTO public.leader_epochs AS l (name, epoch, leader_id) VALUES ($1, 1, $2)
    ON CONFLICT ON CONSTRAINT leader_epochs_pkey
    DO UPDATE SET epoch = l.epoch + 1, leader_id = $2, elected_at = now()
    RETURNING epoch
$$;

REVOKE ALL ON FUNCTION event_log_head_lock() FROM PUBLIC;
REVOKE ALL ON FUNCTION event_log_append(bigint[], text[], integer[], uuid[], text[], integer[],
    text[], uuid[], uuid[], text[], bigint[], timestamptz, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION leader_epoch_share(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION leader_epoch_bump(text, text) FROM PUBLIC;
