package eventlog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/berth-ci/berth/events"
	"github.com/nats-io/nats.go/jetstream"
)

// The stream and the KV buckets are the admin's (law 10): `berth stream
// apply` creates and updates them with the admin credential (Apply), and a
// service only checks that they are there and as it expects
// (VerifyStream), reporting drift rather than "fixing" it, so one host with
// another config cannot reconfigure the fleet's log.

// ErrStreamMissing is VerifyStream's answer when BERTH_EVENTS does not
// exist yet.
var ErrStreamMissing = fmt.Errorf("stream %s does not exist: run `berth stream apply` with the admin credential", events.StreamName)

// VerifyStream compares the stream with cfg and returns the differences
// (nil: none), one line each ("max_age 25h0m0s, want 720h0m0s"), or
// ErrStreamMissing. It changes nothing.
func VerifyStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) ([]string, error) {
	want, err := cfg.Settings()
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, events.StreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, ErrStreamMissing
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", events.StreamName, err)
	}
	return streamDrift(s.CachedInfo().Config, want), nil
}

// streamDrift lists the settings of have that differ from want.
func streamDrift(have, want jetstream.StreamConfig) []string {
	var out []string
	diff := func(name string, h, w any) {
		if fmt.Sprint(h) != fmt.Sprint(w) {
			out = append(out, fmt.Sprintf("%s %v, want %v", name, h, w))
		}
	}
	diff("subjects", have.Subjects, want.Subjects)
	diff("storage", have.Storage, want.Storage)
	diff("replicas", have.Replicas, want.Replicas)
	diff("duplicate_window", have.Duplicates, want.Duplicates)
	diff("max_age", have.MaxAge, want.MaxAge)
	diff("max_bytes", have.MaxBytes, want.MaxBytes)
	diff("max_msgs", have.MaxMsgs, want.MaxMsgs)
	diff("max_consumers", have.MaxConsumers, want.MaxConsumers)
	diff("retention", have.Retention, want.Retention)
	diff("discard", have.Discard, want.Discard)
	diff("deny_delete", have.DenyDelete, want.DenyDelete)
	diff("deny_purge", have.DenyPurge, want.DenyPurge)
	diff("allow_direct", have.AllowDirect, want.AllowDirect)
	diff("sealed", have.Sealed, want.Sealed)
	return out
}

// BucketConfigs is the configuration of every KV bucket Berth uses, at
// replicas (0: 1).
func BucketConfigs(replicas int) []jetstream.KeyValueConfig {
	r := max(replicas, 1)
	return []jetstream.KeyValueConfig{
		{Bucket: events.BucketSnapshots, Description: "fold snapshots of Berth services (a shortcut: delete to force a full replay)",
			History: 1, Replicas: r},
		{Bucket: events.BucketHeartbeats, Description: "vmagent heartbeats (key: host)", History: 1, Replicas: r},
		{Bucket: events.BucketParked, Description: "facts a Berth service could not react to (poison), one key per reader and sequence",
			Replicas: r},
		{Bucket: events.BucketTrust, Description: "keys Berth's readers trust (the dispatchers' curve public keys); written by the admin only",
			History: 5, Replicas: r},
		{Bucket: events.BucketScaleSets, Description: "runner scale sets' leases, message sessions and last message ids (key: scale set name); written by the dispatcher only",
			History: 1, Replicas: r},
	}
}

// BucketConfig is bucket's entry of BucketConfigs.
func BucketConfig(bucket string, replicas int) jetstream.KeyValueConfig {
	for _, c := range BucketConfigs(replicas) {
		if c.Bucket == bucket {
			return c
		}
	}
	return jetstream.KeyValueConfig{Bucket: bucket, Replicas: max(replicas, 1)}
}

