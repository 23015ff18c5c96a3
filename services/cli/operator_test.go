package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Given a host in the log, when an operator cordons, uncordons and drains it
// with the CLI, then each is a fact on the host's subject that the fold
// shows, signed by the operator; an unknown host is refused with the list
// of known ones.
func TestOperatorHostActionsAreFacts(t *testing.T) {
	srv, err := eventlog.StartEmbedded(eventlog.EmbeddedConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, js, err := eventlog.Connect(srv.ClientURL(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := eventlog.EnsureStream(ctx, js, eventlog.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	app := &eventlog.Appender{JS: js, Source: "test"}
	if _, _, err := app.Append(ctx, app.New(time.Now(), events.HostOnline{Host: "mac-1", Boot: "b", PhysicalCap: 2}), nil); err != nil {
		t.Fatal(err)
	}
	host := func() *events.Host {
		f, err := eventlog.Replay(ctx, js, nil)
		if err != nil {
			t.Fatal(err)
		}
		return f.Hosts["mac-1"]
	}
	if _, err := cli.HostAction(ctx, js, "cordon", "mac-1", "disk swap"); err != nil {
		t.Fatal(err)
	}
	if h := host(); !h.Cordoned || h.CordonReason != "disk swap" || !strings.HasPrefix(h.CordonBy, "operator") {
		t.Fatalf("after cordon: %+v", h)
	}
	if _, err := cli.HostAction(ctx, js, "uncordon", "mac-1", ""); err != nil {
		t.Fatal(err)
	}
	if h := host(); h.Cordoned {
		t.Fatal("still cordoned after uncordon")
	}
	if _, err := cli.HostAction(ctx, js, "drain", "mac-1", "retire"); err != nil {
		t.Fatal(err)
	}
	if h := host(); h.State != events.HostStateDraining {
		t.Fatalf("state %s after drain", h.State)
	}
	if _, err := cli.HostAction(ctx, js, "cordon", "nope", ""); err == nil || !strings.Contains(err.Error(), "mac-1") {
		t.Fatalf("unknown host: %v", err)
	}
}
