// Package freeport picks loopback ports for the test servers (PostgreSQL, etcd) that the tests stop and start
// again on the same port.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Pick returns a port that is free on 127.0.0.1. It prefers ports below the kernel's ephemeral range, so that
// while a server is down (a restart, a kill) an outgoing connection cannot take its port.
func Pick() (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const min = 15000
	if low-min >= 1000 {
		for range 100 {
			port := min + rand.IntN(low-min)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
