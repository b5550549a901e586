package pgtest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby creates a streaming standby of primary (pg_basebackup -R, asynchronous replication over
// loopback) on a port of its own and starts it. opts are the standby's (its own ExtraConf and ExtraHBA); the
// caller must call Stop. The standby's reaper stops it, as a primary's does, if the test process dies.
func StartStandby(primary *Cluster, opts Options) (*Cluster, error) {
	c := &Cluster{opts: opts, binDir: primary.binDir}
	if err := c.prepareDir(); err != nil {
		c.removeDir()
		return nil, err
	}
	out, err := c.command(c.Bin("pg_basebackup"), "-h", primary.Host(), "-p", strconv.Itoa(primary.Port()),
		"-U", SuperUser, "-D", c.dataDir, "-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput()
	if err != nil {
		c.removeDir()
		return nil, fmt.Errorf("pgtest: pg_basebackup of %s: %w\n%s", primary.Addr(), err, out)
	}
	// The copy holds the primary's fenceproxy_pgtest.conf (its port and socket directory) and pg_hba.conf:
	// both are written again for the standby (startFreshPort writes the configuration).
	if err := c.armDataDir(); err != nil {
		return nil, err
	}
	if err := c.startFreshPort(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// MustStartStandby is StartStandby for a test: it fails the test on error and stops the standby when the
// test ends.
func MustStartStandby(t testing.TB, primary *Cluster, opts Options) *Cluster {
	t.Helper()
	c, err := StartStandby(primary, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// Promote promotes a standby (pg_ctl promote) and waits until it accepts writes.
func (c *Cluster) Promote() error {
	out, err := c.command(c.bin("pg_ctl"), "promote", "-w", "-t", "60", "-D", c.dataDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// StopImmediate stops the server at once (pg_ctl stop -m immediate: no shutdown checkpoint, as a crash) and
// keeps its directory; StartAgain starts it again.
func (c *Cluster) StopImmediate() error { return c.stop("immediate") }

// StopWALReceiver makes a standby stop streaming from its primary (primary_conninfo emptied, reloaded) and
// waits until its WAL receiver is gone: what the primary writes from then on never reaches this standby, as
// in an asynchronous failover that loses the newest commits.
func (c *Cluster) StopWALReceiver(ctx context.Context) error {
	if err := c.ExecIn("postgres", "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		return err
	}
	if err := c.ExecIn("postgres", "SELECT pg_catalog.pg_reload_conf()"); err != nil {
		return err
	}
	return c.poll(ctx, "the WAL receiver to stop", "SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_stat_wal_receiver)")
}

// WaitReplayed waits until a standby has replayed the primary's WAL up to the primary's current insert
// position (read when it is called).
func (c *Cluster) WaitReplayed(ctx context.Context, primary *Cluster) error {
	conn, err := pgx.Connect(ctx, primary.DSN(SuperUser, "", "postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect to the primary: %w", err)
	}
	var lsn string
	err = conn.QueryRow(ctx, "SELECT pg_catalog.pg_current_wal_lsn()::text").Scan(&lsn)
	conn.Close(context.Background())
	if err != nil {
		return fmt.Errorf("pgtest: read the primary's WAL position: %w", err)
	}
	return c.poll(ctx, "replay up to "+lsn, fmt.Sprintf(
		"SELECT pg_catalog.pg_last_wal_replay_lsn() >= '%s'::pg_lsn", lsn))
}

// poll runs query (one boolean) on this server until it is true or ctx ends.
func (c *Cluster) poll(ctx context.Context, what, query string) error {
	for {
		conn, err := pgx.Connect(ctx, c.DSN(SuperUser, "", "postgres"))
		if err == nil {
			var ok bool
			err = conn.QueryRow(ctx, query).Scan(&ok)
			conn.Close(context.Background())
			if err == nil && ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for %s on %s: %w (last error: %v)", what, c.Addr(), ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
