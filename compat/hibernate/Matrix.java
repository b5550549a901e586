// Hibernate (Debian's 3.6, the one Debian packages) through fenceproxy: one real program per compatibility
// cell (compat/compat_test.go). The mapping is Hibernate's default: every column of the entity is in every
// INSERT and UPDATE (dynamic-update false), the token column included. Environment as
// compat/django/matrix.py. Prints "ok CELL" or "FAIL CELL: why"; exits 1 if any failed.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Savepoint;
import java.util.HashMap;
import java.util.Map;
import org.hibernate.Session;
import org.hibernate.SessionFactory;
import org.hibernate.Transaction;
import org.hibernate.cfg.Configuration;

public class Matrix {
    static final String TABLE = System.getenv("TABLE");
    static final long OLD = Long.parseLong(System.getenv("OLD_TOKEN"));
    static final long NEW = Long.parseLong(System.getenv("NEW_TOKEN"));
    static int failed = 0;
    static Connection direct;

    interface Body { void run() throws Exception; }

    static void cell(String name, Body b) {
        try {
            b.run();
            System.out.println("ok " + name);
        } catch (Throwable e) {
            failed++;
            String msg = String.valueOf(e.getMessage()).split("\n")[0];
            for (Throwable c = e.getCause(); c != null; c = c.getCause()) msg += " / " + String.valueOf(c.getMessage()).split("\n")[0];
            System.out.println("FAIL " + name + ": " + e.getClass().getSimpleName() + ": " + msg);
        }
        System.out.flush();
    }

    static void expect(boolean cond, String msg) { if (!cond) throw new AssertionError(msg); }

