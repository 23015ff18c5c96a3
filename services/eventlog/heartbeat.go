package eventlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// HeartbeatKV opens events.BucketHeartbeats, creating it (or updating its
// config) with replicas replicas (0 means 1): the agents write their
// events.Heartbeat there and the watchdog reads them. Both create it with
// the same config, so whichever starts first makes it.
//
// Services starting together on a fresh cluster race to create the
// replicated bucket, and the losers' requests can time out, so it tries up
// to 5 times, a second apart, logging each failure to logger (nil: the
// default logger), and gives up early when ctx ends.
func HeartbeatKV(ctx context.Context, js jetstream.JetStream, replicas int, logger *slog.Logger) (jetstream.KeyValue, error) {
	if logger == nil {
		logger = slog.Default()
	}
	cfg := jetstream.KeyValueConfig{Bucket: events.BucketHeartbeats,
		Description: "vmagent heartbeats (key: host)", History: 1, Replicas: replicas}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	for try := 1; err != nil && try < 5 && ctx.Err() == nil; try++ {
		logger.Warn("heartbeat bucket not ready; retrying", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("heartbeat bucket: %w", err)
	}
	return kv, nil
}
