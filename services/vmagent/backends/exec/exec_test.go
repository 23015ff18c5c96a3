package exec_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/exec"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script writes body as a POSIX shell script into dir and returns the argv
// that runs it.
func script(t *testing.T, dir, name, body string) []string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{"/bin/sh", path}
}

// attemptVM is an attempt's VM whose work dir and JIT file exist, as the
// agent prepares them before create.
func attemptVM(t *testing.T) backend.VM {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "attempts", "berth-42-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	jit := filepath.Join(dir, "jitconfig")
	if err := os.WriteFile(jit, []byte("jit"), 0o600); err != nil {
		t.Fatal(err)
	}
	return backend.VM{Attempt: "berth-42-1", Pool: "linux", Host: "host-a", Labels: []string{"self-hosted", "linux", "x64"},
		JobID: 42, JITConfigFile: jit, WorkDir: dir}
}

// envFile parses the output of `env` (one NAME=value a line).
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the step did not dump its environment: %v", err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = v
		}
	}
	return out
}

func TestEveryStepGetsTheDocumentedVariablesAndTheExtras(t *testing.T) {
	for _, step := range []string{"create", "stop"} {
		t.Run(step, func(t *testing.T) {
			// Given a backend whose steps dump their environment.
			dir := t.TempDir()
			dump := filepath.Join(dir, "env")
			argv := script(t, dir, "dump.sh", `env > "$DUMP_TO"`)
			b := exec.New(argv, argv, map[string]string{"DUMP_TO": dump, "BERTH_EXTRA": "extra value"})
			vm := attemptVM(t)

			// When the step runs.
			var err error
			if step == "create" {
				err = b.Create(context.Background(), vm)
			} else {
				err = b.Stop(context.Background(), vm)
			}
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}

			// Then every BERTH_* variable of the contract and every extra reached it.
			env := envFile(t, dump)
			want := map[string]string{
				"BERTH_STEP":            step,
				"BERTH_ATTEMPT":         "berth-42-1",
				"BERTH_POOL":            "linux",
				"BERTH_HOST":            "host-a",
				"BERTH_LABELS":          "self-hosted,linux,x64",
				"BERTH_JOB_ID":          "42",
				"BERTH_JIT_CONFIG_FILE": vm.JITConfigFile,
				"BERTH_WORK_DIR":        vm.WorkDir,
				"BERTH_EXTRA":           "extra value",
				"DUMP_TO":               dump,
			}
			for k, v := range want {
				if got, ok := env[k]; !ok || got != v {
					t.Errorf("%s=%q (present %v), want %q", k, got, ok, v)
				}
			}
		})
	}
}

func TestExtraEnvOverridesTheInheritedEnvironment(t *testing.T) {
	// Given the agent's own environment sets a variable the config overrides.
	t.Setenv("BERTH_TEST_OVERRIDE", "from agent")
	dir := t.TempDir()
	dump := filepath.Join(dir, "env")
	argv := script(t, dir, "dump.sh", `env > "`+dump+`"`)
	b := exec.New(argv, argv, map[string]string{"BERTH_TEST_OVERRIDE": "from config"})

	// When create runs, then the configured value wins.
	if err := b.Create(context.Background(), attemptVM(t)); err != nil {
		t.Fatal(err)
	}
	if got := envFile(t, dump)["BERTH_TEST_OVERRIDE"]; got != "from config" {
		t.Errorf("BERTH_TEST_OVERRIDE=%q, want the configured %q", got, "from config")
	}
}

func TestFailingStepReportsExitCodeAndOutputTail(t *testing.T) {
	// Given a create that prints a lot, then a last word on stderr, and exits 3.
	dir := t.TempDir()
	argv := script(t, dir, "fail.sh", `
i=0; while [ $i -lt 200 ]; do echo "early noise line $i padding padding"; i=$((i+1)); done
echo "disk clone failed: no space left" >&2
exit 3`)
	b := exec.New(argv, argv, nil)

	// When create runs.
	err := b.Create(context.Background(), attemptVM(t))

	// Then the error names the exit code and carries the tail of the output.
	if err == nil {
		t.Fatal("create exiting 3 returned nil")
	}
	msg := err.Error()
	for _, want := range []string{"create", "berth-42-1", "exited 3", "disk clone failed: no space left"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	// And only the tail: the first lines are cut off so logs and events stay small.
	if strings.Contains(msg, "early noise line 0 ") {
		t.Errorf("error carries the whole output (%d bytes), want its tail", len(msg))
	}
	if len(msg) > 2300 {
		t.Errorf("error is %d bytes, want about the 2 KiB tail", len(msg))
	}
}

func TestMissingCommandIsAnError(t *testing.T) {
	b := exec.New(nil, nil, nil)
	if err := b.Stop(context.Background(), attemptVM(t)); err == nil {
		t.Fatal("stop with no command configured returned nil")
	}
}

// gone reports whether pid no longer runs: it does not exist, or it is a
// zombie waiting for a parent (PID 1 in a container may never reap it).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Format: pid (comm) state …; comm may hold spaces, so cut at the last ')'.
	rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
	return strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the script did not write %s: %v", path, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %s: %v", path, err)
	}
	return pid
}

