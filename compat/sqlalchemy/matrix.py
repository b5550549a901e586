"""SQLAlchemy (ORM, psycopg2) through fenceproxy: one real program per compatibility cell.

Environment as compat/django/matrix.py. Prints "ok CELL" or "FAIL CELL: why"; exits 1 if any failed.
"""
import os
import sys

import psycopg2
from sqlalchemy import BigInteger, Column, Numeric, Text, create_engine, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, declarative_base

TABLE = os.environ["TABLE"]
OLD = int(os.environ["OLD_TOKEN"])
NEW = int(os.environ["NEW_TOKEN"])
URL = "postgresql+psycopg2://%s@%s:%s/%s" % (os.environ["PGUSER"], os.environ["PGHOST"], os.environ["PGPORT"], os.environ["PGDATABASE"])

Base = declarative_base()


class Mapped(Base):
    """Every column mapped, the token column included (as reflection or a generator would)."""
    __tablename__ = TABLE
    id = Column(BigInteger, primary_key=True, autoincrement=False)
    balance = Column(Numeric)
    note = Column(Text)
    fence_token = Column(BigInteger)


class Legacy(declarative_base()):
    """The legacy model: no token column."""
    __tablename__ = TABLE
    id = Column(BigInteger, primary_key=True, autoincrement=False)
    balance = Column(Numeric)
    note = Column(Text)


engine = create_engine(URL, connect_args={"options": "-c fence.token=%d" % OLD}, future=True)
fresh = create_engine(URL, future=True)
DIRECT = psycopg2.connect(host=os.environ["PGHOST"], port=os.environ["DIRECT_PORT"],
                          user=os.environ["PGUSER"], dbname=os.environ["PGDATABASE"])
DIRECT.autocommit = True
failed = 0


def row(i):
    with DIRECT.cursor() as c:
        c.execute("SELECT balance::int::text, fence_token FROM %s WHERE id = %%s" % TABLE, (i,))
        r = c.fetchone()
        return None if r is None else (r[0], r[1])


def cell(name):
    def run(f):
        global failed
        try:
            f()
            print("ok", name, flush=True)
        except Exception as e:
            failed += 1
            print("FAIL %s: %s: %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""), flush=True)
        return f
    return run


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def expect_sqlstate(code, f):
    try:
        f()
    except DBAPIError as e:
        got = getattr(e.orig, "pgcode", None)
        if got != code:
            raise AssertionError("SQLSTATE %r, want %s: %s" % (got, code, e))
        return
    raise AssertionError("no error, want SQLSTATE %s" % code)


@cell("create")
def _():
    with Session(engine) as s, s.begin():
        s.add(Mapped(id=1, balance=10, note="a", fence_token=7))
    expect(row(1) == ("10", OLD), "row 1 is %r" % (row(1),))


@cell("bulk_create")
def _():
    with Session(engine) as s, s.begin():
        s.add_all([Mapped(id=2, balance=20, note="b"), Mapped(id=3, balance=30, note="c", fence_token=None)])
    with Session(engine) as s, s.begin():
        s.bulk_insert_mappings(Mapped, [{"id": 4, "balance": 40, "fence_token": 3}, {"id": 5, "balance": 50, "fence_token": 3}])
    for i in (2, 3, 4, 5):
        expect(row(i) is not None and row(i)[1] == OLD, "row %d is %r" % (i, row(i)))


@cell("partial_update")
def _():
    with Session(engine) as s, s.begin():
        s.get(Mapped, 2).balance = 21  # the unit of work sends only the changed column
    expect(row(2) == ("21", OLD), "row 2 is %r" % (row(2),))


@cell("full_row_update")
def _():
    with Session(engine) as s, s.begin():
        m = s.get(Mapped, 3)
        m.balance, m.note, m.fence_token = 31, "c", m.fence_token  # every column, the token's own value included
        s.execute(Mapped.__table__.update().where(Mapped.id == 3).values(balance=31, note="c", fence_token=m.fence_token))
    expect(row(3) == ("31", OLD), "row 3 is %r" % (row(3),))


@cell("upsert")
def _():
    stmt = insert(Mapped.__table__).values([{"id": 3, "balance": 32, "note": "c", "fence_token": 1},
                                            {"id": 6, "balance": 60, "note": "f", "fence_token": 1}])
    stmt = stmt.on_conflict_do_update(index_elements=["id"], set_={"balance": stmt.excluded.balance, "fence_token": stmt.excluded.fence_token})
    with engine.begin() as c:
        c.execute(stmt)
    expect(row(3) == ("32", OLD) and row(6) == ("60", OLD), "rows 3, 6: %r %r" % (row(3), row(6)))


@cell("delete")
def _():
    with Session(engine) as s, s.begin():
        s.delete(s.get(Mapped, 6))
    with engine.begin() as c:
        c.execute(Mapped.__table__.delete().where(Mapped.id == 5))
    expect(row(6) is None and row(5) is None, "rows 5, 6 still there")


@cell("legacy_model")
def _():
    with Session(engine) as s, s.begin():
        s.add(Legacy(id=7, balance=70))
    with Session(engine) as s, s.begin():
        s.get(Legacy, 7).balance = 71
    expect(row(7) == ("71", OLD), "row 7 is %r" % (row(7),))


@cell("savepoint")
def _():
    with Session(engine) as s, s.begin():
        s.get(Mapped, 1).balance = 11
        s.flush()
        try:
            with s.begin_nested():  # a savepoint
                s.get(Mapped, 2).balance = 99
                s.flush()
                raise RuntimeError("roll the savepoint back")
        except RuntimeError:
            pass
    expect(row(1) == ("11", OLD) and row(2) == ("21", OLD), "rows 1, 2: %r %r" % (row(1), row(2)))


@cell("missing_token")
def _():
    def create():
        with Session(fresh) as s, s.begin():
            s.add(Mapped(id=8, balance=80))
    expect_sqlstate("55F02", create)
    expect(row(8) is None, "row 8 was written")


@cell("set_local")
def _():
    with Session(fresh) as s, s.begin():
        s.execute(text("SET LOCAL fence.token = %d" % NEW))
        s.get(Mapped, 4).balance = 41
    expect(row(4) == ("41", NEW), "row 4 is %r" % (row(4),))


@cell("stale")
def _():
    before = row(4)

    def update():
        with Session(engine) as s, s.begin():
            s.get(Mapped, 4).balance = 0

    def delete():
        with engine.begin() as c:
            c.execute(Mapped.__table__.delete().where(Mapped.id == 4))
    expect_sqlstate("55F01", update)
    expect_sqlstate("55F01", delete)
    expect(row(4) == before, "row 4 changed to %r" % (row(4),))


sys.exit(1 if failed else 0)
