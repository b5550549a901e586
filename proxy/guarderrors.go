package proxy

import "strings"

// countGuardRefusal counts a fencing error raised by the in-database guard (fenceproxy install): a real
// 55F0x ErrorResponse, passed to the client unchanged (it needs no marker translation). The guard puts the
// protected table's configured name in the error's table field; other values (a user's own RAISE with such a
// code) are counted as "other", which keeps the label set bounded.
func (ss *session) countGuardRefusal(body []byte) {
	code := errorField(body, 'C')
	if !strings.HasPrefix(code, "55F0") || len(code) != 5 {
		return
	}
	table := errorField(body, 't')
	known := false
	for _, t := range ss.srv.cfg.Tables {
		if t.Name == table {
			known = true
			break
		}
	}
	if !known {
		table = "other"
	}
	ss.srv.metrics.refusal(code, table)
}
