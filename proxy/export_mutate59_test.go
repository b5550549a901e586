package proxy

// BetweenFencedShutAndCancel makes the Server built from o call f each time endFencedTx has shut a session's
// upstream connection, before it cancels what runs there. Set before New, as HoldPutBack.
func BetweenFencedShutAndCancel(o *Options, f func()) { o.hooks.fencedShut = f }
