package compose_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	execbe "github.com/berth-ci/berth/services/vmagent/backends/exec"
	"github.com/berth-ci/berth/tests/ghsim"
)

// simRunnerImage builds berth/sim-runner:test, FROM scratch, holding the
// static ghsim binary: its `runner` command is a JIT runner that takes one
// job from the simulator, as the actions-runner image does from GitHub.
func simRunnerImage(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "ghsim"), "./tests/cmd/ghsim")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ghsim: %v\n%s", err, out)
	}
	const image = "berth/sim-runner:test"
	df := "FROM scratch\nCOPY ghsim /ghsim\nENTRYPOINT [\"/ghsim\"]\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("docker", "build", "-q", "-t", image, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build %s: %v\n%s", image, err, out)
	}
	return image
}

// mintJIT asks the simulator for a JIT config, as the dispatcher does.
func mintJIT(t *testing.T, sim *ghsim.Sim, name string) string {
	t.Helper()
	body := `{"name":"` + name + `","runner_group_id":1,"labels":["self-hosted","linux"]}`
	req, _ := http.NewRequest(http.MethodPost, sim.URL()+"/orgs/example-org/actions/runners/generate-jitconfig", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer t")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Encoded string `json:"encoded_jit_config"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusCreated || out.Encoded == "" {
		t.Fatalf("generate-jitconfig: %d %v", resp.StatusCode, err)
	}
	return out.Encoded
}

// Given deploy/exec/docker-runner.sh as an exec backend on a Linux host with
// Docker, and a runner image (here the simulator's runner, FROM scratch),
// when the agent's steps run against the contract, then: create starts one
// container named and labelled by the attempt, whose runner takes a queued
// job with the JIT config and completes it; a retried create makes no second
// container; list reports exactly this host's attempts, exited ones
// included; stop removes the container and a second stop succeeds; a create
// that overruns its deadline returns the deadline's error and the stop that
// follows leaves nothing behind.
func TestDockerExecScriptServesAJobInAContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and runs containers")
	}
	needEngine(t)
	root := repoRoot(t)
	image := simRunnerImage(t, root)
	sim, err := ghsim.New(ghsim.Config{Org: "example-org", Repo: "example-repo",
		FixturesDir: filepath.Join(root, "..", "shared", "fixtures", "github"), AcquireTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	host := "dockertest-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:12] + "-" + time.Now().Format("150405")
	script := filepath.Join(root, "deploy", "exec", "docker-runner.sh")
	attempts := t.TempDir()
	be := execbe.New([]string{"sh", script, "create"}, []string{"sh", script, "stop"}, map[string]string{
		"BERTH_DOCKER_IMAGE":      image,
		"BERTH_DOCKER_CMD":        "runner --jitconfig-file /berth/jitconfig",
		"BERTH_DOCKER_RUN_ARGS":   "--network host",
		"BERTH_DOCKER_STOP_GRACE": "2",
	}).WithList([]string{"sh", script, "list"}, attempts)
	be.Host = host
	vm := func(id string) backend.VM {
		dir := filepath.Join(attempts, id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		jit := filepath.Join(dir, "jitconfig")
		if err := os.WriteFile(jit, []byte(mintJIT(t, sim, id)), 0o600); err != nil {
			t.Fatal(err)
		}
		return backend.VM{Attempt: id, Pool: "linux", Host: host, Labels: []string{"self-hosted", "linux"}, JobID: 1, JITConfigFile: jit, WorkDir: dir}
	}
	step := func(within time.Duration, fn func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		return fn(ctx)
	}
	list := func() []string {
		t.Helper()
		var ids []string
		if err := step(30*time.Second, func(ctx context.Context) (err error) { ids, err = be.List(ctx); return }); err != nil {
			t.Fatalf("list: %v", err)
		}
		slices.Sort(ids)
		return ids
	}
	a1 := "berth-901-1"
	v1 := vm(a1)
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", a1, "berth-902-1").Run() })

	job := sim.Enqueue(ghsim.JobSpec{Labels: []string{"self-hosted", "linux"}, Duration: 300 * time.Millisecond})
	if err := step(60*time.Second, func(ctx context.Context) error { return be.Create(ctx, v1) }); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := step(60*time.Second, func(ctx context.Context) error { return be.Create(ctx, v1) }); err != nil {
		t.Fatalf("retried create: %v", err)
	}
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=berth.attempt="+a1, "--format", `{{.Names}} {{.Label "berth.host"}} {{.Label "berth.pool"}}`).Output()
	if got := strings.TrimSpace(string(out)); err != nil || got != a1+" "+host+" linux" {
		t.Fatalf("containers for %s: %q (%v), want exactly one, named and labelled by the attempt", a1, got, err)
	}
	if got := list(); !slices.Equal(got, []string{a1}) {
		t.Fatalf("list = %v, want [%s] (this host's attempts only)", got, a1)
	}

	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", a1).CombinedOutput()
			t.Logf("container logs:\n%s", logs)
		}
	})
	testkit.Poll(t, context.Background(), 60*time.Second, 200*time.Millisecond, fmt.Sprintf("job %d completed", job), func(context.Context) error {
		var jv ghsim.JobView
		for _, j := range sim.Jobs() {
			if j.ID == job {
				jv = j
			}
		}
		if jv.Status != ghsim.StatusCompleted {
			return fmt.Errorf("job %d is %s", job, jv.Status)
		}
		if jv.RunnerName != a1 || jv.Conclusion != "success" {
			t.Fatalf("job completed by %q with %q, want %s and success", jv.RunnerName, jv.Conclusion, a1)
		}
		return nil
	})
	if got := list(); !slices.Equal(got, []string{a1}) {
		t.Fatalf("after the runner exited, list = %v; want %s still listed until stopped (its container holds disk)", got, a1)
	}
	for i := range 2 {
		if err := step(30*time.Second, func(ctx context.Context) error { return be.Stop(ctx, v1) }); err != nil {
			t.Fatalf("stop #%d: %v", i+1, err)
		}
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("after stop, list = %v, want nothing", got)
	}

	// A create cut off by its deadline (law 3: the agent abandons it) may
	// or may not have made its container; the stop that follows removes
	// whatever it made.
	v2 := vm("berth-902-1")
	err = step(5*time.Millisecond, func(ctx context.Context) error { return be.Create(ctx, v2) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create with a 5 ms deadline: %v, want the deadline's error", err)
	}
	time.Sleep(2 * time.Second) // a window, not a wait: a docker run the kill did not reach may still land, and the stop must remove it
	if err := step(30*time.Second, func(ctx context.Context) error { return be.Stop(ctx, v2) }); err != nil {
		t.Fatalf("stop after an overrun create: %v", err)
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("after the overrun create's stop, list = %v, want nothing", got)
	}
	if err := step(30*time.Second, func(ctx context.Context) error {
		c := exec.CommandContext(ctx, "sh", script, "bogus")
		var stderr bytes.Buffer
		c.Stderr = &stderr
		if err := c.Run(); err == nil || !strings.Contains(stderr.String(), "want create, stop or list") {
			return errors.New("an unknown step must fail and name the steps: " + stderr.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
