package proxy

import (
	"runtime"
	"testing"
	"time"
)

// Clients that prepare the same statement share one Parse body (an idle client's memory: the fenced text of a
// protected table's write is most of what its statement keeps); a name whose body differs (a hash collision)
// never gets another's body; and once no statement holds a body, the collector takes it and its entry goes.
func TestSharedParsesOneCopyWhileHeld(t *testing.T) {
	var sp sharedParses
	rest := []byte("INSERT INTO t VALUES ($1)\x00\x00\x00")
	a := sp.of("fenceproxy_sabc", rest)
	b := sp.of("fenceproxy_sabc", append([]byte(nil), rest...))
	if a != b {
		t.Fatalf("two clients preparing the same statement keep two copies of its Parse")
	}
	if got, want := string(a.body), "fenceproxy_sabc\x00"+string(rest); got != want {
		t.Fatalf("Parse body %q, want %q", got, want)
	}
	other := sp.of("fenceproxy_sabc", []byte("DELETE FROM t\x00\x00\x00"))
	if other == a || string(other.body) != "fenceproxy_sabc\x00DELETE FROM t\x00\x00\x00" {
		t.Fatalf("a colliding name got body %q (shared: %v)", other.body, other == a)
	}
	if again := sp.of("fenceproxy_sabc", rest); again != a {
		t.Fatalf("a collision replaced the kept body")
	}
	// a, b and other are not used past here: nothing holds the bodies.
	deadline := time.Now().Add(10 * time.Second)
	for sp.size() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d Parse bodies still kept after every holder let go", sp.size())
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}
