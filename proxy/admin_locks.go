package proxy

import (
	"context"
	"fmt"
)

// sqlstateSuccessfulCompletion is the SQLSTATE of a NOTICE that reports no condition.
const sqlstateSuccessfulCompletion = "00000"

// SHOW LOCKS: the locks held or waited for in the lock stores of the locks: section, as `fenceproxy locks`
// lists them (the same tokens.Listing and cells: "-" for what a lock nobody holds has none of, "?" for what
// the store cannot tell), one row per lock and store, and beside each lock its mark (lock fences: the newest
// token it has accepted) read from the locks.postgres database, empty where none is read. A lock released
// and not waited for is not listed. Without a lock store it answers no rows and a NOTICE saying so; a store
// that cannot be read within the listing's timeout makes it an ERROR (a partial list would read as "free").
// The admin console exists in pool.mode transaction only, so s.pools is set.
func (s *Server) showLocks(out msgSink) (*adminTable, error) {
	t := &adminTable{cols: []string{"lock", "store", "holder", "token", "lease_left", "held_for", "waiters", "mark"}}
	if s.locks == nil || len(s.locks.Stores) == 0 {
		writeRaw(out, noticeResponse(sqlstateSuccessfulCompletion, "fenceproxy admin console: no lock store is configured",
			"SHOW LOCKS lists the locks of the stores in the configuration's locks: section (postgres, etcd, zookeeper or redis)."))
		return t, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a shutdown does not wait for a store's answer (the listing's timeout bounds it otherwise)
		select {
		case <-s.pools.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	listed, err := s.locks.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the locks: %w", err)
	}
	for _, l := range listed {
		c := l.Cells()
		mark := ""
		if l.Mark > 0 {
			mark = itoa(l.Mark)
		}
		t.rows = append(t.rows, []string{l.Name, l.Store, c.Holder, c.Token, c.LeaseLeft, c.HeldFor, c.Waiters, mark})
	}
	return t, nil
}
