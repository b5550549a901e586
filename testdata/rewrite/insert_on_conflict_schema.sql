-- ON CONFLICT on a schema-qualified target.
-- input:
INSERT INTO public.accounts (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET balance = 0
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO public.accounts (id, fence_token) VALUES (1, {{k accounts}}) ON CONFLICT (id) DO UPDATE SET balance = 0, fence_token = {{light accounts}} WHERE CASE WHEN COALESCE(public.accounts.fence_token, 0) <= {{light accounts}} THEN true ELSE (((('fenceproxy|55F01|' || public.accounts.fence_token::text) || '|') || pg_catalog.ltrim(pg_catalog.current_setting('fence.token'), '0')) || '|accounts|.')::int8 IS NULL END
