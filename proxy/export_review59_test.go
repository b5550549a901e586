package proxy

// BeforePoolMade makes the Server built from o call f each time a pooled client's pool is looked up or made
// (txPools.poolFor), before the pools' lock is taken. Set before New, as HoldPutBack.
func BeforePoolMade(o *Options, f func()) { o.hooks.beforePoolMade = f }
