package procs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/natsauth"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Given NATS run with the authorization `berth nats-auth` writes (each
// service its own nkey, allowed only its role's facts), when the real
// service processes serve jobs, then every job is served and the fleet ends
// clean; and a fact published outside a role is refused by the server and
// never stored: an agent publishing another host's facts, a job fact or a
// booking; the dispatcher publishing a host fact; the watchdog a job fact;
// a connection with no key at all. The system account's user runs
// `nats server report jetstream`.
func TestPerServiceKeysServeJobsAndRefuseForeignFacts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and the services as processes")
	}
	t.Parallel()
	sys := Start(t, Options{Auth: true})
	for range 8 {
		sys.Sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 200 * time.Millisecond})
	}
	sys.AwaitQuiet(90*time.Second, nil)
	sys.Verify()

	url := sys.NATS.URL()
	for _, c := range []struct{ role, subject string }{
		{natsauth.AgentRole("host-a"), events.HostSubject("host-b")},
		{natsauth.AgentRole("host-a"), events.AttemptSubject("host-b", "berth-1-1")},
		{natsauth.AgentRole("host-a"), events.JobSubject(1)},
		{natsauth.AgentRole("host-a"), events.PoolSubject("linux")},
		{natsauth.RoleDispatcher, events.HostSubject("host-a")},
		{natsauth.RoleWatchdog, events.JobSubject(1)},
		{natsauth.RoleCLI, events.JobSubject(1)},
	} {
		if err := publishAs(t, url, filepath.Join(sys.AuthDir, c.role+".nk"), c.subject); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("%s publishing on %s: %v, want a permissions violation", c.role, c.subject, err)
		}
	}
	// An agent reads only its own host: its own consumer and its own
	// host's facts answer; its own consumer's name on host-b's placements,
	// on the jobs or on the whole log, any other name, and a direct read of
	// another host's facts, are refused.
	agentKey := filepath.Join(sys.AuthDir, natsauth.AgentRole("host-a")+".nk")
	own := func(js jetstream.JetStream, ctx context.Context) error {
		if _, err := js.Consumer(ctx, events.StreamName, events.AgentConsumer("host-a")); err != nil {
			return err
		}
		// A direct get: an agent may not read the log's stream info (F2).
		_, err := eventlog.LastOn(ctx, js, events.HostSubject("host-a")+"."+string(events.RoleAgent))
		return err
	}
	if err := readAs(t, url, agentKey, own); err != nil {
		t.Errorf("agent-host-a reading its own consumer and facts: %v", err)
	}
	ownNameOn := func(filter string) func(jetstream.JetStream, context.Context) error {
		return func(js jetstream.JetStream, ctx context.Context) error {
			_, err := js.CreateConsumer(ctx, events.StreamName, jetstream.ConsumerConfig{Name: events.HostWatchConsumer("host-a"),
				FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy})
			return err
		}
	}
	for what, read := range map[string]func(jetstream.JetStream, context.Context) error{
		"a consumer on host-b's placements": ownNameOn(events.HostAttemptsFilter("host-b")),
		"a consumer on every job":           ownNameOn("berth.evt.job.>"),
		"a consumer on the whole log":       ownNameOn(events.SubjectAll),
		"a consumer under another name on its own placements": func(js jetstream.JetStream, ctx context.Context) error {
			_, err := js.OrderedConsumer(ctx, events.StreamName, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.HostAttemptsFilter("host-a")}})
			return err
		},
		"host-b's last fact": func(js jetstream.JetStream, ctx context.Context) error {
			_, err := eventlog.LastOn(ctx, js, events.HostSubject("host-b"))
			return err
		},
	} {
		if err := readAs(t, url, agentKey, read); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("agent-host-a reading %s: %v, want a permissions violation", what, err)
		}
	}

	if _, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("a connection without a key: %v, want an authorization error", err)
	}
	// Nothing refused reached the log: the one fact on host-b's subject is
	// host-b's own announcement, and job 1 has no fact.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := sys.JetStream().Stream(ctx, events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := st.GetLastMsgForSubject(ctx, events.JobSubject(1)); err == nil {
		t.Errorf("a refused job fact was stored at seq %d", m.Sequence)
	}
	if m, err := st.GetLastMsgForSubject(ctx, events.HostSubject("host-b")+"."+string(events.RoleAgent)); err != nil || !strings.Contains(string(m.Data), events.TypeHostOnline) {
		t.Errorf("host-b's last fact: %v; want its own online announcement, not host-a's forgery", err)
	}

	natsBin := filepath.Join(sys.Bins.Root, "bin", "nats")
	if p, err := exec.LookPath("nats"); err == nil {
		natsBin = p
	}
	if _, err := os.Stat(natsBin); err != nil {
		t.Fatalf("the nats CLI is not installed: run `make tools` (%v)", err)
	}
	out, err := exec.CommandContext(ctx, natsBin, "server", "report", "jetstream", "-s", url,
		"--nkey", filepath.Join(sys.AuthDir, natsauth.RoleSystem+".nk")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nats-1") {
		t.Errorf("nats server report jetstream as the system user: %v\n%s", err, out)
	}
}

// publishAs connects with the seed in file, publishes one message on
// subject, and returns the server's asynchronous error for it (nil if none
// came within a round trip).
func publishAs(t *testing.T, url, file, subject string) error {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 4)
	nc, err := nats.Connect(url, opt, nats.Timeout(2*time.Second), inboxOf(file), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		errc <- err
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", filepath.Base(file), err)
	}
	defer nc.Close()
	if err := nc.Publish(subject, []byte(`{"forged":true}`)); err != nil {
		return err
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return err
	}
	select {
	case err := <-errc:
		return err
	case <-time.After(2 * time.Second):
		return nil
	}
}

// readAs connects with the seed in file and runs read; it returns the
// server's permissions violation if one came, else read's own error.
func readAs(t *testing.T, url, file string, read func(jetstream.JetStream, context.Context) error) error {
	t.Helper()
	opt, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 8)
	nc, err := nats.Connect(url, opt, nats.Timeout(2*time.Second), inboxOf(file), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		errc <- err
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", filepath.Base(file), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- read(js, ctx) }()
	select {
	case err := <-errc: // refused: the request itself was never delivered
		cancel()
		<-done
		return err
	case rerr := <-done:
		select {
		case err := <-errc:
			return err
		default:
			return rerr
		}
	}
}

// inboxOf is the inbox prefix of the role whose seed is file (<role>.nk):
// a role may subscribe to its own inboxes only.
func inboxOf(file string) nats.Option {
	return nats.CustomInboxPrefix(natsauth.InboxPrefix(strings.TrimSuffix(filepath.Base(file), ".nk")))
}
