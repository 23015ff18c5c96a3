package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsembed"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server starts an embedded JetStream server for one test and shuts it
// down (waiting for it) at cleanup. An empty cfg.Listen means a free
// loopback port, an empty cfg.StoreDir a fresh t.TempDir(); a test that
// restarts a server on its own store passes both.
func Server(t testing.TB, cfg natsembed.EmbeddedConfig) *server.Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.StoreDir == "" {
		cfg.StoreDir = t.TempDir()
	}
	srv, err := natsembed.StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// Connect dials url as the services do (eventlog.Connect, named after the
// test) and closes the connection at cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js, err := eventlog.Connect(url, t.Name(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, js
}

// NATS starts an embedded JetStream server in t.TempDir() and connects to
// it; both end at cleanup. The stream is not created: see Stream.
func NATS(t testing.TB) (url string, js jetstream.JetStream, nc *nats.Conn) {
	t.Helper()
	srv := Server(t, natsembed.EmbeddedConfig{})
	nc, js = Connect(t, srv.ClientURL())
	return srv.ClientURL(), js, nc
}

// Stream creates (or updates) BERTH_EVENTS per cfg, as every service does
// at start, within 20 s.
func Stream(t testing.TB, js jetstream.JetStream, cfg eventlog.StreamConfig) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := eventlog.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Log is the common start of a test against the event log: an embedded
// server, a connection, the stream with default limits, and an appender
// with the given source.
func Log(t testing.TB, source string) (jetstream.JetStream, *eventlog.Appender) {
	t.Helper()
	_, js, _ := NATS(t)
	Stream(t, js, eventlog.StreamConfig{})
	return js, &eventlog.Appender{JS: js, Source: source}
}
