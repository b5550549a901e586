-- ON CONFLICT on a schema-qualified target.
-- input:
INSERT INTO public.accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET balance = 0
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO public.accounts (id, fence_token) VALUES (1, {{t}}) ON CONFLICT (id) DO UPDATE SET balance = 0, fence_token = excluded.fence_token WHERE CASE WHEN COALESCE(public.accounts.fence_token, 0) OPERATOR(pg_catalog.<=) excluded.fence_token THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', public.accounts.fence_token, '|', excluded.fence_token, '|accounts|.')::bigint IS NULL END
