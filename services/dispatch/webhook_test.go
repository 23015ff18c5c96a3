package dispatch_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

var secret = []byte("berth-webhook-test-secret")

func sign(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// fixture reads ../shared/fixtures/github/webhooks/<name>, relative to the
// folder that holds go.work.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "..", "shared", "fixtures", "github", "webhooks", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// repoRoot is the folder that holds go.work.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.work above the test's working directory")
		}
		dir = parent
	}
	return dir
}

type intake struct {
	h   *dispatch.Intake
	srv *server.Server
	js  jetstream.JetStream
}

// newIntake serves the handler over a real embedded JetStream.
func newIntake(t testing.TB) *intake {
	t.Helper()
	return newIntakeOn(t, natsembed.EmbeddedConfig{})
}

// newIntakeOn serves the handler over a real embedded JetStream set up by cfg.
func newIntakeOn(t testing.TB, cfg natsembed.EmbeddedConfig) *intake {
	t.Helper()
	srv := testkit.Server(t, cfg)
	_, js := testkit.Connect(t, srv.ClientURL())
	testkit.Stream(t, js, eventlog.StreamConfig{})
	return &intake{srv: srv, js: js, h: &dispatch.Intake{
		Secret:  secret,
		Log:     &eventlog.Appender{JS: js, Source: "berth/dispatcher/test", Timeout: time.Second},
		Now:     func() time.Time { return t0 },
		Logger:  slog.New(slog.DiscardHandler),
		Metrics: dispatch.NewMetrics(prometheus.NewRegistry()),
	}}
}

type delivery struct {
	event, id, signature string
	body                 []byte
	header               http.Header // more headers, set after the others (an empty value deletes one)
	chunked              bool        // sent without a Content-Length, as a proxy may forward it
}

// chunked is d sent without a Content-Length.
func chunked(d delivery) delivery {
	d.chunked = true
	return d
}

// signed is a delivery as GitHub sends it, signed with the intake's secret.
func signed(event, id string, body []byte) delivery {
	return delivery{event: event, id: id, signature: sign(secret, body), body: body}
}

type reply struct {
	code    int
	outcome string
	message string
}

func (in *intake) post(t *testing.T, d delivery) reply {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/webhook", bytes.NewReader(d.body))
	if d.chunked {
		r.ContentLength = -1
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("User-Agent", "GitHub-Hookshot/123abc")
	r.Header.Set("X-GitHub-Event", d.event)
	if d.id != "" {
		r.Header.Set("X-GitHub-Delivery", d.id)
	}
	if d.signature != "" {
		r.Header.Set("X-Hub-Signature-256", d.signature)
	}
	for k, vs := range d.header {
		r.Header.Del(k)
		for _, v := range vs {
			if v != "" {
				r.Header.Add(k, v)
			}
		}
	}
	w := httptest.NewRecorder()
	in.h.ServeHTTP(w, r)
	var body struct{ Outcome, Message string }
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("reply %d is not JSON: %q", w.Code, w.Body.String())
	}
	return reply{w.Code, body.Outcome, body.Message}
}

