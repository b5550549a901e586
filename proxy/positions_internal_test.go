package proxy

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fenceproxy/fenceproxy/rewrite"
)

// Hostile positions from the server (not a number, negative, zero, huge, past the text, inside a character;
// a body without its terminator) never panic and never come out pointing outside the client's text.
func TestClientPositionsHostile(t *testing.T) {
	r, err := rewrite.New(rewrite.Config{Tables: []rewrite.Table{{Name: "accounts", TokenColumn: "fence_token"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := rewrite.NewCache(r, 16)
	client := "SELECT 'é☃'; UPDATE accounts SET n = 'x' WHERE id = 1"
	plan := c.Plan([]byte(client), rewrite.DefaultSettings)
	if plan.Action != rewrite.Rewrite {
		t.Fatal(plan.Action)
	}
	for _, set := range []rewrite.Settings{rewrite.DefaultSettings, {ClientEncoding: "UTF8", ServerEncoding: "SQL_ASCII", StandardConformingStrings: true}} {
		ss := &session{}
		ss.notePositions(true, c, []byte(client), set, &plan, plan.SQL)
		ps := []string{"x", "", "-1", "0", "1", "9", "10", "11", strconv.Itoa(len(plan.SQL)), strconv.Itoa(len(plan.SQL) + 1),
			strconv.Itoa(len(plan.SQL) + 2), "99999999999999999999", "2147483648", " 5", "5 "}
		for i := 1; i <= len(plan.SQL)+1; i++ {
			ps = append(ps, strconv.Itoa(i))
		}
		for _, p := range ps {
			body := []byte("SERROR\x00C22P02\x00Mbad\x00P" + p + "\x00\x00")
			out := ss.clientPositions(body)
			if v := errorField(out, fieldPosition); v != "" {
				n, err := strconv.Atoi(v)
				max := utf8.RuneCountInString(client) + 1
				if set.ServerEncoding == "SQL_ASCII" {
					max = len(client) + 1 // counted in bytes
				}
				if err != nil || n < 1 || n > max {
					t.Errorf("%s: position %q from %q", set.ServerEncoding, v, p)
				}
				// The statement it points into is the one the server's position is in.
				in, _ := strconv.Atoi(p)
				sentSemi, clientSemi := utf8.RuneCountInString(plan.SQL[:strings.Index(plan.SQL, ";")])+1, utf8.RuneCountInString(client[:strings.Index(client, ";")])+1
				if set.ServerEncoding == "SQL_ASCII" {
					sentSemi, clientSemi = strings.Index(plan.SQL, ";")+1, strings.Index(client, ";")+1
				}
				if in > 0 && (in <= sentSemi) != (n <= clientSemi) {
					t.Errorf("%s: position %d in the sent text maps to %d, in the other statement", set.ServerEncoding, in, n)
				}
			}
			if errorField(out, fieldMessage) != "bad" || out[len(out)-1] != 0 {
				t.Errorf("%s: body %q from %q", set.ServerEncoding, out, p)
			}
		}
		for _, body := range [][]byte{{}, {0}, []byte("P12"), []byte("P12\x00"), []byte("Mx\x00P"), []byte("P\x00\x00")} {
			ss.clientPositions(body)
		}
	}
}
