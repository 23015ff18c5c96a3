package dispatch_test

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/json"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/dispatch"
	"github.com/prometheus/client_golang/prometheus"
)

// How a fuzzed delivery is signed.
const (
	sigGood        uint8 = iota // X-Hub-Signature-256 of the body with the intake's secret
	sigNone                     // no signature header
	sigWrong                    // signed with another secret
	sigSHA1                     // only the legacy X-Hub-Signature: a correct sha1=…, which Berth does not accept
	sigSHA1In256                // X-Hub-Signature-256: a correct sha1=… (go-github took it)
	sigSHA512In256              // X-Hub-Signature-256: a correct sha512=… (go-github took it)
)

// FuzzWebhook posts arbitrary deliveries to the webhook intake, backed by a
// real embedded JetStream, and checks the contract of POST /webhook whatever
// comes in:
//
//   - the handler never panics;
//   - every answer is one of the documented codes, with a JSON body naming
//     the outcome (and, for an error, a message): 200 only for a ping, 202
//     stored / duplicate / ignored, 400 malformed, 401 bad signature, 413
//     too large; never a 5xx, since the log is reachable (503 is only for a
//     log that is not, which GitHub's redelivery can cure);
//   - a delivery not signed in X-Hub-Signature-256 with the secret (no
//     signature, another secret, SHA-1 or SHA-512) is refused (401, or 413
//     when too big) and stores nothing;
//   - a delivery stores at most one fact, only when it is a workflow_job
//     signed with the secret, its payload is a JSON object holding a
//     workflow_job object, its delivery id is a short HTTP token, and it is
//     answered 202 "stored"; the same delivery again stores nothing and is
//     answered like a redelivery.
//
// The seeds are every payload in ../shared/fixtures/github/webhooks, signed
// and not, truncated, corrupted and with odd headers; corpus entries the
// fuzzer found are kept in testdata/fuzz/FuzzWebhook. Run it with
//
//	go test -fuzz=FuzzWebhook -fuzztime=3m ./services/dispatch/
func FuzzWebhook(f *testing.F) {
	dir := filepath.Join(repoRoot(f), "..", "shared", "fixtures", "github", "webhooks")
	entries, err := os.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	seeded := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		body, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		seeded++
		event, _, _ := strings.Cut(e.Name(), ".") // workflow_job, workflow_run, ping, headers, signature-test-vector
		id := "seed-" + e.Name()
		const js = "application/json"
		f.Add(event, id, sigGood, js, body)
		f.Add(event, id, sigNone, js, body)
		f.Add(event, id, sigWrong, js, body)
		f.Add(event, id, sigSHA1, js, body)
		f.Add(event, id, sigSHA1In256, js, body)
		f.Add(event, id, sigSHA512In256, js, body)
		f.Add(event, id+"-truncated", sigGood, js, body[:len(body)/2])
		f.Add(event, id+"-empty", sigGood, js, []byte{})
		corrupt := bytes.Clone(body)
		corrupt[len(corrupt)/3] ^= 0x5a
		f.Add(event, id+"-corrupt", sigGood, js, corrupt)
		// Odd headers: GitHub's form encoding, an upper-case event name, a
		// missing content type, no delivery id, a delivery id no UUID.
		f.Add(event, id+"-form", sigGood, "application/x-www-form-urlencoded", []byte("payload="+url.QueryEscape(string(body))))
		f.Add(strings.ToUpper(event), id+"-upper", sigGood, js, body)
		f.Add(event, id+"-no-type", sigGood, "", body)
		f.Add(event, "", sigGood, js, body)
		f.Add(event, "  "+id+"\t", sigGood, js, body)
		f.Add("", id+"-no-event", sigGood, js, body)
	}
	if seeded == 0 {
		f.Fatalf("no webhook fixtures in %s", dir)
	}
	f.Add("workflow_job", "huge", sigGood, "application/json",
		[]byte(`{"action":"queued","pad":"`+strings.Repeat("x", dispatch.MaxWebhookBytes)+`"}`))
	for i, b := range []string{"null", " null ", "[]", `"s"`, "1", "true", "false", `{"action":"queued"}[]`} {
		for _, event := range []string{"workflow_job", "ping", "workflow_run"} {
			f.Add(event, "not-object-"+strconv.Itoa(i), sigGood, "application/json", []byte(b))
		}
	}
	f.Add("ping", "form-null", sigGood, "application/x-www-form-urlencoded", []byte("payload=null"))
	minimal := []byte(`{"action":"queued","workflow_job":{"id":11}}`)
	for _, id := range []string{
		strings.Repeat("0", 100<<10), strings.Repeat("d", dispatch.MaxHeaderBytes), strings.Repeat("d", dispatch.MaxHeaderBytes+1),
		"0b989ba4-242f-11e5-81e1-c7b6966d2516", "a b", "a\x00b", "a\x7f", "é", "\xff", "a:b", "a/b", "!#$%&'*+-.^_`|~",
	} {
		f.Add("workflow_job", id, sigGood, "application/json", minimal)
	}
	f.Add(strings.Repeat("e", 100<<10), "long-event", sigGood, "application/json", minimal)
	f.Add("workflow_job", "text-plain", sigGood, "text/plain", minimal)
	f.Add("workflow_job", "json-charset", sigGood, "application/json; charset=utf-8", minimal)
	f.Add("workflow_job", "labels-not-strings", sigGood, "application/json",
		[]byte(`{"action":"queued","workflow_job":{"id":7,"labels":[1,2]}}`))
	f.Add("workflow_job", "huge-id", sigGood, "application/json",
		[]byte(`{"action":"queued","workflow_job":{"id":18446744073709551616}}`))
	f.Add("workflow_job", "minimal", sigGood, "application/json",
		[]byte(`{"action":"completed","workflow_job":{"id":9}}`))
	f.Add("workflow_job", "bad\r\nX-Injected: 1", sigGood, "application/json",
		[]byte(`{"action":"queued","workflow_job":{"id":10}}`))

	in := newIntake(f)
	f.Fuzz(func(t *testing.T, event, delivery string, sig uint8, contentType string, body []byte) {
		before := in.total(t)
		first := fuzzPost(t, in, event, delivery, sig, contentType, body)
		checkReply(t, first, event, sig, len(body))
		stored := in.total(t) - before
		switch {
		case stored > 1:
			t.Fatalf("one delivery stored %d facts: %+v", stored, first)
		case stored == 1 && (first.code != http.StatusAccepted || first.outcome != "stored" || event != "workflow_job" || sig != sigGood):
			t.Fatalf("a fact stored for a delivery answered %+v (event %q, signature mode %d)", first, event, sig)
		case stored == 1 && !holdsWorkflowJob(contentType, body):
			t.Fatalf("a fact stored for a body that is not a JSON object holding a workflow_job object: %.200q", body)
		case stored == 1 && !shortToken(delivery):
			t.Fatalf("a fact stored under the delivery id %.200q", delivery)
		case stored == 0 && first.outcome == "stored":
			t.Fatalf("answered %+v but nothing was stored", first)
		}

		mid := in.total(t)
		again := fuzzPost(t, in, event, delivery, sig, contentType, body)
		checkReply(t, again, event, sig, len(body))
		if n := in.total(t) - mid; n != 0 {
			t.Fatalf("the same delivery again stored %d more fact(s): first %+v, again %+v", n, first, again)
		}
		if first.outcome == "stored" && (again.code != http.StatusAccepted || again.outcome != "duplicate") {
			t.Fatalf("a repeated delivery answered %+v, want 202 duplicate", again)
		}
		if first.outcome != "stored" && first.code != again.code {
			t.Fatalf("the same delivery answered %d then %d", first.code, again.code)
		}
	})
}

