package run

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/natsauth"
)

// Given a service whose nats.url names an address where no NATS server
// answers (a listener that never speaks, held open so that no other
// process can take its port while the test runs), when it is stopped while it waits for the stream, then its error says
// NATS is not reachable there and what to check, not that JetStream is
// disabled after a wait it never made (a new user's trial met "context
// canceled (waited 30s: is JetStream enabled ...)" after 8 s with no
// nats-server running).
func TestAServiceWithoutNATSSaysTheServerIsNotReachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	url := "nats://" + l.Addr().String()
	cfg := &config.Config{DataDir: t.TempDir(), NATS: config.NATS{URL: url}}
	cfg.Defaults()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // the operator's Ctrl-C
	defer cancel()
	_, _, _, err = connect(ctx, cfg, "berth-dispatcher", natsauth.RoleDispatcher)
	if err == nil {
		t.Fatal("connected to a NATS that does not run")
	}
	for _, want := range []string{"not reachable", url, "nats-server running"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "JetStream enabled") {
		t.Errorf("error %q blames JetStream for a server never reached", err)
	}
}
