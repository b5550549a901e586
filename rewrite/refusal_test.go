package rewrite

import (
	"strings"
	"testing"
)

func TestRefusalSQLCarriesTheRefusal(t *testing.T) {
	got := RefusalSQL("55F03", "public.accounts", `invalid fencing token: "it's" \ bad`, "")
	want := `SELECT E'fenceproxy|refuse|55F03|public.accounts|invalid fencing token: "it''s" \\ bad'::bigint`
	if got != want {
		t.Fatalf("RefusalSQL = %s, want %s", got, want)
	}
}

// TestTranslate reads markers as the server reports them: inside the 22P02 message about the cast.
func TestTranslate(t *testing.T) {
	cases := []struct {
		name, serverMessage string
		want                Translation
		ok                  bool
	}{
		{"refusal with hint", `invalid input syntax for type bigint: "fenceproxy|refuse|55F03|t|invalid fencing token: \"x\"` + hintSep + `Use SET LOCAL."`,
			Translation{Code: "55F03", Table: "t", Message: `invalid fencing token: \"x\"`, Hint: "Use SET LOCAL."}, true},
		{"refusal without table", `invalid input syntax for type bigint: "fenceproxy|refuse|55F04||unfenceable write"`,
			Translation{Code: "55F04", Message: "unfenceable write"}, true},
		{"stale", `invalid input syntax for type bigint: "fenceproxy|55F01|9|7|public.accounts|."`,
			Translation{Code: CodeStale, Table: "public.accounts", Token: "7", RowToken: "9"}, true},
		{"unset token is missing", `invalid input syntax for type bigint: "fenceproxy|55F03|fence.token||accounts|."`,
			Translation{Code: CodeMissing, Table: "accounts"}, true},
		{"no marker", `invalid input syntax for type bigint: "abc"`, Translation{}, false},
		{"truncated refusal", `invalid input syntax for type bigint: "fenceproxy|refuse|55F04"`, Translation{}, false},
		{"stale with non-digits", `invalid input syntax for type bigint: "fenceproxy|55F01|9x|7|t|."`, Translation{}, false},
	}
	for _, c := range cases {
		got, ok := Translate(c.serverMessage)
		if ok != c.ok {
			t.Errorf("%s: ok = %v, want %v", c.name, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		if c.want.Code == CodeStale || c.want.Code == CodeMissing {
			// Texts come from Marker.Describe (tested with the guard); check the fields the marker carries.
			if got.Code != c.want.Code || got.Table != c.want.Table || got.Token != c.want.Token || got.RowToken != c.want.RowToken || got.Message == "" || got.Hint == "" {
				t.Errorf("%s: got %+v, want %+v with Describe's texts", c.name, got, c.want)
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A named refusal travels as its name and argument, with whatever the statement appended after a "|", and comes
// back with the message and hint the name stands for; an unknown name is not a marker.
func TestTranslateNamedRefusal(t *testing.T) {
	msg := `invalid input syntax for type bigint: "` + NamedRefusalMarker("55F03", RefusalPooledSetting, "fence.lock") + `|77"`
	got, ok := Translate(msg)
	if !ok || got.Code != "55F03" || got.Message != "invalid fencing token: fence.lock was changed on this pooled server connection behind fenceproxy's back (a function that calls set_config?); the transaction is refused" ||
		got.Hint == "" {
		t.Fatalf("Translate(%q) = %+v, %v", msg, got, ok)
	}
	got, ok = Translate(`invalid input syntax for type bigint: "` + NamedRefusalMarker("0A000", RefusalPooledRole, "") + `|alice"`)
	if !ok || got.Code != "0A000" || !strings.HasPrefix(got.Message, "the role of this pooled server connection was changed") {
		t.Fatalf("role: %+v, %v", got, ok)
	}
	if got, ok := Translate(`invalid input syntax for type bigint: "fenceproxy|refuse|55F03||@no-such-refusal"`); ok {
		t.Fatalf("an unknown name translated: %+v", got)
	}
}
