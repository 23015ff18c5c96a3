package dispatch

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/google/go-github/v62/github"
	"github.com/nats-io/nats.go"
	fastjson "github.com/segmentio/encoding/json"
)

// MaxWebhookBytes is the largest body accepted (GitHub caps payloads at
// 25 MB; workflow_job payloads are a few KiB, so 1 MiB is generous).
const MaxWebhookBytes = 1 << 20

// MaxHeaderBytes is the longest X-GitHub-Delivery or X-GitHub-Event
// accepted. GitHub's delivery ids are GUIDs, 36 characters ("Delivery
// headers", docs.github.com/en/webhooks/webhook-events-and-payloads), and its
// longest event name is about 30; 128 leaves room for GitHub Enterprise
// Server or a relay that prefixes its own, and keeps the Nats-Msg-Id, the
// stored fact and the log lines small.
const MaxHeaderBytes = 128

// The headers the intake reads. X-GitHub-Hook-ID and the other delivery
// headers are not read, so they are not judged either.
const (
	signatureHeader = "X-Hub-Signature-256"
	sha1Header      = "X-Hub-Signature" // legacy HMAC-SHA1, refused
	eventHeader     = "X-GitHub-Event"
	deliveryHeader  = "X-GitHub-Delivery"
)

// Intake is the POST /webhook handler. It checks X-Hub-Signature-256 (and
// only that header: "sha256=" and the hex HMAC-SHA256 of the raw body with
// the shared secret, compared in constant time), reads the body as
// application/json or GitHub's form encoding, requires the payload to be one
// JSON object, stores workflow_job facts with the delivery id as
// Nats-Msg-Id, and answers well inside GitHub's 10 s:
//
//	200 ping
//	202 stored, duplicate (the delivery is already in the log), or ignored
//	    (an event or action Berth does not track)
//	400 signed but malformed: X-GitHub-Delivery or X-GitHub-Event missing,
//	    over MaxHeaderBytes or not an HTTP token; a Content-Type other than
//	    JSON or form; a body that is not a JSON object; a workflow_job
//	    without a job id; a fact too large for the log's max_payload
//	401 X-Hub-Signature-256 missing, malformed or wrong (a SHA-1
//	    X-Hub-Signature alone is refused)
//	413 body over 1 MiB
//	503 the event log is unavailable: redeliver later
//
// Checks run in that order: size, signature, then everything else, so an
// unsigned request learns nothing but 401 or 413. Every error body says what
// to do next. A 5xx is only ever the log being unreachable, since GitHub's
// redelivery (or reconcile_redeliver) can only help then.
type Intake struct {
	Secret  []byte
	Log     *eventlog.Appender
	Now     func() time.Time
	Logger  *slog.Logger
	Metrics *Metrics
	// ScaleSet, when set, reports whether a job with these labels is
	// served through a runner scale set (dispatcher.github.intake
	// scaleset): its queued deliveries are answered 202 and not stored,
	// since a scale set's job is ours only once GitHub assigns it (its
	// JobAssigned message). Its later deliveries are stored: the same
	// transitions as the set's messages, under the job's own ids, so a
	// lost message costs nothing when the webhook arrives, and a job
	// that reached the log by webhook before its set existed still ends.
	// It decides from the dispatcher's fold, so every replica decides
	// alike; an error (the fold has not read the whole log yet) is a 503,
	// redelivered, since a guess would store a transition under a second
	// id.
	ScaleSet func(ctx context.Context, labels []string) (bool, error)
	// Installation names the GitHub installation whose webhook this is
	// ("": the default; config: dispatcher.github as a list, served at
	// /webhook/NAME): every fact it stores carries it, so only that
	// installation's pools serve the job.
	Installation string
}

// refusal is an answer other than 2xx, decided before anything is stored.
type refusal struct {
	code    int
	outcome string
	msg     string
}

func badRequest(format string, a ...any) *refusal {
	return &refusal{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, a...)}
}

