// Package exec is the backend that runs operator-supplied commands for each
// lifecycle step. It is how Berth drives any host, and how tests inject
// faults (a stop that sleeps forever, a create that fails).
//
// Contract: each step runs its command with these environment variables,
// plus the configured extras:
//
//	BERTH_STEP             create | stop | assign
//	BERTH_ATTEMPT          attempt id (also the runner and VM name)
//	BERTH_POOL, BERTH_HOST pool and host names
//	BERTH_LABELS           runner labels, comma-separated
//	BERTH_JOB_ID           the GitHub job the attempt was booked for
//	BERTH_JIT_CONFIG_FILE  path of a 0600 file holding the encoded JIT config
//	BERTH_WORK_DIR         a directory owned by this attempt alone
//	BERTH_CPU, BERTH_MEMORY_MIB, BERTH_DISK_GIB, BERTH_IMAGE
//	                       the machine shape the pool declares (issue 20);
//	                       empty when it declares none (size the VM as usual)
//	BERTH_RUNNER_LOG       where the runner's output should go (a file in
//	                       the work dir): the agent reads the runner's
//	                       version and GitHub's refusal of it there
//	                       (issue 20); a command that sends it elsewhere
//	                       only loses that report
//
// Warm VMs (issue 8): with an assign command, create runs for a warm VM
// with BERTH_WARM=1 and an empty BERTH_JIT_CONFIG_FILE, and returns when the
// VM is ready; assign (BERTH_STEP=assign) then starts its runner with the
// JIT config's file.
//
// The optional list step (BERTH_STEP=list) gets BERTH_ATTEMPTS_DIR, the
// parent of every attempt's work dir, and BERTH_HOST, and prints the attempt
// ids of this host's VMs that exist, one per line. Without a list command the agent sweeps nothing.
//
// Exit 0 is success; anything else is a failure whose last output lines are
// reported. When the step's deadline passes, its whole process group is
// killed, so a command must not leave children in its group that should
// outlive the step (start a runner with setsid, as deploy/exec/ does).
package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Backend runs Create and Stop commands.
type Backend struct {
	CreateCmd []string
	StopCmd   []string
	ListCmd   []string
	// AssignCmd, optional, starts a warm VM's runner (BERTH_STEP=assign);
	// with it the host can keep warm VMs, whose create step runs with
	// BERTH_WARM=1 and no JIT config.
	AssignCmd []string
	Env       map[string]string
	// Host is the agent's host name, given to the list step as BERTH_HOST
	// (a backend shared by several hosts, such as one Docker engine, lists
	// only this host's VMs).
	Host string

	attemptsDir string
}

// New returns an exec backend; create and stop are argv slices.
func New(create, stop []string, env map[string]string) *Backend {
	return &Backend{CreateCmd: create, StopCmd: stop, Env: env}
}

// WithList adds the optional inventory command.
func (b *Backend) WithList(list []string, attemptsDir string) *Backend {
	b.ListCmd, b.attemptsDir = list, attemptsDir
	return b
}

