package rewrite

import (
	"math/rand/v2"
	"testing"
)

// TestFoldWordsAgreesWithContainsFold: one pass over the text finds a word exactly when a search for each word
// (containsFoldBytes, the plain search FoldWords replaced) does, over random texts made of the words' letters in
// both cases (so near misses abound) and of the words.
func TestFoldWordsAgreesWithContainsFold(t *testing.T) {
	sets := [][]string{
		{"set_config", "pg_settings", "advisory", "temp", "u&"},
		{"prepare", "execute", "deallocate"},
		{"a", "ab", "abc"},
		{"set"},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, words := range sets {
		f := NewFoldWords(words...)
		var alphabet []byte
		for _, w := range words {
			for i := 0; i < len(w); i++ {
				c := w[i]
				alphabet = append(alphabet, c)
				if c >= 'a' && c <= 'z' {
					alphabet = append(alphabet, c-'a'+'A')
				}
			}
		}
		alphabet = append(alphabet, ' ', '@', '[', '`', '{')
		found := 0
		for n := 0; n < 20000; n++ {
			text := make([]byte, r.IntN(24))
			for i := range text {
				text[i] = alphabet[r.IntN(len(alphabet))]
			}
			if r.IntN(4) == 0 && len(text) > 0 {
				w := words[r.IntN(len(words))]
				at := r.IntN(len(text))
				text = append(text[:at], append([]byte(w), text[at:]...)...)
			}
			want := false
			for _, w := range words {
				want = want || containsFoldBytes(text, w)
			}
			if got := f.In(text); got != want {
				t.Fatalf("%q in %q: FoldWords says %v, containsFoldBytes %v", words, text, got, want)
			}
			if want {
				found++
			}
		}
		if found < 1000 {
			t.Fatalf("%q: only %d texts held a word: the test does not exercise matches", words, found)
		}
	}
}

// A word split by a letter that only differs by case folding outside ASCII letters ('@' is 'A'-1, '[' is 'Z'+1)
// is not a match.
func TestFoldWordsOnlyFoldsLetters(t *testing.T) {
	f := NewFoldWords("u&", "temp")
	for text, want := range map[string]bool{"U&'x'": true, "u&": true, "TeMp": true, "tem": false, "te@p": false, "TEM[": false, "u": false, "": false} {
		if got := f.In([]byte(text)); got != want {
			t.Errorf("in(%q) = %v, want %v", text, got, want)
		}
	}
}

func BenchmarkSessionStateWords(b *testing.B) {
	sessionState := NewFoldWords("set_config", "pg_settings", "advisory", "temp", "u&") // proxy/pooled.go's
	sqlPrepared := NewFoldWords("prepare", "execute", "deallocate")                     // proxy/pooledsqlprep.go's
	texts := [][]byte{
		[]byte("UPDATE pgbench_accounts SET abalance = abalance + -4321 WHERE aid = 832117;"),
		[]byte("SELECT abalance FROM pgbench_accounts WHERE aid = 832117;"),
		[]byte("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (7, 1, 832117, -4321, CURRENT_TIMESTAMP);"),
	}
	for b.Loop() {
		for _, t := range texts {
			sessionState.In(t)
			sqlPrepared.In(t)
		}
	}
}
