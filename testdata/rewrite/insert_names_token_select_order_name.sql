-- SQLAlchemy's insertmanyvalues shape with the token column mapped: ORDER BY a name, fenced.
-- input:
INSERT INTO accounts (id, fence_token) SELECT p0::INTEGER, p1::BIGINT FROM (VALUES ($1, $2, 0), ($3, $4, 1)) AS imp_sen(p0, p1, sen_counter) ORDER BY sen_counter RETURNING id
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, fence_token) SELECT p0::int, CASE WHEN false THEN p1::bigint::bigint ELSE {{t}} END FROM (VALUES ($1, $2, 0), ($3, $4, 1)) imp_sen(p0, p1, sen_counter) WHERE {{t}} IS NOT NULL ORDER BY sen_counter RETURNING id