    static String row(long id) throws SQLException {
        try (PreparedStatement st = direct.prepareStatement("SELECT balance::int8, fence_token FROM " + TABLE + " WHERE id = ?")) {
            st.setLong(1, id);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? rs.getLong(1) + "/" + rs.getObject(2) : null;
            }
        }
    }

    static void expectSQLState(String code, Body b) throws Exception {
        try {
            b.run();
        } catch (Exception e) {
            for (Throwable c = e; c != null; c = c.getCause()) {
                if (c instanceof SQLException && ((SQLException) c).getSQLState() != null) {
                    String got = ((SQLException) c).getSQLState();
                    if (!got.equals(code)) throw new AssertionError("SQLSTATE " + got + ", want " + code + ": " + c.getMessage());
                    return;
                }
            }
            throw new AssertionError("no SQLSTATE in " + e, e);
        }
        throw new AssertionError("no error, want SQLSTATE " + code);
    }

    static String mapping(String entity, boolean token) {
        return "<?xml version=\"1.0\"?><!DOCTYPE hibernate-mapping PUBLIC \"-//Hibernate/Hibernate Mapping DTD 3.0//EN\" "
            + "\"http://www.hibernate.org/dtd/hibernate-mapping-3.0.dtd\"><hibernate-mapping>"
            + "<class entity-name=\"" + entity + "\" table=\"" + TABLE + "\">"
            + "<id name=\"id\" type=\"long\" column=\"id\"><generator class=\"assigned\"/></id>"
            + "<property name=\"balance\" type=\"long\" column=\"balance\"/>"
            + "<property name=\"note\" type=\"string\" column=\"note\"/>"
            + (token ? "<property name=\"fence_token\" type=\"long\" column=\"fence_token\"/>" : "")
            + "</class></hibernate-mapping>";
    }

    static SessionFactory factory(String options) {
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/" + System.getenv("PGDATABASE");
        if (options != null) url += "?options=" + options.replace(" ", "%20").replace("=", "%3D");
        Configuration c = new Configuration()
            .setProperty("hibernate.connection.driver_class", "org.postgresql.Driver")
            .setProperty("hibernate.connection.url", url)
            .setProperty("hibernate.connection.username", System.getenv("PGUSER"))
            .setProperty("hibernate.dialect", "org.hibernate.dialect.PostgreSQLDialect")
            .setProperty("hibernate.default_entity_mode", "dynamic-map")
            .setProperty("hibernate.jdbc.batch_size", "20")
            .setProperty("hibernate.connection.pool_size", "2");
        c.addXML(mapping("Mapped", true));
        c.addXML(mapping("Legacy", false));
        return c.buildSessionFactory();
    }

    static Map<String, Object> acct(long id, long balance, Long token) {
        Map<String, Object> m = new HashMap<>();
        m.put("id", id);
        m.put("balance", balance);
        m.put("note", "n" + id);
        if (token != null) m.put("fence_token", token);
        return m;
    }

    interface Work { void run(Session s) throws Exception; }

    static void tx(SessionFactory f, Work w) throws Exception {
        Session s = f.openSession();
        Transaction t = s.beginTransaction();
        try {
            w.run(s);
            t.commit();
        } catch (Exception e) {
            try { t.rollback(); } catch (Exception ignored) { }
            throw e;
        } finally {
            s.close();
        }
    }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        direct = DriverManager.getConnection("jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("DIRECT_PORT")
            + "/" + System.getenv("PGDATABASE"), System.getenv("PGUSER"), "");
        SessionFactory db = factory("-c fence.token=" + OLD);
        SessionFactory fresh = factory(null);

        cell("create", () -> {
            tx(db, s -> s.save("Mapped", acct(1, 10, 7L)));
            expect(("10/" + OLD).equals(row(1)), "row 1 is " + row(1));
        });
        cell("bulk_create", () -> {
            tx(db, s -> { s.save("Mapped", acct(2, 20, null)); s.save("Mapped", acct(3, 30, 3L)); });
            tx(db, s -> { s.save("Legacy", acct(4, 40, null)); s.save("Legacy", acct(5, 50, null)); });
            for (long i = 2; i <= 5; i++) expect(row(i) != null && row(i).endsWith("/" + OLD), "row " + i + " is " + row(i));
        });
        cell("partial_update", () -> {
            tx(db, s -> s.createQuery("update Legacy set balance = 21 where id = 2").executeUpdate());
            expect(("21/" + OLD).equals(row(2)), "row 2 is " + row(2));
        });
        cell("full_row_update", () -> {
            tx(db, s -> ((Map<String, Object>) s.get("Mapped", 3L)).put("balance", 31L)); // flush: UPDATE of every column
            expect(("31/" + OLD).equals(row(3)), "row 3 is " + row(3));
        });
        cell("upsert", () -> {
            tx(db, s -> { s.merge("Mapped", acct(3, 32, 1L)); s.merge("Mapped", acct(6, 60, 1L)); });
            expect(("32/" + OLD).equals(row(3)) && ("60/" + OLD).equals(row(6)), "rows 3, 6: " + row(3) + " " + row(6));
        });
        cell("delete", () -> {
            tx(db, s -> s.delete("Mapped", s.get("Mapped", 6L)));
            tx(db, s -> s.createQuery("delete from Legacy where id = 5").executeUpdate());
            expect(row(6) == null && row(5) == null, "rows 5, 6 still there");
        });
        cell("legacy_model", () -> {
            tx(db, s -> s.save("Legacy", acct(7, 70, null)));
            tx(db, s -> ((Map<String, Object>) s.get("Legacy", 7L)).put("balance", 71L));
            expect(("71/" + OLD).equals(row(7)), "row 7 is " + row(7));
        });
        cell("savepoint", () -> {
            tx(db, s -> {
                ((Map<String, Object>) s.get("Mapped", 1L)).put("balance", 11L);
                s.flush();
                Connection c = s.connection();
                Savepoint sp = c.setSavepoint();
                s.createQuery("update Mapped set balance = 99 where id = 2").executeUpdate();
                c.rollback(sp);
            });
            expect(("11/" + OLD).equals(row(1)) && ("21/" + OLD).equals(row(2)), "rows 1, 2: " + row(1) + " " + row(2));
        });
        cell("missing_token", () -> {
            expectSQLState("55F02", () -> tx(fresh, s -> s.save("Mapped", acct(8, 80, null))));
            expect(row(8) == null, "row 8 was written");
        });
        cell("set_local", () -> {
            tx(fresh, s -> {
                s.createSQLQuery("SET LOCAL fence.token = " + NEW).executeUpdate();
                ((Map<String, Object>) s.get("Mapped", 4L)).put("balance", 41L);
            });
            expect(("41/" + NEW).equals(row(4)), "row 4 is " + row(4));
        });
        cell("stale", () -> {
            String before = row(4);
            expectSQLState("55F01", () -> tx(db, s -> ((Map<String, Object>) s.get("Mapped", 4L)).put("balance", 0L)));
            expectSQLState("55F01", () -> tx(db, s -> s.delete("Mapped", s.get("Mapped", 4L))));
            expect(before != null && before.equals(row(4)), "row 4 changed to " + row(4));
        });
        db.close();
        fresh.close();
        System.exit(failed == 0 ? 0 : 1);
    }
}
