package proxy

// AfterLockAnswer makes the Server built from o call f each time a client message's lock question (unplanned.go:
// which relations the session's backend holds a write's lock on, asked of a host the router refuses fenced
// writes on) has its answer or its failure, before the answer is used. Set before New, as HoldPutBack.
func AfterLockAnswer(o *Options, f func()) { o.hooks.lockAnswered = f }
