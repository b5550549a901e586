"""Django through fenceproxy: one real program per compatibility cell (see compat/compat_test.go).

Environment: PGHOST, PGPORT (the proxy), PGUSER, PGDATABASE, DIRECT_PORT (the same PostgreSQL without the
proxy), TABLE (a protected table: id bigint primary key, balance numeric, note text, fence_token bigint),
OLD_TOKEN < NEW_TOKEN. Prints "ok CELL" or "FAIL CELL: why" per cell; exits 1 if any failed.
"""
import os
import sys

import django
from django.conf import settings

TABLE = os.environ["TABLE"]
OLD = int(os.environ["OLD_TOKEN"])
NEW = int(os.environ["NEW_TOKEN"])


def db(options=None):
    d = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ["PGHOST"],
        "PORT": os.environ["PGPORT"],
        "USER": os.environ["PGUSER"],
        "NAME": os.environ["PGDATABASE"],
        "OPTIONS": {},
    }
    if options:
        d["OPTIONS"]["options"] = options
    return d


settings.configure(
    DATABASES={"default": db("-c fence.token=%d" % OLD), "fresh": db()},
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()

import psycopg2  # noqa: E402
from django.db import connections, models, transaction, DatabaseError  # noqa: E402


class Mapped(models.Model):
    """Every column mapped, the token column included (as inspectdb generates it)."""

    id = models.BigIntegerField(primary_key=True)
    balance = models.DecimalField(max_digits=20, decimal_places=2)
    note = models.TextField(null=True)
    fence_token = models.BigIntegerField(null=True)

    class Meta:
        app_label = "compat"
        db_table = TABLE
        managed = False


class Legacy(models.Model):
    """The legacy model: no token column."""

    id = models.BigIntegerField(primary_key=True)
    balance = models.DecimalField(max_digits=20, decimal_places=2)
    note = models.TextField(null=True)

    class Meta:
        app_label = "compat"
        db_table = TABLE
        managed = False


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
        except Exception as e:  # a cell's failure is reported, the others still run
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
    except DatabaseError as e:
        got = getattr(e.__cause__, "pgcode", None)
        if got != code:
            raise AssertionError("SQLSTATE %r, want %s: %s" % (got, code, e))
        return
    raise AssertionError("no error, want SQLSTATE %s" % code)


@cell("create")
def _():
    Mapped.objects.create(id=1, balance=10, note="a", fence_token=7)
    expect(row(1) == ("10", OLD), "row 1 is %r" % (row(1),))


@cell("bulk_create")
def _():
    Mapped.objects.bulk_create([Mapped(id=2, balance=20, note="b"), Mapped(id=3, balance=30, note="c", fence_token=5)])
    Legacy.objects.bulk_create([Legacy(id=4, balance=40), Legacy(id=5, balance=50)])
    for i in (2, 3, 4, 5):
        expect(row(i) is not None and row(i)[1] == OLD, "row %d is %r" % (i, row(i)))


@cell("partial_update")
def _():
    m = Mapped.objects.get(id=2)
    m.balance = 21
    m.save(update_fields=["balance"])
    Mapped.objects.filter(id=5).update(balance=51)
    expect(row(2) == ("21", OLD) and row(5) == ("51", OLD), "rows 2, 5: %r %r" % (row(2), row(5)))


@cell("full_row_update")
def _():
    m = Mapped.objects.get(id=3)
    m.balance = 31
    m.save()  # UPDATE of every field, fence_token included
    expect(row(3) == ("31", OLD), "row 3 is %r" % (row(3),))


@cell("upsert")
def _():
    # Django 3.2 has no bulk upsert; update_or_create is its upsert (SELECT ... FOR UPDATE, then UPDATE or INSERT).
    Mapped.objects.update_or_create(id=3, defaults={"balance": 32, "fence_token": 1})
    Mapped.objects.update_or_create(id=6, defaults={"balance": 60, "fence_token": 1})
    expect(row(3) == ("32", OLD) and row(6) == ("60", OLD), "rows 3, 6: %r %r" % (row(3), row(6)))


@cell("delete")
def _():
    Mapped.objects.get(id=6).delete()
    Legacy.objects.filter(id=5).delete()
    expect(row(6) is None and row(5) is None, "rows 5, 6 still there")


@cell("legacy_model")
def _():
    Legacy.objects.create(id=7, balance=70)
    m = Legacy.objects.get(id=7)
    m.balance = 71
    m.save()
    expect(row(7) == ("71", OLD), "row 7 is %r" % (row(7),))


@cell("savepoint")
def _():
    with transaction.atomic():
        Mapped.objects.filter(id=1).update(balance=11)
        try:
            with transaction.atomic():  # a savepoint
                Mapped.objects.filter(id=2).update(balance=99)
                raise RuntimeError("roll the savepoint back")
        except RuntimeError:
            pass
    expect(row(1) == ("11", OLD) and row(2) == ("21", OLD), "rows 1, 2: %r %r" % (row(1), row(2)))


@cell("missing_token")
def _():
    expect_sqlstate("55F02", lambda: Mapped.objects.using("fresh").create(id=8, balance=80))
    expect(row(8) is None, "row 8 was written")


@cell("set_local")
def _():
    with transaction.atomic(using="fresh"):
        with connections["fresh"].cursor() as c:
            c.execute("SET LOCAL fence.token = %d" % NEW)
        m = Mapped.objects.using("fresh").get(id=4)
        m.balance = 41
        m.save(using="fresh")
    expect(row(4) == ("41", NEW), "row 4 is %r" % (row(4),))


@cell("stale")
def _():
    before = row(4)

    def save():
        m = Mapped.objects.get(id=4)
        m.balance = 0
        m.save()
    expect_sqlstate("55F01", save)
    expect_sqlstate("55F01", lambda: Mapped.objects.filter(id=4).delete())
    expect(row(4) == before, "row 4 changed to %r" % (row(4),))


@cell("migration_additive")
def _():
    from django.db.migrations.state import ProjectState  # noqa: F401  (the schema editor is what migrations use)
    with connections["default"].schema_editor() as editor:
        f = models.TextField(null=True)
        f.set_attributes_from_name("memo")
        editor.add_field(Mapped, f)
        editor.execute("CREATE INDEX %s_note_idx ON %s (note)" % (TABLE, TABLE))
    with DIRECT.cursor() as c:
        c.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'memo'", (TABLE,))
        expect(c.fetchone() is not None, "no memo column")


@cell("migration_token_column_refused")
def _():
    def drop():
        with connections["default"].schema_editor() as editor:
            editor.remove_field(Mapped, Mapped._meta.get_field("fence_token"))

    def retype():
        with connections["default"].schema_editor() as editor:
            old = Mapped._meta.get_field("fence_token")
            new = models.IntegerField(null=True)
            new.set_attributes_from_name("fence_token")
            new.model = Mapped
            editor.alter_field(Mapped, old, new)
    expect_sqlstate("55F04", drop)
    expect_sqlstate("55F04", retype)
    with DIRECT.cursor() as c:
        c.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'fence_token' "
                  "AND NOT attisdropped AND atttypid = 'int8'::regtype", (TABLE,))
        expect(c.fetchone() is not None, "token column changed")


sys.exit(1 if failed else 0)
