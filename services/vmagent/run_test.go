package vmagent_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRunReturnsWhenItsLoopFails: an agent whose account may publish facts
// but not create consumers announces itself, starts heartbeating, and then
// cannot follow the log. Run must return that error rather than wait forever
// for its heartbeat, which only its caller's context used to end.
func TestRunReturnsWhenItsLoopFails(t *testing.T) {
	// Given a server where the agent's user may not create consumers.
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		Users: []*server.User{{Username: "agent", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.>"}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(waitLimit) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("agent", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// A short API timeout: the denied consumer request fails when it expires.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	a, err := vmagent.New(js, &eventlog.Appender{JS: js, Source: "berth/vmagent/host-a"}, testkit.NewBackend(t), vmagent.Options{
		Host: "host-a", DataDir: t.TempDir(), CreateTimeout: time.Second, StopTimeout: time.Second,
		Heartbeat: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}

	// When it runs, with its caller's context never ending.
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()

	// Then Run returns the loop's error (and its heartbeat goroutine ended: goleak).
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Run returned nil though its loop could not follow the log")
		}
	case <-time.After(waitLimit):
		cancel()
		<-errc
		t.Fatalf("Run still running %v after its loop failed", waitLimit)
	}
}
