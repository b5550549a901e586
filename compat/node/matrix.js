// Sequelize, Knex and TypeORM through fenceproxy: one real program per compatibility cell (compat/compat_test.go).
// Usage: node matrix.js sequelize|knex|typeorm. Environment as compat/django/matrix.py. Prints "ok CELL" or
// "FAIL CELL: why"; exits 1 if any failed.
'use strict';
const { Client } = require('pg');

const which = process.argv[2];
const TABLE = process.env.TABLE;
const OLD = Number(process.env.OLD_TOKEN);
const NEW = Number(process.env.NEW_TOKEN);
const conn = {
  host: process.env.PGHOST, port: Number(process.env.PGPORT),
  user: process.env.PGUSER, database: process.env.PGDATABASE,
};
let failed = 0;

const direct = new Client({ ...conn, port: Number(process.env.DIRECT_PORT) });

async function row(id) {
  const r = await direct.query(`SELECT balance::int::text AS b, fence_token::int AS t FROM ${TABLE} WHERE id = $1`, [id]);
  return r.rows.length ? [r.rows[0].b, r.rows[0].t] : null;
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function cell(name, f) {
  try {
    await f();
    console.log(`ok ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.name}: ${String(e.message).split('\n')[0]}`);
  }
}
function expect(cond, msg) { if (!cond) throw new Error(msg); }
async function expectSqlstate(code, f) {
  let err;
  try { await f(); } catch (e) { err = e; }
  if (!err) throw new Error(`no error, want SQLSTATE ${code}`);
  const got = (err.parent && err.parent.code) || (err.driverError && err.driverError.code) || err.code;
  if (got !== code) throw new Error(`SQLSTATE ${got}, want ${code}: ${err.message}`);
}

// The operations each ORM implements; the cells below are the same for both.
async function sequelizeOps() {
  const { Sequelize, DataTypes } = require('sequelize');
  const url = `postgres://${conn.user}@${conn.host}:${conn.port}/${conn.database}`;
  const quiet = { logging: false };
  const db = new Sequelize(url, { ...quiet, dialectOptions: { options: `-c fence.token=${OLD}` } });
  const fresh = new Sequelize(url, quiet);
  const cols = { id: { type: DataTypes.BIGINT, primaryKey: true }, balance: DataTypes.DECIMAL, note: DataTypes.TEXT };
  const opts = { tableName: TABLE, timestamps: false };
  const Mapped = db.define('Mapped', { ...cols, fence_token: DataTypes.BIGINT }, opts);
  const Legacy = db.define('Legacy', cols, opts);
  const FreshMapped = fresh.define('Mapped', { ...cols, fence_token: DataTypes.BIGINT }, opts);
  return {
    create: () => Mapped.create({ id: 1, balance: 10, note: 'a', fence_token: 7 }),
    bulk: async () => {
      await Mapped.bulkCreate([{ id: 2, balance: 20, note: 'b', fence_token: 3 }, { id: 3, balance: 30, note: 'c' }]);
      await Legacy.bulkCreate([{ id: 4, balance: 40 }, { id: 5, balance: 50 }]);
    },
    partial: async () => { const m = await Mapped.findByPk(2); m.balance = 21; await m.save(); },
    full: () => Mapped.update({ balance: 31, note: 'c', fence_token: 3 }, { where: { id: 3 } }),
    upsert: () => Mapped.bulkCreate([{ id: 3, balance: 32, note: 'c', fence_token: 1 }, { id: 6, balance: 60, note: 'f', fence_token: 1 }],
      { updateOnDuplicate: ['balance', 'note', 'fence_token'] }),
    del: async () => { await (await Mapped.findByPk(6)).destroy(); await Legacy.destroy({ where: { id: 5 } }); },
    legacy: async () => { await Legacy.create({ id: 7, balance: 70 }); await Legacy.update({ balance: 71 }, { where: { id: 7 } }); },
    savepoint: () => db.transaction(async (t) => {
      await Mapped.update({ balance: 11 }, { where: { id: 1 }, transaction: t });
      try {
        await db.transaction({ transaction: t }, async (t2) => {
          await Mapped.update({ balance: 99 }, { where: { id: 2 }, transaction: t2 });
          throw new Error('roll the savepoint back');
        });
      } catch (e) { if (e.message !== 'roll the savepoint back') throw e; }
    }),
    missing: () => FreshMapped.create({ id: 8, balance: 80 }),
    setLocal: () => fresh.transaction(async (t) => {
      await fresh.query(`SET LOCAL fence.token = ${NEW}`, { transaction: t });
      const m = await FreshMapped.findByPk(4, { transaction: t });
      m.balance = 41;
      await m.save({ transaction: t });
    }),
    staleUpdate: async () => { const m = await Mapped.findByPk(4); m.balance = 0; await m.save(); },
    staleDelete: () => Mapped.destroy({ where: { id: 4 } }),
    close: async () => { await db.close(); await fresh.close(); },
  };
}

async function knexOps() {
  const knex = require('knex');
  const db = knex({ client: 'pg', connection: { ...conn, options: `-c fence.token=${OLD}` } });
  const fresh = knex({ client: 'pg', connection: conn });
  return {
    create: () => db(TABLE).insert({ id: 1, balance: 10, note: 'a', fence_token: 7 }),
    bulk: async () => {
      await db(TABLE).insert([{ id: 2, balance: 20, note: 'b', fence_token: null }, { id: 3, balance: 30, note: 'c', fence_token: null }]);
      await db(TABLE).insert([{ id: 4, balance: 40 }, { id: 5, balance: 50 }]);
    },
    partial: () => db(TABLE).where({ id: 2 }).update({ balance: 21 }),
    full: () => db(TABLE).where({ id: 3 }).update({ balance: 31, note: 'c', fence_token: 3 }),
    upsert: () => db(TABLE).insert([{ id: 3, balance: 32, note: 'c', fence_token: 1 }, { id: 6, balance: 60, note: 'f', fence_token: 1 }])
      .onConflict('id').merge(),
    del: async () => { await db(TABLE).where({ id: 6 }).del(); await db(TABLE).where({ id: 5 }).del(); },
    legacy: async () => { await db(TABLE).insert({ id: 7, balance: 70 }); await db(TABLE).where({ id: 7 }).update({ balance: 71 }); },
    savepoint: () => db.transaction(async (t) => {
      await t(TABLE).where({ id: 1 }).update({ balance: 11 });
      try {
        await t.transaction(async (t2) => {
          await t2(TABLE).where({ id: 2 }).update({ balance: 99 });
          throw new Error('roll the savepoint back');
        });
      } catch (e) { if (e.message !== 'roll the savepoint back') throw e; }
    }),
    missing: () => fresh(TABLE).insert({ id: 8, balance: 80 }),
    setLocal: () => fresh.transaction(async (t) => {
      await t.raw(`SET LOCAL fence.token = ${NEW}`);
      await t(TABLE).where({ id: 4 }).update({ balance: 41, fence_token: 0 });
    }),
    staleUpdate: () => db(TABLE).where({ id: 4 }).update({ balance: 0 }),
    staleDelete: () => db(TABLE).where({ id: 4 }).del(),
    close: async () => { await db.destroy(); await fresh.destroy(); },
  };
}

async function typeormOps() {
  require('reflect-metadata');
  const { DataSource, EntitySchema } = require('typeorm');
  const columns = {
    id: { type: 'bigint', primary: true }, balance: { type: 'numeric' }, note: { type: 'text', nullable: true },
  };
  const mapped = new EntitySchema({ name: 'Mapped', tableName: TABLE, columns: { ...columns, fence_token: { type: 'bigint', nullable: true } } });
  const legacy = new EntitySchema({ name: 'Legacy', tableName: TABLE, columns });
  const source = (extra) => new DataSource({ type: 'postgres', ...conn, username: conn.user, entities: [mapped, legacy], logging: false, ...extra });
  const db = source({ extra: { options: `-c fence.token=${OLD}` } });
  const fresh = source({});
  await db.initialize();
  await fresh.initialize();
  const M = db.getRepository('Mapped');
  const L = db.getRepository('Legacy');
  return {
    create: () => M.insert({ id: 1, balance: 10, note: 'a', fence_token: 7 }),
    bulk: async () => {
      await M.save([{ id: 2, balance: 20, note: 'b', fence_token: null }, { id: 3, balance: 30, note: 'c', fence_token: 2 }]);
      await L.insert([{ id: 4, balance: 40 }, { id: 5, balance: 50 }]);
    },
    partial: () => M.update({ id: 2 }, { balance: 21 }),
    full: async () => { const m = await M.findOneBy({ id: 3 }); m.balance = 31; m.fence_token = '3'; await M.save(m); },
    upsert: () => M.upsert([{ id: 3, balance: 32, note: 'c', fence_token: 1 }, { id: 6, balance: 60, note: 'f', fence_token: 1 }], ['id']),
    del: async () => { await M.remove(await M.findOneBy({ id: 6 })); await L.delete({ id: 5 }); },
    legacy: async () => { await L.insert({ id: 7, balance: 70 }); await L.update({ id: 7 }, { balance: 71 }); },
    savepoint: () => db.transaction(async (em) => {
      await em.getRepository('Mapped').update({ id: 1 }, { balance: 11 });
      const qr = em.queryRunner;
      await qr.startTransaction(); // nested: a savepoint
      await em.getRepository('Mapped').update({ id: 2 }, { balance: 99 });
      await qr.rollbackTransaction();
    }),
    missing: () => fresh.getRepository('Mapped').insert({ id: 8, balance: 80 }),
    setLocal: () => fresh.transaction(async (em) => {
      await em.query(`SET LOCAL fence.token = ${NEW}`);
      const r = em.getRepository('Mapped');
      const m = await r.findOneBy({ id: 4 });
      m.balance = 41;
      await r.save(m);
    }),
    staleUpdate: () => M.update({ id: 4 }, { balance: 0 }),
    staleDelete: () => M.delete({ id: 4 }),
    close: async () => { await db.destroy(); await fresh.destroy(); },
  };
}

(async () => {
  await direct.connect();
  const ops = which === 'sequelize' ? await sequelizeOps() : which === 'knex' ? await knexOps() : which === 'typeorm' ? await typeormOps() : null;
  if (!ops) { console.log(`unknown ORM ${which}`); process.exit(2); }
  await cell('create', async () => { await ops.create(); expect(same(await row(1), ['10', OLD]), `row 1 is ${await row(1)}`); });
  await cell('bulk_create', async () => {
    await ops.bulk();
    for (const i of [2, 3, 4, 5]) { const r = await row(i); expect(r && r[1] === OLD, `row ${i} is ${r}`); }
  });
  await cell('partial_update', async () => { await ops.partial(); expect(same(await row(2), ['21', OLD]), `row 2 is ${await row(2)}`); });
  await cell('full_row_update', async () => { await ops.full(); expect(same(await row(3), ['31', OLD]), `row 3 is ${await row(3)}`); });
  await cell('upsert', async () => {
    await ops.upsert();
    expect(same(await row(3), ['32', OLD]) && same(await row(6), ['60', OLD]), `rows 3, 6: ${await row(3)} ${await row(6)}`);
  });
  await cell('delete', async () => { await ops.del(); expect(!(await row(6)) && !(await row(5)), 'rows 5, 6 still there'); });
  await cell('legacy_model', async () => { await ops.legacy(); expect(same(await row(7), ['71', OLD]), `row 7 is ${await row(7)}`); });
  await cell('savepoint', async () => {
    await ops.savepoint();
    expect(same(await row(1), ['11', OLD]) && same(await row(2), ['21', OLD]), `rows 1, 2: ${await row(1)} ${await row(2)}`);
  });
  await cell('missing_token', async () => { await expectSqlstate('55F02', ops.missing); expect(!(await row(8)), 'row 8 was written'); });
  await cell('set_local', async () => { await ops.setLocal(); expect(same(await row(4), ['41', NEW]), `row 4 is ${await row(4)}`); });
  await cell('stale', async () => {
    const before = await row(4);
    await expectSqlstate('55F01', ops.staleUpdate);
    await expectSqlstate('55F01', ops.staleDelete);
    expect(same(await row(4), before), `row 4 changed to ${await row(4)}`);
  });
  await ops.close();
  await direct.end();
  process.exit(failed ? 1 : 0);
})().catch((e) => { console.log(`FAIL setup: ${e.stack}`); process.exit(1); });
