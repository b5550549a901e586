package proxy

import (
	"log/slog"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// ParkedRetained is what the parked sessions of s keep on the heap, in bytes, counting each object once however
// many sessions reach it (so what they share counts once for all), and by the session's and its pooledState's
// fields, the largest first. Objects of the server's own (the Server, pools, server connections, loggers, the
// planner) are not counted: they are there for no client in particular. An estimate of the live bytes (a
// slice's capacity, a map's entries), for comparing, not an account of the allocator's.
func ParkedRetained(s *Server) (total int, n int, byField []string) {
	pk := s.pools.parker
	// Held for the whole walk, not only for the list: a session resumed or ended later (the test's clients
	// closed at its end) writes what the walk read, and only the parker's lock orders the two (go test -race
	// reported the walk's reads against resumePooled's and endPooled's writes).
	pk.mu.Lock()
	defer pk.mu.Unlock()
	sessions := make([]*session, 0, len(pk.parked))
	for _, ss := range pk.parked {
		sessions = append(sessions, ss)
	}
	w := retainWalker{seen: map[uintptr]bool{}}
	fields := map[string]int{}
	for _, ss := range sessions {
		w.n += int(unsafe.Sizeof(*ss))
		w.seen[uintptr(unsafe.Pointer(ss))] = true
		sv := reflect.ValueOf(ss).Elem()
		for i := 0; i < sv.NumField(); i++ {
			before := w.n
			if sv.Type().Field(i).Name == "pooled" {
				pl := sv.Field(i)
				w.n += int(unsafe.Sizeof(*ss.pooled))
				w.seen[pl.Pointer()] = true
				pv := pl.Elem()
				for j := 0; j < pv.NumField(); j++ {
					b := w.n
					w.walk(pv.Field(j))
					fields["pooled."+pv.Type().Field(j).Name] += w.n - b
				}
				continue
			}
			w.walk(sv.Field(i))
			fields[sv.Type().Field(i).Name] += w.n - before
		}
	}
	for name, b := range fields {
		if b > 0 {
			byField = append(byField, name+" "+strconv.Itoa(b))
		}
	}
	sort.Slice(byField, func(i, j int) bool {
		a, _, _ := strings.Cut(byField[i], " ")
		b, _, _ := strings.Cut(byField[j], " ")
		return fields[a] > fields[b]
	})
	return w.n, len(sessions), byField
}

// retainWalker sums what the values it walks reach on the heap.
type retainWalker struct {
	seen map[uintptr]bool
	n    int
}

// notOwned reports whether objects of type t belong to the server, not to a client.
func notOwned(t reflect.Type) bool {
	switch t {
	case
		reflect.TypeFor[*Server](), reflect.TypeFor[*txPool](), reflect.TypeFor[*serverConn](), reflect.TypeFor[*slog.Logger](),
		reflect.TypeFor[*rewrite.FoldWords](), reflect.TypeFor[*Metrics](), reflect.TypeFor[Planner]():
		return true
	}
	return false
}

func (w *retainWalker) walk(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() || notOwned(v.Type()) || w.seen[v.Pointer()] {
			return
		}
		w.seen[v.Pointer()] = true
		w.n += int(v.Type().Elem().Size())
		w.walk(v.Elem())
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			w.walk(v.Field(i))
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			w.walk(v.Index(i))
		}
	case reflect.Slice:
		if v.IsNil() || v.Cap() == 0 || w.seen[v.Pointer()] {
			return
		}
		w.seen[v.Pointer()] = true
		w.n += v.Cap() * int(v.Type().Elem().Size())
		for i := 0; i < v.Len(); i++ {
			w.walk(v.Index(i))
		}
	case reflect.String:
		s := v.String()
		if len(s) == 0 || w.seen[uintptr(unsafe.Pointer(unsafe.StringData(s)))] {
			return
		}
		w.seen[uintptr(unsafe.Pointer(unsafe.StringData(s)))] = true
		w.n += len(s)
	case reflect.Map:
		if v.IsNil() || w.seen[v.Pointer()] {
			return
		}
		w.seen[v.Pointer()] = true
		w.n += 48 + (v.Len()+8)*int(v.Type().Key().Size()+v.Type().Elem().Size()+1)
		for it := v.MapRange(); it.Next(); {
			w.walk(it.Key())
			w.walk(it.Value())
		}
	case reflect.Interface:
		if !v.IsNil() && !notOwned(v.Type()) {
			w.walk(v.Elem())
		}
	case reflect.Chan:
		if v.IsNil() || w.seen[v.Pointer()] {
			return
		}
		w.seen[v.Pointer()] = true
		w.n += 96 + v.Cap()*int(v.Type().Elem().Size())
	}
}

// SessionSizes are the sizes of a session and of its pooledState.
func SessionSizes() (sessionSize, pooledSize uintptr) {
	return unsafe.Sizeof(session{}), unsafe.Sizeof(pooledState{})
}