func (in *intake) stream(t testing.TB, subject string) *jetstream.StreamInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := in.js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// stored returns the messages on subject (count) and the last one decoded.
func (in *intake) stored(t *testing.T, subject string) (uint64, events.Event) {
	t.Helper()
	n := in.stream(t, subject).State.Subjects[subject]
	if n == 0 {
		return 0, events.Event{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := in.js.Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Unmarshal(m.Data, m.Sequence)
	if err != nil {
		t.Fatalf("stored message does not decode: %v", err)
	}
	return n, ev
}

func (in *intake) total(t testing.TB) uint64 { return in.stream(t, events.SubjectAll).State.Msgs }

// jobOf reads the job id and labels from a workflow_job payload.
func jobOf(t *testing.T, body []byte) (int64, []string) {
	t.Helper()
	var p struct {
		WorkflowJob struct {
			ID     int64    `json:"id"`
			Labels []string `json:"labels"`
		} `json:"workflow_job"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.WorkflowJob.ID == 0 {
		t.Fatalf("fixture is not a workflow_job payload: %v", err)
	}
	return p.WorkflowJob.ID, p.WorkflowJob.Labels
}

func TestQueuedDeliveryIsStoredOnceUnderItsDeliveryID(t *testing.T) {
	in := newIntake(t)
	body := fixture(t, "workflow_job.queued.json")
	id, labels := jobOf(t, body)
	d := signed("workflow_job", "0b989ba4-242f-11e5-81e1-c7b6966d2516", body)

	if r := in.post(t, d); r.code != http.StatusAccepted || r.outcome != "stored" {
		t.Fatalf("first delivery: %+v, want 202 stored", r)
	}
	n, ev := in.stored(t, events.JobSubject(id))
	if n != 1 || ev.Type() != events.TypeJobQueued {
		t.Fatalf("%d message(s) of type %v on %s, want 1 %s", n, ev.Data, events.JobSubject(id), events.TypeJobQueued)
	}
	q := ev.Data.(*events.JobQueued)
	if q.JobID != id || q.Delivery != d.id || !reflect.DeepEqual(q.Labels, labels) {
		t.Fatalf("stored %+v, want job %d, delivery %s, labels %v", q.JobRef, id, d.id, labels)
	}

	if r := in.post(t, d); r.code != http.StatusAccepted || r.outcome != "duplicate" {
		t.Fatalf("redelivery: %+v, want 202 duplicate", r)
	}
	if n, _ := in.stored(t, events.JobSubject(id)); n != 1 || in.total(t) != 1 {
		t.Fatalf("after redelivery %d message(s) on the job, %d in all; want 1", n, in.total(t))
	}
}

// Given a signed delivery, when it comes with its Content-Length (as
// GitHub sends it) or without one (as a proxy may forward it), then each
// is read whole and stored.
func TestADeliveryIsReadWholeWithOrWithoutItsLength(t *testing.T) {
	in := newIntake(t)
	body := fixture(t, "workflow_job.queued.self-hosted.json")
	for _, d := range []delivery{signed("workflow_job", "len-1", body), chunked(signed("workflow_job", "len-2", body))} {
		if r := in.post(t, d); r.code != http.StatusAccepted || r.outcome != "stored" {
			t.Errorf("delivery %s (no Content-Length: %v): %+v, want 202 stored", d.id, d.chunked, r)
		}
	}
	id, _ := jobOf(t, body)
	if n, ev := in.stored(t, events.JobSubject(id)); n != 2 || ev.Data.(*events.JobQueued).JobID != id {
		t.Errorf("%d facts on the job (last %+v), want one for each delivery", n, ev.Data)
	}
}

func TestCancelledBeforeRunnerIsStoredAsCompletedWithoutRunner(t *testing.T) {
	in := newIntake(t)
	body := fixture(t, "workflow_job.completed.cancelled.self-hosted-arm64.partial.json")
	id, labels := jobOf(t, body)

	if r := in.post(t, signed("workflow_job", "cancelled-1", body)); r.code != http.StatusAccepted {
		t.Fatalf("reply %+v, want 202", r)
	}
	n, ev := in.stored(t, events.JobSubject(id))
	if n != 1 || ev.Type() != events.TypeJobCompleted {
		t.Fatalf("%d message(s), last %v, want 1 %s", n, ev.Data, events.TypeJobCompleted)
	}
	c := ev.Data.(*events.JobCompleted)
	if c.RunnerName != "" || c.Conclusion != "cancelled" || !reflect.DeepEqual(c.Labels, labels) {
		t.Fatalf("stored %+v, want cancelled, no runner, labels %v", c, labels)
	}
}

func TestDeliveriesThatStoreNothing(t *testing.T) {
	queued := fixture(t, "workflow_job.queued.self-hosted.json")
	huge := []byte(`{"action":"queued","pad":"` + strings.Repeat("x", dispatch.MaxWebhookBytes) + `"}`)
	wrong := signed("workflow_job", "d-2", queued)
	wrong.signature = sign([]byte("not-the-secret"), queued)
	cases := []struct {
		name    string
		d       delivery
		code    int
		outcome string
	}{
		{"unsigned", delivery{event: "workflow_job", id: "d-1", body: queued}, http.StatusUnauthorized, "unauthorized"},
		{"wrong secret", wrong, http.StatusUnauthorized, "unauthorized"},
		{"tampered body", delivery{event: "workflow_job", id: "d-3", signature: sign(secret, queued), body: append([]byte(" "), queued...)}, http.StatusUnauthorized, "unauthorized"},
		{"over 1 MiB", signed("workflow_job", "d-4", huge), http.StatusRequestEntityTooLarge, "too_large"},
		{"over 1 MiB, no Content-Length", chunked(signed("workflow_job", "d-4c", huge)), http.StatusRequestEntityTooLarge, "too_large"},
		{"no delivery id", signed("workflow_job", "", queued), http.StatusBadRequest, "bad_request"},
		{"ping", signed("ping", "d-5", fixture(t, "ping.json")), http.StatusOK, "ping"},
		{"workflow_run", signed("workflow_run", "d-6", fixture(t, "workflow_run.requested.json")), http.StatusAccepted, "ignored"},
		{"signed but truncated JSON", signed("workflow_job", "d-7", queued[:len(queued)/2]), http.StatusBadRequest, "bad_request"},
		{"workflow_job null", signed("workflow_job", "d-8", []byte(`{"action":"queued","workflow_job":null}`)), http.StatusBadRequest, "bad_request"},
		{"workflow_job missing", signed("workflow_job", "d-9", []byte(`{"action":"queued"}`)), http.StatusBadRequest, "bad_request"},
		{"job id 0", signed("workflow_job", "d-10", []byte(`{"action":"queued","workflow_job":{"id":0,"labels":["self-hosted"]}}`)), http.StatusBadRequest, "bad_request"},
		{"job id negative", signed("workflow_job", "d-11", []byte(`{"action":"queued","workflow_job":{"id":-5,"labels":["self-hosted"]}}`)), http.StatusBadRequest, "bad_request"},
	}
	in := newIntake(t)
	for _, c := range cases {
		if r := in.post(t, c.d); r.code != c.code || r.outcome != c.outcome {
			t.Errorf("%s: %+v, want %d %s", c.name, r, c.code, c.outcome)
		}
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d message(s) stored, want none", n)
	}
}

// GitHub's published vector (docs: validating webhook deliveries) passes the
// same code path; one changed digit does not.
func TestGitHubSignatureTestVector(t *testing.T) {
	var v struct {
		Secret, Payload string
		Header          string `json:"X-Hub-Signature-256"`
	}
	if err := json.Unmarshal(fixture(t, "signature-test-vector.json"), &v); err != nil {
		t.Fatal(err)
	}
	if got := sign([]byte(v.Secret), []byte(v.Payload)); got != v.Header {
		t.Fatalf("test signer gives %s, GitHub's vector %s", got, v.Header)
	}
	in := newIntake(t)
	in.h.Secret = []byte(v.Secret)
	good := delivery{event: "workflow_job", id: "vector", signature: v.Header, body: []byte(v.Payload)}
	if r := in.post(t, good); r.code == http.StatusUnauthorized {
		t.Fatalf("GitHub's own signature rejected: %+v", r)
	}
	bad := good
	bad.signature = v.Header[:len(v.Header)-1] + "0"
	if r := in.post(t, bad); r.code != http.StatusUnauthorized {
		t.Fatalf("altered signature: %+v, want 401", r)
	}
}

func TestLogDownAsksForRedelivery(t *testing.T) {
	in := newIntake(t)
	in.srv.Shutdown()
	in.srv.WaitForShutdown()

	r := in.post(t, signed("workflow_job", "while-down", fixture(t, "workflow_job.queued.self-hosted.json")))
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.message, "redeliver") {
		t.Fatalf("NATS down: %+v, want 503 telling the operator to redeliver", r)
	}
}

// hmacHex is "<prefix>=" and the hex HMAC of body under key with hash h.
func hmacHex(prefix string, h func() hash.Hash, key, body []byte) string {
	m := hmac.New(h, key)
	m.Write(body)
	return prefix + "=" + hex.EncodeToString(m.Sum(nil))
}

// Issue 16: go-github's ValidatePayload falls back to the SHA-1
// X-Hub-Signature when X-Hub-Signature-256 is missing, and takes whatever
// hash the prefix names (sha1, sha256, sha512) in either header. Given a
// real workflow_job payload, when it comes with a correct signature of any
// other form than X-Hub-Signature-256: sha256=<hex>, then it is refused with
// 401, the message names the header Berth requires, and nothing is stored.
func TestOnlyXHubSignature256IsAccepted(t *testing.T) {
	body := fixture(t, "workflow_job.queued.self-hosted.json")
	sha1Sig := hmacHex("sha1", sha1.New, secret, body)
	cases := []struct {
		name   string
		header http.Header
	}{
		{"correct SHA-1 X-Hub-Signature alone", http.Header{"X-Hub-Signature": {sha1Sig}}},
		{"correct SHA-1 X-Hub-Signature, wrong X-Hub-Signature-256", http.Header{
			"X-Hub-Signature": {sha1Sig}, "X-Hub-Signature-256": {sign([]byte("not-the-secret"), body)}}},
		{"sha1= in X-Hub-Signature-256", http.Header{"X-Hub-Signature-256": {sha1Sig}}},
		{"sha512= in X-Hub-Signature-256", http.Header{"X-Hub-Signature-256": {hmacHex("sha512", sha512.New, secret, body)}}},
		{"no prefix", http.Header{"X-Hub-Signature-256": {strings.TrimPrefix(sign(secret, body), "sha256=")}}},
		{"SHA256= upper-case prefix", http.Header{"X-Hub-Signature-256": {"SHA256=" + strings.TrimPrefix(sign(secret, body), "sha256=")}}},
		{"digest cut short", http.Header{"X-Hub-Signature-256": {sign(secret, body)[:40]}}},
		{"digest with more after it", http.Header{"X-Hub-Signature-256": {sign(secret, body) + "00"}}},
		{"two X-Hub-Signature-256, one right", http.Header{"X-Hub-Signature-256": {sign([]byte("x"), body), sign(secret, body)}}},
		{"no signature at all", nil},
	}
	in := newIntake(t)
	for i, c := range cases {
		d := delivery{event: "workflow_job", id: "sig-" + strconv.Itoa(i), body: body, header: c.header}
		r := in.post(t, d)
		if r.code != http.StatusUnauthorized || r.outcome != "unauthorized" || !strings.Contains(r.message, "X-Hub-Signature-256") {
			t.Errorf("%s: %+v, want 401 naming X-Hub-Signature-256", c.name, r)
		}
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d fact(s) stored for deliveries without a valid X-Hub-Signature-256", n)
	}
	// The same payload with GitHub's header (upper-case hex decodes to the
	// same digest) is stored.
	upper := "sha256=" + strings.ToUpper(strings.TrimPrefix(sign(secret, body), "sha256="))
	if r := in.post(t, delivery{event: "workflow_job", id: "sig-ok", signature: upper, body: body}); r.code != http.StatusAccepted || r.outcome != "stored" {
		t.Fatalf("correctly signed: %+v, want 202 stored", r)
	}
}

// Issue 16: a signed body that is not a JSON object (null, an array, a
// string, a number, a boolean, nothing) was answered 200 or 202 for a ping
// or an event Berth ignores. GitHub sends every payload as one JSON object,
// so given such a body, signed, when it is posted as any event, then 400
// with a message saying so, and nothing is stored.
func TestSignedBodiesThatAreNotJSONObjectsAre400(t *testing.T) {
	bodies := []string{"null", " null\n", "[]", `[{"action":"queued"}]`, `"workflow_job"`, "1", "true", "false", "", "{", `{"action":"queued"} {}`}
	in := newIntake(t)
	for _, event := range []string{"workflow_job", "ping", "workflow_run", "made_up"} {
		for i, b := range bodies {
			d := signed(event, event+"-"+strconv.Itoa(i), []byte(b))
			r := in.post(t, d)
			if r.code != http.StatusBadRequest || r.outcome != "bad_request" || !strings.Contains(r.message, "JSON object") {
				t.Errorf("%s %q: %+v, want 400 saying the body is not a JSON object", event, b, r)
			}
		}
	}
	// The form encoding GitHub offers carries the JSON in "payload".
	form := []byte("payload=null")
	d := signed("ping", "form-null", form)
	d.header = http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	if r := in.post(t, d); r.code != http.StatusBadRequest || !strings.Contains(r.message, "JSON object") {
		t.Errorf("form payload=null: %+v, want 400", r)
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d fact(s) stored for bodies that are not JSON objects", n)
	}
}

// Issue 16: a 100 KB X-GitHub-Delivery became a 100 KB Nats-Msg-Id and the
// append failed, so the answer was 503, which asks GitHub to deliver again,
// forever. GitHub's delivery ids are GUIDs (36 characters); given a signed,
// real payload, when a header Berth reads (X-GitHub-Delivery,
// X-GitHub-Event) is over dispatch.MaxHeaderBytes or holds a character that
// is not an HTTP token character (whitespace, a control character, a byte
// outside ASCII), then 400 naming the header, never a 5xx, and nothing is
// stored. Headers Berth does not read are not judged.
func TestOversizedOrOddHeadersAre400(t *testing.T) {
	body := fixture(t, "workflow_job.queued.self-hosted.json")
	long := strings.Repeat("a", dispatch.MaxHeaderBytes+1)
	bad := []struct {
		name, event, id, header string
	}{
		{"100 KB delivery id", "workflow_job", strings.Repeat("0", 100<<10), "X-GitHub-Delivery"},
		{"delivery id one byte over", "workflow_job", long, "X-GitHub-Delivery"},
		{"delivery id with a space", "workflow_job", "0b989ba4 242f", "X-GitHub-Delivery"},
		{"delivery id with a tab", "workflow_job", "0b989ba4\t242f", "X-GitHub-Delivery"},
		{"delivery id with a newline", "workflow_job", "0b989ba4\nNats-Expected-Stream: x", "X-GitHub-Delivery"},
		{"delivery id with NUL", "workflow_job", "0b989ba4\x00", "X-GitHub-Delivery"},
		{"delivery id with DEL", "workflow_job", "0b989ba4\x7f", "X-GitHub-Delivery"},
		{"delivery id not ASCII", "workflow_job", "0b989ba4-é", "X-GitHub-Delivery"},
		{"delivery id not UTF-8", "workflow_job", "0b989ba4-\xff", "X-GitHub-Delivery"},
		{"delivery id with a colon", "workflow_job", "a:b", "X-GitHub-Delivery"},
		{"100 KB event", strings.Repeat("e", 100<<10), "ev-1", "X-GitHub-Event"},
		{"event with a space", "workflow job", "ev-2", "X-GitHub-Event"},
		{"event with a newline", "workflow_job\n", "ev-3", "X-GitHub-Event"},
		{"no event", "", "ev-4", "X-GitHub-Event"},
	}
	in := newIntake(t)
	for _, c := range bad {
		r := in.post(t, signed(c.event, c.id, body))
		if r.code != http.StatusBadRequest || r.outcome != "bad_request" || !strings.Contains(r.message, c.header) {
			t.Errorf("%s: %d %s %.200q, want 400 naming %s", c.name, r.code, r.outcome, r.message, c.header)
		}
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d fact(s) stored for deliveries with bad headers", n)
	}

	// GitHub's own example delivery id, the longest accepted one, and a
	// 100 KB header Berth does not read are all fine.
	var headers map[string]map[string]any
	if err := json.Unmarshal(fixture(t, "headers.openapi-example.json"), &headers); err != nil {
		t.Fatal(err)
	}
	guid := headers["workflow-job-queued"]["X-GitHub-Delivery"].(string)
	hookID := delivery{event: "workflow_job", id: "hook-id", signature: sign(secret, body), body: body,
		header: http.Header{"X-Github-Hook-Id": {strings.Repeat("9", 100<<10)}}}
	for i, d := range []delivery{signed("workflow_job", guid, body), signed("workflow_job", long[1:], body), hookID} {
		if r := in.post(t, d); r.code != http.StatusAccepted {
			t.Errorf("good delivery %d: %+v, want 202", i, r)
		}
	}
	if n := in.total(t); n != 3 {
		t.Fatalf("%d fact(s), want 3 (one per delivery)", n)
	}
}

// A signed workflow_job of at most 1 MiB whose fact does not fit in one NATS
// message is not the log being unavailable, and a 503 would have GitHub
// deliver it again for nothing. Given a log with nats-server's default
// max_payload (1 MiB), when a signed delivery of exactly 1 MiB that is all
// labels is posted, then 400, not 503, and nothing is stored.
func TestFactTooLargeForTheLogIs400(t *testing.T) {
	const head, tail = `{"action":"queued","workflow_job":{"id":77,"labels":["`, `"]}}`
	pad := dispatch.MaxWebhookBytes - len(head) - len(tail)
	body := []byte(head + strings.Repeat("x", pad) + tail)
	in := newIntakeOn(t, natsembed.EmbeddedConfig{MaxPayload: 1 << 20})
	r := in.post(t, signed("workflow_job", "big-labels", body))
	if r.code != http.StatusBadRequest || r.outcome != "bad_request" || !strings.Contains(r.message, "max_payload") {
		t.Fatalf("%+v, want 400 naming max_payload", r)
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d fact(s) stored", n)
	}
}

// Content types: GitHub offers application/json and
// application/x-www-form-urlencoded (the JSON in "payload"); both are read.
// Anything else, signed, is a 400 that says which to choose, not a 401.
func TestContentTypes(t *testing.T) {
	body := fixture(t, "workflow_job.queued.json")
	form := []byte("payload=" + url.QueryEscape(string(body)))
	in := newIntake(t)
	fd := signed("workflow_job", "form", form)
	fd.header = http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	if r := in.post(t, fd); r.code != http.StatusAccepted || r.outcome != "stored" {
		t.Fatalf("form-encoded: %+v, want 202 stored", r)
	}
	for i, ct := range []string{"text/plain", "", "application/json; charset=utf-8"} {
		d := signed("workflow_job", "ct-"+strconv.Itoa(i), body)
		d.header = http.Header{"Content-Type": {ct}}
		r := in.post(t, d)
		if ct == "application/json; charset=utf-8" {
			if r.code != http.StatusAccepted {
				t.Errorf("Content-Type %q: %+v, want 202", ct, r)
			}
			continue
		}
		if r.code != http.StatusBadRequest || !strings.Contains(r.message, "application/json") {
			t.Errorf("Content-Type %q: %+v, want 400 naming application/json", ct, r)
		}
	}
}

// go-github's ValidatePayload checks nothing when both the secret and the
// signature are empty. run refuses to start without a secret, but the
// handler does not rely on it: given an intake with no secret, when an
// unsigned (or empty-key-signed) delivery comes, then 401 naming the setting.
func TestNoSecretRefusesEverything(t *testing.T) {
	in := newIntake(t)
	in.h.Secret = nil
	body := fixture(t, "workflow_job.queued.self-hosted.json")
	for i, d := range []delivery{
		{event: "workflow_job", id: "nosecret-1", body: body},
		{event: "workflow_job", id: "nosecret-2", signature: sign(nil, body), body: body},
	} {
		if r := in.post(t, d); r.code != http.StatusUnauthorized || !strings.Contains(r.message, "webhook_secret") {
			t.Errorf("delivery %d: %+v, want 401 naming webhook_secret", i, r)
		}
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d fact(s) stored without a secret", n)
	}
}

// Given the intake of a dispatcher whose scale set serves the job's pool,
// when its queued delivery arrives, then it is answered 202 "scale_set"
// and nothing is stored: the set's JobAssigned carries the job; a job of
// another pool is stored as before. A completed delivery of a scale set's
// job is stored: the set's lost JobCompleted would otherwise hold its
// slot, and a job that reached the log before its set existed must end.
func TestWebhookForAScaleSetPoolIsAcknowledgedNotStored(t *testing.T) {
	in := newIntake(t)
	body := fixture(t, "workflow_job.queued.json")
	_, labels := jobOf(t, body)
	in.h.ScaleSet = func(_ context.Context, l []string) (bool, error) { return slices.Equal(l, labels), nil }
	if r := in.post(t, signed("workflow_job", "d-1", body)); r.code != http.StatusAccepted || r.outcome != "scale_set" {
		t.Fatalf("delivery for a scale-set pool: %d %q, want 202 scale_set", r.code, r.outcome)
	}
	if n := in.total(t); n != 0 {
		t.Fatalf("%d facts stored for a scale-set pool's delivery, want 0", n)
	}
	done := fixture(t, "workflow_job.completed.success.json")
	_, doneLabels := jobOf(t, done)
	in.h.ScaleSet = func(context.Context, []string) (bool, error) { return true, nil }
	if r := in.post(t, signed("workflow_job", "d-3", done)); r.outcome != "stored" || in.total(t) != 1 {
		t.Fatalf("completed delivery for a scale-set pool (labels %v): %q, %d facts; want stored, 1", doneLabels, r.outcome, in.total(t))
	}
	// Under the job's own id, as the set's JobCompleted is: the same
	// transition from both is stored once.
	doneID, _ := jobOf(t, done)
	if r := in.post(t, signed("workflow_job", "d-4", done)); r.outcome != "duplicate" || in.total(t) != 1 {
		t.Fatalf("the same completion again (job %d, another delivery): %q, %d facts; want duplicate, 1", doneID, r.outcome, in.total(t))
	}
	in.h.ScaleSet = func(context.Context, []string) (bool, error) { return false, nil }
	if r := in.post(t, signed("workflow_job", "d-2", body)); r.outcome != "stored" || in.total(t) != 2 {
		t.Fatalf("delivery for a webhook pool: %q, %d facts; want stored, 2", r.outcome, in.total(t))
	}
}

// Given a dispatcher that cannot tell yet whether a job is a scale set's
// (its fold has not read the whole log since it started), when a delivery
// arrives, then it is answered 503 with Retry-After and nothing is stored:
// a guess would store the transition under the delivery's id beside the
// set's own, two facts for one.
func TestWebhookWaitsUntilItCanTellAScaleSetsJob(t *testing.T) {
	in := newIntake(t)
	in.h.ScaleSet = func(context.Context, []string) (bool, error) { return false, errors.New("catching up") }
	body := fixture(t, "workflow_job.completed.success.json")
	r := in.post(t, signed("workflow_job", "d-1", body))
	if r.code != http.StatusServiceUnavailable || r.outcome != "unavailable" || in.total(t) != 0 {
		t.Fatalf("delivery while the fold catches up: %d %q, %d facts; want 503 unavailable, 0", r.code, r.outcome, in.total(t))
	}
}

// newDispatcher makes a dispatcher on the intake's stream with minter m and
// options o (their Logger, when nil, discards), its metrics on a registry of
// its own; its loop is not run.
func newDispatcher(t testing.TB, in *intake, m dispatch.Minter, o dispatch.Options) *dispatch.Dispatcher {
	t.Helper()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := dispatch.New(&eventlog.Loop{JS: in.js}, &eventlog.Appender{JS: in.js, Source: "test"}, m, o, dispatch.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
