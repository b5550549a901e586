// Command relayconfig prints the relay settings a fenceproxy configuration file comes to once fenceproxy's own
// defaults are applied, or the configuration error. bench/run uses it to name what each fenceproxy target runs
// (and which relay mode is not the default one) without repeating the defaults that config/ owns.
// Usage: go run ./bench/relayconfig FILE; prints "mode=loop spin=0s event_loops=0 prepared_fences=64 pool=session".
package main

import (
	"fmt"
	"os"

	"github.com/fenceproxy/fenceproxy/config"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: relayconfig FILE")
		os.Exit(2)
	}
	cfg, err := config.Load(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayconfig:", err)
		os.Exit(1)
	}
	fmt.Printf("mode=%s spin=%v event_loops=%d prepared_fences=%d pool=%s\n", cfg.Relay.Mode, cfg.Relay.SpinFor(), cfg.Relay.EventLoops,
		cfg.Upstream.Prepared(cfg.Token.Scope, cfg.Pool.Transaction()), cfg.Pool.Mode)
}
