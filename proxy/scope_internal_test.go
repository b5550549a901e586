package proxy

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func TestFastpathSetsToken(t *testing.T) {
	call := func(oid uint32, formats []uint16, args ...[]byte) []byte {
		b, err := (&pgproto3.FunctionCall{Function: oid, ArgFormatCodes: formats, Arguments: args}).Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b[5:] // the body, after type and length
	}
	text := []uint16{0}
	cases := []struct {
		name string
		body []byte
		want bool
	}{
		{"set_config of the token", call(setConfigOID, text, []byte("fence.token"), []byte("9"), []byte("false")), true},
		{"upper case", call(setConfigOID, text, []byte("FENCE.Token"), []byte("9"), []byte("true")), true},
		{"quoted", call(setConfigOID, text, []byte(`"fence"."token"`), []byte("9"), []byte("true")), true},
		{"binary format", call(setConfigOID, []uint16{1}, []byte("fence.token"), []byte("9"), []byte{0}), true},
		{"another setting", call(setConfigOID, text, []byte("application_name"), []byte("x"), []byte("false")), false},
		{"a setting with the token's prefix", call(setConfigOID, text, []byte("fence.tokens"), []byte("x"), []byte("false")), false},
		{"another function", call(957, text, []byte("-1")), false},
		{"no arguments", call(setConfigOID, nil), true},
		{"NULL name", call(setConfigOID, text, nil, []byte("9"), []byte("false")), false},
		{"truncated after the OID", []byte{0, 0, 8, 30}, true},
		{"truncated argument", append(call(setConfigOID, text, []byte("fence.token"))[:12], 0), true},
	}
	for _, c := range cases {
		got, err := fastpathSetsToken(c.body, "fence.token")
		if err != nil || got != c.want {
			t.Errorf("%s: got %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := fastpathSetsToken([]byte{0, 0}, "fence.token"); !errors.Is(err, errProtocol) {
		t.Errorf("a FunctionCall shorter than an OID: %v, want a protocol error", err)
	}
}
