package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/cli"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/run"
	"github.com/berth-ci/berth/tests/harness"
)

// natsCLI finds the real nats CLI (natscli v0.5.0): on PATH, or in the
// repository's bin/ where `make tools` installs it.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	root, _ := harness.RepoRoot()
	if p := filepath.Join(root, "bin", "nats"); fileExists(p) {
		return p
	}
	t.Fatal("the nats CLI is not installed: run `make tools` (go install github.com/nats-io/natscli/nats@v0.5.0)")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func runNATS(t *testing.T, ctx context.Context, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--server", url}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no operator contexts leak in
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("nats %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out.Bytes()
}

// Given a running system that served jobs, when an operator looks in with the
// real nats CLI, then the stream is listed with Berth's contract (subjects,
// immutability, file storage) and one job's story reads, in order, from its
// own subject.
func TestOperatorReadsTheLogWithTheNatsCLI(t *testing.T) {
	bin := natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := demoOptions(t, 8)
	f, err := harness.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	if _, err := f.Drive(ctx, o); err != nil {
		t.Fatal(err)
	}
	url := f.Sys.NATSURL

	var names []string
	if err := json.Unmarshal(runNATS(t, ctx, bin, url, "stream", "ls", "--names", "--json"), &names); err != nil {
		t.Fatal(err)
	}
	if !contains(names, events.StreamName) {
		t.Fatalf("nats stream ls: %v has no %s", names, events.StreamName)
	}

	var info struct {
		Config struct {
			Subjects   []string `json:"subjects"`
			Storage    string   `json:"storage"`
			DenyDelete bool     `json:"deny_delete"`
			DenyPurge  bool     `json:"deny_purge"`
			Duplicates int64    `json:"duplicate_window"`
		} `json:"config"`
		State struct {
			Messages uint64 `json:"messages"`
		} `json:"state"`
	}
	if err := json.Unmarshal(runNATS(t, ctx, bin, url, "stream", "info", events.StreamName, "--json"), &info); err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if len(c.Subjects) != 1 || c.Subjects[0] != "berth.evt.>" || c.Storage != "file" || !c.DenyDelete || !c.DenyPurge || c.Duplicates == 0 {
		t.Errorf("stream config breaks the contract: %+v", c)
	}
	if info.State.Messages == 0 {
		t.Error("stream info shows no messages after jobs ran")
	}

	job := f.Sim.Jobs()[0]
	subject := events.JobSubject(job.ID)
	subjects := string(runNATS(t, ctx, bin, url, "stream", "subjects", events.StreamName, "berth.evt.job.>", "--names"))
	if !strings.Contains(subjects, subject) {
		t.Errorf("nats stream subjects does not list %s:\n%s", subject, subjects)
	}

	out := runNATS(t, ctx, bin, url, "sub", subject, "--stream", events.StreamName, "--all", "--count", "3", "--raw")
	var types []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var env events.Envelope
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatalf("not an envelope: %s", line)
		}
		if env.Subject != subject {
			t.Errorf("envelope subject %s read from %s", env.Subject, subject)
		}
		types = append(types, env.Type)
	}
	want := []string{events.TypeJobQueued, events.TypeJobInProgress, events.TypeJobCompleted}
	if fmt.Sprint(types) != fmt.Sprint(want) {
		t.Errorf("job %d's story from nats sub: %v, want %v\n%s", job.ID, types, want, out)
	}

	// And `berth replay --check`'s comparison finds the live dispatcher and
	// watchdog equal to a replay of the log.
	closeNC, js, err := run.JetStream(url)
	if err != nil {
		t.Fatal(err)
	}
	defer closeNC()
	// A URL, or the host:port the demo prints (a new user's first try).
	for _, addr := range []string{"http://" + f.Sys.DispatcherAddr, f.Sys.WatchdogAddr} {
		diffs, seq, err := cli.Check(ctx, js, addr, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(diffs) != 0 || seq == 0 {
			t.Errorf("%s at seq %d differs from a replay: %v", addr, seq, diffs)
		}
	}

	// Every recipe in docs/nats-recipes.md runs, filled in from this run.
	fleet, err := eventlog.Replay(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := fleet.Attempts[job.RunnerName]
	if a == nil {
		t.Fatalf("job %d ran on %q, which the log does not know", job.ID, job.RunnerName)
	}
	fill := strings.NewReplacer("JOB", strconv.FormatInt(job.ID, 10), "POOL", a.Pool, "HOST", a.Host, "ATTEMPT", a.ID)
	recipes := docRecipes(t)
	if len(recipes) < 8 {
		t.Fatalf("docs/nats-recipes.md has %d recipes, want the ones for the stream, jobs, pools, hosts and attempts", len(recipes))
	}
	for _, r := range recipes {
		args := shellWords(t, fill.Replace(r))
		out := runNATS(t, ctx, bin, url, args[1:]...)
		if len(bytes.TrimSpace(out)) == 0 {
			t.Errorf("recipe %q printed nothing", fill.Replace(r))
		}
		for _, want := range []string{a.Host, a.Pool, a.ID, strconv.FormatInt(job.ID, 10)} {
			if strings.Contains(fill.Replace(r), "."+want) && !strings.Contains(string(out), want) {
				t.Errorf("recipe %q: output does not mention %s:\n%s", fill.Replace(r), want, out)
			}
		}
	}
}

// docRecipes returns the nats commands of docs/nats-recipes.md's sh block.
func docRecipes(t *testing.T) []string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "nats-recipes.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in && strings.HasPrefix(line, "nats "):
			out = append(out, line)
		}
	}
	return out
}

// shellWords splits a recipe line into words, honouring single quotes
// (the only quoting the recipes use).
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in recipe %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
