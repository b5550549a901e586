package config

import (
	"strings"
	"testing"
)

func TestLocksSection(t *testing.T) {
	base := "upstream:\n  address: 127.0.0.1:5432\n"
	cfg, err := Parse("f.yaml", []byte(base+"metrics:\n  listen: 127.0.0.1:9187\nlocks:\n  postgres:\n    dsn: postgres://x@h/db\n  etcd:\n    endpoints: [127.0.0.1:2379]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Locks.Enabled() || cfg.Locks.MaxLocks != DefaultLocksMaxLocks || cfg.Locks.Interval != DefaultLocksInterval || cfg.Locks.Etcd.Prefix != DefaultLocksEtcdPrefix {
		t.Fatalf("locks: %+v", cfg.Locks)
	}
	if cfg, err := Parse("f.yaml", []byte(base)); err != nil || cfg.Locks.Enabled() {
		t.Fatalf("no locks section: %v %+v", err, cfg.Locks)
	}
	// Without metrics, the admin console's SHOW LOCKS reads the stores.
	if _, err := Parse("f.yaml", []byte(base+"pool:\n  mode: transaction\n  admin_users: [admin]\nauth:\n  type: trust\nlocks:\n  postgres:\n    dsn: x\n")); err != nil {
		t.Fatalf("locks for SHOW LOCKS only: %v", err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"locks:\n  postgres:\n    dsn: x\n", "locks: observing locks needs metrics.listen"},
		// admin_users without pool.mode transaction: no admin console.
		{"pool:\n  admin_users: [admin]\nlocks:\n  postgres:\n    dsn: x\n", "locks: observing locks needs metrics.listen"},
		{"metrics:\n  listen: 127.0.0.1:1\nlocks:\n  interval: -1s\n", "locks.interval"},
		{"metrics:\n  listen: 127.0.0.1:1\nlocks:\n  postgres:\n    dns: x\n", "dns"},
	} {
		_, err := Parse("f.yaml", []byte(base+tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %q", tc.yaml, err, tc.want)
		}
	}
}