func TestStepOverrunningItsDeadlineIsKilledWithItsProcessGroup(t *testing.T) {
	// Given a create that records its pids and then sleeps "forever" in a
	// child process (the same process group).
	dir := t.TempDir()
	vm := attemptVM(t)
	argv := script(t, dir, "wedge.sh", `
echo $$ > "$BERTH_WORK_DIR/shell.pid"
sleep 1000 &
echo $! > "$BERTH_WORK_DIR/sleep.pid"
wait`)
	b := exec.New(argv, argv, nil)

	// When create runs under a 200ms deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := b.Create(ctx, vm)
	took := time.Since(start)

	// Then it returns promptly with an error wrapping the deadline.
	if took > 5*time.Second {
		t.Errorf("create returned after %v, want promptly after its 200ms deadline", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create error %v, want one wrapping context.DeadlineExceeded", err)
	}
	// And the shell and its sleeping child are gone (checked with kill -0,
	// polling because the kernel finishes killing asynchronously).
	pids := map[string]int{
		"shell": readPID(t, filepath.Join(vm.WorkDir, "shell.pid")),
		"sleep": readPID(t, filepath.Join(vm.WorkDir, "sleep.pid")),
	}
	for name, pid := range pids {
		t.Cleanup(func() {
			if !gone(pid) {
				syscall.Kill(pid, syscall.SIGKILL) // do not leave it behind
			}
		})
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("%s (pid %d) gone after the step was abandoned", name, pid),
			func() bool { return gone(pid) })
	}
}

func TestStopAfterWorkDirIsGoneStillRuns(t *testing.T) {
	// Given an attempt whose work dir was already removed.
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	vm := attemptVM(t)
	if err := os.RemoveAll(vm.WorkDir); err != nil {
		t.Fatal(err)
	}
	// And a stop that records it ran, then finds nothing to stop.
	argv := script(t, dir, "stop.sh", `
echo "$BERTH_ATTEMPT" > "`+ran+`"
[ -f "$BERTH_WORK_DIR/runner.pid" ] || exit 0
exit 1`)
	b := exec.New(nil, argv, nil)

	// When stop runs, then it succeeds and really ran.
	if err := b.Stop(context.Background(), vm); err != nil {
		t.Fatalf("stop with the work dir gone: %v", err)
	}
	if got, err := os.ReadFile(ran); err != nil || strings.TrimSpace(string(got)) != vm.Attempt {
		t.Fatalf("stop command did not run for %s: %q, %v", vm.Attempt, got, err)
	}
}

func TestShippedSimRunnerScriptStopsWhatCreateStarted(t *testing.T) {
	// A path relative to the agent's working directory, as operators write
	// it in the config: steps run there, not in the attempt's work dir.
	const simRunner = "../../../../deploy/exec/sim-runner.sh"
	if _, err := os.Stat(simRunner); err != nil {
		t.Skipf("deploy/exec/sim-runner.sh not found: %v", err)
	}
	if _, err := os.Stat("/usr/bin/setsid"); err != nil {
		if _, err := os.Stat("/bin/setsid"); err != nil {
			t.Skip("setsid not installed")
		}
	}
	// Given the shipped script with a "runner" that just sleeps.
	dir := t.TempDir()
	runner := script(t, dir, "runner.sh", `exec sleep 1000`)[1]
	b := exec.New([]string{"/bin/sh", simRunner, "create"}, []string{"/bin/sh", simRunner, "stop"},
		map[string]string{"BERTH_SIM_RUNNER": runner})
	vm := attemptVM(t)

	// When create runs under a deadline, then the runner outlives the step
	// (setsid: the step's process group is not the runner's).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Create(ctx, vm); err != nil {
		t.Fatalf("create: %v", err)
	}
	pid := readPID(t, filepath.Join(vm.WorkDir, "runner.pid"))
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if gone(pid) {
		t.Fatalf("runner pid %d died with the create step", pid)
	}

	// When stop runs, then the runner is gone.
	if err := b.Stop(ctx, vm); err != nil {
		t.Fatalf("stop: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, fmt.Sprintf("runner pid %d gone after stop", pid), func() bool { return gone(pid) })
	// And a second stop, with the work dir gone, is a harmless success.
	if err := os.RemoveAll(vm.WorkDir); err != nil {
		t.Fatal(err)
	}
	if err := b.Stop(ctx, vm); err != nil {
		t.Fatalf("stop with nothing left: %v", err)
	}
}

// A create that exits 0 but leaves a background child holding its output
// open (a runner started without redirecting it) succeeded: the contract is
// the exit status.
func TestCreateThatLeavesAChildHoldingOutputOpenSucceeds(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "create.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nsleep 3 &\necho started\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := exec.New([]string{script}, []string{"true"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Create(ctx, backend.VM{Attempt: "berth-1-1", WorkDir: dir}); err != nil {
		t.Fatalf("create exited 0 but was reported failed: %v", err)
	}
}

