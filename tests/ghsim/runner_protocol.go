package ghsim

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// Sim-only runner protocol paths. They stand in for the runner <-> GitHub
// "broker" protocol that a real JIT runner speaks after `run.sh --jitconfig`.
const (
	AcquirePath  = "/_sim/runner/acquire"
	CompletePath = "/_sim/runner/complete"
)

// AcquireRequest is the body of POST /_sim/runner/acquire.
type AcquireRequest struct {
	Token string `json:"token"` // JITConfig.Token
}

// AcquireResponse is the 200 body of POST /_sim/runner/acquire: the job handed
// to the runner, how long to "run" it (milliseconds) and the conclusion to report.
type AcquireResponse struct {
	JobID      int64  `json:"job_id"`
	DurationMS int64  `json:"duration_ms"`
	Conclusion string `json:"conclusion"`
}

// CompleteRequest is the body of POST /_sim/runner/complete. An empty
// Conclusion means the one from AcquireResponse.
type CompleteRequest struct {
	Token      string `json:"token"`
	JobID      int64  `json:"job_id"`
	Conclusion string `json:"conclusion"`
}

func simError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"message": msg})
}

// handleAcquire marks the runner online and long-polls (Config.AcquireTimeout,
// default 50 s, then 204) until a queued job whose labels are a subset of the
// runner's exists. Like GitHub, the runner gets the oldest such job, not
// necessarily the one it was created for. On assignment the job turns
// in_progress, an "in_progress" webhook is queued, and 200 AcquireResponse is
// returned. 401: unknown token; 410: runner deleted or already given its one
// job; 503: sim closing. A request cancelled while waiting is assigned nothing.
func (s *Sim) handleAcquire(w http.ResponseWriter, r *http.Request) {
	var req AcquireRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		simError(w, http.StatusBadRequest, "invalid JSON")
		return
	}
	code, resp := s.acquire(r.Context(), req.Token)
	switch code {
	case http.StatusOK:
		writeJSON(w, code, resp)
	case http.StatusNoContent:
		w.WriteHeader(code)
	case http.StatusUnauthorized:
		simError(w, code, "unknown runner token")
	case http.StatusGone:
		simError(w, code, "runner was deleted or has already run its job")
	case http.StatusServiceUnavailable:
		simError(w, code, "simulator shutting down")
	default: // context cancelled: the client is gone
		w.WriteHeader(http.StatusRequestTimeout)
	}
}

// acquire implements the long-poll; it returns an HTTP status and, for 200, the
// assignment. It returns 0 when ctx ended first.
func (s *Sim) acquire(ctx context.Context, token string) (int, *AcquireResponse) {
	timer := time.NewTimer(s.acquireTTL)
	defer timer.Stop()
	s.mu.Lock()
	rn := s.tokens[token]
	if rn == nil {
		s.mu.Unlock()
		return http.StatusUnauthorized, nil
	}
	rn.polling++
	defer func() {
		s.mu.Lock()
		rn.polling--
		s.mu.Unlock()
	}()
	for {
		switch {
		case rn.deleted || rn.jobID != 0:
			s.mu.Unlock()
			return http.StatusGone, nil
		case s.closed:
			s.mu.Unlock()
			return http.StatusServiceUnavailable, nil
		case ctx.Err() != nil:
			s.mu.Unlock()
			return 0, nil
		}
		if j := s.pickJobLocked(rn); j != nil {
			s.assignLocked(rn, j)
			resp := &AcquireResponse{JobID: j.id, DurationMS: j.duration.Milliseconds(), Conclusion: j.want}
			s.mu.Unlock()
			return http.StatusOK, resp
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, nil
		case <-s.stop:
			return http.StatusServiceUnavailable, nil
		case <-timer.C:
			return http.StatusNoContent, nil
		}
		s.mu.Lock()
	}
}

// handleComplete finishes the runner's job: the job turns completed with the
// conclusion, a "completed" webhook carrying the runner name is queued, and the
// ephemeral runner is removed from the runner list. Repeating it is a no-op 200.
// 401: unknown token; 409: job_id is not the job handed to this runner.
func (s *Sim) handleComplete(w http.ResponseWriter, r *http.Request) {
	var req CompleteRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		simError(w, http.StatusBadRequest, "invalid JSON")
		return
	}
	s.mu.Lock()
	rn := s.tokens[req.Token]
	if rn == nil {
		s.mu.Unlock()
		simError(w, http.StatusUnauthorized, "unknown runner token")
		return
	}
	j := s.jobByID[req.JobID]
	if rn.jobID == 0 || j == nil || rn.jobID != j.id {
		s.mu.Unlock()
		simError(w, http.StatusConflict, "job is not assigned to this runner")
		return
	}
	if j.status != StatusCompleted {
		c := req.Conclusion
		if c == "" {
			c = j.want
		}
		s.completeLocked(rn, j, c)
	}
	resp := map[string]any{"job_id": j.id, "status": j.status, "conclusion": j.conclusion}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, resp)
}
