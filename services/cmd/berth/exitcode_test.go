package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
)

// berthIn runs the berth command in-process with args and returns its
// output and the exit code main would give.
func berthIn(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	cmd := root()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), exitCode(err), err
}

// Given a command or a flag berth does not know, when it runs, then it
// exits 2 and what it prints says where the known ones are listed.
func TestAnUnknownCommandOrFlagSaysWhereTheKnownOnesAre(t *testing.T) {
	for args, want := range map[string]string{"nosuch": "berth --help", "status --nosuch": "berth status --help", "agent install --nosuch": "berth agent install --help"} {
		_, code, err := berthIn(t, strings.Fields(args)...)
		if code != exitUsage || err == nil || !strings.Contains(errorText(err), want) {
			t.Errorf("berth %s: exit %d, prints %q; want %d and a pointer to %q", args, code, errorText(err), exitUsage, want)
		}
	}
}

// Given a command with subcommands of its own (berth agent), when it is
// given a word that is none of them, then it exits 2 naming its commands,
// not "accepts 0 arg(s)".
func TestAnUnknownSubcommandNamesTheKnownOnes(t *testing.T) {
	_, code, err := berthIn(t, "agent", "frob")
	if code != exitUsage || err == nil || !strings.Contains(err.Error(), `no command "frob"`) ||
		!strings.Contains(err.Error(), "install, uninstall") {
		t.Errorf("berth agent frob: exit %d, %v; want %d naming install and uninstall", code, err, exitUsage)
	}
}

// Given a help topic berth does not know, when `berth help TOPIC` runs,
// then it exits 2 saying where the known ones are; a known topic exits 0
// with that command's help.
func TestAnUnknownHelpTopicIsBadUsage(t *testing.T) {
	_, code, err := berthIn(t, "help", "nosuch")
	if code != exitUsage || err == nil || !strings.Contains(err.Error(), "berth --help") {
		t.Errorf("berth help nosuch: exit %d, %v; want %d pointing to berth --help", code, err, exitUsage)
	}
	out, code, err := berthIn(t, "help", "status")
	if code != 0 || err != nil || !strings.Contains(out, "berth status") {
		t.Errorf("berth help status: exit %d, %v, printed %q; want 0 and status's help", code, err, out)
	}
}

// Given a malformed --nats URL, when any command runs, then it exits 2
// (bad usage) saying what a NATS URL looks like, not "is nats-server
// running?" as if a server were down.
func TestAMalformedNATSURLIsBadUsage(t *testing.T) {
	for _, u := range []string{"nats//127.0.0.1:4222", "http://127.0.0.1:4222", "nats://127.0.0.1:99999", "127.0.0.1:4222x", "nats://127.0.0.1:4222/x",
		"bogus::", "nats://127.0.0.1:4222,"} { // found by a new user: exit 3 "is nats-server running?", and --nats ""
		_, code, err := berthIn(t, "status", "--nats", u)
		if code != exitUsage || err == nil || strings.Contains(err.Error(), "nats-server running") || !strings.Contains(err.Error(), "nats://HOST:PORT") {
			t.Errorf("--nats %s: exit %d, %v; want %d saying what a NATS URL is", u, code, err, exitUsage)
		}
	}
	for _, u := range []string{"nats://127.0.0.1:1", "127.0.0.1:1", "nats://a:1,nats://b:1", "tls://127.0.0.1:1"} {
		if err := checkNATSURL(u); err != nil {
			t.Errorf("--nats %s refused: %v", u, err)
		}
	}
}

// Given a log holding job 7's facts, when an operator asks for the events
// of job 8, pool nope or attempt berth-9-1, then berth exits 1 naming what
// it looked for and where to list what exists; job 7's events print.
// Found by a new user: `events --job notanumber` printed strconv's
// message, and `berth undrain` suggested drain.
func TestAJobIdThatIsNoNumberSaysSoAndUndrainIsUncordon(t *testing.T) {
	_, code, err := berthIn(t, "events", "--job", "notanumber")
	if code != exitUsage || err == nil || strings.Contains(err.Error(), "strconv") || !strings.Contains(err.Error(), "give a whole number") {
		t.Errorf("events --job notanumber: exit %d, %v; want %d saying to give a number", code, err, exitUsage)
	}
	out, code, err := berthIn(t, "undrain", "--help")
	if code != 0 || err != nil || !strings.Contains(out, "berth uncordon HOST") {
		t.Errorf("undrain --help: exit %d, %v:\n%s\nwant uncordon's help", code, err, out)
	}
}

