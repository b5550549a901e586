-- A database-side guard for a protected table, for the writes fenceproxy cannot see (functions, triggers,
-- connections that bypass the proxy). It refuses any UPDATE that does not raise or keep the row's token through
-- the session's own fence.token, any INSERT without one, and any UPDATE or DELETE of a row holding a newer token. Install it per table:
--   psql -v table=accounts -v column=fence_token -f deploy/guard-trigger.sql
CREATE OR REPLACE FUNCTION fenceproxy_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    col   text   := TG_ARGV[0];
    tok   text   := current_setting('fence.token', true);
    k     bigint;
    old_k bigint;
    new_k bigint;
BEGIN
    IF tok IS NULL OR tok !~ '^[0-9]{1,19}$' THEN
        RAISE EXCEPTION 'missing fencing token: writes to % need fence.token to be set', TG_TABLE_NAME
            USING ERRCODE = '55F02';
    END IF;
    k := tok::bigint;
    IF TG_OP <> 'DELETE' THEN
        EXECUTE format('SELECT ($1).%I', col) INTO new_k USING NEW;
    END IF;
    IF TG_OP <> 'DELETE' AND new_k IS DISTINCT FROM k THEN
        RAISE EXCEPTION 'unfenceable write: % must be written with fence_token = the session token', TG_TABLE_NAME
            USING ERRCODE = '55F04';
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        EXECUTE format('SELECT ($1).%I', col) INTO old_k USING OLD;
        IF coalesce(old_k, 0) > k THEN
            RAISE EXCEPTION 'stale fencing token: a newer lock holder has already written to %', TG_TABLE_NAME
                USING ERRCODE = '55F01', DETAIL = format('The row holds fencing token %s; this session presented token %s.', old_k, k);
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

DROP TRIGGER IF EXISTS fenceproxy_guard ON :"table";
CREATE TRIGGER fenceproxy_guard BEFORE INSERT OR UPDATE OR DELETE ON :"table"
    FOR EACH ROW EXECUTE FUNCTION fenceproxy_guard(:'column');
