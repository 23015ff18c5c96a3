package compose_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
)

// natsCLI is the nats CLI (`make tools` installs it into bin/).
func natsCLI(t *testing.T, root string) string {
	t.Helper()
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	p := filepath.Join(root, "bin", "nats")
	if _, err := os.Stat(p); err != nil {
		t.Fatal("the nats CLI is not installed: run `make tools` (go install github.com/nats-io/natscli/nats@v0.5.0)")
	}
	return p
}

// Given a fresh clone's docker-compose.yml and the images `make images`
// builds, when the documented demo command runs (`docker-compose --env-file
// deploy/compose/demo.env up`: nats, dispatcher, watchdog, one agent with the
// exec backend, and the demo profile's GitHub simulator driving jobs), then
// the simulator sees every job completed and exits 0, and from outside the
// containers `berth status --json` shows every job completed, no slot held
// and no VM alive on the agent's host, and `nats stream info BERTH_EVENTS`
// shows the log holding the run. The stack is always taken down.
func TestComposeDemoServesJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images and runs five containers (about a minute)")
	}
	cmd := composeCommand(t)
	needEngine(t)
	root := repoRoot(t)
	begin := time.Now()
	since := func() string { return time.Since(begin).Round(100 * time.Millisecond).String() }
	buildImages(t, root)
	berth := berthCLI(t, root)
	natsBin := natsCLI(t, root)
	fixtures, err := filepath.Abs(filepath.Join(root, "..", "shared", "fixtures", "github"))
	if err != nil {
		t.Fatal(err)
	}

	const jobs = 12
	s := &stack{cmd: cmd, root: root, project: fmt.Sprintf("berthdemo%d%d", os.Getpid(), time.Now().UnixNano()%1e6),
		envFile: filepath.Join(root, "deploy", "compose", "demo.env")}
	ports := map[string]int{}
	env := []string{"BERTH_WEBHOOK_SECRET=compose-demo", fmt.Sprintf("BERTH_DEMO_JOBS=%d", jobs), "BERTH_FIXTURES=" + fixtures}
	for _, v := range []string{"BERTH_NATS_PORT", "BERTH_NATS_MONITOR_PORT", "BERTH_DISPATCHER_PORT", "BERTH_WATCHDOG_PORT", "BERTH_AGENT_PORT", "BERTH_SIM_PORT", "BERTH_PAGE_PORT"} {
		ports[v] = testkit.FreePort(t)
		env = append(env, fmt.Sprintf("%s=%d", v, ports[v]))
	}
	s.env = composeEnv(env...)
	s.downAtCleanup(t, "--env-file deploy/compose/demo.env")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Logf("[%s] up: project %s, %d jobs", since(), s.project, jobs)
	if _, err := s.compose(ctx, "up", "-d"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, "docker", "ps", "--all", "--filter", "label=com.docker.compose.project="+s.project,
		"--format", `{{.Label "com.docker.compose.service"}}`).Output()
	if err != nil {
		t.Fatal(err)
	}
	running := strings.Fields(string(out))
	slices.Sort(running)
	if want := []string{"agent", "dispatcher", "nats", "sim", "stream-apply", "watchdog"}; !slices.Equal(running, want) {
		t.Fatalf("containers made: %v, want %v (the default stack and the demo profile, not the ha one)", running, want)
	}

	// The simulator exits 0 once every job completed and its webhooks
	// were delivered.
	id, err := s.compose(ctx, "ps", "-q", "sim")
	if err != nil || strings.TrimSpace(id) == "" {
		t.Fatalf("sim container: %q %v", id, err)
	}
	took := testkit.Poll(t, ctx, 3*time.Minute, 200*time.Millisecond, "the simulator done with every job", func(ctx context.Context) error {
		out, err := exec.CommandContext(ctx, "docker", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", strings.TrimSpace(id)).Output()
		if err != nil {
			return err
		}
		switch st := strings.TrimSpace(string(out)); st {
		case "exited 0":
			return nil
		case "running 0", "created 0":
			return fmt.Errorf("sim is %s", st)
		default:
			cancel() // a failed simulator will not recover
			return fmt.Errorf("sim ended %q", st)
		}
	})
	t.Logf("[%s] the simulator saw %d jobs completed after %v", since(), jobs, took.Round(100*time.Millisecond))

	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", ports["BERTH_NATS_PORT"])
	var st events.Status
	testkit.Poll(t, ctx, 60*time.Second, 200*time.Millisecond, "berth status: every job completed, nothing held, no VM alive", func(ctx context.Context) error {
		c := exec.CommandContext(ctx, berth, "status", "--json", "--nats", natsURL)
		c.Env = append(os.Environ(), "BERTH_NATS_URL=")
		out, err := c.Output()
		if err != nil {
			return fmt.Errorf("berth status --json: %w", err)
		}
		st = events.Status{}
		if err := json.Unmarshal(out, &st); err != nil {
			return fmt.Errorf("berth status --json printed %q: %w", out, err)
		}
		if st.Jobs.Completed != jobs || st.Jobs.Queued+st.Jobs.InProgress != 0 {
			return fmt.Errorf("jobs %+v, want %d completed and none open", st.Jobs, jobs)
		}
		for _, p := range st.Pools {
			if p.Held != 0 {
				return fmt.Errorf("pool %s holds %d slots", p.Name, p.Held)
			}
		}
		i := slices.IndexFunc(st.Hosts, func(h events.HostStatus) bool { return h.Name == "compose-agent-1" })
		if i < 0 || st.Hosts[i].State != events.HostStateOnline || st.Hosts[i].LiveVMs != 0 || st.Hosts[i].LastHeartbeat == nil {
			return fmt.Errorf("hosts %+v: want compose-agent-1 online, heartbeating, with no VM alive", st.Hosts)
		}
		return nil
	})
	t.Logf("[%s] berth status: %+v as of seq %d", since(), st.Jobs, st.AsOfSeq)

	// The operator's page, published on the host's loopback, shows the
	// same pools.
	pageURL := fmt.Sprintf("http://127.0.0.1:%d/", ports["BERTH_PAGE_PORT"])
	testkit.Poll(t, ctx, 30*time.Second, 200*time.Millisecond, "the page at "+pageURL, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, pageURL, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", pageURL, resp.Status)
		}
		for _, p := range st.Pools {
			if !strings.Contains(string(b), `<tr data-pool="`+p.Name+`">`) {
				return fmt.Errorf("the page lacks pool %s", p.Name)
			}
		}
		return nil
	})

	c := exec.CommandContext(ctx, natsBin, "stream", "info", events.StreamName, "--json", "-s", natsURL)
	c.Env = append(os.Environ(), "NATS_CONTEXT=")
	out2, err := c.Output()
	if err != nil {
		t.Fatalf("nats stream info %s: %v", events.StreamName, err)
	}
	var info struct {
		Config struct {
			Name     string   `json:"name"`
			Subjects []string `json:"subjects"`
		} `json:"config"`
		State struct {
			Messages uint64 `json:"messages"`
			LastSeq  uint64 `json:"last_seq"`
		} `json:"state"`
	}
	if err := json.Unmarshal(out2, &info); err != nil {
		t.Fatalf("nats stream info --json printed %q: %v", out2, err)
	}
	if info.Config.Name != events.StreamName || !slices.Contains(info.Config.Subjects, events.SubjectAll) ||
		info.State.Messages < uint64(jobs)*4 || info.State.LastSeq < st.AsOfSeq {
		t.Fatalf("nats stream info: %+v; want %s on %s holding at least 4 facts a job and the status's seq %d",
			info, events.StreamName, events.SubjectAll, st.AsOfSeq)
	}
	t.Logf("[%s] nats stream info: %d facts, last seq %d", since(), info.State.Messages, info.State.LastSeq)

	var health map[string]any
	if err := get(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", ports["BERTH_AGENT_PORT"]), &health); err != nil {
		t.Errorf("agent /healthz: %v", err)
	}
}