// List implements backend.Backend.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	if len(b.ListCmd) == 0 {
		return nil, backend.ErrNoInventory
	}
	out := &capped{max: 1 << 20}
	cmd := b.command(ctx, b.ListCmd, "BERTH_STEP=list", "BERTH_ATTEMPTS_DIR="+b.attemptsDir, "BERTH_HOST="+b.Host)
	var errOut tail
	cmd.Stdout, cmd.Stderr = out, &errOut
	if err := cmd.Run(); err != nil && !(errors.Is(err, osexec.ErrWaitDelay) && cmd.ProcessState.Success()) {
		return nil, fmt.Errorf("list step: %w: %s", err, errOut.String())
	}
	var ids []string
	for _, line := range strings.Split(out.b.String(), "\n") {
		if id := strings.TrimSpace(line); id != "" {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "exec" }

// PhysicalCap implements backend.Backend: the commands set no limit of
// their own; the agent's physical_cap decides.
func (b *Backend) PhysicalCap() int { return 0 }

// CanAssign implements backend.Backend: with an assign command.
func (b *Backend) CanAssign() bool { return len(b.AssignCmd) > 0 }

// Assign implements backend.Backend: the assign command, with the JIT
// config's file, starts a warm VM's runner.
func (b *Backend) Assign(ctx context.Context, vm backend.VM) error {
	if len(b.AssignCmd) == 0 {
		return backend.ErrNoAssign
	}
	return b.run(ctx, "assign", b.AssignCmd, vm)
}

// Create implements backend.Backend.
func (b *Backend) Create(ctx context.Context, vm backend.VM) error {
	return b.run(ctx, "create", b.CreateCmd, vm)
}

// RunnerOutput implements backend.RunnerOutput: what the runner wrote to
// BERTH_RUNNER_LOG (the create command sends the runner's output there).
func (b *Backend) RunnerOutput(ctx context.Context, vm backend.VM) ([]byte, error) {
	return backend.ReadTail(filepath.Join(vm.WorkDir, backend.RunnerLogName))
}

// Stop implements backend.Backend.
func (b *Backend) Stop(ctx context.Context, vm backend.VM) error {
	return b.run(ctx, "stop", b.StopCmd, vm)
}

func (b *Backend) run(ctx context.Context, step string, argv []string, vm backend.VM) error {
	if len(argv) == 0 {
		return fmt.Errorf("exec backend: no %s command configured", step)
	}
	var shape events.Shape
	if vm.Shape != nil {
		shape = *vm.Shape
	}
	cmd := b.command(ctx, argv,
		"BERTH_STEP="+step,
		"BERTH_ATTEMPT="+vm.Attempt,
		"BERTH_POOL="+vm.Pool,
		"BERTH_HOST="+vm.Host,
		"BERTH_LABELS="+strings.Join(vm.Labels, ","),
		"BERTH_JOB_ID="+strconv.FormatInt(vm.JobID, 10),
		"BERTH_JIT_CONFIG_FILE="+vm.JITConfigFile,
		"BERTH_WORK_DIR="+vm.WorkDir,
		"BERTH_WARM="+warmFlag(vm.Warm),
		"BERTH_CPU="+positive(shape.CPU),
		"BERTH_MEMORY_MIB="+positive(shape.MemoryMiB),
		"BERTH_DISK_GIB="+positive(shape.DiskGiB),
		"BERTH_IMAGE="+shape.Image,
		"BERTH_RUNNER_LOG="+filepath.Join(vm.WorkDir, backend.RunnerLogName),
	)
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if errors.Is(err, osexec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// The command exited 0 but left a child holding its output open
		// (a runner started without redirecting it): the step succeeded.
		err = nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s step for %s: %w", step, vm.Attempt, ctx.Err())
	}
	if err != nil {
		var exit *osexec.ExitError
		if errors.As(err, &exit) {
			return fmt.Errorf("%s step for %s exited %d: %s", step, vm.Attempt, exit.ExitCode(), out.String())
		}
		return fmt.Errorf("%s step for %s: %w", step, vm.Attempt, err)
	}
	return nil
}

func warmFlag(w bool) string {
	if w {
		return "1"
	}
	return ""
}

// command prepares one step: the agent's environment plus env and the
// configured extras, in the agent's working directory (so relative paths in
// the config mean what the operator wrote), in its own process group, which
// is killed when ctx ends.
func (b *Backend) command(ctx context.Context, argv []string, env ...string) *osexec.Cmd {
	cmd := osexec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	for k, v := range b.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// capped keeps at most max bytes of a step's output and drops the rest.
type capped struct {
	b   bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// tail keeps the last 2 KiB a step printed, for its error message.
type tail struct{ b bytes.Buffer }

func (t *tail) Write(p []byte) (int, error) {
	t.b.Write(p)
	if t.b.Len() > 2048 {
		rest := t.b.Bytes()[t.b.Len()-2048:]
		t.b = *bytes.NewBuffer(append([]byte(nil), rest...))
	}
	return len(p), nil
}

func (t *tail) String() string { return strings.TrimSpace(t.b.String()) }

// positive is n in decimal, or "" for an unset (zero) size.
func positive(n int) string {
	if n <= 0 {
		return ""
	}
	return strconv.Itoa(n)
}
