package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceproxy/fenceproxy/config"
)

// hostResult is one of upstream.hosts as check found it.
type hostResult struct {
	Host string `json:"host"`
	// Role is primary, read-only (not in recovery, default_transaction_read_only on), standby or down.
	Role  string `json:"role"`
	Error string `json:"error,omitempty"`
	// LagBytes is, on a standby, how much WAL it received and has not replayed; on a primary, the largest
	// replay lag of its standbys in bytes (-1: none connected).
	LagBytes int64 `json:"lag_bytes"`
	// ReplayDelay is, on a standby, how long ago the last transaction it replayed committed on the primary
	// ("" when unknown).
	ReplayDelay string `json:"replay_delay,omitempty"`
	// Standbys is, on a primary, how many standbys stream from it and how many of them are synchronous.
	Standbys     int `json:"standbys"`
	SyncStandbys int `json:"sync_standbys"`
}

// checkHosts reports the role and replication lag of each of upstream.hosts (connecting as connectDirect does,
// with each host's address) and returns the number of problems: no primary, or more than one (split brain). A
// host that is down is a warning: the others may still serve.
func checkHosts(ctx context.Context, cfg *config.Config, dsn string, stdout io.Writer) ([]hostResult, int) {
	var results []hostResult
	primaries := 0
	for _, h := range cfg.Upstream.HostList() {
		r := checkHost(ctx, cfg, dsn, h)
		results = append(results, r)
		switch r.Role {
		case "down":
			fmt.Fprintf(stdout, "WARN  host %s: down: %s\n", h, r.Error)
		case "primary":
			primaries++
			lag := "no standby streaming"
			switch {
			case r.Standbys > 0 && r.LagBytes >= 0:
				lag = fmt.Sprintf("%d standby(s), %d synchronous, largest replay lag %d bytes", r.Standbys, r.SyncStandbys, r.LagBytes)
			case r.Standbys > 0:
				lag = fmt.Sprintf("%d standby(s), %d synchronous, replay lag not known yet", r.Standbys, r.SyncStandbys)
			}
			fmt.Fprintf(stdout, "ok    host %s: primary (%s)\n", h, lag)
		default:
			delay := ""
			if r.ReplayDelay != "" {
				delay = ", last replayed commit " + r.ReplayDelay + " old"
			}
			fmt.Fprintf(stdout, "ok    host %s: %s (received, not replayed: %d bytes%s)\n", h, r.Role, r.LagBytes, delay)
		}
	}
	switch {
	case primaries == 0:
		fmt.Fprintf(stdout, "FAIL  upstream.hosts: no host is primary: read-write sessions wait, fenced writes cannot go anywhere\n")
		return results, 1
	case primaries > 1:
		fmt.Fprintf(stdout, "FAIL  upstream.hosts: %d hosts claim to be primary (split brain): the proxy refuses fenced writes until one is demoted\n", primaries)
		return results, 1
	}
	return results, 0
}

// checkHost finds one host's role and lag.
func checkHost(ctx context.Context, cfg *config.Config, dsn, host string) hostResult {
	r := hostResult{Host: host, Role: "down", LagBytes: -1}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := connectAt(ctx, dsn, host)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer conn.Close(context.Background())
	var recovery bool
	var readOnly string
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('default_transaction_read_only')").Scan(&recovery, &readOnly); err != nil {
		r.Error = err.Error()
		return r
	}
	switch {
	case recovery:
		r.Role = "standby"
		var delay *float64
		err = conn.QueryRow(ctx, `SELECT coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_last_wal_receive_lsn(), pg_catalog.pg_last_wal_replay_lsn()), 0)::int8,
			extract(epoch FROM pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.pg_last_xact_replay_timestamp())::float8`).Scan(&r.LagBytes, &delay)
		if delay != nil {
			r.ReplayDelay = time.Duration(*delay * float64(time.Second)).Round(time.Millisecond).String()
		}
	case readOnly == "on":
		r.Role = "read-only"
		err = replicationOf(ctx, conn, &r)
	default:
		r.Role = "primary"
		err = replicationOf(ctx, conn, &r)
	}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// replicationOf reads a primary's standbys from pg_stat_replication.
func replicationOf(ctx context.Context, conn *pgx.Conn, r *hostResult) error {
	var lag *int64
	err := conn.QueryRow(ctx, `SELECT count(*)::int, count(*) FILTER (WHERE sync_state IN ('sync', 'quorum'))::int,
		max(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), replay_lsn))::int8
		FROM pg_catalog.pg_stat_replication`).Scan(&r.Standbys, &r.SyncStandbys, &lag)
	if lag != nil {
		r.LagBytes = *lag
	}
	return err
}
