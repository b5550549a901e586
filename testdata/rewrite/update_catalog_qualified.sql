-- db.schema.table: the reference keeps all parts.
-- input:
UPDATE mydb.public.accounts SET balance = 1 WHERE id = 2
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token) UPDATE mydb.public.accounts SET balance = 1, fence_token = {{t}} WHERE id = 2 AND CASE WHEN id = 2 THEN CASE WHEN COALESCE(mydb.public.accounts.fence_token, 0) OPERATOR(pg_catalog.<=) {{t}} THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', mydb.public.accounts.fence_token, '|', {{t}}, '|accounts|.')::bigint IS NULL END ELSE false END AND {{t}} IS NOT NULL
