-- A whole group of appends in one statement (issue 15). The head row's lock serialises every
-- append and is held until the appending transaction ends, its WAL flush included; with the
-- lock, the versions' read, the insert and the commit as four round trips, the log held the
-- lock about 80% of the time under single submissions, each transaction waiting ~8 ms for it.
-- This function takes the lock, reads the versions (a statement after the lock, so that its
-- snapshot holds every append committed before ours), skips each request whose expected
-- versions do not hold and appends the others through event_log_append (0030: its checks, the
-- epoch fence and the notification stay the one definition): one round trip inside the lock,
-- and none more when the caller runs it as its own transaction (a fenced append too: the
-- epoch's check and share lock come first, inside it).
--
-- Per append (in request order; a request's appends are adjacent and name distinct streams):
-- its request's number, its stream, its expected version (NULL: any) and its number of rows.
-- Per row (in the appends' order): the columns of event_log_append that the caller decides.
-- Returned: the recorded time, per row its position and version (NULL: its request was not
-- written), and per append the version its stream had when its request was checked.
CREATE FUNCTION event_log_append_checked(
    append_requests integer[], append_streams text[], append_expected integer[],
    append_counts integer[], event_ids uuid[], types text[], schema_versions integer[],
    payloads text[], correlation_ids uuid[], causation_ids uuid[], producers text[],
    epochs bigint[], leadership text, channel text,
    OUT recorded timestamptz, OUT positions bigint[], OUT versions integer[],
    OUT checked integer[]
)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
DECLARE
    last bigint;
    n_appends integer := coalesce(cardinality(append_streams), 0);
    n_rows integer := coalesce(cardinality(event_ids), 0);
    slot integer[];        -- per append: where its stream's version is in `latest`
    latest integer[];      -- per stream named: its version as the requests are applied
    row_streams text[];
    next_position bigint;
    a integer := 1;
    b integer;
    r integer := 1;
    fits boolean;
    w_positions bigint[]; w_streams text[]; w_versions integer[]; w_event_ids uuid[];
    w_types text[]; w_schema_versions integer[]; w_payloads text[]; w_correlation_ids uuid[];
    w_causation_ids uuid[]; w_producers text[]; w_epochs bigint[];
    fence bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(epochs) AS e(epoch) WHERE e.epoch IS NOT NULL) THEN
        -- A fenced append: the epoch row's share lock comes before the head row's, as in every
        -- fenced append (a new leader's bump waits for it), and a stale epoch is refused before
        -- anything else, even when every request would conflict; event_log_append checks again.
        fence := leader_epoch_share(leadership);
        IF fence IS NULL
           OR EXISTS (SELECT 1 FROM unnest(epochs) AS e(epoch) WHERE e.epoch IS DISTINCT FROM fence)
        THEN
            RAISE EXCEPTION 'stale leader epoch for %: the current one is %',
                leadership, coalesce(fence, 0)
                USING ERRCODE = 'GW001', DETAIL = coalesce(fence, 0)::text;
        END IF;
    END IF;
    SELECT h.position, clock_timestamp() INTO last, recorded
    FROM public.event_log_head h FOR UPDATE;
    -- A new statement: its snapshot holds every append committed before the lock was ours.
    WITH named AS (
        SELECT s.stream, s.ord FROM unnest(append_streams) WITH ORDINALITY AS s(stream, ord)
    ), streams AS (
        SELECT d.stream, row_number() OVER (ORDER BY d.stream)::integer AS slot
        FROM (SELECT DISTINCT n.stream FROM named n) d
    )
    SELECT (SELECT array_agg(st.slot ORDER BY n.ord) FROM named n JOIN streams st USING (stream)),
           (SELECT array_agg(coalesce((SELECT max(e.version) FROM public.events e
                                       WHERE e.stream = st.stream), 0) ORDER BY st.slot)
            FROM streams st)
    INTO slot, latest;
    positions := array_fill(NULL::bigint, ARRAY[n_rows]);
    versions := array_fill(NULL::integer, ARRAY[n_rows]);
    row_streams := array_fill(NULL::text, ARRAY[n_rows]);
    checked := array_fill(NULL::integer, ARRAY[n_appends]);
    next_position := last;
    WHILE a <= n_appends LOOP
        -- The request's appends are a .. b - 1: all of them are checked before any is applied.
        b := a;
        fits := true;
        WHILE b <= n_appends AND append_requests[b] = append_requests[a] LOOP
            checked[b] := latest[slot[b]];
            IF append_expected[b] IS NOT NULL AND append_expected[b] <> checked[b] THEN
                fits := false;
            END IF;
            b := b + 1;
        END LOOP;
        FOR i IN a .. b - 1 LOOP
            FOR e IN 1 .. append_counts[i] LOOP
                IF r > n_rows THEN
                    RAISE EXCEPTION 'the appends count more rows than the % given', n_rows
                        USING ERRCODE = 'check_violation';
                END IF;
                row_streams[r] := append_streams[i];
                IF fits THEN
                    next_position := next_position + 1;
                    latest[slot[i]] := latest[slot[i]] + 1;
                    positions[r] := next_position;
                    versions[r] := latest[slot[i]];
                END IF;
                r := r + 1;
            END LOOP;
        END LOOP;
        a := b;
    END LOOP;
    IF r <> n_rows + 1 THEN
        RAISE EXCEPTION 'the appends count % rows, not the % given', r - 1, n_rows
            USING ERRCODE = 'check_violation';
    END IF;
    IF next_position = last THEN
        RETURN;  -- nothing written (every request conflicted, or none had rows)
    END IF;
    IF next_position - last = n_rows THEN
        PERFORM event_log_append(positions, row_streams, versions, event_ids, types,
                                 schema_versions, payloads, correlation_ids, causation_ids,
                                 producers, epochs, recorded, leadership, channel);
        RETURN;
    END IF;
    SELECT array_agg(u.p ORDER BY u.o), array_agg(u.s ORDER BY u.o), array_agg(u.v ORDER BY u.o),
           array_agg(u.id ORDER BY u.o), array_agg(u.t ORDER BY u.o),
           array_agg(u.sv ORDER BY u.o), array_agg(u.pl ORDER BY u.o),
           array_agg(u.co ORDER BY u.o), array_agg(u.ca ORDER BY u.o),
           array_agg(u.pr ORDER BY u.o), array_agg(u.ep ORDER BY u.o)
    INTO w_positions, w_streams, w_versions, w_event_ids, w_types, w_schema_versions,
         w_payloads, w_correlation_ids, w_causation_ids, w_producers, w_epochs
    FROM unnest(positions, row_streams, versions, event_ids, types, schema_versions, payloads,
                correlation_ids, causation_ids, producers, epochs)
         WITH ORDINALITY AS u(p, s, v, id, t, sv, pl, co, ca, pr, ep, o)
    WHERE u.p IS NOT NULL;
    PERFORM event_log_append(w_positions, w_streams, w_versions, w_event_ids, w_types,
                             w_schema_versions, w_payloads, w_correlation_ids, w_causation_ids,
                             w_producers, w_epochs, recorded, leadership, channel);
END;
$$;

REVOKE ALL ON FUNCTION event_log_append_checked(integer[], text[], integer[], integer[], uuid[],
    text[], integer[], text[], uuid[], uuid[], text[], bigint[], text, text) FROM PUBLIC;
