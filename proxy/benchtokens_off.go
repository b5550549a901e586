//go:build fenceproxy_bench_notokens

package proxy

// sendTokenStmt is false in this build only: bench/run's notokens targets measure transaction pooling without
// the token statement. Such a build leaves every pooled transaction with the placeholder as its token (fenced
// writes are refused with 55F03): never for real use.
const sendTokenStmt = false
