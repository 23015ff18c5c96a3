package eventlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// HeartbeatKV opens events.BucketHeartbeats (OpenBucket: created with
// replicas replicas, 0 means 1, only where the credential may, never
// updated): the agents write their events.Heartbeat there and the watchdog
// reads them.
//
// Services starting together on a fresh cluster race to create the
// replicated bucket, and the losers' requests can time out, so it tries up
// to 5 times, a second apart, logging each failure to logger (nil: the
// default logger), and gives up early when ctx ends.
func HeartbeatKV(ctx context.Context, js jetstream.JetStream, replicas int, logger *slog.Logger) (jetstream.KeyValue, error) {
	if logger == nil {
		logger = slog.Default()
	}
	kv, err := OpenBucket(ctx, js, events.BucketHeartbeats, replicas)
	for try := 1; err != nil && try < 5 && ctx.Err() == nil; try++ {
		logger.Warn("heartbeat bucket not ready; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		kv, err = OpenBucket(ctx, js, events.BucketHeartbeats, replicas)
	}
	if err != nil {
		return nil, fmt.Errorf("heartbeat bucket: %w", err)
	}
	return kv, nil
}