func (in *Intake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a GitHub webhook here", http.StatusMethodNotAllowed)
		return
	}
	event, delivery := r.Header.Get(eventHeader), r.Header.Get(deliveryHeader)
	payload, no := in.admit(w, r)
	if no != nil {
		if no.code == http.StatusUnauthorized {
			in.Logger.Warn("webhook rejected: bad signature", "delivery", clip(delivery), "err", no.msg)
		}
		in.reply(w, no.code, event, "", no.outcome, no.msg)
		return
	}
	switch event {
	case "workflow_job":
		e, err := decodeWorkflowJob(payload)
		if err != nil {
			in.unreadable(w, event, err)
			return
		}
		in.store(w, r, delivery, e)
	case "ping":
		var p github.PingEvent
		if err := json.Unmarshal(payload, &p); err != nil {
			in.unreadable(w, event, err)
			return
		}
		in.reply(w, http.StatusOK, event, "", "ping", p.GetZen())
	default:
		in.reply(w, http.StatusAccepted, event, "", "ignored", "event not handled: "+event)
	}
}

// unreadable answers a signed delivery whose payload does not have GitHub's
// shape. It must not look delivered: GitHub shows a 400 as failed, and it
// can be redelivered.
func (in *Intake) unreadable(w http.ResponseWriter, event string, err error) {
	in.reply(w, http.StatusBadRequest, event, "", "bad_request",
		"unreadable "+event+" payload: "+err.Error()+"; send GitHub's payload unchanged")
}

// admit reads the body and decides whether the delivery may be read at all:
// its size, its signature, its headers, its content type and its shape. It
// returns the JSON payload, or why not.
func (in *Intake) admit(w http.ResponseWriter, r *http.Request) ([]byte, *refusal) {
	body, err := readBody(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &refusal{http.StatusRequestEntityTooLarge, "too_large",
				"body over 1 MiB: Berth reads only workflow_job and ping; subscribe the webhook to those events only"}
		}
		return nil, badRequest("body unreadable (%v): redeliver it", err)
	}
	if no := checkSignature(r.Header, body, in.Secret); no != nil {
		return nil, no
	}
	if no := checkToken(r.Header, deliveryHeader); no != nil {
		return nil, no
	}
	if no := checkToken(r.Header, eventHeader); no != nil {
		return nil, no
	}
	payload, no := payloadOf(r.Header.Get("Content-Type"), body)
	if no != nil {
		return nil, no
	}
	if !isObject(payload) {
		return nil, badRequest("the payload is not a JSON object, and GitHub sends every payload as one: " +
			"send GitHub's delivery unchanged")
	}
	return payload, nil
}

// checkSignature accepts exactly one X-Hub-Signature-256 header holding
// "sha256=" and the hex HMAC-SHA256 of body with secret, compared in
// constant time. go-github's ValidatePayload is not used: it falls back to
// the SHA-1 X-Hub-Signature and takes any hash the prefix names.
func checkSignature(h http.Header, body, secret []byte) *refusal {
	unauthorized := func(msg string) *refusal {
		return &refusal{http.StatusUnauthorized, "unauthorized", msg}
	}
	sigs := h.Values(signatureHeader)
	switch {
	case len(secret) == 0:
		return unauthorized("the dispatcher has no webhook secret, so it cannot check X-Hub-Signature-256: " +
			"set dispatcher.webhook_secret (or webhook_secret_env) to the webhook's secret")
	case len(sigs) == 0 && h.Get(sha1Header) != "":
		return unauthorized("X-Hub-Signature-256 required: the SHA-1 X-Hub-Signature is not accepted; " +
			"GitHub sends X-Hub-Signature-256 whenever the webhook has a secret")
	case len(sigs) == 0:
		return unauthorized("X-Hub-Signature-256 missing: give the webhook a secret in GitHub, " +
			"the same as dispatcher.webhook_secret")
	case len(sigs) > 1:
		return unauthorized("more than one X-Hub-Signature-256: send exactly one")
	}
	hexMAC, ok := strings.CutPrefix(sigs[0], "sha256=")
	got, err := hex.DecodeString(hexMAC)
	if !ok || err != nil || len(got) != sha256.Size {
		return unauthorized("X-Hub-Signature-256 malformed: want sha256= followed by the 64 hex digits " +
			"of the body's HMAC-SHA256")
	}
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return unauthorized("X-Hub-Signature-256 does not match the body: check that the webhook's secret " +
			"in GitHub is dispatcher.webhook_secret")
	}
	return nil
}

