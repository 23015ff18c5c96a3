package ghsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// ErrRunnerRejected is returned (wrapped) by RunRunner when the sim refuses the
// runner: unknown token (401), or a runner deleted or already used (410).
var ErrRunnerRejected = errors.New("ghsim: runner rejected by simulator")

// keepAliveThrough: a runner whose job runs shorter keeps its connection
// to complete the job on.
const keepAliveThrough = time.Second

// giveUpAfter bounds how long RunRunner retries while the sim is unreachable.
const giveUpAfter = 2 * time.Minute

// RunRunner plays an ephemeral JIT runner started with `run.sh --jitconfig
// encodedJIT`: it decodes the config, long-polls POST /_sim/runner/acquire until
// it is handed a job (any queued job its labels satisfy), sleeps the job's
// duration, posts /_sim/runner/complete and returns nil. Transient failures
// (connection errors, 5xx) are retried with backoff for up to 2 minutes. If ctx
// ends first it returns ctx.Err() without completing; a 401/410 from the sim
// yields an error wrapping ErrRunnerRejected. logger may be nil.
func RunRunner(ctx context.Context, encodedJIT string, logger *slog.Logger) error {
	cfg, err := DecodeJITConfig(encodedJIT)
	if err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := logger.With("runner", cfg.RunnerName, "runner_id", cfg.RunnerID)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &runnerClient{cfg: cfg, http: &http.Client{Transport: tr}}

	log.Info("runner listening for jobs", "labels", cfg.Labels)
	var job AcquireResponse
	err = c.retry(ctx, func() (bool, error) {
		code, err := c.post(ctx, AcquirePath, AcquireRequest{Token: cfg.Token}, &job, DefaultAcquireTimeout+30*time.Second)
		switch {
		case err != nil:
			return false, err
		case code == http.StatusOK:
			return true, nil
		case code == http.StatusNoContent:
			return false, nil // long-poll expired: poll again
		case code == http.StatusUnauthorized || code == http.StatusGone:
			return true, fmt.Errorf("%w: acquire answered %d", ErrRunnerRejected, code)
		default:
			return false, fmt.Errorf("acquire answered %d", code)
		}
	})
	if err != nil {
		return err
	}
	// Hold no connection while a long job runs: 10,000 runners sleeping on
	// idle keep-alive connections in one process (the bench's scale phase)
	// used up its 20,000 file descriptors. A short job's runner completes
	// on the connection it acquired on, as a runner process does: closed
	// here, every job of the bench's throughput phase (0 s) dialled twice.
	if time.Duration(job.DurationMS)*time.Millisecond >= keepAliveThrough {
		tr.CloseIdleConnections()
	}
	log.Info("running job", "job_id", job.JobID, "duration_ms", job.DurationMS)
	t := time.NewTimer(time.Duration(job.DurationMS) * time.Millisecond)
	select {
	case <-ctx.Done():
		t.Stop()
		log.Info("runner stopped before finishing job", "job_id", job.JobID)
		return ctx.Err()
	case <-t.C:
	}
	err = c.retry(ctx, func() (bool, error) {
		code, err := c.post(ctx, CompletePath, CompleteRequest{Token: cfg.Token, JobID: job.JobID, Conclusion: job.Conclusion}, nil, 30*time.Second)
		switch {
		case err != nil:
			return false, err
		case code == http.StatusOK:
			return true, nil
		case code == http.StatusUnauthorized || code == http.StatusConflict:
			return true, fmt.Errorf("%w: complete answered %d", ErrRunnerRejected, code)
		default:
			return false, fmt.Errorf("complete answered %d", code)
		}
	})
	if err != nil {
		return err
	}
	log.Info("job completed", "job_id", job.JobID, "conclusion", job.Conclusion)
	return nil
}

type runnerClient struct {
	cfg  JITConfig
	http *http.Client
}

// retry calls try until it reports done, ctx ends, or failures persist for
// giveUpAfter. A nil-error not-done result (204) resets the failure clock.
func (c *runnerClient) retry(ctx context.Context, try func() (done bool, err error)) error {
	backoff := 100 * time.Millisecond
	var failingSince time.Time
	for {
		done, err := try()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if done {
			return err
		}
		if err == nil {
			failingSince, backoff = time.Time{}, 100*time.Millisecond
			continue
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		} else if time.Since(failingSince) > giveUpAfter {
			return fmt.Errorf("ghsim runner: giving up: %w", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// post sends a JSON body and decodes a 200 JSON answer into out (if non-nil).
func (c *runnerClient) post(ctx context.Context, path string, in, out any, timeout time.Duration) (int, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.SimURL+path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return 0, fmt.Errorf("decode %s answer: %w", path, err)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
