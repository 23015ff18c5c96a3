package dispatch_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
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

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	srv := testkit.Server(t, natsembed.EmbeddedConfig{})
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
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("User-Agent", "GitHub-Hookshot/123abc")
	r.Header.Set("X-GitHub-Event", d.event)
	if d.id != "" {
		r.Header.Set("X-GitHub-Delivery", d.id)
	}
	if d.signature != "" {
		r.Header.Set("X-Hub-Signature-256", d.signature)
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
		{"tampered body", delivery{"workflow_job", "d-3", sign(secret, queued), append([]byte(" "), queued...)}, http.StatusUnauthorized, "unauthorized"},
		{"over 1 MiB", signed("workflow_job", "d-4", huge), http.StatusRequestEntityTooLarge, "too_large"},
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
