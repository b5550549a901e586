# ActiveRecord through fenceproxy: one real program per compatibility cell (see compat/README.md).
#
# Environment (set by compat/compat_test.go): PGHOST, PGPORT (the proxy), PGUSER, PGDATABASE, DIRECT_PORT (the
# same PostgreSQL without the proxy, for checking rows), TABLE (a protected table with columns id bigint primary
# key, balance numeric, note text, fence_token bigint), OLD_TOKEN < NEW_TOKEN.
#
# Prints "ok CELL" or "FAIL CELL: why" per cell and exits non-zero if any cell failed.
require "active_record"
require "pg"

TABLE = ENV.fetch("TABLE")
OLD = Integer(ENV.fetch("OLD_TOKEN"))
NEW = Integer(ENV.fetch("NEW_TOKEN"))
$failed = 0

def conf(options = nil)
  c = { adapter: "postgresql", host: ENV.fetch("PGHOST"), port: Integer(ENV.fetch("PGPORT")),
        username: ENV.fetch("PGUSER"), database: ENV.fetch("PGDATABASE"), prepared_statements: true }
  c[:options] = options if options
  c
end

# Mapped: the model knows every column, the token column included (ActiveRecord reflects the table).
class Mapped < ActiveRecord::Base
  self.table_name = TABLE
  self.partial_writes = false # full-row INSERT and UPDATE, as Rails 7 does for inserts by default
end

# Legacy: a model that never heard of the token column.
class Legacy < ActiveRecord::Base
  self.table_name = TABLE
  self.ignored_columns = ["fence_token"]
end

DIRECT = PG.connect(host: ENV.fetch("PGHOST"), port: Integer(ENV.fetch("DIRECT_PORT")),
                    user: ENV.fetch("PGUSER"), dbname: ENV.fetch("PGDATABASE"))

def row(id)
  r = DIRECT.exec_params("SELECT balance::int::text, fence_token FROM #{TABLE} WHERE id = $1", [id]).to_a.first
  r && [r["balance"], r["fence_token"]&.to_i]
end

def cell(name)
  yield
  puts "ok #{name}"
rescue StandardError => e
  $failed += 1
  puts "FAIL #{name}: #{e.class}: #{e.message.lines.first&.strip}"
end

def expect(cond, msg)
  raise msg unless cond
end

def sqlstate(err)
  c = err.respond_to?(:cause) ? err.cause : nil
  c.respond_to?(:result) && c.result ? c.result.error_field(PG::PG_DIAG_SQLSTATE) : nil
end

def expect_sqlstate(code)
  yield
  raise "no error, want SQLSTATE #{code}"
rescue ActiveRecord::StatementInvalid => e
  got = sqlstate(e)
  raise "SQLSTATE #{got.inspect}, want #{code}: #{e.message.lines.first}" unless got == code
end

ActiveRecord::Base.establish_connection(conf("-c fence.token=#{OLD}"))

cell("create") do
  m = Mapped.create!(id: 1, balance: 10, note: "a", fence_token: 7) # the ORM sends a value of its own
  expect(row(1) == ["10", OLD], "row 1 is #{row(1).inspect}, want [10, #{OLD}]")
  expect(m.id == 1, "id #{m.id}")
end

cell("bulk_create") do
  Mapped.insert_all([{ id: 2, balance: 20, note: "b", fence_token: nil }, { id: 3, balance: 30, note: "c", fence_token: nil }])
  Mapped.create!([{ id: 4, balance: 40 }, { id: 5, balance: 50 }])
  [2, 3, 4, 5].each { |i| expect(row(i)&.last == OLD, "row #{i} is #{row(i).inspect}") }
end

cell("partial_update") do
  Legacy.find(2).update!(balance: 21)
  expect(row(2) == ["21", OLD], "row 2 is #{row(2).inspect}")
end

