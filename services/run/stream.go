package run

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/nats-io/nats.go/jetstream"
)

// streamConfig is what the config's nats section asks of the stream.
func streamConfig(cfg *config.Config) eventlog.StreamConfig {
	n := cfg.NATS
	return eventlog.StreamConfig{Replicas: n.Replicas, DuplicateWindow: n.DuplicateWindow,
		MaxAge: n.StreamMaxAge(), MaxBytes: int64(n.MaxBytes), MaxMsgs: n.MaxMsgs}
}

// ApplyStream is `berth stream apply`: the stream and the buckets as the
// config's nats section says, one line per object saying what changed.
func ApplyStream(ctx context.Context, js jetstream.JetStream, cfg *config.Config) ([]string, error) {
	return eventlog.Apply(ctx, js, streamConfig(cfg))
}

// StreamDrift is how the stream differs from the config's nats section
// (`berth status --config`), or eventlog.ErrStreamMissing.
func StreamDrift(ctx context.Context, js jetstream.JetStream, cfg *config.Config) ([]string, error) {
	return eventlog.VerifyStream(ctx, js, streamConfig(cfg))
}

// authConfigured reports whether the service connects with a credential:
// production, where only the admin creates the stream.
func authConfigured(cfg *config.Config) bool {
	return cfg.NATS.CredsFile != "" || cfg.NATS.NKeyFile != ""
}

// awaitStream makes sure the stream is there before a service starts, and
// never changes it (law 10: only `berth stream apply`, with the admin
// credential, creates or updates it). Missing, with a credential
// configured, it waits for the admin, saying so every few seconds; missing
// without one (a dev server), it creates it, which never updates an
// existing stream. Other errors (a cluster still electing its meta leader
// answers with timeouts) are retried for streamWait. Drift is returned for
// health to report, not fixed.
func awaitStream(ctx context.Context, cfg *config.Config, js jetstream.JetStream, service string, verify func(context.Context) ([]string, error)) ([]string, error) {
	sc := streamConfig(cfg)
	deadline, lastSaid := time.Now().Add(streamWait), time.Time{}
	for {
		vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		drift, err := verify(vctx)
		if errors.Is(err, eventlog.ErrStreamMissing) && !authConfigured(cfg) {
			_, err = eventlog.EnsureStream(vctx, js, sc)
			drift = nil
		}
		cancel()
		switch {
		case err == nil:
			if len(drift) > 0 {
				slog.Warn("the stream differs from this service's config; not changing it (run `berth stream apply` to set it, or fix this config)",
					"service", service, "stream_drift", drift)
			}
			return drift, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, eventlog.ErrStreamMissing):
			deadline = time.Now().Add(streamWait) // waiting for the admin is not a failure
			if time.Since(lastSaid) > 10*time.Second {
				slog.Error("waiting for the event log: run `berth stream apply` (with the admin credential) to create it",
					"service", service, "err", err)
				lastSaid = time.Now()
			}
		case time.Now().After(deadline):
			return nil, err
		default:
			slog.Warn("JetStream not ready yet; retrying", "service", service, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// verifier is how role checks the stream: its config against cfg
// (VerifyStream), or, for an agent, whose credential may not read the
// stream's info (it would list every subject, natsauth), only that it is
// there, by a direct get of its own host's facts (eventlog.StreamThere):
// an agent sees no drift.
func verifier(js jetstream.JetStream, cfg *config.Config, role string) func(context.Context) ([]string, error) {
	if host, agent := strings.CutPrefix(role, natsauth.AgentRole("")); agent {
		return func(ctx context.Context) ([]string, error) {
			return nil, eventlog.StreamThere(ctx, js, events.HostFilter(host))
		}
	}
	sc := streamConfig(cfg)
	return func(ctx context.Context) ([]string, error) { return eventlog.VerifyStream(ctx, js, sc) }
}

// presenceOnly reports whether role's verifier sees only that the stream
// is there.
func presenceOnly(role string) bool { return strings.HasPrefix(role, natsauth.AgentRole("")) }

// streamHealth checks the stream for /healthz, at most every 10 s: drift
// is reported (stream_drift) and leaves health as it is; a missing stream
// makes the service unhealthy. An agent checks presence only
// (stream_checked: "presence").
type streamHealth struct {
	verify   func(context.Context) ([]string, error)
	presence bool

	mu       sync.Mutex
	at       time.Time
	drift    []string
	missing  bool
	checking bool // a check runs off the request (probe)
}

func newStreamHealth(verify func(context.Context) ([]string, error), drift []string, presence bool) *streamHealth {
	return &streamHealth{verify: verify, at: time.Now(), drift: drift, presence: presence}
}

// probe checks the stream off the /healthz request: while a cluster
// elects a stream leader, STREAM.INFO waits for seconds, and a health
// check that waited with it timed out (the HA compose test's 2 s) on a
// service that was fine. Until it answers, add reports what it knew.
func (h *streamHealth) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	drift, err := h.verify(ctx)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checking = false
	if err == nil || errors.Is(err, eventlog.ErrStreamMissing) {
		h.drift, h.missing, h.at = drift, err != nil, time.Now()
	}
}

// add puts stream_drift (and stream_missing) in detail and returns ok
// unless the stream is gone.
func (h *streamHealth) add(ok bool, detail map[string]any) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) > 10*time.Second && !h.checking {
		h.checking = true
		go h.probe()
	}
	detail["stream_drift"] = h.drift
	if h.drift == nil {
		detail["stream_drift"] = []string{}
	}
	if h.missing {
		detail["stream_missing"] = true
	}
	if h.presence {
		detail["stream_checked"] = "presence" // an agent may not read the stream's config: drift shows on the other services
	}
	return ok && !h.missing
}
