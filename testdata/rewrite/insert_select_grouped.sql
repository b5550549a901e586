-- An aggregate SELECT: k is an uncorrelated subquery, allowed beside GROUP BY.
-- input:
INSERT INTO accounts (id, balance) SELECT account_id, sum(amount) FROM transfers GROUP BY account_id HAVING sum(amount) > 0
-- output:
-- action: rewrite
-- tables: accounts
INSERT INTO accounts (id, balance, fence_token) SELECT account_id, sum(amount), {{k accounts}} FROM transfers WHERE {{k accounts}} IS NOT NULL GROUP BY account_id HAVING sum(amount) > 0