// checkToken requires header to be present once, at most MaxHeaderBytes
// long, and an HTTP token (RFC 9110, 5.6.2: letters, digits and
// !#$%&'*+-.^_`|~): no whitespace, control character or non-ASCII byte can
// reach a Nats-Msg-Id, a stored fact or a log line through it.
func checkToken(h http.Header, header string) *refusal {
	vs := h.Values(header)
	switch {
	case len(vs) == 0 || vs[0] == "":
		return badRequest("%s header missing: GitHub sends it with every delivery; send the delivery unchanged", header)
	case len(vs) > 1:
		return badRequest("more than one %s header: send exactly one", header)
	case len(vs[0]) > MaxHeaderBytes:
		return badRequest("%s is %d bytes, over %d: GitHub's are far shorter (a delivery id is a 36-character GUID); "+
			"send the delivery unchanged", header, len(vs[0]), MaxHeaderBytes)
	}
	for i := 0; i < len(vs[0]); i++ {
		if !isTokenChar(vs[0][i]) {
			return badRequest("%s holds %q at byte %d; only letters, digits and !#$%%&'*+-.^_`|~ are accepted "+
				"(GitHub's are GUIDs and event names): send the delivery unchanged", header, vs[0][i], i)
		}
	}
	return nil
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// payloadOf returns the JSON a signed body carries in either content type
// GitHub offers.
func payloadOf(contentType string, body []byte) ([]byte, *refusal) {
	mt, _, err := mime.ParseMediaType(contentType)
	switch {
	case err == nil && mt == "application/json":
		return body, nil
	case err == nil && mt == "application/x-www-form-urlencoded":
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, badRequest("form body unreadable (%v): set the webhook's content type to application/json", err)
		}
		return []byte(form.Get("payload")), nil
	}
	return nil, badRequest("Content-Type %.64q not accepted: set the webhook's content type to application/json", contentType)
}

// readBody reads a delivery's body, at most MaxWebhookBytes. GitHub
// sends a Content-Length, so a body of a workflow_job's size is read into
// one buffer of that size (net/http ends the body there), not grown from
// 512 bytes by doubling for every delivery. A larger one grows as it
// arrives: a sender not yet known to hold the secret gets no megabyte for
// the asking.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, MaxWebhookBytes)
	n := r.ContentLength
	if n <= 0 || n > presizedBody {
		return io.ReadAll(rd) // unknown length, large, or over the limit: MaxBytesReader says so
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	return body, nil
}

// presizedBody is the largest body readBody sizes its buffer for up
// front: GitHub's workflow_job deliveries are 5–20 KiB.
const presizedBody = 64 << 10

