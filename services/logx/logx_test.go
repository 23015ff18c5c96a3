package logx_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/logx"
	"github.com/nats-io/nkeys"
)

// Given a logger in JSON (as in a container), when records carry secrets in
// attributes named for them, inside messages, inside errors and as bare
// values, then none of them reaches the output, and the ordinary fields do.
func TestSecretsNeverReachTheLog(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	jit := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte(`{"runner":"berth-1-1","url":"https://pipelines.example"}`), 20))
	secrets := map[string]string{
		"classic token":      "ghs_" + strings.Repeat("A1b2C3", 6),
		"fine-grained token": "github_pat_" + strings.Repeat("Z9y8X7", 8),
		"jwt":                "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjM0NSJ9.c2lnbmF0dXJlLWJ5dGVz",
		"nkey seed":          string(seed),
		"jit config":         jit,
		"webhook secret":     "hunter2-but-longer",
	}
	var out bytes.Buffer
	log, err := logx.New(&out, "debug", logx.FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("minted", "attempt", "berth-1-1", "jit_config", secrets["jit config"], "pool", "linux")
	log.Warn("GitHub said no to token "+secrets["classic token"], "status", 401)
	log.Error("call failed", "err", errors.New("POST with Authorization: Bearer "+secrets["jwt"]+" refused"))
	log.Info("config", "webhook_secret", secrets["webhook secret"], "token_env", "BERTH_GITHUB_TOKEN")
	log.Info("loaded", "value", secrets["nkey seed"], "other", secrets["fine-grained token"])
	log.Debug("blob", "body", secrets["jit config"])

	text := out.String()
	for what, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s is in the log:\n%s", what, text)
		}
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 6:\n%s", len(lines), text)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatalf("not JSON: %v: %s", err, lines[0])
	}
	if first["attempt"] != "berth-1-1" || first["pool"] != "linux" || first["jit_config"] != logx.Redacted {
		t.Errorf("first record %v: want attempt and pool kept, jit_config redacted", first)
	}
	if !strings.Contains(text, `"token_env":"BERTH_GITHUB_TOKEN"`) {
		t.Errorf("the name of a token's variable is no secret and must stay:\n%s", text)
	}
}

// Given each format, then auto is JSON when the output is not a terminal,
// text is key=value, and an unknown format or level is an error that names
// the accepted values.
func TestFormats(t *testing.T) {
	for format, wantJSON := range map[string]bool{logx.FormatAuto: true, logx.FormatJSON: true, logx.FormatText: false} {
		var out bytes.Buffer
		log, err := logx.New(&out, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("hello", "k", "v", "timeout", 90*time.Second)
		if !strings.Contains(out.String(), "1m30s") {
			t.Errorf("format %s: %q, want the duration as 1m30s", format, out.String())
		}
		if got := strings.HasPrefix(out.String(), "{"); got != wantJSON {
			t.Errorf("format %s: %q, want JSON %v", format, out.String(), wantJSON)
		}
	}
	if _, err := logx.New(&bytes.Buffer{}, "info", "yaml"); err == nil || !strings.Contains(err.Error(), "auto, json or text") {
		t.Errorf("unknown format: %v", err)
	}
	if _, err := logx.New(&bytes.Buffer{}, "loud", "json"); err == nil || !strings.Contains(err.Error(), "debug, info, warn or error") {
		t.Errorf("unknown level: %v", err)
	}
}
