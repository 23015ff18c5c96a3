package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// yamlKeys lists every key path of t's yaml tags, e.g. "nats.max_age".
func yamlKeys(t reflect.Type, prefix string, out *[]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" { // inlined
			yamlKeys(f.Type, prefix, out)
			continue
		}
		*out = append(*out, prefix+tag)
		if f.Type != reflect.TypeOf(ByteSize(0)) && f.Type.String() != "time.Duration" {
			yamlKeys(f.Type, prefix+tag+".", out)
		}
	}
}

// deploy/berth.example.yaml is the configuration reference: every key the
// config reads appears in it (set, or commented out where it is an
// alternative), under its parent section, with its default.
func TestTheExampleFileDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "berth.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	var keys []string
	yamlKeys(reflect.TypeOf(Config{}), "", &keys)
	var missing []string
	for _, k := range keys {
		leaf := k[strings.LastIndex(k, ".")+1:]
		if !regexp.MustCompile(`(?m)^[ #]*(- )?` + regexp.QuoteMeta(leaf) + `:`).MatchString(text) {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("deploy/berth.example.yaml does not document %d keys: %s", len(missing), strings.Join(missing, ", "))
	}
}
