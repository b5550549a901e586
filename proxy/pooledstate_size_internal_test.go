package proxy

import (
	"testing"
	"unsafe"
)

// TestPooledStateFitsItsSizeClass pins what every pooled connection allocates for its state, a count that no
// machine load moves. Go puts an 8-byte header before a heap object that holds pointers and is larger than 512
// bytes, and rounds the two up to a size class: up to 1144 bytes of pooledState take 1152 bytes of heap, one
// byte more takes 1280. The watches pointer of 28bc55c (1136 -> 1152 bytes) and the fields of review56 (1176)
// crossed that line unseen: 128 bytes more per connection, zeroed at each connect and swept by the collector,
// while the struct held 76 bytes of padding between its small fields.
func TestPooledStateFitsItsSizeClass(t *testing.T) {
	const (
		mallocHeader = 8    // before an object with pointers over 512 bytes (runtime: minSizeForMallocHeader)
		sizeClass    = 1152 // the class pooledState fitted in up to stop 55 (d7570a1); the next is 1280
	)
	if size := unsafe.Sizeof(pooledState{}); size+mallocHeader > sizeClass {
		t.Errorf("pooledState is %d bytes, %d with the malloc header: allocated in the 1280-byte class, 128 bytes more "+
			"per pooled connection than %d; put its small fields (bool, atomic.Bool) beside each other, where "+
			"padding is, or keep what only a busy client needs in pooledCache", size, size+mallocHeader, sizeClass)
	}
}
