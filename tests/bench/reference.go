package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// References: what the JetStream server under test does with no Berth in
// the way, measured on the same server in the same run as the figure they
// stand beside.

const scratchStream = "BENCH_SCRATCH"

// scratch creates a file-backed scratch stream beside BERTH_EVENTS (same
// storage and duplicate window) and returns a client for it and a cleanup.
func scratch(ctx context.Context, url string, maxPending int) (jetstream.JetStream, func(), error) {
	nc, err := nats.Connect(url, nats.Name("berth-bench-reference"))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxPending))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: scratchStream, Subjects: []string{"bench.scratch.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("scratch stream: %w", err)
	}
	return js, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, scratchStream)
		nc.Close()
	}, nil
}

// scratchSubject spreads messages over one subject per five messages, as
// Berth's facts are spread over per-job and per-attempt subjects.
func scratchSubject(i int) string { return "bench.scratch." + strconv.Itoa(i/5) }

// RawAsyncPublish publishes n messages of size bytes with js.PublishAsync
// (up to 4,096 in flight) and returns messages per second, acknowledged.
func RawAsyncPublish(ctx context.Context, url string, n, size int, timeout time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	js, done, err := scratch(ctx, url, 4096)
	if err != nil {
		return 0, err
	}
	defer done()
	body := make([]byte, size)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync(scratchSubject(i), body); err != nil {
			return 0, fmt.Errorf("raw async publish %d of %d: %w", i, n, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, fmt.Errorf("raw async publish: %d acks missing after %s", js.PublishAsyncPending(), timeout)
	}
	return rate(float64(n), time.Since(start)), nil
}

// RawSyncPublish publishes n messages one at a time (each waits for its
// ack, as a Berth append does) and returns the round-trip distribution and
// the rate.
func RawSyncPublish(ctx context.Context, url string, n, size int, timeout time.Duration) (Dist, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	js, done, err := scratch(ctx, url, 1)
	if err != nil {
		return Dist{}, 0, err
	}
	defer done()
	body := make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		t := time.Now()
		if _, err := js.Publish(ctx, scratchSubject(i), body); err != nil {
			return Dist{}, 0, fmt.Errorf("raw sync publish %d of %d: %w", i, n, err)
		}
		rtts = append(rtts, time.Since(t))
	}
	return Summarize(rtts), rate(float64(n), time.Since(start)), nil
}

// RawRead reads the whole BERTH_EVENTS stream with an ordered consumer (the
// same kind and batch as eventlog.Follow), touching each message's metadata
// but decoding nothing, and returns messages per second.
func RawRead(ctx context.Context, js jetstream.JetStream, timeout time.Duration) (float64, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last, err := eventlog.LastSeq(ctx, js)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	cons, err := js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, 0, err
	}
	defer eventlog.DropOrdered(js, cons)
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return 0, 0, err
	}
	defer it.Stop()
	var n, bytes uint64
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return 0, 0, fmt.Errorf("raw read: %d of %d messages after %s", n, last, timeout)
			}
			return 0, 0, err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return 0, 0, err
		}
		n++
		bytes += uint64(len(msg.Data()))
		if meta.Sequence.Stream >= last {
			return rate(float64(n), time.Since(start)), bytes, nil
		}
	}
}
