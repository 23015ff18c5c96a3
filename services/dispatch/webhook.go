package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/google/go-github/v62/github"
)

// MaxWebhookBytes is the largest body accepted (GitHub caps payloads at
// 25 MB; workflow_job payloads are a few KiB, so 1 MiB is generous).
const MaxWebhookBytes = 1 << 20

// Intake is the POST /webhook handler. It checks the signature with
// go-github's ValidatePayload (X-Hub-Signature-256, HMAC-SHA256 of the body
// with the shared secret), stores workflow_job facts with the delivery id as
// Nats-Msg-Id, and answers well inside GitHub's 10 s:
//
//	202 stored (or a duplicate delivery)    200 ping
//	401 missing or wrong signature          413 body over 1 MiB
//	400 unreadable payload or no delivery   503 log unavailable: redeliver later
type Intake struct {
	Secret  []byte
	Log     *eventlog.Appender
	Now     func() time.Time
	Logger  *slog.Logger
	Metrics *Metrics
}

func (in *Intake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a GitHub webhook here", http.StatusMethodNotAllowed)
		return
	}
	event, delivery := github.WebHookType(r), github.DeliveryID(r)
	r.Body = http.MaxBytesReader(w, r.Body, MaxWebhookBytes)
	body, err := github.ValidatePayload(r, in.Secret)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			in.reply(w, http.StatusRequestEntityTooLarge, event, "", "too_large", "body over 1 MiB")
			return
		}
		in.Logger.Warn("webhook rejected: bad signature", "delivery", delivery, "err", err)
		in.reply(w, http.StatusUnauthorized, event, "", "unauthorized",
			"signature missing or wrong: check that the webhook secret matches dispatcher.webhook_secret")
		return
	}
	if delivery == "" {
		in.reply(w, http.StatusBadRequest, event, "", "bad_request", "X-GitHub-Delivery header missing")
		return
	}
	parsed, err := github.ParseWebHook(event, body)
	if err != nil {
		if event == "workflow_job" || event == "ping" {
			// A signed delivery we cannot read must not look delivered:
			// GitHub shows a 400 as failed, and it can be redelivered.
			in.reply(w, http.StatusBadRequest, event, "", "bad_request", "unreadable "+event+" payload: "+err.Error())
			return
		}
		in.reply(w, http.StatusAccepted, event, "", "ignored", "event not handled: "+event)
		return
	}
	switch e := parsed.(type) {
	case *github.PingEvent:
		in.reply(w, http.StatusOK, event, "", "ping", e.GetZen())
	case *github.WorkflowJobEvent:
		if e.WorkflowJob == nil || e.GetWorkflowJob().GetID() <= 0 {
			in.reply(w, http.StatusBadRequest, event, e.GetAction(), "bad_request", "workflow_job payload without a job id")
			return
		}
		p := jobFact(delivery, e)
		if p == nil {
			in.reply(w, http.StatusAccepted, event, e.GetAction(), "ignored", "action not tracked")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		seq, dup, err := in.Log.Append(ctx, in.Log.New(in.Now(), p), nil)
		if err != nil {
			in.Logger.Error("webhook not stored", "delivery", delivery, "err", err)
			in.reply(w, http.StatusServiceUnavailable, event, e.GetAction(), "unavailable",
				"event log unavailable; redeliver this delivery from the GitHub UI or API")
			return
		}
		crashpoint.Hit(crashpoint.DispatcherAfterIntake)
		outcome := "stored"
		if dup {
			outcome = "duplicate"
		}
		in.Logger.Debug("webhook stored", "delivery", delivery, "job", e.GetWorkflowJob().GetID(), "action", e.GetAction(), "seq", seq)
		in.reply(w, http.StatusAccepted, event, e.GetAction(), outcome, "")
	default:
		in.reply(w, http.StatusAccepted, event, "", "ignored", "event not handled: "+event)
	}
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

// jobFact turns a workflow_job webhook into a fact, or nil for actions Berth
// does not track.
func jobFact(delivery string, e *github.WorkflowJobEvent) events.Payload {
	j := e.GetWorkflowJob()
	ref := events.JobRef{
		Delivery: delivery, JobID: j.GetID(), RunID: j.GetRunID(), RunAttempt: j.GetRunAttempt(),
		Org: e.GetRepo().GetOwner().GetLogin(), Repo: e.GetRepo().GetName(), Name: j.GetName(),
		Labels: j.Labels,
	}
	if ref.Labels == nil {
		ref.Labels = []string{}
	}
	switch e.GetAction() {
	case "queued":
		return events.JobQueued{JobRef: ref}
	case "waiting":
		return events.JobWaiting{JobRef: ref}
	case "in_progress":
		return events.JobInProgress{JobRef: ref, RunnerName: j.GetRunnerName(), RunnerID: j.GetRunnerID()}
	case "completed":
		return events.JobCompleted{JobRef: ref, Conclusion: j.GetConclusion(), RunnerName: j.GetRunnerName(), RunnerID: j.GetRunnerID()}
	}
	return nil
}
