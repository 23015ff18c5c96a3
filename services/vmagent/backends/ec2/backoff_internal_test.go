package ec2

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/smithy-go"

	"github.com/berth-ci/berth/services/clock"
	"github.com/berth-ci/berth/services/vmagent/backends/ec2/ec2sim"
)

// Given one backend's retryer on a fake clock, when one call is throttled,
// then the next attempt of any other call waits out the throttled call's
// jittered back-off before it is sent; an error that is not a throttle
// holds nobody back, and the waits vary (jitter) within MaxBackoff.
func TestAThrottleHoldsBackEveryCallOfTheBackend(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	r := newSharedBackoff(newRetryer(5, 8*time.Second), c.Now)
	var slept []time.Duration
	r.sleep = func(_ context.Context, d time.Duration) error {
		slept = append(slept, d)
		c.Advance(d)
		return nil
	}
	take := func() {
		t.Helper()
		release, err := r.GetAttemptToken(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = release(nil)
	}

	// A 500 is retried by its own call only.
	if _, err := r.RetryDelay(1, &smithy.GenericAPIError{Code: "InternalError"}); err != nil {
		t.Fatal(err)
	}
	take()
	if len(slept) != 0 {
		t.Fatalf("a non-throttle error held another call back: %v", slept)
	}

	// A throttle on call A: call B's next attempt waits A's delay.
	d, err := r.RetryDelay(3, &smithy.GenericAPIError{Code: "RequestLimitExceeded"})
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(d / 4) // B comes along a little later
	take()
	if len(slept) != 1 || slept[0] != d-d/4 {
		t.Fatalf("after a throttle with delay %v, another call slept %v, want [%v]", d, slept, d-d/4)
	}
	// Once the back-off has passed, nobody waits.
	take()
	if len(slept) != 1 {
		t.Fatalf("a call waited after the back-off ended: %v", slept)
	}

	// Jitter: the delays of many throttles differ, and none passes the cap.
	seen := map[time.Duration]bool{}
	for range 20 {
		d, _ := r.RetryDelay(4, &smithy.GenericAPIError{Code: "RequestLimitExceeded"})
		if d > 8*time.Second {
			t.Fatalf("delay %v above MaxBackoff", d)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Fatalf("20 throttles all waited the same: no jitter (%v)", seen)
	}
}

// Given a throttled backend, when a call's context ends while it waits
// out another's back-off, then it returns the context's error at once.
func TestAWaitForTheSharedBackoffEndsWithTheCall(t *testing.T) {
	r := newSharedBackoff(newRetryer(5, time.Hour), time.Now)
	r.until = time.Now().Add(time.Hour) // as a throttle with a long back-off leaves it
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.GetAttemptToken(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// Given a backend on the fake EC2 endpoint whose DescribeInstances is
// throttled once, when the inventory is read, then the throttle went through
// the backend's one shared retryer (its gate held the retry back) and the
// read succeeded; the next call, after the back-off, is not held back.
func TestTheBackendsClientUsesTheSharedBackoff(t *testing.T) {
	f := ec2sim.New(t)
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b, err := New(context.Background(), Options{Region: ec2sim.Region, Endpoint: f.URL(), Fleet: "fleet-a", AMI: "ami-1",
		Credentials: credentials.NewStaticCredentialsProvider(ec2sim.AccessKey, ec2sim.SecretKey, ""),
		MaxAttempts: 3, MaxBackoff: 5 * time.Millisecond, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var slept []time.Duration
	b.retryer.sleep = func(_ context.Context, d time.Duration) error {
		slept = append(slept, d)
		c.Advance(d)
		return nil
	}
	f.Throttle("DescribeInstances", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := b.List(ctx); err != nil {
		t.Fatal(err)
	}
	if len(slept) != 1 || f.Count("DescribeInstances") != 2 {
		t.Fatalf("after one throttle: shared waits %v, %d DescribeInstances calls; want one wait, 2 calls", slept, f.Count("DescribeInstances"))
	}
	if _, err := b.List(ctx); err != nil || len(slept) != 1 {
		t.Fatalf("a later call waited: %v (err %v)", slept, err)
	}
}