// OpenBucket binds a service to bucket. A missing bucket is created only
// where the credential allows it (a dev server without authorization);
// with the generated authorization the server refuses, and the error says
// to run `berth stream apply`. An existing bucket is never updated.
func OpenBucket(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, BucketConfig(bucket, replicas))
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, bucket) // another service made it first
		} else if err == nil {
			_, err = hardenBucket(ctx, js, bucket)
		}
		if err != nil {
			return nil, fmt.Errorf("KV bucket %s is missing and this credential may not create it (%w): run `berth stream apply` with the admin credential", bucket, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("KV bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// Apply creates the stream and the KV buckets, or updates them to cfg, and
// returns one line per object saying what changed ("created", "updated:
// max_age 25h0m0s, want 720h0m0s" read as was → now, or "unchanged"). It is
// idempotent: a second run reports everything unchanged. It needs the admin
// credential.
func Apply(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) ([]string, error) {
	want, err := cfg.Settings()
	if err != nil {
		return nil, err
	}
	var out []string
	drift, err := VerifyStream(ctx, js, cfg)
	switch {
	case errors.Is(err, ErrStreamMissing):
		out = append(out, fmt.Sprintf("stream %s: created (replicas %d, max_age %v, max_bytes %d, max_msgs %d, duplicate_window %v)",
			events.StreamName, want.Replicas, want.MaxAge, want.MaxBytes, want.MaxMsgs, want.Duplicates))
	case err != nil:
		return nil, err
	case len(drift) == 0:
		out = append(out, "stream "+events.StreamName+": unchanged")
	default:
		out = append(out, "stream "+events.StreamName+": updated: "+joinWas(drift))
	}
	if _, err := EnsureStream(ctx, js, cfg); err != nil {
		return out, err
	}
	for _, bc := range BucketConfigs(cfg.Replicas) {
		line, err := applyBucket(ctx, js, bc)
		if err != nil {
			return out, err
		}
		hardened, err := hardenBucket(ctx, js, bc.Bucket)
		if err != nil {
			return out, err
		}
		if hardened {
			line += "; rollups and purges denied"
		}
		out = append(out, line)
	}
	return out, nil
}

func applyBucket(ctx context.Context, js jetstream.JetStream, bc jetstream.KeyValueConfig) (string, error) {
	name := "bucket " + bc.Bucket + ": "
	s, err := js.Stream(ctx, "KV_"+bc.Bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := js.CreateKeyValue(ctx, bc); err != nil {
			return "", fmt.Errorf("create KV bucket %s: %w", bc.Bucket, err)
		}
		return name + fmt.Sprintf("created (replicas %d, history %d)", bc.Replicas, max(bc.History, 1)), nil
	}
	if err != nil {
		return "", fmt.Errorf("KV bucket %s: %w", bc.Bucket, err)
	}
	have := s.CachedInfo().Config
	var drift []string
	if have.Replicas != bc.Replicas {
		drift = append(drift, fmt.Sprintf("replicas %d, want %d", have.Replicas, bc.Replicas))
	}
	if h := int64(max(bc.History, 1)); have.MaxMsgsPerSubject != h {
		drift = append(drift, fmt.Sprintf("history %d, want %d", have.MaxMsgsPerSubject, h))
	}
	if have.Description != bc.Description {
		drift = append(drift, fmt.Sprintf("description %q, want %q", have.Description, bc.Description))
	}
	if len(drift) == 0 {
		return name + "unchanged", nil
	}
	if _, err := js.UpdateKeyValue(ctx, bc); err != nil {
		return "", fmt.Errorf("update KV bucket %s: %w", bc.Bucket, err)
	}
	return name + "updated: " + joinWas(drift), nil
}

// hardenBucket denies rollups and purges on a bucket's stream. A KV bucket
// allows both by default, and a `Nats-Rollup: all` header on a put to a key
// a credential may write purges every other key in the bucket: an agent
// wiped all heartbeats, snapshots and parking records that way. Berth's
// puts need neither (a key is overwritten, a snapshot part deleted).
func hardenBucket(ctx context.Context, js jetstream.JetStream, bucket string) (bool, error) {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return false, err
	}
	cfg := s.CachedInfo().Config
	if !cfg.AllowRollup && cfg.DenyPurge {
		return false, nil
	}
	cfg.AllowRollup, cfg.DenyPurge = false, true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return false, fmt.Errorf("deny rollups and purges on KV bucket %s: %w", bucket, err)
	}
	return true, nil
}

// joinWas turns drift lines ("x A, want B") into "x A → B; …".
func joinWas(drift []string) string {
	out := make([]string, len(drift))
	for i, d := range drift {
		out[i] = strings.Replace(d, ", want ", " → ", 1)
	}
	return strings.Join(out, "; ")
}
