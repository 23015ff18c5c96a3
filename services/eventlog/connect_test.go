package eventlog_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/eventlog"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Found by a new user: connecting without a key to a server that wants one
// said "is nats-server running?". Given a server with authorization, when
// a tool connects without a credential, then the error is nats'
// authorization error and says which flag gives the key.
func TestAConnectionWithoutItsKeySaysWhichFlagGivesIt(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		Users: []*server.User{{Username: "cli", Password: "pw"}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(waitLimit) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nc, _, err := eventlog.Connect(srv.ClientURL(), "test")
	if err == nil {
		nc.Close()
		t.Fatal("connected without a credential")
	}
	if !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(err.Error(), "--nats-nkey") {
		t.Errorf("error %q: want the authorization error naming --nats-nkey", err)
	}
}