// fuzzPost sends one delivery through the handler.
func fuzzPost(t *testing.T, in *intake, event, delivery string, sig uint8, contentType string, body []byte) reply {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/webhook", bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	r.Header.Set("User-Agent", "GitHub-Hookshot/fuzz")
	if event != "" {
		r.Header.Set("X-GitHub-Event", event)
	}
	if delivery != "" {
		r.Header.Set("X-GitHub-Delivery", delivery)
	}
	switch sig {
	case sigGood:
		r.Header.Set("X-Hub-Signature-256", sign(secret, body))
	case sigWrong:
		r.Header.Set("X-Hub-Signature-256", sign([]byte("not-the-secret"), body))
	case sigSHA1:
		r.Header.Set("X-Hub-Signature", hmacHex("sha1", sha1.New, secret, body))
	case sigSHA1In256:
		r.Header.Set("X-Hub-Signature-256", hmacHex("sha1", sha1.New, secret, body))
	case sigSHA512In256:
		r.Header.Set("X-Hub-Signature-256", hmacHex("sha512", sha512.New, secret, body))
	}
	w := httptest.NewRecorder()
	in.h.ServeHTTP(w, r)
	var out struct{ Outcome, Message string }
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("reply %d is not JSON: %q", w.Code, w.Body.String())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("reply %d has Content-Type %q, want application/json", w.Code, ct)
	}
	return reply{w.Code, out.Outcome, out.Message}
}

