package proxy_test

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/fenceproxy/fenceproxy/internal/pgtest"
	"github.com/fenceproxy/fenceproxy/rewrite"
)

func rewriteSettings(enc string, scs bool) rewrite.Settings {
	return rewrite.Settings{ClientEncoding: enc, ServerEncoding: "UTF8", StandardConformingStrings: scs}
}

func lexRaw(text []byte, s rewrite.Settings) (rewrite.Lexed, error) { return rewrite.Lex(text, s) }

// TestLexerMatchesServer compares the proxy's reading of generated texts with the server's (the oracle): for
// every text the server runs, the lexer finds as many statements as the server completes and the same string
// values the server returns, under standard_conforming_strings on and off and in several client encodings;
// every text the lexer rejects, the server rejects too.
func TestLexerMatchesServer(t *testing.T) {
	pgtest.Require(t, pg)
	rng := rand.New(rand.NewSource(1))
	type setting struct {
		enc string
		scs bool
	}
	settings := []setting{{"UTF8", true}, {"UTF8", false}, {"SJIS", true}, {"SJIS", false}, {"BIG5", false}, {"GBK", true},
		{"LATIN1", false}, {"GB18030", false}, {"EUC_JP", false}, {"UHC", true}, {"KOI8R", false}}
	for _, s := range settings {
		t.Run(fmt.Sprintf("%s scs %v", s.enc, s.scs), func(t *testing.T) {
			params := map[string]string{"client_encoding": s.enc}
			if !s.scs {
				params["options"] = "-c standard_conforming_strings=off"
			}
			cl := dialRaw(t, pg.Addr(), pgtest.SuperUser, pgtest.TestDB, params)
			set := rewriteSettings(s.enc, s.scs)
			alphabet := []string{"a", "'", `\`, ";", " ", "\n", "-", "/", "*", "$", `"`, "4", "0", "u", "(", ")",
				`\x41`, `\101`, `\u0042`, `\U00000043`, `\\`, "''", `\0041`, `\+000044`, "\n'", "--"}
			if s.enc == "UTF8" || s.enc == "LATIN1" || s.enc == "GB18030" {
				alphabet = append(alphabet, "é")
			}
			if s.enc != "UTF8" && s.enc != "LATIN1" {
				alphabet = append(alphabet, fiveC(s.enc, 3)...)
			}
			if s.enc == "UTF8" {
				alphabet = append(alphabet, "!0041", `\u00e9`, `\xc3\xa9`, `\D83D\DE00`)
			}
			prefixes := []string{"'", "'", "E'", "e'", "N'", "U&'", "$$", "$q$", "'", "E'", "u&'"}
			closers := map[string]string{"$$": "$$", "$q$": "$q$"}
			uescapes := []string{"", "", "", " UESCAPE '!'", " UESCAPE '\\'", " /* c */ uescape\n'!'"}
			agree, serverOnlyErr := 0, 0
			for i := 0; i < 500; i++ {
				var b strings.Builder
				for n := 1 + rng.Intn(3); n > 0; n-- {
					b.WriteString("SELECT ")
					for k := 1 + rng.Intn(2); k > 0; k-- {
						p := prefixes[rng.Intn(len(prefixes))]
						b.WriteString(p)
						for m := rng.Intn(8); m > 0; m-- {
							b.WriteString(alphabet[rng.Intn(len(alphabet))])
						}
						if c, ok := closers[p]; ok {
							b.WriteString(c)
						} else {
							b.WriteString("'")
						}
						if p == "U&'" || p == "u&'" {
							b.WriteString(uescapes[rng.Intn(len(uescapes))])
						}
						if k > 1 {
							b.WriteString([]string{", ", ",\n", "\n"}[rng.Intn(3)])
						}
					}
					b.WriteString([]string{"; ", ";", " -- x\n;", "/* ; */;"}[rng.Intn(4)])
				}
				text := enc(t, s.enc, b.String())
				lexed, lexErr := lexRaw(text, set)
				r := cl.query(t, text)[0]
				switch {
				case lexErr != nil && r.err == nil:
					t.Errorf("lexer rejects %q (%v); the server runs it: %v", b.String(), lexErr, r)
				case lexErr == nil && r.err == nil:
					vals := make([]string, len(r.values))
					for j, v := range r.values {
						vals[j] = decodeFrom(t, s.enc, v)
					}
					if lexed.Statements != r.completes || strings.Join(lexed.Strings, "\x00") != strings.Join(vals, "\x00") {
						t.Errorf("text %q: lexer reads %d statements %q, the server %d %q", b.String(), lexed.Statements, lexed.Strings, r.completes, vals)
					}
					agree++
				case lexErr == nil:
					serverOnlyErr++ // a syntax error beyond lexing
				}
			}
			if agree < 50 {
				t.Errorf("only %d texts ran on the server (%d server-only errors): the generator tests too little", agree, serverOnlyErr)
			}
			t.Logf("%d texts agreed, %d rejected by the server only", agree, serverOnlyErr)
		})
	}
}