cell("full_row_update") do
  m = Mapped.find(3)
  m.balance = 31
  m.save! # partial_writes = false: UPDATE of every column, fence_token included
  expect(row(3) == ["31", OLD], "row 3 is #{row(3).inspect}")
end

cell("upsert") do
  Mapped.upsert_all([{ id: 3, balance: 32, note: "c", fence_token: 1 }, { id: 6, balance: 60, note: "f", fence_token: 1 }], unique_by: :id)
  expect(row(3) == ["32", OLD] && row(6) == ["60", OLD], "rows 3, 6: #{row(3).inspect} #{row(6).inspect}")
end

cell("delete") do
  Mapped.find(6).destroy!
  Legacy.where(id: 5).delete_all
  expect(row(6).nil? && row(5).nil?, "rows 5, 6 still there")
end

cell("legacy_model") do
  Legacy.create!(id: 7, balance: 70)
  Legacy.find(7).update!(balance: 71)
  expect(row(7) == ["71", OLD], "row 7 is #{row(7).inspect}")
end

cell("savepoint") do
  Mapped.transaction do
    Mapped.find(1).update!(balance: 11)
    Mapped.transaction(requires_new: true) do
      Mapped.find(2).update!(balance: 99)
      raise ActiveRecord::Rollback
    end
  end
  expect(row(1) == ["11", OLD] && row(2) == ["21", OLD], "rows 1, 2: #{row(1).inspect} #{row(2).inspect}")
end

# A second pool without a token in its connection: the token comes from SET LOCAL in each transaction.
class Fresh < ActiveRecord::Base
  self.abstract_class = true
end
class FreshMapped < Fresh
  self.table_name = TABLE
  self.partial_writes = false
end
Fresh.establish_connection(conf)

cell("missing_token") do
  expect_sqlstate("55F02") { FreshMapped.create!(id: 8, balance: 80) }
  expect(row(8).nil?, "row 8 was written")
end

cell("set_local") do
  FreshMapped.transaction do
    FreshMapped.connection.execute("SET LOCAL fence.token = #{NEW}")
    m = FreshMapped.find(4)
    m.balance = 41
    m.save!
  end
  expect(row(4) == ["41", NEW], "row 4 is #{row(4).inspect}")
end

cell("stale") do
  before = row(4)
  expect_sqlstate("55F01") { Mapped.find(4).update!(balance: 0) }
  expect(row(4) == before, "row 4 changed to #{row(4).inspect}")
  expect_sqlstate("55F01") { Mapped.where(id: 4).delete_all }
  expect_sqlstate("55F01") { Mapped.upsert_all([{ id: 4, balance: 0, note: "x", fence_token: nil }], unique_by: :id) }
  expect(row(4) == before, "row 4 changed to #{row(4).inspect}")
end

cell("migration_additive") do
  ActiveRecord::Migration.verbose = false
  conn = Mapped.connection
  ActiveRecord::Migration.new.instance_exec do
    @connection = conn
    add_column TABLE, :memo, :text
    add_index TABLE, :note
  end
  expect(DIRECT.exec("SELECT 1 FROM pg_attribute WHERE attrelid = '#{TABLE}'::regclass AND attname = 'memo'").ntuples == 1, "no memo column")
end

cell("migration_token_column_refused") do
  conn = Mapped.connection
  expect_sqlstate("55F04") do
    ActiveRecord::Migration.new.instance_exec do
      @connection = conn
      remove_column TABLE, :fence_token
    end
  end
  expect_sqlstate("55F04") do
    ActiveRecord::Migration.new.instance_exec do
      @connection = conn
      change_column TABLE, :fence_token, :integer
    end
  end
  expect(DIRECT.exec("SELECT 1 FROM pg_attribute WHERE attrelid = '#{TABLE}'::regclass AND attname = 'fence_token' AND NOT attisdropped AND atttypid = 'int8'::regtype").ntuples == 1, "token column changed")
end

exit($failed.zero? ? 0 : 1)