// checkReply checks one answer against the documented codes.
func checkReply(t *testing.T, r reply, event string, sig uint8, size int) {
	t.Helper()
	want := map[int][]string{
		http.StatusOK:                    {"ping"},
		http.StatusAccepted:              {"stored", "duplicate", "ignored"},
		http.StatusBadRequest:            {"bad_request"},
		http.StatusUnauthorized:          {"unauthorized"},
		http.StatusRequestEntityTooLarge: {"too_large"},
	}
	outcomes, ok := want[r.code]
	if !ok {
		t.Fatalf("undocumented answer %+v", r)
	}
	known := false
	for _, o := range outcomes {
		known = known || o == r.outcome
	}
	if !known {
		t.Fatalf("answer %d with outcome %q, want one of %v", r.code, r.outcome, outcomes)
	}
	if r.code >= 500 {
		t.Fatalf("%+v with a reachable log: a 5xx has GitHub deliver again, for nothing", r)
	}
	if r.code >= 400 && strings.TrimSpace(r.message) == "" {
		t.Fatalf("error %d without a message telling why", r.code)
	}
	if r.code == http.StatusOK && event != "ping" {
		t.Fatalf("200 for a %q delivery; only a ping is answered 200", event)
	}
	if r.code == http.StatusRequestEntityTooLarge && size <= dispatch.MaxWebhookBytes {
		t.Fatalf("413 for a %d-byte body", size)
	}
	if sig != sigGood && r.code != http.StatusUnauthorized && r.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a delivery not signed with the secret (mode %d) answered %+v, want 401", sig, r)
	}
}

// Found by FuzzWebhook (testdata/fuzz/FuzzWebhook/c536d107c49d4c35): an
// X-GitHub-Event that is not UTF-8 made the Prometheus client panic while
// the intake counted the delivery, before the signature was even checked,
// and every distinct event name became a label value of its own, so any
// caller could grow the metric without bound. Such deliveries are refused
// like any other and counted as event "other".
func TestOddEventHeadersAreCountedAsOther(t *testing.T) {
	in := newIntake(t)
	reg := prometheus.NewRegistry()
	in.h.Metrics = dispatch.NewMetrics(reg)
	body := []byte(`{"action":"queued","workflow_job":{"id":1}}`)
	for i, event := range []string{"\x80", "\xff\xfe", "made-up-1", "made-up-2", "workflow_job\n"} {
		for _, sig := range []uint8{sigNone, sigGood} {
			r := fuzzPost(t, in, event, "odd-"+strconv.Itoa(i), sig, "application/json", body)
			checkReply(t, r, event, sig, len(body))
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "berth_webhooks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" && l.GetValue() != "other" {
					t.Errorf("event label %q from a made-up event header", l.GetValue())
				}
			}
		}
	}
}

// holdsWorkflowJob is the test's own reading of a body: in the content type
// given, a JSON object whose "workflow_job" is an object.
func holdsWorkflowJob(contentType string, body []byte) bool {
	payload := body
	if mt, _, _ := mime.ParseMediaType(contentType); mt == "application/x-www-form-urlencoded" {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return false
		}
		payload = []byte(form.Get("payload"))
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(payload, &p); err != nil || p == nil {
		return false
	}
	var job map[string]json.RawMessage
	return json.Unmarshal(p["workflow_job"], &job) == nil && job != nil
}

// shortToken: at most 128 bytes of RFC 9110 token characters.
func shortToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}