func TestAnUnknownJobPoolOrAttemptIsAFailureThatSaysWhere(t *testing.T) {
	url, js, _ := testkit.NATS(t)
	testkit.Stream(t, js, eventlog.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	app := &eventlog.Appender{JS: js, Source: "test", Role: events.RoleDispatcher}
	if _, _, err := app.Append(ctx, app.New(time.Now(), &events.JobQueued{JobRef: testkit.JobRef(7)}), nil); err != nil {
		t.Fatal(err)
	}
	out, code, err := berthIn(t, "events", "--job", "7", "--nats", url)
	if code != 0 || !strings.Contains(out, "job.queued") {
		t.Fatalf("events --job 7: exit %d (%v), printed %q; want its fact", code, err, out)
	}
	for args, want := range map[string]string{"--job 8": "berth jobs", "--pool nope": "berth status", "--attempt berth-9-1": "attempt berth-9-1"} {
		out, code, err := berthIn(t, append(append([]string{"events"}, strings.Fields(args)...), "--nats", url)...)
		if code != exitFailed || !errors.Is(err, cli.ErrNoFacts) || !strings.Contains(err.Error(), want) {
			t.Errorf("events %s: exit %d, %v, printed %q; want %d saying %q", args, code, err, out, exitFailed, want)
		}
	}
}

// Given a log with host-a online, job 7 booked on it as attempt
// berth-7-1, when the shell asks berth to complete `berth drain `,
// `berth events --pool `, `berth release ` and `berth events --job `,
// then it offers the log's host, pool, attempt and job.
func TestCompletionOffersTheLogsNames(t *testing.T) {
	url, js, _ := testkit.NATS(t)
	testkit.Stream(t, js, eventlog.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := testkit.History().HostOnline("host-a", 2, 2).Queued(7).Reserved(7, 1, "host-a")
	for _, e := range h.Events() {
		role := events.Authors(e.Type())[0] // the agent's announcement, the admin's grant, the dispatcher's facts
		app := &eventlog.Appender{JS: js, Source: "test", Role: role}
		if _, _, err := app.Append(ctx, app.New(e.Time, e.Data), nil); err != nil {
			t.Fatal(err)
		}
	}
	for line, want := range map[string]string{"drain ": "host-a", "events --pool ": "linux", "release ": "berth-7-1",
		"events --job ": "7", "events --host ho": "host-a"} {
		args := append([]string{"__complete", "--nats", url}, strings.Fields(line)...)
		if strings.HasSuffix(line, " ") {
			args = append(args, "")
		}
		out, code, err := berthIn(t, args...)
		if code != 0 || !strings.Contains("\n"+out, "\n"+want+"\n") {
			t.Errorf("complete %q: exit %d (%v), offered:\n%s\nwant %s", line, code, err, out, want)
		}
	}
}

// Found by a new user: `berth status --config FILE` compared the stream
// with FILE's nats section but dialled the default 127.0.0.1:4222, not
// FILE's nats.url. Given a config naming a test server, when status runs
// with it and no --nats, then it reads that server.
func TestStatusWithAConfigReadsTheConfigsServer(t *testing.T) {
	url, js, _ := testkit.NATS(t)
	testkit.Stream(t, js, eventlog.StreamConfig{})
	cfg := t.TempDir() + "/berth.yaml"
	if err := os.WriteFile(cfg, []byte("nats:\n  url: "+url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A host only the test's server knows, so the test cannot pass by
	// reading whatever else runs on the default 127.0.0.1:4222.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	app := &eventlog.Appender{JS: js, Source: "test", Role: events.RoleAgent}
	at := time.Now()
	if _, _, err := app.Append(ctx, app.New(at, &events.HostOnline{Host: "only-here", Boot: "b1", PhysicalCap: 1, At: at}), nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BERTH_NATS_URL", "")
	out, code, err := berthIn(t, "status", "--json", "--config", cfg)
	if code != 0 || !strings.Contains(out, `"only-here"`) {
		t.Fatalf("status --config: exit %d (%v), printed %q; want the config's server's status", code, err, out)
	}
}