// isObject reports whether payload is exactly one JSON object. Checked
// with segmentio/encoding's json.Valid, the decoder of the workflow_job
// fields too: about 3× encoding/json's, with the same answers
// (FuzzIsObject; FuzzWebhook holds the intake to encoding/json's).
func isObject(payload []byte) bool {
	t := bytes.TrimLeft(payload, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && fastjson.Valid(payload)
}

// clip bounds a header value that was not checked yet for a log line.
func clip(s string) string {
	if len(s) > MaxHeaderBytes {
		return s[:MaxHeaderBytes] + "…"
	}
	return s
}

// store appends the fact a signed, well-formed workflow_job delivery carries.
func (in *Intake) store(w http.ResponseWriter, r *http.Request, delivery string, e *workflowJobEvent) {
	const event = "workflow_job"
	if e.jobID() <= 0 {
		in.reply(w, http.StatusBadRequest, event, e.Action, "bad_request",
			"workflow_job payload without a job id: send GitHub's payload unchanged")
		return
	}
	scaleSet, err := in.scaleSet(r.Context(), e.labels())
	if err != nil {
		in.Logger.Warn("webhook not stored: cannot tell yet whether its job is a scale set's", "delivery", delivery, "err", err)
		w.Header().Set("Retry-After", "1")
		in.reply(w, http.StatusServiceUnavailable, event, e.Action, "unavailable",
			"the dispatcher is still reading the event log; redeliver this delivery from the GitHub UI or API in a few seconds")
		return
	}
	if scaleSet {
		if e.Action == "queued" {
			in.reply(w, http.StatusAccepted, event, e.Action, "scale_set",
				"this job's pool is served through its runner scale set, whose messages carry it: nothing to do")
			return
		}
		// Stored under the job's own id (no delivery), the id the set's
		// message stores the same transition under: the log keeps one.
		delivery = ""
	}
	p := jobFact(delivery, e, in.Installation)
	if p == nil {
		in.reply(w, http.StatusAccepted, event, e.Action, "ignored", "action not tracked")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	// Confirmed: a duplicate answer whose id another writer took is not
	// this delivery stored (issue 16); it is appended under a fresh id.
	c, err := in.Log.AppendConfirmed(ctx, in.Log.New(in.Now(), p), nil)
	seq, dup := c.Seq, c.Dup
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		// Not the log being down: the same delivery would fail again.
		in.Logger.Warn("webhook not stored: fact over max_payload", "delivery", delivery, "err", err)
		in.reply(w, http.StatusBadRequest, event, e.Action, "bad_request",
			"this job's fact is larger than the event log's max_payload (labels or names too long): "+
				"shorten them, or raise max_payload in the NATS server's config")
		return
	case err != nil:
		in.Logger.Error("webhook not stored", "delivery", delivery, "err", err)
		in.reply(w, http.StatusServiceUnavailable, event, e.Action, "unavailable",
			"event log unavailable; redeliver this delivery from the GitHub UI or API")
		return
	}
	crashpoint.Hit(crashpoint.DispatcherAfterIntake)
	outcome := "stored"
	if dup {
		outcome = "duplicate"
	}
	in.Logger.Debug("webhook stored", "delivery", delivery, "job", e.jobID(), "action", e.Action, "seq", seq)
	in.reply(w, http.StatusAccepted, event, e.Action, outcome, "")
}

// scaleSet is whether a job with labels comes through a scale set (false
// without ScaleSet).
func (in *Intake) scaleSet(ctx context.Context, labels []string) (bool, error) {
	if in.ScaleSet == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return in.ScaleSet(ctx, labels)
}

func (in *Intake) reply(w http.ResponseWriter, code int, event, action, outcome, msg string) {
	in.Metrics.webhooks.WithLabelValues(metricLabel(event, knownEvents), metricLabel(action, knownActions), outcome).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"outcome": outcome, "message": msg})
}

// The label values berth_webhooks_total takes from a delivery's headers and
// payload. Anything else counts as "other": the headers come from whoever
// calls, before the signature is checked, so passing them through would let
// any caller grow the metric without bound or, with a value that is not
// UTF-8, make the Prometheus client panic (found by FuzzWebhook).
var (
	knownEvents  = []string{"workflow_job", "workflow_run", "ping", "check_run", "check_suite", "installation", "installation_repositories"}
	knownActions = []string{"", "queued", "waiting", "in_progress", "completed", "requested"}
)

func metricLabel(v string, known []string) string {
	for _, k := range known {
		if v == k {
			return v
		}
	}
	return "other"
}
