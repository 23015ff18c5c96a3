package dispatch

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzIsObject holds the intake's JSON-object check (segmentio/encoding's
// json.Valid) to encoding/json's answer for any input. The seeds are every
// payload in ../shared/fixtures/github/webhooks, whole and cut short, and
// JSON that validators are known to disagree on (invalid UTF-8, lone
// surrogates, deep nesting, trailing data).
func FuzzIsObject(f *testing.F) {
	dir := filepath.Join("..", "..", "..", "shared", "fixtures", "github", "webhooks")
	entries, err := os.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	for _, s := range []string{`{}`, ` {"a":1} `, `{"a":1}{}`, `{"a":"\xff"}`, `{"a":"\ud800"}`, `{"a":1,}`, `{"a":01}`,
		`{"a":1e}`, `{"a":-}`, `{"a":"\u00"}`, strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200), "{\"a\":\"\t\"}", `[]`, `{"a" 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		t1 := bytes.TrimLeft(b, " \t\r\n")
		want := len(t1) > 0 && t1[0] == '{' && json.Valid(b)
		if got := isObject(b); got != want {
			t.Errorf("isObject(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}
