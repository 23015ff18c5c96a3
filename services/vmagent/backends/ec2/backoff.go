package ec2

import (
	"context"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

// sharedBackoff is the SDK's standard retryer (exponential back-off with
// full jitter, a retry quota) plus what it lacks: EC2 throttles an account
// per region, not a call, so a RequestLimitExceeded answered to any call
// holds back every call of this backend (creates, stops, the inventory)
// until the throttled call's jittered back-off ends, instead of each call
// finding out for itself and adding to the storm. The SDK's adaptive mode
// does something similar but is documented as experimental.
//
// One sharedBackoff serves every call of one Backend (New builds one and
// hands the same instance to the client).
type sharedBackoff struct {
	aws.RetryerV2
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	mu    sync.Mutex
	until time.Time // no attempt is sent before this
}

func newSharedBackoff(inner aws.RetryerV2, now func() time.Time) *sharedBackoff {
	return &sharedBackoff{RetryerV2: inner, now: now, sleep: sleepCtx}
}

// throttled recognises the SDK's throttling codes (RequestLimitExceeded is
// EC2's).
var throttled = retry.IsErrorThrottles(retry.DefaultThrottles)

// GetAttemptToken waits out a back-off another call started, then takes the
// standard retryer's token. It is called before every attempt, the first
// included.
func (s *sharedBackoff) GetAttemptToken(ctx context.Context) (func(error) error, error) {
	s.mu.Lock()
	wait := s.until.Sub(s.now())
	s.mu.Unlock()
	if wait > 0 {
		if err := s.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	return s.RetryerV2.GetAttemptToken(ctx)
}

// RetryDelay is the standard retryer's jittered delay; after a throttle it
// also becomes every other call's wait.
func (s *sharedBackoff) RetryDelay(attempt int, err error) (time.Duration, error) {
	d, derr := s.RetryerV2.RetryDelay(attempt, err)
	if derr == nil && throttled.IsErrorThrottle(err) == aws.TrueTernary {
		s.mu.Lock()
		if t := s.now().Add(d); t.After(s.until) {
			s.until = t
		}
		s.mu.Unlock()
	}
	return d, derr
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
