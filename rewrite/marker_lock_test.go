package rewrite

import "testing"

func TestStaleLock(t *testing.T) {
	for _, lock := range []string{"settle", "a lock; refusing the write to x", "|."} {
		msg, _, _ := Marker{Code: CodeStale, Table: "public.accounts", Lock: lock, RowToken: "2", Token: "1"}.Describe()
		if got, ok := StaleLock(msg, "public.accounts"); !ok || got != lock {
			t.Errorf("StaleLock(%q) = %q, %v; want %q", msg, got, ok, lock)
		}
	}
	row, _, _ := Marker{Code: CodeStale, Table: "accounts", RowToken: "2", Token: "1"}.Describe()
	for _, msg := range []string{row, "stale fencing token: lock  has accepted a newer token; refusing the write to accounts", ""} {
		if got, ok := StaleLock(msg, "accounts"); ok {
			t.Errorf("StaleLock(%q) = %q, want no lock", msg, got)
		}
	}
}
