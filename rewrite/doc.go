// Package rewrite makes writes to protected tables check fencing tokens inside
// PostgreSQL. It is pure: SQL text and the protected-table configuration in,
// a Plan (pass, rewrite or refuse) out. The proxy calls it for every simple
// Query message and every extended-protocol Parse, through a Cache.
//
// # Mechanism
//
// For a protected table T with token column C, every INSERT, UPDATE and
// DELETE of T is rewritten on the pg_query parse tree (and deparsed; SQL text
// is never spliced) so that PostgreSQL itself compares the statement's token
// t with the row's C, under the row lock, in the same statement:
//
//	WITH fenceproxy_stmt AS MATERIALIZED (SELECT k AS token
//	  FROM pg_catalog.current_setting(setting, true) AS fenceproxy_token(s))
//	UPDATE T SET ..., C = check
//	WHERE (cond) AND t IS NOT NULL
//
//	check: (SELECT CASE WHEN COALESCE(T.C, 0) OPERATOR(pg_catalog.<=) fenceproxy_stmt.token
//	                    THEN fenceproxy_stmt.token
//	                    ELSE pg_catalog.concat('fenceproxy|55F01|', T.C, '|', fenceproxy_stmt.token, '|T|.')::bigint END
//	        FROM fenceproxy_stmt)
//
// where k validates the session's token s (below) and t is
// (SELECT fenceproxy_stmt.token FROM fenceproxy_stmt). t IS NOT NULL is a
// one-time filter that PostgreSQL evaluates before it reads any row: it is the
// CTE's first read, which runs k, so a missing or invalid token raises before
// any row is touched, and from then on every read of the CTE returns the row
// it stored. The row check is the value written to C: PostgreSQL computes an
// UPDATE's SET list only for the rows it writes, once every condition of the
// WHERE has held (and again on the newest row version when it re-checks a row
// it waited for), so no row the statement leaves alone reaches the check,
// whatever order the planner evaluates the WHERE in, and the client's WHERE
// stays as it is (index scans; volatile functions run once per row).
//
// DELETE has no SET list: its WHERE is
//
//	(cond) AND CASE WHEN (cond) THEN check IS NOT NULL ELSE false END AND t IS NOT NULL
//
// (check is the token or raises, never NULL). INSERT gets the WITH, C in its column
// list and t in every row (VALUES, SELECT, DEFAULT VALUES; INSERT ... SELECT
// also gets the one-time filter in its WHERE); ON CONFLICT DO UPDATE gets
// C = excluded.C and the row check against excluded.C as its WHERE: the token
// the conflicting row is checked against is, by construction, the one written
// into it, and the one the inserted row carries. The golden files in
// testdata/rewrite at the repository root show every form.
//
// The token k, in the CTE whose FROM reads the setting once, is
//
//	CASE WHEN <s is a valid token> THEN s::bigint ELSE <55F02/55F03 marker>::bigint END
//
// evaluated at execution time. The token is the one in force when the
// statement runs, also for a statement prepared (extended protocol or
// PREPARE) long before and executed with a cached generic plan; SET, SET
// LOCAL, RESET, set_config and transaction rollback behave exactly as in
// PostgreSQL because the setting is PostgreSQL's own. "Valid" is the rule of
// ValidToken, written in SQL as one regular expression match (tokenPattern),
//
//	s COLLATE "C" ~ '^(?!0+$)([0-9]{1,18}|[0-8][0-9]{18}|9[0-1][0-9]{17}|...|9223372036854775807)$'
//
// (with the operator and the collation qualified, see below; the match
// cannot fail, and CASE runs s::bigint only when it holds). The server
// parses, analyses and plans the check in every simple-query statement: one
// operator on one constant costs it much less than the string functions
// (ltrim, length and comparisons) it replaced; it compiles the expression
// once per session (bench/fence-sql-phases, docs/fence-sql.md).
//
// # Inline tokens
//
// A caller that knows the token in force wherever a text's statements run
// (a transaction pool, which has just set it) asks for Settings.InlineToken:
// the token is then a constant of the rewrite instead of the CTE's read of
// the setting, and the one-time filter checks the setting against it:
//
//	CASE WHEN current_setting(setting, true) COLLATE "C" = 'T' THEN 'T'::bigint
//	     ELSE <55F03 marker with the setting's value>::bigint END IS NOT NULL
//
// The statement runs with T only when the setting is exactly T as it starts,
// where the CTE form would read T, so both forms accept the same writes; any
// other value fails it before a row is touched. It costs the server about
// half as much (no CTE, no InitPlans, no regular expression). A plan holds
// the text cut where T goes (Plan.TokenSegs) and is cached whatever the
// token; Plan.WithToken fills it in. See inline.go.
//
// # The fence cannot be redefined
//
// Every operator, function, type, cast and collation the rewrite adds is
// pg_catalog's by name: OPERATOR(pg_catalog.<=), OPERATOR(pg_catalog.~),
// pg_catalog.concat, ::pg_catalog.int8, COLLATE pg_catalog."C". The deparser
// prints pg_catalog.int8 as bigint, a type keyword that always means
// pg_catalog's. COALESCE, CASE, IS [NOT] NULL, AND and OR are syntax. So no
// search_path (SET, startup option, ALTER ROLE/DATABASE SET), user operator,
// function, type, domain or collation changes what the fence means. Markers
// are built with pg_catalog.concat, which turns a NULL part into an empty string and so
// always yields a string that raises. The client's own expressions keep
// their meaning: the fence never reinterprets them.
//
// # One token per statement
//
// A value written to C or compared with it is never the setting read again:
// it is t, a read of one MATERIALIZED CTE. PostgreSQL evaluates a CTE once,
// at its first read, and every later read sees the stored row, so whatever
// the statement runs after that (a set_config in a SET list, in the WHERE, in
// a VALUES row, in a function it calls), the token it checks and the token it
// writes are one value. For UPDATE, DELETE and INSERT ... SELECT the first
// read is the one-time filter, before the first row is read; for a
// multi-row VALUES, C is put first in the column list and rows are built in
// the order written, so it is the first thing the VALUES evaluates. Only a
// single-row INSERT ... VALUES is built in the table's column order, so its
// other columns may come first: a set_config there sets the token the whole
// statement then uses (checked and written alike), exactly as a SET just
// before it would. Whenever it is read, the value is validated by k at that
// read. Each data-modifying statement in a text has its own CTE on
// its own WITH (the innermost scope of its references); its name is reserved
// and a client CTE of that name is refused (55F04), so nothing can shadow it.
//
// # Multi-row VALUES
//
// Each reference to t is a scalar subquery, planned as an InitPlan, and
// PostgreSQL's planning time grows quadratically with the number of
// InitPlans at one query level (measured on PostgreSQL 15, fastest of 7-15
// runs on a loaded machine: a 1000-row VALUES with t in every row plans in
// 52 ms instead of 1.3-1.8; 4000 rows in 630 ms instead of 12-17).
// So only the first row carries t when every item of the VALUES is inert
// (constants, parameters, DEFAULT, NULL, arrays of those, casts of those to
// types the grammar qualifies with pg_catalog: int, bigint, numeric, boolean,
// varchar, timestamp, ...): nothing can then run between rows that changes
// the setting (only table-owner code: triggers, defaults, domain checks and
// index expressions of T, see Limits), and the later rows carry the
// setting's value, pg_catalog.current_setting(setting)::bigint, which equals
// t. When an item may run code (a function call, an operator, a cast to a
// type found through search_path, which may be a domain with a CHECK), every
// row carries t, at that planning cost.
//
// # Writes that name the token column
//
// With token_column_writes: override (the default; Table.RefuseTokenColumnWrites
// false), a write that names C (SET C = ..., C in an INSERT column list, C =
// excluded.C, as ORMs that map every column send) is fenced as if C were not
// named: the client's value v becomes
//
//	CASE WHEN false THEN (v)::bigint ELSE t END
//
// which PostgreSQL never evaluates (the WHEN false arm is removed at plan
// time) but still types: a parameter in v gets the type the assignment to a
// bigint column would give it (or keeps the one the client declared), so
// Describe and Bind see the client's own parameters. DEFAULT becomes t; in ON
// CONFLICT DO UPDATE, excluded.C. The row check is unchanged. A multiple-
// column assignment SET (a, C) = ..., an assignment to part of C, C named
// twice, INSERT ... SELECT * and set operations whose output for C cannot be
// told are refused (55F04). With token_column_writes: refuse, every write
// naming C is refused (55F04).
//
// # Why a cast marker
//
// Plain SQL cannot raise a chosen SQLSTATE. Casting a marker string to int8
// raises 22P02 `invalid input syntax for type bigint: "fenceproxy|55F01|7|5|T|."`;
// the proxy recognises the marker in the ErrorResponse (DecodeMarker, which
// does not depend on the message language) and sends the client the
// contract's SQLSTATE, message, DETAIL and HINT (Marker.Describe). It is a
// real server-side error: the statement changes nothing, the transaction is
// aborted, later statements get 25P02. The marker always includes a part that
// is not a constant (the row's C, or the setting's value): PostgreSQL folds
// constant expressions at plan time even inside CASE arms that are never
// taken, so a constant marker would raise for every statement.
//
// # Why the check is in the SET list, or under a CASE
//
// The planner orders the WHERE's quals as it likes (cheapest first, index
// quals into the scan), and AND/OR do not promise an evaluation order, so a
// check among them could raise for a row the statement does not write. An
// UPDATE's SET list is computed only for the rows that passed the whole
// WHERE: its check is there, in the value it writes to C. A DELETE's check
// is wrapped in CASE WHEN (cond) THEN ... ELSE false END: CASE does fix the
// order, so a row that does not satisfy the statement's own condition never
// reaches the 55F01 arm; the leading plain (cond) keeps the statement's index
// use. ON CONFLICT DO UPDATE's check against excluded.C is its WHERE, under
// the same CASE when the client's DO UPDATE has a WHERE.
//
// # Why the one-time filter
//
// t IS NOT NULL has no column references, so PostgreSQL evaluates it once, as
// a One-Time Filter before scanning (t never yields NULL: k raises instead).
// A missing (55F02) or invalid (55F03) token thus fails the statement even
// when no row matches, and before any row is changed; and it is the first
// read of the statement's token. INSERT ... SELECT gets the same filter in
// its SELECT's WHERE.
//
// # Properties
//
//   - Rows whose C > t are never changed: the statement fails with 55F01 and
//     changes nothing. C = t is accepted (the same holder writes twice); NULL
//     counts as 0.
//   - Under READ COMMITTED, an UPDATE, DELETE or ON CONFLICT DO UPDATE that
//     waits for a row lock re-evaluates the whole WHERE on the new row
//     version once the lock holder commits, and an UPDATE computes its SET
//     list again from that version (EvalPlanQual), so a stale writer
//     queued behind a newer holder gets 55F01, not a silent "0 rows". Under
//     REPEATABLE READ and SERIALIZABLE it gets PostgreSQL's 40001 as usual.
//   - Every new row gets C = t; a write naming C writes t too (or is refused
//     with token_column_writes: refuse).
//   - The check is statement-level and atomic with the write: no window
//     between check and write, no extra round trip, no stored procedures or
//     triggers to install.
//   - Reads and statements writing no protected table pass unchanged (the
//     original text; a prefilter, MayTouch, skips parsing entirely for text
//     that cannot concern a protected table or the token: parsing happens
//     only for text holding a write keyword token (insert, update, delete,
//     merge, truncate, copy) and an identifier naming a protected table, or
//     DO, or an identifier naming set_config or the token setting).
//
// # Reading SQL as the server does
//
// Every text is read under the session's client_encoding, server_encoding
// and standard_conforming_strings (Settings, from the server's
// ParameterStatus): decoded to UTF-8 exactly (reading.go), split into tokens
// by a lexer with the server's own rules (lexer.go), and the prefilter looks
// at decoded tokens, so no escape, quoting, comment or Unicode spelling hides
// a name. With standard_conforming_strings off, each '...' literal holding a
// backslash is given to pg_query (which always reads it on) as E'...', which
// is how the server scans it. A rewrite is re-encoded to the client's
// encoding. Text that cannot be read exactly (an encoding the proxy cannot
// decode, invalid bytes, settings that an unanswered earlier statement may
// have changed) is refused when its raw bytes hold a keyword that could
// write. DO blocks are always analysed, after decoding (do.go). See
// docs/reading-sql.md.
//
// # Where statements are found
//
// The whole tree is walked: CTEs (also under SELECT and nested), several
// statements in one text, PREPARE bodies, EXPLAIN [ANALYZE], COPY (query) TO,
// CREATE TABLE AS. Refused with 55F04: TRUNCATE, COPY ... FROM and MERGE on a
// protected table, TRUNCATE ... CASCADE reaching one (bycheck.go), WHERE CURRENT OF, INSERT
// without a column list (the position of C is unknown), the writes naming C
// listed above, a client CTE named fenceproxy_stmt, an unqualified name that
// could be two configured tables with different token columns, a DO block
// whose static SQL writes a protected table (or whose body cannot be parsed
// and names one), and text the parser rejects that mentions a protected name
// and a write keyword. SET and set_config of the token
// setting to an invalid literal are refused with 55F03; valid ones are
// reported in Plan.TokenSet.
//
// # Text cache
//
// The Cache keeps plans by text (and the Settings it was read under). A text
// the raw prefilter passes (no write keyword, DO, set_config or the token
// setting: rawMayTouch) is never looked up. One the lexer then passes without
// parsing (a write of no protected table) is kept only when it holds no
// constant that could vary (fixedText: no quote, no digit but a parameter's,
// as the extended protocol sends them): texts whose literals differ each
// time would push plans out.
//
// # Shape cache
//
// Code that inlines its values (UPDATE accounts SET balance = balance + 17
// WHERE id = 4242) sends a new text every time, so a Cache keyed by text
// never hits. On a text miss the Cache therefore looks up the text's shape
// (shape.go): the decoded text as pg_query reads it, each constant replaced
// by a NUL-delimited placeholder that records the constant's class (an
// integer that fits 32 bits, another number, and each string form: '...',
// E'...', N'...', U&'...', B'...', X'...', dollar-quoted), so that two texts share a
// shape only when they differ in constant values alone and the parser
// builds the same node kinds for both. A unary minus folded into a number
// is part of the constant (unless ::, [ or . follows, which bind tighter).
// The first two texts of a shape are planned in full, and at the second
// (building costs about two plans, wasted on shapes seen once, such as a
// VALUES list of a new length) its normalised form (each constant a
// parameter $1..$n) is planned once (parse, fence, deparse) and kept as a
// template: the deparsed text cut at its parameters, which the
// lexer finds (never a string search). A later text of the shape gets the
// template with its own constants, as the client spelled them (after
// decoding and the standard_conforming_strings normalisation), put in at
// each parameter (a DELETE's fence repeats the WHERE, so a constant may
// appear several times), a negative one in parentheses; then re-encoded for the
// client, and re-verified when Config.Verify is set. Template hits count as
// cache hits. A template of one statement whose constants are all numbers
// and that returns no rows also carries itself as a statement the server can
// prepare (Plan.Prepared, prepared.go): its parameters typed as the parser
// types the numbers they stand for, so that EXECUTE with the text's numbers
// as arguments (Plan.Args) runs the filled template; the proxy prepares it
// once per upstream connection.
//
// Not normalised (the text is planned in full, or the constant stays in the
// key as written):
//
//   - texts with a statement that does not start with SELECT, INSERT,
//     UPDATE, DELETE, WITH or VALUES (SET, DO, COPY, DDL, PREPARE, EXPLAIN:
//     their analysis reads constants, or their grammar needs them), texts
//     naming set_config or the token setting anywhere, texts with a
//     parameter, and texts longer than the text cache's limit;
//   - constants right after an identifier other than an operand keyword
//     (SELECT, WHERE, AND, THEN, LIMIT, ...) or after ')': typed literals
//     (DATE '...', INTERVAL '1' DAY, "char" 'x', numeric(10,2) '1'), ORDER
//     BY / GROUP BY ordinals, FETCH FIRST n, AT TIME ZONE '...'; numbers in
//     other notations (0x1F, 1_000);
//   - texts with a parenthesised constant followed by a subscript or field,
//     (-1)[1], and with a bit string holding a backslash: the full plan
//     respells or refuses those by their value (deparse.go).
//
// Why it is safe: the fence's analysis of plain DML never reads a
// constant's value, only where constants are and of which node kind (a
// parameter and a constant are both inert, and a token-column write
// becomes CASE WHEN false THEN (v)::int8 ELSE t END for either), so a
// template is a function of the shape. That is also checked, not assumed:
// a template is kept only when the normalised text parses, its plan has the
// same outcome and tables as the full plan of the text it was built from,
// and the template filled with that text's constants parses to the same
// tree (locations aside) as the full rewrite; otherwise the shape is marked
// and each of its texts is planned in full. Refusals and token-setting plans
// are never templated. TestShapeCacheEquivalence and FuzzShapeCache compare
// template and full rewrite (parse trees, and that the result is fenced) for
// statements with constants of every form.
//
// # Limits
//
//   - DDL naming a protected table is refused unless its form is on the
//     allowlist of additive changes in ddl.go (docs/ddl.md); so are CREATE
//     RULE, CREATE VIEW and SQL-standard function bodies that name one.
//   - Writes not visible in the statement text are not fenced: functions and
//     procedures (SQL-standard bodies are refused by the DDL rule when they
//     name a protected table; a DO block's static SQL is analysed, its
//     dynamic SQL, EXECUTE of a string built at run time, is not seen),
//     triggers, rules created directly,
//     updatable views over a protected table, and writes through a parent
//     table or partition that is not itself configured. Configure the table
//     the application writes through.
//   - Names are compared as PostgreSQL stores them after case folding of
//     unquoted identifiers. A table configured unqualified matches it in
//     every schema; search_path is not known to the proxy.
//   - The statement's token is read once per data-modifying statement: two
//     writes in one text (or two CTE writes in one statement) each read it
//     once, and a set_config between them changes the second's. Each is
//     consistent in itself: what it checks is what it writes.
//   - Code of T's owner that runs while rows are inserted (triggers, column
//     defaults, domain CHECKs, index expressions) could change the setting
//     between the rows of an inert multi-row VALUES, whose later rows read
//     the setting; and a BEFORE INSERT trigger can change the excluded.C that
//     ON CONFLICT DO UPDATE checks and writes. The in-database guard covers
//     code that runs inside the server.
//   - A DELETE's condition is evaluated twice per candidate row (plain and in
//     the CASE), except its top-level conjuncts that call a function outside
//     a short list of side-effect-free ones: those appear only in the CASE,
//     so nextval(), random() and user functions run once per row, as in the
//     client's statement (at the price of index use on them). An UPDATE's
//     condition is evaluated once, as written.
//   - The deparser prints a parenthesised constant with a subscript or field,
//     (-1)[1], without its parentheses; negative numbers are respelled so that
//     it prints them right ((- 1)[1], which parses to the same tree), other
//     constants there and bit strings holding a backslash (which it prints as
//     bE'...') are refused (55F04): PostgreSQL rejects them anyway (deparse.go).
//   - A rewritten statement is deparsed, so comments and formatting of the
//     whole text are lost; the deparser emits PostgreSQL 17 syntax, which
//     PostgreSQL 15 accepts for everything the rewriter adds.
//   - Unquoted identifiers are downcased in ASCII only; a server with a
//     single-byte encoding may also downcase non-ASCII letters (by its
//     locale): protected table names with non-ASCII letters should be
//     configured and written quoted there.
package rewrite
