//go:build !fenceproxy_bench_notokens

package proxy

// sendTokenStmt is whether a pooled transaction starts with the client's token statement (pooled.go:
// injectTokens). Always, except in the bench-only build tagged fenceproxy_bench_notokens (benchtokens_off.go),
// which bench/run's notokens targets run to measure what the statement costs.
const sendTokenStmt = true
