package ghsim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// DeliveryView is one webhook delivery attempt, like a row of a GitHub hook's
// "Recent Deliveries" page.
type DeliveryView struct {
	ID     string // X-GitHub-Delivery (a UUID); a redelivery reuses its original's ID
	Event  string // X-GitHub-Event, always "workflow_job"
	Action string // payload "action": "queued", "in_progress" or "completed"
	JobID  int64  // workflow_job.id
	// Redelivery is true for entries created by Redeliver.
	Redelivery bool
	// Done is true once the attempt finished (answered, failed, or dropped on Close).
	Done bool
	// StatusCode is the receiver's HTTP status, 0 if there was no response.
	StatusCode int
	// Err describes a transport failure (connection refused, 10 s timeout, no
	// WebhookURL, sim closed); "" when the receiver answered, whatever the status.
	Err      string
	Duration time.Duration // time spent on the HTTP exchange
	Body     []byte        // exact signed payload (a copy)
}

type delivery struct {
	view DeliveryView
	body []byte
	num  int64     // the attempt's id in the hook deliveries API
	at   time.Time // when the attempt ended
}

// Deliveries returns every delivery produced so far, in production order,
// including redeliveries and ones not yet sent (Done false).
func (s *Sim) Deliveries() []DeliveryView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]DeliveryView, 0, len(s.deliveries))
	for _, d := range s.deliveries {
		v := d.view
		v.Body = slices.Clone(d.body)
		out = append(out, v)
	}
	return out
}

// Redeliver queues the body of the delivery deliveryID again, with the same
// X-GitHub-Delivery and signature, like "Redeliver" in GitHub's hook settings
// (POST /orgs/{org}/hooks/{hook_id}/deliveries/{delivery_id}/attempts). It is
// asynchronous; the attempt appears in Deliveries with Redelivery true. It errors
// for an unknown id or a closed sim.
func (s *Sim) Redeliver(deliveryID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("ghsim: sim closed")
	}
	for _, d := range s.deliveries {
		if d.view.ID == deliveryID && !d.view.Redelivery {
			nd := &delivery{body: d.body, view: DeliveryView{
				ID: d.view.ID, Event: d.view.Event, Action: d.view.Action, JobID: d.view.JobID,
				Redelivery: true,
			}}
			s.queueLocked(nd)
			return nil
		}
	}
	return fmt.Errorf("ghsim: unknown delivery %q", deliveryID)
}

// emitJobLocked builds the workflow_job payload for j and queues its delivery.
func (s *Sim) emitJobLocked(action string, j *job) {
	s.queueLocked(&delivery{body: s.jobHookBodyLocked(action, j), view: DeliveryView{
		ID: newUUID(), Event: "workflow_job", Action: action, JobID: j.id,
	}})
}

func (s *Sim) queueLocked(d *delivery) {
	s.nextHookNo++
	d.num = s.nextHookNo
	if k := s.cfg.KeepDeliveries; k > 0 && len(s.deliveries) >= 2*k {
		// Forget the oldest half at once, so that each delivery costs one
		// copy however long the run; one still queued is sent all the
		// same (the outbox holds it).
		s.deliveries = append(s.deliveries[:0:0], s.deliveries[len(s.deliveries)-k:]...)
	}
	s.deliveries = append(s.deliveries, d)
	i := int(uint64(d.view.JobID) % uint64(len(s.outbox))) // a job's deliveries stay in order
	s.outbox[i] = append(s.outbox[i], d)
	select {
	case s.wake[i] <- struct{}{}:
	default:
	}
}

// sendLoop is sender i: it delivers its queued webhooks one at a time, in
// production order. Like GitHub it records the outcome and never retries.
func (s *Sim) sendLoop(i int) {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		select {
		case <-s.stop:
			for _, d := range s.outbox[i] {
				d.view.Done, d.view.Err = true, "sim closed"
			}
			s.outbox[i] = nil
			s.mu.Unlock()
			return
		default:
		}
		if len(s.outbox[i]) == 0 {
			s.mu.Unlock()
			select {
			case <-s.wake[i]:
			case <-s.stop:
			}
			continue
		}
		d := s.outbox[i][0]
		s.outbox[i] = s.outbox[i][1:]
		s.mu.Unlock()
		if s.lost(d) {
			s.log.Info("webhook lost", "delivery", d.view.ID, "action", d.view.Action, "job_id", d.view.JobID)
			continue
		}

		start := time.Now()
		code, err := s.post(d)
		s.mu.Lock()
		d.view.Done, d.view.StatusCode, d.view.Duration = true, code, time.Since(start)
		d.at = time.Now().UTC()
		if err != nil {
			d.view.Err = err.Error()
		}
		if s.timeOut != nil && s.timeOut(d.view) {
			// The receiver got it, but GitHub gave up waiting for the answer.
			d.view.StatusCode, d.view.Err = 0, "timed out"
		}
		s.mu.Unlock()
		s.log.Debug("webhook delivered", "delivery", d.view.ID, "action", d.view.Action,
			"job_id", d.view.JobID, "status", code, "err", err)
	}
}

// post sends one delivery with GitHub's headers.
func (s *Sim) post(d *delivery) (int, error) {
	s.mu.Lock()
	url := s.cfg.WebhookURL // SetWebhookURL may change it
	s.mu.Unlock()
	if url == "" {
		return 0, fmt.Errorf("no webhook URL configured")
	}
	ctx, cancel := context.WithTimeout(s.sendCtx, webhookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.body))
	if err != nil {
		return 0, err
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "GitHub-Hookshot/sim")
	h.Set("X-GitHub-Event", d.view.Event)
	h.Set("X-GitHub-Delivery", d.view.ID)
	h.Set("X-GitHub-Hook-ID", strconv.FormatInt(s.hookID, 10))
	h.Set("X-GitHub-Hook-Installation-Target-Type", "organization")
	h.Set("X-GitHub-Hook-Installation-Target-ID", strconv.FormatInt(s.orgID(), 10))
	h.Set("X-Hub-Signature-256", Sign(s.cfg.WebhookSecret, d.body))
	resp, err := s.hookClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// Sign returns GitHub's X-Hub-Signature-256 value for body: "sha256=" followed by
// the lowercase hex HMAC-SHA256 of body keyed with secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// orgID is the organization id from the queued fixture (the payloads' org).
func (s *Sim) orgID() int64 {
	if f, ok := s.fx.hookQueued["organization"].(map[string]any)["id"].(float64); ok {
		return int64(f)
	}
	return 1
}
