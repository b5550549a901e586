//go:build !linux

package proxy

import (
	"io"
	"net"
)

// rawIO is c, after the bytes of pending: raw system calls are Linux's (rawsocket_linux.go).
func rawIO(c net.Conn, pending []byte) io.ReadWriter { return withPending(c, pending) }
