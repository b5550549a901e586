-- The ORM upsert shape (GORM UpdateAll, Sequelize updateOnDuplicate): C in the column list and C = excluded.C.
-- input:
INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, $3), ($4, $5, $6) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence_token = excluded.fence_token
-- output:
-- action: rewrite
-- tables: accounts
WITH fenceproxy_stmt AS MATERIALIZED (SELECT {{k accounts}} AS token FROM pg_catalog.current_setting('fence.token', true) fenceproxy_token(s)) INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, CASE WHEN false THEN $3::bigint ELSE {{t}} END), ($4, $5, CASE WHEN false THEN $6::bigint ELSE {{light accounts}} END) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence_token = CASE WHEN false THEN excluded.fence_token::bigint ELSE excluded.fence_token END WHERE CASE WHEN COALESCE(accounts.fence_token, 0) OPERATOR(pg_catalog.<=) excluded.fence_token THEN true ELSE pg_catalog.concat('fenceproxy|55F01|', accounts.fence_token, '|', excluded.fence_token, '|accounts|.')::bigint IS NULL END
