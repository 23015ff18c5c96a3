package setintake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/actions/scaleset"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Sets maps a pool's runner labels to its scale set id. Safe for
// concurrent use.
type Sets struct {
	mu       sync.RWMutex
	byKey    map[string]int
	expected map[string]bool // labels of scale-set pools whose set is not known yet
}

// expect marks labels as a scale-set pool's before its set is known, so a
// mint for it waits instead of minting a REST runner.
func (s *Sets) expect(labels []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.expected == nil {
		s.expected = map[string]bool{}
	}
	s.expected[events.LabelKey(labels)] = true
}

func (s *Sets) pending(labels []string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.expected[events.LabelKey(labels)]
}

func (s *Sets) put(labels []string, id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey == nil {
		s.byKey = map[string]int{}
	}
	s.byKey[events.LabelKey(labels)] = id
	delete(s.expected, events.LabelKey(labels))
}

// setWait bounds how long a mint waits for its pool's set to be known.
const setWait = 3 * time.Second

// await is For, asked again every 50 ms until it answers, wait passes or
// ctx ends.
func (s *Sets) await(ctx context.Context, labels []string, wait time.Duration) (int, bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if id, ok := s.For(labels); ok {
			return id, true
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-deadline.C:
			return 0, false
		case <-tick.C:
		}
	}
}

// For is the scale set serving runners with these labels.
func (s *Sets) For(labels []string) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	id, ok := s.byKey[events.LabelKey(labels)]
	return id, ok
}

// Minter mints JIT configs for scale-set pools through the set's
// generatejitconfig and removes their runners through the actions
// service; every other pool goes to the embedded REST minter, whose
// reconcile and sweep reads it also serves.
type Minter struct {
	*dispatch.GitHubMinter
	Client *scaleset.Client
	Sets   *Sets
	// Pools names the pools served through scale sets (config): a runner
	// for one is never minted through the REST API, even before its set
	// is known, since a REST runner is never given a scale set's job.
	Pools []string
	// SetWait bounds how long a mint waits for its pool's set at start;
	// 0: 3 s.
	SetWait time.Duration
}

// ErrSetNotReady: the pool's scale set is not created yet; the mint is
// retried.
var ErrSetNotReady = errors.New("scale set not created yet")

// Mint implements dispatch.Minter.
func (m *Minter) Mint(ctx context.Context, r dispatch.MintRequest) (int64, string, error) {
	id, ok := m.Sets.For(r.Labels)
	if !ok && (m.Sets.pending(r.Labels) || slices.Contains(m.Pools, r.Pool)) {
		// The set is being created at start: wait for it here, within
		// the mint's own deadline, rather than fail and be retried only
		// after the dispatcher's in-flight mark expires (seconds during
		// which another job's runner takes this job, and so on down the
		// queue).
		id, ok = m.Sets.await(ctx, r.Labels, cmp.Or(m.SetWait, setWait))
	}
	switch {
	case !ok && (m.Sets.pending(r.Labels) || slices.Contains(m.Pools, r.Pool)):
		// A REST runner would never be given a scale-set job: wait (a
		// retryable error) until the set is known.
		return 0, "", fmt.Errorf("runner %s: %w; the mint is tried again", r.RunnerName, ErrSetNotReady)
	case !ok:
		return m.GitHubMinter.Mint(ctx, r)
	}
	jit, err := m.Client.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: r.RunnerName}, id)
	if err != nil {
		return 0, "", fmt.Errorf("generate JIT config for runner %s in scale set %d: %w", r.RunnerName, id, err)
	}
	if jit.Runner == nil {
		return 0, "", fmt.Errorf("generate JIT config for runner %s: GitHub named no runner", r.RunnerName)
	}
	return int64(jit.Runner.ID), jit.EncodedJITConfig, nil
}

// Deregister implements dispatch.Minter: through the actions service
// (RemoveRunner) when scale sets are served, the REST API otherwise or
// when the service does not know the runner. A busy runner is
// dispatch.ErrRunnerBusy.
func (m *Minter) Deregister(ctx context.Context, runnerID int64, org, repo string) error {
	err := m.Client.RemoveRunner(ctx, runnerID)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, scaleset.JobStillRunningError):
		return fmt.Errorf("%w: runner %d: %v", dispatch.ErrRunnerBusy, runnerID, err)
	}
	return m.GitHubMinter.Deregister(ctx, runnerID, org, repo)
}
