package proxy_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/auth"
	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/internal/proxytest"
)

// BenchmarkConnectPerTransaction is pgbench -C through transaction pooling: each op connects, logs in (trust, or
// SCRAM against an auth file), runs one simple Query and disconnects with Terminate, as a connection-per-request
// client does. The client is a minimal wire client (its SCRAM keys derived once: PBKDF2 is the client's cost, not
// the proxy's), so that what the op costs is mostly the proxy's: cpu-us/op is the whole process's user and
// system CPU per connection (the client's few system calls included), user-us/op its user share (the system's
// is mostly the kernel's socket work, which any proxy pays), allocs/op the whole process's. The proxy
// logs at info, as in production (connection lines included).
func BenchmarkConnectPerTransaction(b *testing.B) {
	pgtest.Require(b, pg)
	ctx := context.Background()
	secret := scramSecret(b)
	userlist := b.TempDir() + "/userlist.txt"
	if err := os.WriteFile(userlist, []byte(fmt.Sprintf("%q %q\n", pgtest.ScramUser, secret)), 0o600); err != nil {
		b.Fatal(err)
	}
	sec, err := auth.ParseSecret(secret)
	if err != nil {
		b.Fatal(err)
	}
	clientKey, _, err := auth.SCRAMKeys(pgtest.ScramPassword, sec.Salt, sec.Iterations)
	if err != nil {
		b.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name, user, auth string
		scram            bool
	}{
		{"trust", pgtest.SuperUser, "auth:\n  type: trust\n", false},
		{"scram", pgtest.ScramUser, fmt.Sprintf("auth:\n  type: scram-sha-256\n  file: %s\n", userlist), true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := proxytest.Start(b, pg.Addr(), proxytest.Options{Logger: logger,
				YAML: "pool:\n  mode: transaction\n  size: 8\n" + tc.auth})
			c := connectClient{addr: p.Addr, user: tc.user, database: pgtest.TestDB}
			if tc.scram {
				c.scram = func() *auth.ClientExchange { return auth.NewKeyClient(clientKey, sec) }
			}
			if err := c.run(ctx); err != nil { // the pool's first server connection
				b.Fatal(err)
			}
			b.ReportAllocs()
			user, sys := cpuTime()
			b.ResetTimer()
			for range b.N {
				if err := c.run(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			user2, sys2 := cpuTime()
			perOp := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(perOp(user2-user+sys2-sys), "cpu-us/op")
			b.ReportMetric(perOp(user2-user), "user-us/op") // the system's share is mostly the sockets' kernel work
		})
	}
}

// scramSecret is ScramUser's SCRAM secret as PostgreSQL keeps it.
func scramSecret(tb testing.TB) string {
	d, err := pgx.Connect(context.Background(), pg.SuperDSN())
	if err != nil {
		tb.Fatal(err)
	}
	defer d.Close(context.Background())
	var secret string
	if err := d.QueryRow(context.Background(), "SELECT rolpassword FROM pg_authid WHERE rolname = $1", pgtest.ScramUser).Scan(&secret); err != nil {
		tb.Fatal(err)
	}
	return secret
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() (user, sys time.Duration) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// connectClient is a minimal PostgreSQL client: StartupMessage, trust or SCRAM, one Query, Terminate.
type connectClient struct {
	addr, user, database string
	scram                func() *auth.ClientExchange // nil: expect trust
}

func (c connectClient) run(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	params := "user\x00" + c.user + "\x00database\x00" + c.database + "\x00\x00"
	startup := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
	startup = binary.BigEndian.AppendUint32(startup, 3<<16)
	if _, err := conn.Write(append(startup, params...)); err != nil {
		return err
	}
	var ex *auth.ClientExchange
	for {
		typ, body, err := readRawMsg(r)
		if err != nil {
			return err
		}
		switch typ {
		case 'E':
			return fmt.Errorf("server error: %q", body)
		case 'R':
			switch code := binary.BigEndian.Uint32(body); code {
			case 0:
			case 10: // SASL
				if c.scram == nil {
					return fmt.Errorf("unexpected SASL")
				}
				ex = c.scram()
				first := ex.First()
				msg := append([]byte(auth.Mechanism+"\x00"), binary.BigEndian.AppendUint32(nil, uint32(len(first)))...)
				if err := writeRawMsg(conn, 'p', append(msg, first...)); err != nil {
					return err
				}
			case 11:
				final, err := ex.Final(body[4:])
				if err != nil {
					return err
				}
				if err := writeRawMsg(conn, 'p', final); err != nil {
					return err
				}
			case 12:
				if err := ex.Verify(body[4:]); err != nil {
					return err
				}
			default:
				return fmt.Errorf("authentication request %d", code)
			}
		}
		if typ == 'Z' {
			break
		}
	}
	if err := writeRawMsg(conn, 'Q', []byte("SELECT 1\x00")); err != nil {
		return err
	}
	for {
		typ, body, err := readRawMsg(r)
		if err != nil {
			return err
		}
		if typ == 'E' {
			return fmt.Errorf("query error: %q", body)
		}
		if typ == 'Z' {
			break
		}
	}
	return writeRawMsg(conn, 'X', nil)
}

func writeRawMsg(w io.Writer, typ byte, body []byte) error {
	msg := binary.BigEndian.AppendUint32([]byte{typ}, uint32(4+len(body)))
	_, err := w.Write(append(msg, body...))
	return err
}

func readRawMsg(r *bufio.Reader) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
	_, err := io.ReadFull(r, body)
	return head[0], body, err
}