// Given an exec backend with an assign command, then it can keep warm VMs:
// create for a warm VM runs with BERTH_WARM=1 and no JIT config file, and
// assign runs the assign command (BERTH_STEP=assign) with the JIT config's
// file. Without an assign command it cannot, and Assign says so.
func TestWarmCreateAndAssignFollowTheContract(t *testing.T) {
	dir := t.TempDir()
	dump := func(name string) []string {
		return script(t, dir, name+".sh", `env > "`+filepath.Join(dir, name+".env")+`"`)
	}
	b := exec.New(dump("create"), dump("stop"), nil)
	b.AssignCmd = dump("assign")
	if !b.CanAssign() {
		t.Fatal("with an assign command the backend says it cannot assign")
	}
	vm := attemptVM(t)
	jit := vm.JITConfigFile
	vm.Warm, vm.JITConfigFile = true, ""
	ctx := context.Background()
	if err := b.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	env := envFile(t, filepath.Join(dir, "create.env"))
	if env["BERTH_STEP"] != "create" || env["BERTH_WARM"] != "1" || env["BERTH_JIT_CONFIG_FILE"] != "" {
		t.Errorf("warm create saw step %q, warm %q, JIT file %q; want create, 1 and none",
			env["BERTH_STEP"], env["BERTH_WARM"], env["BERTH_JIT_CONFIG_FILE"])
	}
	vm.JITConfigFile = jit
	if err := b.Assign(ctx, vm); err != nil {
		t.Fatal(err)
	}
	env = envFile(t, filepath.Join(dir, "assign.env"))
	if env["BERTH_STEP"] != "assign" || env["BERTH_JIT_CONFIG_FILE"] != jit || env["BERTH_ATTEMPT"] != vm.Attempt {
		t.Errorf("assign saw step %q, JIT file %q, attempt %q", env["BERTH_STEP"], env["BERTH_JIT_CONFIG_FILE"], env["BERTH_ATTEMPT"])
	}
	plain := exec.New(dump("create"), dump("stop"), nil)
	if plain.CanAssign() || !errors.Is(plain.Assign(ctx, vm), backend.ErrNoAssign) {
		t.Error("without an assign command the backend must say it cannot assign")
	}
}

// Given a VM of a pool that declares a machine shape, when it is created,
// then the create command sees the shape's CPU, memory, disk and image;
// a VM without a shape sees them empty (the command sizes it as usual).
func TestCreateSeesTheMachineShape(t *testing.T) {
	dir := t.TempDir()
	b := exec.New(script(t, dir, "create.sh", `env > "`+filepath.Join(dir, "create.env")+`"`), script(t, dir, "stop.sh", "true"), nil)
	vm := attemptVM(t)
	vm.Shape = &events.Shape{CPU: 8, MemoryMiB: 16384, DiskGiB: 100, Image: "xcode-16"}
	if err := b.Create(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	env := envFile(t, filepath.Join(dir, "create.env"))
	if env["BERTH_CPU"] != "8" || env["BERTH_MEMORY_MIB"] != "16384" || env["BERTH_DISK_GIB"] != "100" || env["BERTH_IMAGE"] != "xcode-16" {
		t.Errorf("create saw cpu %q memory %q disk %q image %q", env["BERTH_CPU"], env["BERTH_MEMORY_MIB"], env["BERTH_DISK_GIB"], env["BERTH_IMAGE"])
	}
	vm.Shape = nil
	if err := b.Create(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
	if env := envFile(t, filepath.Join(dir, "create.env")); env["BERTH_CPU"] != "" || env["BERTH_IMAGE"] != "" {
		t.Errorf("without a shape create saw cpu %q image %q", env["BERTH_CPU"], env["BERTH_IMAGE"])
	}
}
